"""docs/ARCHITECTURE.md tells the same story as the code: its floors table holds every module of the
package and no module imports a floor above its own; every module path the page names exists."""

import re

from tests.conftest import ROOT
from tests.unit.test_layering import PACKAGE, import_graph

DOC = ROOT / "docs" / "ARCHITECTURE.md"


def floors(text: str) -> list:
    """``[(floor, [module path prefixes])]`` of the page's floors table, top floor first."""
    section = text.split("## The floors", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| floor")]
    return [(cells[0], re.findall(r"`ssdmpi/([^`]+)`", cells[1]))
            for cells in ([c.strip() for c in row.strip("|").split("|")] for row in rows)]


def floor_of(module: str, table: list) -> int:
    """The index of ``module``'s floor (0 = top): the floor whose prefix matches it longest."""
    from tests.unit.test_layering import modules

    path = module.replace(".", "/")[len("ssdmpi/"):]
    if modules(PACKAGE)[module].name == "__init__.py":
        path += "/"
    best = None
    for i, (_, prefixes) in enumerate(table):
        for prefix in prefixes:
            hit = path + ".py" == prefix or path.startswith(prefix) and prefix.endswith("/")
            if hit and (best is None or len(prefix) > best[0]):
                best = (len(prefix), i)
    assert best is not None, f"{module} is in no floor of docs/ARCHITECTURE.md"
    return best[1]


def test_every_module_is_on_a_floor_and_imports_only_its_own_and_lower_ones():
    table = floors(DOC.read_text(encoding="utf-8"))
    assert [name for name, _ in table][0] == "commands" and len(table) >= 5
    graph = import_graph(PACKAGE)
    up = []
    for module, targets in graph.items():
        if module == "ssdmpi":
            continue        # the package's face: it loads load_model and train from above when asked for
        mine = floor_of(module, table)
        up += [f"{module} -> {t}" for t in targets if t != "ssdmpi" and floor_of(t, table) < mine]
    assert up == []


def test_the_floor_checker_sees_an_upward_import():
    table = [("top", ["run/"]), ("low", ["algos/"])]
    assert floor_of("ssdmpi.run.loop", table) == 0 and floor_of("ssdmpi.algos.base", table) == 1


def test_every_module_path_the_page_names_exists():
    text = DOC.read_text(encoding="utf-8")
    named = set(re.findall(r"`ssdmpi/([\w/]+(?:\.py)?/?)`", text))
    named |= {m for m in re.findall(r"`((?:algos|run|optim|nn|data|checkpoint|comm|config|verify|bench)/[\w/]+\.py)`",
                                    text)}
    missing = sorted(p for p in named if not (PACKAGE / p).exists())
    assert named and missing == []
