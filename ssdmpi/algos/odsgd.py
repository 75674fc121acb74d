"""``--algo odsgd``: OD-SGD, the authors' predecessor of SSD-SGD: ``ssd`` with ``k = 1`` and ``--comm step``
(ALGORITHM.md 5c)."""

from __future__ import annotations

from ssdmpi.algos import ssd
from ssdmpi.spec import AlgorithmSpec


class ODSGD(ssd.SSDStep):
    """``--algo odsgd``: ``SSDStep`` with ``k = 1``."""

    name = "odsgd"


SPEC = AlgorithmSpec("odsgd", lambda cfg: "ssdmpi.algos.odsgd:ODSGD", ssd.SPEC.reference,
                     lambda cfg, workers: f"odsgd (k=1, comm step, warm-up {cfg.warmup_steps} steps)",
                     settings=ssd.SETTINGS, fixed={ssd.DELAY.name: 1, ssd.COMM.name: "step"}, variant_of=ssd.SPEC.name,
                     inspect=lambda cfg: "k=1", variants={"odsgd": {}}, pattern=lambda cfg: ("step", 1))
