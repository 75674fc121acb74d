"""``tests/mutation/run.py`` itself: a snippet that no longer matches is reported, never silently
skipped; one mutant planted in a copy of this tree is killed by its serial tests."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.mutation.mutants import MUTANTS, Mutant
from tests.mutation.run import apply

MUTANT = Mutant("a test mutant", "x.py", "b = 2\n", "b = 3\n", (), ())


def test_a_snippet_is_replaced_once_and_a_missing_or_repeated_one_is_an_error():
    assert apply(MUTANT, "a = 1\nb = 2\n") == "a = 1\nb = 3\n"
    with pytest.raises(ValueError, match=r"snippet not found in x.py: 'b = 2'"):
        apply(MUTANT, "a = 1\nb = 4\n")
    with pytest.raises(ValueError, match=r"snippet ambiguous \(2 matches\) in x.py"):
        apply(MUTANT, "b = 2\nb = 2\n")


def test_every_mutant_changes_its_file_and_names_tests():
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names))
    for m in MUTANTS:
        assert m.original != m.replacement and m.serial and m.mpi and m.ranks
        named = [t for t in m.serial + m.mpi if t.startswith("tests/")]
        assert (ROOT / m.file).is_file() and named and all((ROOT / t).is_file() for t in named), m.name
        assert m.why or m.ranks == (2,), m.name


@pytest.mark.timeout(300)
def test_one_mutant_planted_in_a_copy_is_killed_by_its_serial_tests():
    name = "store: retention deletes the checkpoint best points to"
    proc = subprocess.run([sys.executable, "tests/mutation/run.py", "--worktree", "--serial-only", "--no-baseline",
                           "--only", name], cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"| {name} | `ssdmpi/checkpoint/store.py` | `tests/unit/test_checkpoint.py` | yes (" in proc.stdout
    assert "1 of 1 mutants killed by every run" in proc.stdout
    assert "(link_target(directory, LAST), link_target(directory, BEST))" in (ROOT / "ssdmpi/checkpoint/store.py") \
        .read_text()                                                   # this tree itself is left alone
