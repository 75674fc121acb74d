"""The ``ssdmpi train`` flags: one per setting (``SETTINGS``), each help stating the default a run without
it gets; and the settings a command line gave (``from_flags``). Imported when the CLI parser is built."""

from __future__ import annotations

from ssdmpi.algos import registry
from ssdmpi.config.files import list_presets, load_preset
from ssdmpi.config.settings import FIELD_NAMES, RUN_DIR, SETTINGS


def _show(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def default_help(name: str, presets: dict) -> str:
    """``"default: ..."`` for the setting ``name``, as a run with no flags resolves it: the default
    preset's value if it has one, else the setting's default; and which other presets set their own."""
    base = presets.get("default", {})
    others = [p for p, values in presets.items() if p != "default" and name in values]
    if name in base:
        text = f"default: {_show(base[name])}, from the default preset"
        return text + (f"; preset {', '.join(others)} set{'s its' if len(others) == 1 else ' their'} own"
                       if others else "")
    s = SETTINGS[name]
    value = registry.default_text(name) if name in registry.SETTINGS else s.default_text or _show(s.default)
    return f"default: {value}" + (f"; set by preset {', '.join(others)}" if others else "")


def add_arguments(parser) -> None:
    """The ``ssdmpi train`` flags, one per setting. Every default is None: only flags actually given
    override. The help of each flag states the default a run without it gets (``default_help``)."""
    presets = {p: load_preset(p) for p in list_presets()}
    g = parser.add_argument_group("configuration")
    g.add_argument("--config", metavar="FILE",
                   help="YAML file of settings (keys as below, e.g. batch_size: 64) (default: none)")
    g.add_argument("--preset", metavar="NAME",
                   help=f"named preset: {', '.join(presets) or 'default'} (default: default)")
    g.add_argument("--print-config", action="store_true",
                   help="print the resolved settings (preset < --config FILE < flags) as YAML and exit; "
                        "writes nothing, trains nothing")
    groups, exclusive = {}, {}
    for name, s in SETTINGS.items():
        g = groups.get(s.group) or groups.setdefault(s.group, parser.add_argument_group(s.group))
        options = {k: v for k, v in s.argparse.items() if k not in ("flag", "group")}
        if "group" in s.argparse:
            g = exclusive.get(s.argparse["group"]) or exclusive.setdefault(s.argparse["group"],
                                                                           g.add_mutually_exclusive_group())
        choices = " | ".join(s.choices) if s.choices else ""
        head = s.help.format(choices=choices) if "{choices}" in s.help else f"{s.help}: {choices}" if choices \
            else s.help
        g.add_argument(s.argparse.get("flag", f"--{s.flag}"), dest=name, default=None, metavar=s.metavar,
                       **({"type": s.type} if s.type else {}), **options,
                       help=f"{head} ({default_help(name, presets)})".replace("%", "%%"))
    groups[RUN_DIR].add_argument("--resume", metavar="auto|PATH",
                                 help="auto: newest valid checkpoint of --run-dir (fresh start if none); "
                                      "PATH: a checkpoint, any file of one, or a run directory (default: a fresh run)")


def from_flags(args) -> dict:
    """The settings actually given on the command line (argparse defaults are None)."""
    return {name: value for name in FIELD_NAMES if (value := getattr(args, name, None)) is not None}
