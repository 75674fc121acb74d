"""The package's layering, read from the source (AST): no import circles, and MPI only in the comm layer."""

import ast
import pathlib
import subprocess
import sys

from tests.source import docstring_ids

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ssdmpi"

# The trainer's floors (ssdmpi/run/), lowest first: a module imports only those below it.
RUN_FLOORS = ("job", "directory", "evaluation", "state", "setup", "start", "report", "loop", "trainer", "api")

# Where MPI may be named in code: the comm layer, `ssdmpi info` (it reports on the library) and the
# raw-mpi4py baseline of `ssdmpi bench comm`. Within them, mpi4py is imported in one place only,
# after ssdmpi's MPI settings are applied (every path into MPI goes through `mpi_env.load_mpi`).
MPI_ALLOWED = ("comm/", "info.py", "bench/comm.py")
MPI_IMPORTED_IN = "comm/mpi_env.py"


# -- the import graph ----------------------------------------------------------------------------

def modules(package: pathlib.Path) -> dict:
    """``{dotted module name: path}`` of every .py file under ``package`` (a package's own name for
    its ``__init__.py``)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imported_modules(tree: ast.AST, module: str, is_package: bool, mods) -> set:
    """The modules of ``mods`` that the imports in ``tree`` (the source of ``module``) name, anywhere:
    top level, functions, TYPE_CHECKING blocks; relative imports resolved. ``from a import b`` is
    the module ``a.b`` if there is one, else ``a``; ``import a.b`` is ``a.b`` (running the parent
    packages' ``__init__`` first is Python's, not an edge)."""
    base = module.split(".") if is_package else module.split(".")[:-1]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.name
                while name and name not in mods:
                    name = name.rpartition(".")[0]
                if name:
                    out.add(name)
        elif isinstance(node, ast.ImportFrom):
            parent = base[:len(base) - node.level + 1] if node.level else []
            source = ".".join(parent + ([node.module] if node.module else []))
            for alias in node.names:
                if f"{source}.{alias.name}" in mods:
                    out.add(f"{source}.{alias.name}")
                elif source in mods:
                    out.add(source)
    out.discard(module)
    return out


def import_graph(package: pathlib.Path) -> dict:
    """``{module: set of the package's modules it imports}`` (see ``imported_modules``)."""
    mods = modules(package)
    return {name: imported_modules(ast.parse(path.read_text(encoding="utf-8"), str(path)), name,
                                   path.name == "__init__.py", mods)
            for name, path in mods.items()}


def circles(graph: dict) -> list:
    """The import circles of ``graph``: its strongly connected components of more than one module
    (Tarjan's algorithm), each sorted, in sorted order."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def without(graph: dict, edges) -> dict:
    return {v: {w for w in targets if (v, w) not in edges} for v, targets in graph.items()}


def write_package(root: pathlib.Path, files: dict) -> pathlib.Path:
    """A package ``pkg`` under ``root`` with ``files`` (``{relative path: source}``)."""
    for rel, source in files.items():
        path = root / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return root / "pkg"


def test_the_circle_finder_finds_a_planted_circle(tmp_path):
    package = write_package(tmp_path, {
        "__init__.py": "",
        "a.py": "from pkg.b import f\n",
        "b.py": "def f():\n    from pkg import c\n",           # an import inside a function counts
        "c.py": "from . import a\n",                             # so does a relative one
        "d.py": "from pkg import a\n",                           # d -> a, nothing back: no circle
        "sub/__init__.py": "from pkg.sub.x import X\n",          # a package re-exporting its module
        "sub/x.py": "X = 1\n",
    })
    graph = import_graph(package)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.c"] == {"pkg.a"} and graph["pkg.d"] == {"pkg.a"}
    assert circles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert circles(without(graph, {("pkg.c", "pkg.a")})) == []


def test_the_ssdmpi_import_graph_has_no_circle():
    assert circles(import_graph(PACKAGE)) == []


def test_the_trainer_s_floors_import_only_downward():
    graph = import_graph(PACKAGE)
    run = {f"ssdmpi.run.{name}": i for i, name in enumerate(RUN_FLOORS)}
    assert sorted(m for m in graph if m.startswith("ssdmpi.run.")) == sorted([*run, "ssdmpi.run.command"])
    upward = [(m, t) for m, floor in run.items() for t in graph[m] if t in run and run[t] >= floor]
    assert upward == []
    assert [t for t in graph["ssdmpi.run.command"] if t.startswith("ssdmpi.run")] == []   # the parser's: light


def test_import_ssdmpi_loads_no_trainer_numpy_or_mpi():
    code = ("import sys, ssdmpi; ssdmpi.load_model; "
            "print(sorted(m for m in sys.modules if m.startswith(('ssdmpi.run', 'numpy', 'mpi4py'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", (out.stdout, out.stderr)
    code = "import ssdmpi; from ssdmpi.run.api import train; print(ssdmpi.train is train)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "True", (out.stdout, out.stderr)


# -- MPI stays in the comm layer ----------------------------------------------------------------

def mpi_uses(package: pathlib.Path, allowed=MPI_ALLOWED, imported_in=MPI_IMPORTED_IN) -> list:
    """``["rel/path.py:line what", ...]``: imports of mpi4py outside ``imported_in``, code strings
    that import it (for a child process) outside it, and the name ``MPI`` in code outside
    ``allowed`` (paths relative to ``package``; a folder ends with ``/``). Prose (comments,
    docstrings, help texts) may name MPI and mpi4py anywhere."""
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        may_name_mpi = any(rel == a or (a.endswith("/") and rel.startswith(a)) for a in allowed)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        docstrings = docstring_ids(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "mpi4py" for a in node.names) \
                    or isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "mpi4py":
                what = "imports mpi4py" if rel != imported_in else None
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings \
                    and any(code in node.value for code in ("import mpi4py", "from mpi4py", "mpi4py.MPI")):
                what = "has mpi4py code in a string" if rel != imported_in else None
            elif isinstance(node, ast.Name) and node.id == "MPI":
                what = "uses MPI" if not may_name_mpi else None
            else:
                what = None
            if what:
                found.append((rel, node.lineno, what))
    return [f"{rel}:{line} {what}" for rel, line, what in sorted(found)]


def test_the_mpi_check_finds_planted_uses(tmp_path):
    package = write_package(tmp_path, {
        "comm/mpi_env.py": "def load_mpi():\n    from mpi4py import MPI\n    return MPI\n",
        "comm/world.py": "from pkg.comm.mpi_env import load_mpi\nMPI = load_mpi()\nsize = MPI.COMM_WORLD.Get_size()\n",
        "info.py": '"""Reports on mpi4py and MPI."""\nimport mpi4py\n',
        "checks.py": ('"""Calls MPI. directly; docstrings may."""\nimport subprocess\n'
                      'CODE = "import mpi4py; mpi4py.rc.initialize = False"\n'
                      'def world(load):\n    MPI = load()\n    return MPI.COMM_WORLD\n'),
        "cli.py": 'HELP = "allreduce bandwidth vs raw mpi4py"   # prose: allowed\n',
    })
    assert mpi_uses(package) == ["checks.py:3 has mpi4py code in a string", "checks.py:5 uses MPI",
                                 "checks.py:6 uses MPI", "info.py:2 imports mpi4py"]


def test_mpi_is_named_only_in_the_comm_layer_and_imported_only_by_mpi_env():
    assert mpi_uses(PACKAGE) == []


def test_the_trainer_asks_the_algorithm_only_through_its_contract():
    """No ``getattr``/``hasattr`` on the algorithm in ``ssdmpi/run/`` (``ssdmpi/algos/contract.py`` gives
    every attribute the trainer reads a default), in any form: ``algo``, ``job.algo``, ``self.algo``."""
    found = []
    for path in sorted((PACKAGE / "run").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            reflective = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "hasattr")
            if reflective and node.args and "algo" in ast.unparse(node.args[0]):
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    assert found == []
    from ssdmpi.algos.asgd import ASGD
    from ssdmpi.algos.base import Algorithm
    from ssdmpi.algos.contract import TrainingAlgorithm

    assert issubclass(ASGD, TrainingAlgorithm) and issubclass(Algorithm, TrainingAlgorithm)
    assert not ASGD.__abstractmethods__ and not getattr(Algorithm, "__abstractmethods__", ())
