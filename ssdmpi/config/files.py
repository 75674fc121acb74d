"""Settings from files: the built-in presets (``ssdmpi/presets/NAME.yaml``) and YAML config files.

A file is a mapping of settings (``batch_size`` or ``batch-size``); unknown keys are an error naming
the file and the key; values are read as the flags would give them (``widths: 64,32``,
``bucket_size: 4M``).
"""

from __future__ import annotations

from importlib import resources

import yaml

from ssdmpi.config.settings import FIELD_NAMES, SETTINGS, widths_value
from ssdmpi.errors import UserError
from ssdmpi.parsing import parse_size
from ssdmpi.validate import did_you_mean, is_int


def list_presets() -> list:
    """Names of the built-in presets."""
    return sorted(p.name[:-5] for p in resources.files("ssdmpi").joinpath("presets").iterdir()
                  if p.name.endswith(".yaml"))


def load_preset(name: str) -> dict:
    """The settings of preset ``name``; ``UserError`` if there is no such preset."""
    names = list_presets()
    if name not in names:
        raise UserError(f"unknown preset {name!r}; choose one of {', '.join(names)}")
    text = resources.files("ssdmpi").joinpath("presets", f"{name}.yaml").read_text(encoding="utf-8")
    return normalise(_parse_yaml(text, f"preset {name}"), f"preset {name}")


def load_file(path: str) -> dict:
    """The settings of a YAML config file; ``UserError`` if unreadable, malformed or with unknown keys."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise UserError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    return normalise(_parse_yaml(text, path), path)


def _parse_yaml(text: str, where: str) -> dict:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark is not None else ""
        raise UserError(f"{where}: not valid YAML{at}: {getattr(exc, 'problem', None) or exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a mapping of settings (key: value), got {type(data).__name__}")
    return data


def normalise(data: dict, where: str) -> dict:
    """Keys with dashes or underscores -> field names (unknown keys are an error); values as the
    flags would give them (``widths: 64,32``, ``bucket_size: 4M``)."""
    out = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name == "no_progress_bar":
            name, value = "progress_bar", not value
        if name not in SETTINGS:
            raise UserError(f"{where}: unknown setting {key!r}{did_you_mean(name, FIELD_NAMES)}; "
                            "see ssdmpi train --help for the settings")
        if name == "widths":
            value = widths_value(value) if isinstance(value, str) else [value] if is_int(value) else value
        if name == "bucket_size" and isinstance(value, str):
            try:
                value = parse_size(value)
            except UserError as exc:
                raise UserError(f"{where}: bucket_size: {exc}") from None
        out[name] = value
    return out
