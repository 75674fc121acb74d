"""README.md is for scanning: at most 150 lines; the test command CI runs, verbatim; every
subcommand and every bench kind in its commands table (and every bench kind in ``ssdmpi
--help``); no measured figure (those live in BENCHMARKS.md and docs/ACCURACY.md, and README links
to them); and every command in it runs as written: the cheap ones here, in README's order, in
one directory (a later command reads what an earlier one wrote); the others skip, saying why."""

import importlib.util
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from ssdmpi import cli
from ssdmpi.bench import KINDS
from ssdmpi.bench.report import anchor
from tests.conftest import ROOT, mpiexec

README = (ROOT / "README.md").read_text(encoding="utf-8")
README_LIMIT = 150

# A README command that matches one of these does not run here; the reason says where it is tested.
SKIP = {
    r"^python3 -m venv ": "installs a virtual environment and runs its own commands: .ci/run runs them",
    r"fashion-mnist": "needs Debian's dataset-fashion-mnist and minutes of training "
                      "(tests/unit/test_data_formats.py reads the real files)",
    r"bench comm": "a minute of benchmarking; tests/unit/test_comm_bench.py runs it at small sizes",
    r"^sbatch ": "needs Slurm: tests/slurm/ runs the templates on a private cluster",
}


def readme_commands() -> list:
    """The command lines of README's ``bash`` blocks, in order (comments and blank lines dropped,
    continued lines joined)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def as_run_here(command: str) -> str:
    """``command`` with this environment's launcher and Python: ``mpiexec`` -> the venv's,
    ``ssdmpi`` -> ``python -m ssdmpi``."""
    command = re.sub(r"^mpiexec(?=\s)", shlex.quote(mpiexec()), command)
    return re.sub(r"(^|\s)ssdmpi(?=\s|$)", lambda m: m.group(1) + f"{shlex.quote(sys.executable)} -m ssdmpi",
                  command)


def skip_reason(command: str):
    for pattern, reason in SKIP.items():
        if re.search(pattern, command):
            return reason
    for word, module, extra in (("plot", "matplotlib", "plot"), ("export", "safetensors", "export")):
        if f" {word} " in f" {command} " and importlib.util.find_spec(module) is None:
            return f"ssdmpi {word} needs {module} (pip install 'ssdmpi[{extra}]')"
    return None


def test_the_readme_is_short():
    assert len(README.splitlines()) <= README_LIMIT


def test_the_readme_holds_the_test_command_ci_runs_verbatim():
    (command,) = re.findall(r'^README_TEST="(.*)"$', (ROOT / ".ci" / "run").read_text(), re.M)
    assert command in readme_commands()


def test_every_subcommand_and_bench_kind_is_in_the_readme_table_and_bench_kinds_in_help(capsys):
    rows = re.findall(r"^\| `(ssdmpi [a-z ]+)` \|", README, re.M)
    assert [f"ssdmpi {name}" for name in cli.COMMANDS if f"ssdmpi {name}" not in rows] == []
    assert [kind for kind in KINDS if f"ssdmpi bench {kind}" not in rows] == []
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())      # argparse wraps the lines
    assert [kind for kind in KINDS if not re.search(rf"\b{kind}\b", help_text)] == []


def test_the_readme_states_no_measured_figure():
    """Speedups and accuracies are stated once, in BENCHMARKS.md and docs/ACCURACY.md."""
    for pattern in (r"\b\d+(\.\d+)?x\b", r"\d+(\.\d+)?\s*%", r"\btimes (faster|slower)\b", r"\d+ samples/s"):
        found = re.search(pattern, README)
        assert found is None, f"README.md: {found.group(0)!r}: link the page that holds the figure"


def test_links_to_usage_sections_resolve():
    """README's links into docs/USAGE.md, and USAGE.md's own table of contents, name its headings."""
    usage = (ROOT / "docs" / "USAGE.md").read_text(encoding="utf-8")
    headings = {anchor(h) for h in re.findall(r"^#+ (.+)$", usage, re.M)}
    targets = re.findall(r"docs/USAGE\.md#([^)\s]+)\)", README) + re.findall(r"\]\(#([^)\s]+)\)", usage)
    assert targets and [t for t in targets if t not in headings] == []


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """The directory README's commands run in, one after another; ``mymodels.py`` from examples/."""
    where = tmp_path_factory.mktemp("readme")
    shutil.copy(ROOT / "examples" / "mymodels.py", where)
    return where


@pytest.mark.timeout(300)
@pytest.mark.parametrize("command", readme_commands())
def test_a_readme_command_runs_as_written(command, session):
    reason = skip_reason(command)
    if reason:
        pytest.skip(reason)
    result = subprocess.run(as_run_here(command), shell=True, cwd=session, capture_output=True, text=True,
                            timeout=280)
    assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
    if ">" in command:                          # a redirected command wrote its file
        target = session / command.rsplit(">", 1)[1].strip()
        assert target.stat().st_size > 0, target
