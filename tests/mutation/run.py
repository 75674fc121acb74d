#!/usr/bin/env python3
"""Plant each one-line bug of ``tests/mutation/mutants.py`` in a copy of the repository and report
which the tests kill: serially (``python -m pytest``) and under ``mpiexec -n 2 python -m pytest``.

    .venv/bin/python tests/mutation/run.py                     # every mutant, the table on stdout
    .venv/bin/python tests/mutation/run.py --report tests/mutation/REPORT.md
    .venv/bin/python tests/mutation/run.py --only asgd --only store --serial-only
    .venv/bin/python tests/mutation/run.py --list

The copy (a temporary directory) holds the files of commit ``--rev`` (default ``HEAD``: commit the
change first), or with ``--worktree`` this working tree's files (tracked, and untracked ones git does
not ignore). First the named tests run on the copy unchanged (they must pass: a test that fails
without a bug kills nothing); then, for each mutant in turn, its snippet is replaced (it must occur
exactly once, else the mutant is reported "snippet not found" or "snippet ambiguous"), its serial
and its MPI tests run with this Python and the ``mpiexec`` beside it, each under ``--timeout``
seconds, and the file is restored. A mutant is killed by a run that exits non-zero; a run that
times out counts as killed but says so (the tests hang instead of failing). Exit 0 when every
mutant was killed by every run, 1 otherwise, 2 when a snippet no longer matches.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.mutation.mutants import MUTANTS, Mutant  # noqa: E402

PYTEST = ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--timeout=600"]


def mpiexec() -> str:
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else (shutil.which("mpiexec") or "mpiexec")


def copy_repository(dest: Path, rev: str | None) -> None:
    """The files of commit ``rev`` (or, for None, of the working tree) into ``dest``."""
    if rev is not None:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        return
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def apply(mutant: Mutant, text: str) -> str:
    """``text`` with the mutant's snippet replaced; ``ValueError`` unless it occurs exactly once."""
    count = text.count(mutant.original)
    if count != 1:
        raise ValueError(f"snippet {'not found' if count == 0 else f'ambiguous ({count} matches)'} in {mutant.file}: "
                         f"{mutant.original.strip()[:80]!r}")
    return text.replace(mutant.original, mutant.replacement)


def run_tests(copy: Path, args: tuple, ranks: int | None, timeout: float) -> tuple[str, float, str]:
    """Run pytest on ``args`` in ``copy`` (serially, or under ``mpiexec -n ranks``): ``(outcome, seconds,
    output tail)``, outcome ``passed``, ``failed`` (exit code), ``timeout`` or ``no tests``."""
    cmd = [sys.executable] + PYTEST + list(args)
    if ranks is not None:
        cmd = [mpiexec(), "-n", str(ranks)] + cmd
    env = dict(os.environ, PYTHONPATH=str(copy), PATH=str(Path(sys.executable).parent) + os.pathsep +
               os.environ.get("PATH", ""))
    env.pop("SSDMPI_TEST_CONSOLE_FD", None)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=copy, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        return "timeout", time.monotonic() - start, out[-3000:]
    seconds = time.monotonic() - start
    if proc.returncode == 0:
        return "passed", seconds, out[-3000:]
    if proc.returncode == 5:
        return "no tests", seconds, out[-3000:]
    return f"failed (exit {proc.returncode})", seconds, out[-3000:]


