"""The registry (ssdmpi/algos/registry.py): an algorithm's or rule's name is compared as a string
nowhere else, each default is stated once, and a period rule is one file (plus its reference twin
and its tests): a planted rule file shows up everywhere the registry reaches."""

import argparse
import ast
import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

from ssdmpi.algos import registry
from ssdmpi.cli import build_parser
from ssdmpi.spec import load
from tests.conftest import ROOT
from tests.source import docstring_ids

PACKAGE = ROOT / "ssdmpi"
REGISTRY = ("algos/registry.py",)
# Parameters named like an algorithm setting that are another thing: not restatements of its default.
NOT_THE_SETTING = {("optim/schedules.py", "warmup_steps"): "the lr schedule's linear warm-up (--lr-warmup-epochs), "
                                                            "not the SSGD warm-up"}


def write_package(root: pathlib.Path, files: dict) -> pathlib.Path:
    for rel, source in files.items():
        path = root / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    return root / "pkg"


def _names_in(text: str, names, part_of_fstring: bool) -> set:
    """The names ``text`` writes out: the whole string, an option with it (``--algo ssd``), or, in an
    f-string, a piece that starts with one (``f"ssd:period:{k}"``)."""
    hit = {n for n in names if text == n or any(f"--{option} {n}" in text for option in OPTIONS)}
    if part_of_fstring:
        hit |= {n for n in names if text.startswith((f"{n}:", f"{n}/", f"{n}-"))}
    return hit


OPTIONS = ("algo", "period-rule", "optimizer")


def name_literals(package: pathlib.Path, allowed: dict) -> list:
    """``["rel:line name", ...]``: every string (not a docstring) that writes out a name of ``allowed``
    (``{name: files where it may}``) outside those files: a literal, a dict key, a tuple member, a
    comparison's operand, an option in a message (``--algo ssgd``), an f-string's piece (``ssd:``)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = docstring_ids(tree)
        in_fstrings = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                for name in sorted(_names_in(node.value, allowed, id(node) in in_fstrings)):
                    if rel not in allowed[name]:
                        found.append(f"{rel}:{node.lineno} {name}")
    return sorted(set(found))


def allowed_files() -> dict:
    """Where each algorithm's, rule's and optimizer's name may be written: its own spec's file, the
    registry, and the reference twins (an independent second implementation, ``verify/reference.py``);
    ``sgd`` also names a local update (``optim/local.py``, which declares it, and ``algos/ssd.py``) and an
    outer optimizer (``optim/outer.py``, which declares it)."""
    import inspect

    out = {}
    for specs in (registry.ALGORITHMS, registry.RULES, registry.OPTIMIZERS):
        for name, spec in specs.items():
            own = pathlib.Path(inspect.getsourcefile(_declaring_module(spec))).relative_to(PACKAGE)
            out[name] = {own.as_posix(), *REGISTRY, "verify/reference.py"}
    out["sgd"] |= {"optim/local.py", "optim/outer.py"}
    return out


def _declaring_module(spec):
    """The module that declares ``spec`` (the registry indexes a copy of an algorithm's spec, with its rules')."""
    import sys

    return next(m for m in list(sys.modules.values()) if type(getattr(m, "SPEC", None)) is type(spec)
                and m.SPEC.name == spec.name)


def test_the_literal_finder_finds_every_form(tmp_path):
    package = write_package(tmp_path, {
        "registry.py": "def f(a):\n    return a == 'ssd'\n",                      # allowed here
        "plot.py": "def g(a):\n    return a.algo == 'ssgd' or a in ('x', 'localsgd')\n",
        "bench.py": "VARIANTS = {'ssgd': 1}\n\ndef h(v, k):\n"
                    "    return f'ssd:period:{k}' if v else 'use --algo asgd'\n",
        "doc.py": '"""A docstring may say ssgd."""\nX = "delta-own"\n',
    })
    allowed = {n: {"registry.py"} for n in ("ssgd", "ssd", "localsgd", "delta-own", "asgd")}
    assert name_literals(package, allowed) == ["bench.py:1 ssgd", "bench.py:4 asgd", "bench.py:4 ssd",
                                               "doc.py:2 delta-own", "plot.py:2 localsgd", "plot.py:2 ssgd"]


def test_algorithm_rule_and_optimizer_names_are_written_only_in_their_own_files():
    assert name_literals(PACKAGE, allowed_files()) == []


def test_the_delta_merge_settings_are_written_only_in_its_file_and_its_twin():
    """``--merge-delay``, ``--merge-momentum`` and ``delta_merge`` as code (a string or a name; not in a
    docstring or a comment) only in the rule's own file and its reference twin."""
    words = ("merge-delay", "merge_delay", "merge-momentum", "merge_momentum", "delta_merge")
    allowed, found = {"algos/rules/delta_merge.py", "verify/reference.py"}, []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = docstring_ids(tree)
        for node in ast.walk(tree):
            text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                id(node) not in skip else node.id if isinstance(node, ast.Name) else node.attr \
                if isinstance(node, ast.Attribute) else node.name if isinstance(node, ast.alias) else ""
            found += [f"{rel}:{node.lineno} {w}" for w in words if w in text and rel not in allowed]
    assert found == []


