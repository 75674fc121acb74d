"""The configurations of ``ssdmpi bench accuracy``: its models, its variants (every algorithm's and period
rule's named configurations, ``ssdmpi/algos/registry.py``), a variant's settings at a period ``k``, and the
fields that identify a result.
"""

from __future__ import annotations

from ssdmpi.algos import registry
from ssdmpi.errors import UserError

IMAGE_MODELS = ("mlp", "lenet5")
# Models of token windows: they train on a text --dataset and are scored by their validation loss.
LANGUAGE_MODELS = ("gpt",)
MODELS = IMAGE_MODELS + LANGUAGE_MODELS
# --dataset when none is given, by the kind of data the models take (ssdmpi.data.datasets.dataset_kind).
DEFAULT_DATASETS = {"classification": "fashion-mnist", "text": "devils-dictionary"}
# --gpt: the language model's sizes, each one a positive integer (a gpt far smaller than the text-gpt preset's,
# so that the reference simulator runs a table of them on one core in minutes each).
GPT_SIZES = {"n_layer": 2, "n_head": 2, "d_model": 64, "context": 64}
# Every algorithm's named configurations (``ssdmpi/algos/registry.py``: a new rule adds ``period/<rule>``).
VARIANTS = registry.variants()
# Variants without a delay/period k: one configuration (k = 0) and one column per row.
NO_DELAY = tuple(v for v, s in VARIANTS.items() if not registry.ALGORITHMS[s["algo"]].takes("delay"))
BASELINE = next(v for v, s in VARIANTS.items() if registry.ALGORITHMS[s["algo"]].baseline)
DEFAULT_VARIANTS = registry.accuracy_defaults()
DEFAULT_EPOCHS = "mlp=3,lenet5=2,gpt=2"
# Settings that identify a result; --resume only reuses rows whose settings all match.
# ``gpt`` and ``val_windows`` are a language model's (``gpt_text``; 0: every validation window), '' and 0 for
# an image model.
SETTINGS = ("dataset", "lr", "batch_size", "epochs", "warmup_steps", "optimizer", "momentum", "weight_decay",
            "train_subset", "seed", "tail", "gpt", "val_windows")
# A language model's acc_W* are its next-token accuracy (%), val_loss* its validation loss (nats per token) and
# val_ppl its perplexity, exp(val_loss); an image model's val_* are ''.
FIELDS = ("model", "N", "variant", "k") + SETTINGS + ("steps", "acc_W", "acc_W_noflush", "acc_W_tail", "seconds",
                                                      "val_loss", "val_loss_noflush", "val_loss_tail", "val_ppl")
# Fields a results.csv written before they existed lacks, and what such a row means by them.
ADDED_FIELDS = {"tail": "0", "acc_W_tail": "", "optimizer": registry.DEFAULT_OPTIMIZER, "gpt": "",
                "val_windows": "0", "val_loss": "", "val_loss_noflush": "", "val_loss_tail": "", "val_ppl": ""}


def gpt_sizes(text: str) -> dict:
    """``--gpt``'s ``"n_layer=2,d_model=32"`` -> every size of ``GPT_SIZES``, those given replacing its
    defaults; ``UserError`` (one line) for an unknown name or a value that is not a positive integer."""
    sizes = dict(GPT_SIZES)
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in GPT_SIZES:
            raise UserError(f"--gpt: unknown size {name!r}; give NAME=INT,... with names from {', '.join(GPT_SIZES)}")
        try:
            sizes[name] = int(value)
        except ValueError:
            raise UserError(f"--gpt: {name} must be a positive integer, got {value.strip()!r}") from None
        if sizes[name] < 1:
            raise UserError(f"--gpt: {name} must be a positive integer, got {sizes[name]}")
    return sizes


def gpt_text(sizes: dict) -> str:
    """The sizes as a row records them, in ``GPT_SIZES``' order: ``"n_layer=2,n_head=2,d_model=64,context=64"``."""
    return ",".join(f"{name}={int(sizes[name])}" for name in GPT_SIZES)


def warmup_steps(text) -> int | str:
    """``--warmup-steps``: iterations (``200``) or a share of the run's (``"25%"``, kept as text and resolved per
    configuration by ``warmup_iterations``); ``UserError`` (one line) otherwise."""
    text = str(text).strip()
    try:
        value = float(text[:-1]) if text.endswith("%") else int(text)
    except ValueError:
        raise UserError(f"--warmup-steps must be iterations (an integer) or a percentage of the run (25%), "
                        f"got {text!r}") from None
    if value < 0 or (text.endswith("%") and value >= 100):
        raise UserError(f"--warmup-steps must be >= 0 (and a percentage below 100%), got {text}")
    return f"{value:g}%" if text.endswith("%") else value


def warmup_iterations(setting, steps: int) -> int:
    """The SSGD iterations before the delay stage of a run of ``steps``: ``setting`` itself, or its percentage of
    ``steps``, rounded."""
    if isinstance(setting, str) and setting.endswith("%"):
        return int(round(float(setting[:-1]) * steps / 100))
    return int(setting)


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