def check_copy_imports_itself(copy: Path) -> None:
    """The copy's tests must import the copy's ssdmpi, not the installed (editable) one."""
    env = dict(os.environ, PYTHONPATH=str(copy))
    where = subprocess.run([sys.executable, "-c", "import ssdmpi; print(ssdmpi.__file__)"], cwd=copy, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    if not Path(where).resolve().is_relative_to(copy.resolve()):
        raise SystemExit(f"the copy imports ssdmpi from {where}, not from {copy}: cannot test mutants there")


def cell(outcome: str, seconds: float) -> str:
    if outcome == "passed":
        return f"**no** (survived, {seconds:.0f} s)"
    if outcome == "timeout":
        return f"yes, by a hang: timed out after {seconds:.0f} s"
    if outcome == "no tests":
        return f"no tests collected ({seconds:.0f} s)"
    return f"yes ({seconds:.0f} s)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--rev", default="HEAD", help="the commit to copy (default HEAD)")
    parser.add_argument("--worktree", action="store_true", help="copy the working tree's files instead of --rev")
    parser.add_argument("--only", action="append", default=[], metavar="TEXT",
                        help="only the mutants whose name contains TEXT (repeatable)")
    parser.add_argument("--serial-only", action="store_true", help="skip the MPI runs")
    parser.add_argument("--no-baseline", action="store_true", help="do not first run the tests on the unchanged copy")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one test run may take (default 900)")
    parser.add_argument("--report", help="also write the table (Markdown) to this file")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args()
    mutants = [m for m in MUTANTS if not args.only or any(t in m.name for t in args.only)]
    if args.list or not mutants:
        for m in mutants:
            print(f"{m.name}\n    {m.file}: {m.original.strip()!r} -> {m.replacement.strip()!r}")
        return 0 if mutants else 2

    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="ssdmpi-mutation-"))
    copy = workdir / "repo"
    copy.mkdir()
    try:
        copy_repository(copy, None if args.worktree else args.rev)
        check_copy_imports_itself(copy)
        source = "the working tree" if args.worktree else subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", args.rev], capture_output=True, text=True).stdout.strip()
        print(f"mutation run on a copy of {source} in {copy}", flush=True)
        originals = {}
        for m in mutants:
            if m.file not in originals:
                originals[m.file] = (copy / m.file).read_text()
            try:
                apply(m, originals[m.file])
            except ValueError as exc:
                print(f"{m.name}: {exc}", flush=True)
                return 2

        baseline_ok = True
        if not args.no_baseline:
            runs = {(m.serial, None) for m in mutants}
            if not args.serial_only:
                runs |= {(m.mpi, n) for m in mutants for n in m.ranks}
            for tests, ranks in sorted(runs, key=str):
                outcome, seconds, tail = run_tests(copy, tests, ranks, args.timeout)
                where = "serially" if ranks is None else f"at {ranks} ranks"
                print(f"baseline {where}: {' '.join(tests)}: {outcome} in {seconds:.0f} s", flush=True)
                if outcome != "passed":
                    baseline_ok = False
                    print(tail, flush=True)
            if not baseline_ok:
                print("the tests fail without any mutant: fix them first", flush=True)
                return 1

        rows, all_killed = [], True
        for m in mutants:
            path = copy / m.file
            path.write_text(apply(m, originals[m.file]))
            try:
                serial = run_tests(copy, m.serial, None, args.timeout)
                print(f"{m.name}: serially {serial[0]} in {serial[1]:.0f} s", flush=True)
                parallel = []
                if not args.serial_only:
                    for n in m.ranks:
                        parallel.append((n,) + run_tests(copy, m.mpi, n, args.timeout))
                        print(f"{m.name}: at {n} ranks {parallel[-1][1]} in {parallel[-1][2]:.0f} s", flush=True)
            finally:
                path.write_text(originals[m.file])
            outcomes = [serial[0]] + [p[1] for p in parallel]
            all_killed &= all(o.startswith("failed") or o == "timeout" for o in outcomes)
            rows.append((m, serial, parallel))
        table = report(rows, args, source, time.monotonic() - started)
        print("\n" + table, flush=True)
        if args.report:
            Path(args.report).write_text(table)
        return 0 if all_killed else 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def report(rows, args, source: str, seconds: float) -> str:
    """The Markdown table of the outcomes."""
    lines = ["| mutant | file | serial tests | killed serially | MPI tests | killed under mpiexec |",
             "| --- | --- | --- | --- | --- | --- |"]
    for m, serial, parallel in rows:
        mpi = "; ".join(f"at {n} ranks: {cell(o, s)}" for n, o, s, _ in parallel) or "not run"
        if m.why and parallel:
            mpi += f" (not at 2 ranks: {m.why})"
        lines.append(f"| {m.name} | `{m.file}` | `{' '.join(m.serial)}` | {cell(serial[0], serial[1])} | "
                     f"`{' '.join(m.mpi)}` | {mpi} |")
    killed = sum(all(o.startswith("failed") or o == "timeout" for o in [s[0]] + [p[1] for p in par])
                 for _, s, par in rows)
    lines += ["", f"{killed} of {len(rows)} mutants killed by every run; copy of {source}; "
              f"{seconds / 60:.1f} minutes in all (baseline {'skipped' if args.no_baseline else 'included'})."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
