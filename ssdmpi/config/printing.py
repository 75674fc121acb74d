"""``ssdmpi train --print-config``: the settings a run uses, as YAML valid as a ``--config`` file."""

from __future__ import annotations

from ssdmpi.algos import registry
from ssdmpi.algos.registry import RESOLVED
from ssdmpi.config.files import list_presets, load_preset
from ssdmpi.config.flags import default_help
from ssdmpi.config.settings import SETTINGS


def _comments(resolved) -> dict:
    """``{setting: comment}`` for the algorithm's and optimizer's settings no layer gave: the default the
    run resolved them to, or that this run does not use them (``registry.where``)."""
    cfg, out = resolved.config, {}
    for key in RESOLVED:
        if resolved.sources.get(key, "default") != "default" and key not in resolved.dropped:
            continue
        if key not in resolved.applied:
            out[key] = f"not used by this run (only with {registry.where(key)})"
        elif getattr(cfg, key) is None:
            out[key] = f"default: {registry.default_text(key)}"
        elif key == registry.OPTIMIZER_SELECTOR.name:
            out[key] = "the default"
        elif SETTINGS[key].group == registry.OPTIMIZER:
            out[key] = f"the default for --optimizer {cfg.optimizer}"
        else:
            out[key] = f"the default for --algo {cfg.algo}"
    if cfg.warmup_steps is None and cfg.warmup_epochs is not None:
        out["warmup_steps"] = "unset, --warmup-epochs decides"
    return out


def annotated_yaml(resolved) -> str:
    """The settings of a resolved run (``resolve_request``'s result) as YAML valid as a ``--config`` file,
    with a comment after each setting the run chose (its default for ``--algo`` or ``--optimizer``) and
    after each left unset (``null``) saying what a run gets instead, or that this run does not use it;
    the settings left out because they do not apply are noted at the top."""
    presets = {p: load_preset(p) for p in list_presets()}
    lines = ["# ssdmpi train: resolved settings (defaults < preset < --config file < flags)"]
    lines += [f"# note: {note}" for note in resolved.notes]
    comments = _comments(resolved)
    for line in resolved.config.to_yaml().splitlines():
        key, sep, value = line.partition(": ")
        if sep and key in comments and (value == "null") != comments[key].startswith("the default"):
            line += f"   # {comments[key]}"
        elif sep and value == "null" and key in SETTINGS:
            line += f"   # default: {SETTINGS[key].default_text or default_help(key, presets)}"
        lines.append(line)
    if resolved.config.run_dir is None:
        lines.append(f"# run_dir: {default_help('run_dir', presets)}")
    return "\n".join(lines) + "\n"
