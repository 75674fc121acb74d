"""``--algo ssgd``: synchronous SGD, the baseline: the SSGD warm-up forever (ALGORITHM.md 5c)."""

from __future__ import annotations

from ssdmpi.algos.base import Algorithm
from ssdmpi.spec import AlgorithmSpec, LinearMap


class SSGD(Algorithm):
    """``--algo ssgd``: one allreduce, overlapped with the backward pass, and one global update per step."""

    name = "ssgd"
    has_delay_stage = False


def _linear_map(x, k, N, mu):
    """Momentum SGD on ``W`` alone, blocking every step (the reference: stable up to ``2 (1 + mu)``)."""
    from ssdmpi.algos.stability import LinearState, chain, power

    s = LinearState(1, shared=("W", "M"), per_rank=())
    return power(chain(s.assign(x, {"M": {"M": mu, "W": -x}}), s.assign(x, {"W": {"W": 1.0, "M": 1.0}})), k)


SPEC = AlgorithmSpec("ssgd", lambda cfg: "ssdmpi.algos.ssgd:SSGD", lambda cfg, rule: None, lambda cfg, workers: "ssgd",
                     why="blocking allreduce every step", delay_stage=False, warmup=False, variants={"ssgd": {}},
                     accuracy_defaults=("ssgd",), pattern=lambda cfg: ("blocking", 1), baseline=True, torch_peer="ddp",
                     linear_map=LinearMap(_linear_map, period=False))
