"""``ssdmpi/bench/`` is an outer layer (docs/ARCHITECTURE.md): read from the source, its modules import
nothing of the trainer (``ssdmpi.run``) nor an algorithm's or rule's own module or any private name of
``ssdmpi.algos``, write out no algorithm's, rule's or optimizer's name, and read run directories only
through ``ssdmpi/rundir.py``, the one module that reads ``metrics.jsonl``."""

import ast
import inspect
import pathlib
import re
import sys
import textwrap

from ssdmpi.algos import registry
from tests.conftest import ROOT
from tests.source import docstring_ids

PACKAGE = ROOT / "ssdmpi"
BENCH = PACKAGE / "bench"


def _modules(root: pathlib.Path) -> list:
    return [(p.relative_to(root.parent).as_posix(), ast.parse(p.read_text(encoding="utf-8")))
            for p in sorted(root.rglob("*.py"))]


def imports(tree) -> list:
    """``(module, name or None)`` for every import in ``tree`` (``from ssdmpi import run``: ``("ssdmpi.run",
    None)`` as well as ``("ssdmpi", "run")``)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                out += [(node.module, a.name), (f"{node.module}.{a.name}", None)]
    return out


def _algorithm_modules() -> set:
    """The modules that declare an algorithm's or a rule's spec: their internals belong to them."""
    out = set()
    for spec in [*registry.ALGORITHMS.values(), *registry.RULES.values()]:
        out |= {name for name, m in list(sys.modules.items())
                if type(getattr(m, "SPEC", None)) is type(spec) and m.SPEC.name == spec.name}
    return out


def layering_violations(root: pathlib.Path, algorithm_modules: set) -> list:
    """``["rel: what", ...]``: imports of the trainer, of an algorithm's own module, or of a private name
    of ``ssdmpi.algos``, in the modules under ``root``."""
    found = []
    for rel, tree in _modules(root):
        for module, name in imports(tree):
            if module == "ssdmpi.run" or module.startswith("ssdmpi.run."):
                found.append(f"{rel}: imports {module}")
            elif module in algorithm_modules:
                found.append(f"{rel}: imports {module}")
            elif module.startswith("ssdmpi.algos") and name is not None and name.startswith("_"):
                found.append(f"{rel}: imports {module}.{name}")
    return sorted(set(found))


def written_names(root: pathlib.Path, names) -> list:
    """``["rel:line name", ...]``: each string of code (not a docstring; f-string pieces included) under
    ``root`` that has one of ``names`` as a word (``ssd:period:``, ``ssgd's``; not ``ssd-period-k5``)."""
    pattern = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True)))
                         + r")(?![\w-])")
    found = []
    for rel, tree in _modules(root):
        skip = docstring_ids(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                found += [f"{rel}:{node.lineno} {m}" for m in pattern.findall(node.value)]
    return sorted(set(found))


def metrics_file_named(root: pathlib.Path) -> list:
    """The modules under ``root`` whose code (not a docstring) writes the file name ``metrics.jsonl``."""
    found = set()
    for rel, tree in _modules(root):
        skip = docstring_ids(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value == "metrics.jsonl" and id(node) not in skip:
                found.add(rel.removeprefix(f"{root.name}/"))
    return sorted(found)


READS = {"read_text", "read_bytes", "readlines", "load", "loads"}    # reading a file's lines or parsing JSON


def metrics_file_opened(root: pathlib.Path) -> list:
    """The modules under ``root`` that name ``metrics.jsonl`` and read or parse a file themselves
    (``Path.read_text``, ``readlines``, ``json.load``/``loads``) instead of asking ``ssdmpi.rundir``.
    A module that only names it to write it (``MetricsLog(path)``) or move it is no reader."""
    found = []
    for rel, tree in _modules(root):
        skip = docstring_ids(tree)
        named = any(isinstance(n, ast.Constant) and n.value == "metrics.jsonl" and id(n) not in skip
                    for n in ast.walk(tree))
        reads = any(isinstance(n, ast.Call) and (getattr(n.func, "id", None) in READS
                                                 or getattr(n.func, "attr", None) in READS) for n in ast.walk(tree))
        if named and reads:
            found.append(rel.removeprefix(f"{root.name}/"))
    return sorted(found)


def _plant(tmp_path, files: dict) -> pathlib.Path:
    for rel, text in files.items():
        path = tmp_path / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path / "pkg"


# -- the finders find what they look for ------------------------------------------------------------

def test_the_finders_find_planted_violations(tmp_path):
    pkg = _plant(tmp_path, {
        "a.py": "from ssdmpi.run.setup import resolve_run\nfrom ssdmpi import run\n",
        "b.py": "import ssdmpi.run.evaluation as ev\nfrom ssdmpi.algos.asgd import PULL_TAG\n",
        "c.py": "from ssdmpi.algos.registry import _discover\nfrom ssdmpi.algos import registry\n",
        "d.py": '"""ssgd in a docstring is fine."""\nK = {"ssgd": 1}\n\n\ndef f(k):\n'
                '    return f"ssd:period:{k}", "ssd-period-k5", "ssgd\'s final", "odsgd"\n',
        "e.py": 'import os\nPATH = os.path.join("run", "metrics.jsonl")\n',
        "f.py": 'import json, os\n\n\ndef read(d):\n    with open(os.path.join(d, "metrics.jsonl")) as f:\n'
                '        return [json.loads(line) for line in f]\n',
        "g.py": 'import json\nfrom pathlib import Path\n\n\ndef lines(d):\n'
                '    return [json.loads(x) for x in (Path(d) / "metrics.jsonl").read_text().splitlines()]\n',
    })
    assert layering_violations(pkg, {"ssdmpi.algos.asgd"}) == [
        "pkg/a.py: imports ssdmpi.run", "pkg/a.py: imports ssdmpi.run.setup",
        "pkg/a.py: imports ssdmpi.run.setup.resolve_run",
        "pkg/b.py: imports ssdmpi.algos.asgd", "pkg/b.py: imports ssdmpi.run.evaluation",
        "pkg/c.py: imports ssdmpi.algos.registry._discover"]
    assert written_names(pkg, {"ssgd", "ssd", "odsgd"}) == ["pkg/d.py:2 ssgd", "pkg/d.py:6 odsgd", "pkg/d.py:6 ssd",
                                                         "pkg/d.py:6 ssgd"]
    assert metrics_file_named(pkg) == ["e.py", "f.py", "g.py"]
    assert metrics_file_opened(pkg) == ["f.py", "g.py"]


# -- the package -----------------------------------------------------------------------------------

def test_bench_uses_no_trainer_internals_and_no_algorithm_internals():
    assert layering_violations(BENCH, _algorithm_modules()) == []


def test_bench_writes_no_algorithm_rule_or_optimizer_name():
    names = set(registry.ALGORITHMS) | set(registry.RULES) | set(registry.OPTIMIZERS)
    assert written_names(BENCH, names) == []


def test_only_the_run_directory_reader_opens_the_metrics_file():
    """Elsewhere the trainer may name the file it writes (``MetricsLog(path)``), nobody reads it but
    ``ssdmpi/rundir.py``; the bench, ``plot`` and ``loggers`` do not even name it (``rundir.metrics_path``)."""
    from ssdmpi import rundir

    assert rundir.METRICS == "metrics.jsonl"
    assert metrics_file_opened(PACKAGE) == ["rundir.py"]
    assert [f for f in metrics_file_named(PACKAGE) if f.startswith("bench/") or f in ("plot.py", "loggers.py")] == []


def test_bench_plot_and_loggers_read_run_directories_through_the_reader():
    """No ``json`` parsing of a run's files in plot.py, loggers.py or bench (they call ``ssdmpi.rundir``)."""
    import ssdmpi.loggers
    import ssdmpi.plot

    for module in (ssdmpi.plot, ssdmpi.loggers):
        source = inspect.getsource(module)
        assert "json.load" not in source and "yaml.safe_load" not in source, module.__name__
    for rel, tree in _modules(BENCH):
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in ("summary.json", "config.yaml"):
                raise AssertionError(f"{rel}:{node.lineno} names {node.value}: read it through ssdmpi.rundir")