# -- each default stated once ----------------------------------------------------------------------

def _literal(node):
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _defaults(tree) -> list:
    """``(name, value node)`` of every parameter default, class-body field and ``add_argument`` default."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            positional = a.posonlyargs + a.args
            out += list(zip([p.arg for p in positional[len(positional) - len(a.defaults):]], a.defaults))
            out += [(k.arg, d) for k, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            out.append((node.target.id, node.value))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument" and node.args \
                and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith("--"):
            out += [(node.args[0].value[2:].replace("-", "_"), k.value) for k in node.keywords if k.arg == "default"]
    return out


def restated_defaults(package: pathlib.Path, defaults: dict, exempt=NOT_THE_SETTING) -> list:
    """``["rel:line name = value", ...]``: a default written again as a literal (a parameter, a field or a
    flag named like a setting of ``defaults``, with that setting's default value) outside ``exempt``."""
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        for name, node in _defaults(ast.parse(path.read_text(encoding="utf-8"))):
            ok, value = _literal(node)
            if ok and name in defaults and (rel, name) not in exempt and defaults[name] is not None \
                    and type(value) is type(defaults[name]) and value == defaults[name]:
                found.append(f"{rel}:{node.lineno} {name} = {value!r}")
    return sorted(found)


def test_the_restatement_finder_finds_planted_duplicates(tmp_path):
    package = write_package(tmp_path, {
        "settings.py": "S = [Setting('momentum', 0.9), Setting('delay', 5)]\n",   # the declaration itself
        "algo.py": """\
            from dataclasses import dataclass

            @dataclass
            class Config:
                momentum: float = 0.9
                delay: int = 4

            def sgd(w, momentum=0.9, lr=0.1):
                return w
            """,
        "bench.py": "def flags(p):\n    p.add_argument('--delay', type=int, default=5)\n",
    })
    assert restated_defaults(package, {"momentum": 0.9, "delay": 5}) == [
        "algo.py:5 momentum = 0.9", "algo.py:8 momentum = 0.9", "bench.py:2 delay = 5"]


def test_the_algorithm_settings_defaults_are_stated_once():
    """Each default of the optimizer's and the algorithms' settings appears in the registry's
    declaration only: ``TrainConfig``, ``AlgoConfig`` and the benchmarks take it from there."""
    assert restated_defaults(PACKAGE, {n: s.default for n, s in registry.SETTINGS.items()}) == []


def literal_defaults_in_help(parser, path=()) -> list:
    """``["ssdmpi bench train --epochs", ...]``: flags whose help writes their default out instead of
    letting argparse fill it in (``%(default)s``), so that the two can drift apart."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += literal_defaults_in_help(sub, path + (name,))
        elif action.help and action.default not in (None, False, "", argparse.SUPPRESS) \
                and "%(default)" not in action.help and f"default {action.default}" in action.help.replace(":", ""):
            found.append(" ".join(path + (action.option_strings[0],)))
    return found


def test_the_help_finder_finds_a_planted_literal_default():
    parser = argparse.ArgumentParser(prog="p")
    sub = parser.add_subparsers().add_parser("bench")
    sub.add_argument("--epochs", type=int, default=3, help="epochs per run (default 3)")
    sub.add_argument("--lr", type=float, default=0.05, help="global learning rate (default: 0.05)")
    sub.add_argument("--seed", type=int, default=0, help="seed (default %(default)s)")
    assert literal_defaults_in_help(parser) == ["bench --epochs", "bench --lr"]


def test_no_command_writes_a_flag_default_into_its_help():
    assert literal_defaults_in_help(build_parser(), ("ssdmpi",)) == []


# -- the specs ------------------------------------------------------------------------------------

def test_one_rule_is_the_default_and_every_rule_file_declares_its_spec():
    files = sorted(p.stem for p in (PACKAGE / "algos" / "rules").glob("*.py") if p.stem != "__init__")
    assert sorted(name.replace("-", "_") for name in registry.RULES) == files
    assert [name for name, spec in registry.RULES.items() if spec.default] == ["delta-merge"]


@pytest.mark.parametrize("variant", list(registry.variants()))
def test_every_variant_builds_and_steps_as_its_reference_twin(variant):
    """Each named variant builds the class its spec names (its ``--algo``), and on one rank it takes the
    same steps as the simulation its spec names with the twin its spec names (bitwise, float64)."""
    import numpy as np
    from mpi4py import MPI

    from ssdmpi.algos import build_algorithm
    from ssdmpi.comm.communicator import Communicator
    from ssdmpi.nn import build_model

    settings = registry.variants()[variant]
    if registry.ALGORITHMS[settings["algo"]].takes("servers"):
        pytest.skip("parameter servers need two ranks (tests/mpi/test_asgd.py)")
    cfg = registry.AlgoConfig(**settings, warmup_steps=2, lr=0.05,
                              **({"delay": 2} if registry.ALGORITHMS[settings["algo"]].takes("delay") else {}))
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 5)), rng.integers(0, 3, 40)
    model = lambda: build_model("mlp", (5,), 3, widths=(4,), dtype=np.float64, seed=2)   # noqa: E731
    sim = load(registry.ALGORITHMS[cfg.algo].simulation)(cfg, model, lambda r, t: (x[4 * t:4 * t + 4],
                                                                                    y[4 * t:4 * t + 4]), 1)
    comm = Communicator(MPI.COMM_SELF, progress="blocking")
    try:
        algo = build_algorithm(cfg, model(), comm)
        assert algo.name == cfg.algo
        for t in range(8):
            algo.step(x[4 * t:4 * t + 4], y[4 * t:4 * t + 4])
            sim.step()
            assert np.array_equal(algo.global_weights(), sim.W), (variant, t)
    finally:
        comm.free()


PLANTED = '''\
"""A rule planted by tests/unit/test_registry.py: replay under another name, with a setting of its own."""

from ssdmpi.algos.rules.replay import GradientReplay
from ssdmpi.spec import RuleSpec, Setting
from ssdmpi.validate import positive_int


class Planted(GradientReplay):
    """Replay, built with its own setting (the registry passes it: Rule(state, planted_knob=...))."""

    def __init__(self, state, planted_knob):
        super().__init__(state)
        self.knob = planted_knob


SPEC = RuleSpec("planted", Planted, reference="ssdmpi.verify.reference:ReplayTwin", summary="replay, planted",
                uses_local_update=True, variant={"local_update": "sgd"},
                settings=(Setting("planted_knob", 3, "a knob of the planted rule", int, positive_int),))
'''

PROBE = '''\
import json
from ssdmpi import config
from ssdmpi.algos import registry
from ssdmpi.verify.reference import simulate
from ssdmpi.bench import accuracy
from ssdmpi.cli import build_parser
from ssdmpi.nn import build_model
import numpy as np

train = build_parser()._subparsers._group_actions[0].choices["train"]
helps = {a.dest: a.help for a in train._actions}
args = train.parse_args(["--comm", "period", "--period-rule", "planted", "--planted-knob", "4", "--delay", "2",
                         "--warmup-steps", "2"])
cfg = config.resolve(args)
algo = config.algo_config(cfg, 10, 100, world_size=2)
rng = np.random.default_rng(0)
x, y = rng.normal(size=(64, 6)).astype(np.float32), rng.integers(0, 3, size=64)
sim = simulate(algo, lambda: build_model("mlp", (6,), 3, widths=(4,), seed=1, xp=np),
               lambda r, t: (x[8 * r:8 * r + 8], y[8 * r:8 * r + 8]), 8, world_size=2)
import contextlib, io, yaml
from ssdmpi.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(["train", "--comm", "period", "--period-rule", "planted", "--planted-knob", "4", "--delay", "2",
                 "--warmup-steps", "2", "--local-update", "sgd", "--steps", "12", "--run-dir", "run",
                 "--no-progress-bar"])
with open("run/config.yaml") as f:
    recorded = yaml.safe_load(f)
print(json.dumps({"rules": list(registry.RULES), "help": helps["period_rule"], "knob_help": helps["planted_knob"],
                  "knob": algo.planted_knob, "variant": accuracy.VARIANTS.get("period/planted"),
                  "yaml": config.annotated_yaml(config.resolve_request(args)),
                  "twin": type(sim.twin).__name__, "s": sim.s, "code": code,
                  "trained": {k: recorded.get(k) for k in ("period_rule", "planted_knob", "steps")}}))
'''


def test_a_rule_file_is_all_the_registry_needs(tmp_path):
    """A file dropped into a copy of ssdmpi/algos/rules/ (nothing else changed) is a --period-rule with its own
    flag, resolved and recorded like any setting, handed to the rule it builds, a benchmark variant, a reference
    twin the simulator runs, and a run of ``ssdmpi train`` through the command line."""
    shutil.copytree(PACKAGE, tmp_path / "ssdmpi", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "ssdmpi" / "algos" / "rules" / "planted.py").write_text(PLANTED)
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["rules"] == ["delta-merge", "delta-own", "eager", "planted", "replay"]
    assert "delta-merge | delta-own | eager | planted | replay" in got["help"]
    assert got["knob_help"].startswith("a knob of the planted rule (default: 3 with --comm period --period-rule "
                                       "planted)")
    assert got["knob"] == 4
    assert got["variant"] == {"algo": "ssd", "comm": "period", "period_rule": "planted", "local_update": "sgd"}
    assert "planted_knob: 4\n" in got["yaml"] and "period_rule: planted\n" in got["yaml"]
    assert got["twin"] == "ReplayTwin" and got["s"] == 2 + 2 * 2   # 2 warm-up steps, 3 periods of k = 2 (the
                                                                   # first period's sum is applied at the second)
    assert got["code"] == 0 and got["trained"] == {"period_rule": "planted", "planted_knob": 4, "steps": 12}
