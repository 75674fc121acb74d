"""The configurations of ``ssdmpi bench accuracy``: its variants (every algorithm's and period rule's
named configurations, ``ssdmpi/algos/registry.py``), a variant's settings at a period ``k``, and the fields
that identify a result.
"""

from __future__ import annotations

from ssdmpi.algos import registry
from ssdmpi.errors import UserError

MODELS = ("mlp", "lenet5")
# Every algorithm's named configurations (``ssdmpi/algos/registry.py``: a new rule adds ``period/<rule>``).
VARIANTS = registry.variants()
# Variants without a delay/period k: one configuration (k = 0) and one column per row.
NO_DELAY = tuple(v for v, s in VARIANTS.items() if not registry.ALGORITHMS[s["algo"]].takes("delay"))
BASELINE = next(v for v, s in VARIANTS.items() if registry.ALGORITHMS[s["algo"]].baseline)
DEFAULT_VARIANTS = registry.accuracy_defaults()
DEFAULT_EPOCHS = "mlp=3,lenet5=2"
# Settings that identify a result; --resume only reuses rows whose settings all match.
SETTINGS = ("dataset", "lr", "batch_size", "epochs", "warmup_steps", "optimizer", "momentum", "weight_decay",
            "train_subset", "seed", "tail")
FIELDS = ("model", "N", "variant", "k") + SETTINGS + ("steps", "acc_W", "acc_W_noflush", "acc_W_tail", "seconds")
# Fields a results.csv written before they existed lacks, and what such a row means by them.
ADDED_FIELDS = {"tail": "0", "acc_W_tail": "", "optimizer": registry.DEFAULT_OPTIMIZER}


def _own_setting(variant: str) -> dict:
    """What ``BASE:TAG=V[:TAG=V...]`` adds to the variant ``BASE``: settings of its period rule, each named
    once by the setting's bench tag (``period/delta-merge:d=2``: ``merge_delay`` 2), checked; ``{}`` for a
    plain name of ``VARIANTS``. ``ValueError`` or ``UserError`` when it is neither."""
    base, _, param = variant.partition(":")
    if base not in VARIANTS:
        raise ValueError(variant)
    if not param:
        return {}
    rule = registry.RULES.get(VARIANTS[base].get("period_rule"))
    out = {}
    for part in param.split(":"):
        tag, _, value = part.partition("=")
        found = [s for s in (rule.settings if rule is not None else ())
                 if s.bench_tag and s.bench_tag.split("{")[0] == tag]
        if not found or found[0].name in out:
            raise ValueError(variant)
        s = found[0]
        s.validate(s.type(value))
        out[s.name] = s.type(value)
    return out


def known(variant: str) -> bool:
    """A name of ``VARIANTS``, or one with a setting of its rule (``_own_setting``)."""
    try:
        _own_setting(variant)
    except (ValueError, UserError):
        return False
    return True


def runs_at(variant: str, k: int, optimizer: str | None = None) -> bool:
    """``ssdmpi train`` takes ``variant`` at period ``k`` with ``optimizer`` (``period/delta-merge:d=3`` does not
    at ``k = 2``)."""
    try:
        registry.resolve({**variant_settings(variant, k), "warmup_steps": 0, "optimizer": optimizer})
    except UserError:
        return False
    return True


def variant_settings(variant: str, k: int) -> dict:
    """``AlgoConfig`` keywords of ``variant`` at period/delay ``k`` (none for ``NO_DELAY`` variants)."""
    base = variant.partition(":")[0]
    algo = dict(VARIANTS[base])
    if base not in NO_DELAY:
        algo["delay"] = k
    return {**algo, **_own_setting(variant)}


def result_key(row: dict) -> tuple:
    """What identifies a result: the configuration and every setting, as strings (CSV round trip)."""
    return tuple(_fmt(row[f]) for f in ("model", "N", "variant", "k") + SETTINGS)


def _fmt(value) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)
