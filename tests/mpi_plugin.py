"""Under ``mpiexec -n N pytest``: a test that fails on one rank fails on every rank, and never hangs the run.

Every rank runs the same tests, and a test's collectives pair the ranks up. A rank whose test
fails (or errors) goes on to the next test while the others may still wait for it in a
collective of the failed one: the next collectives pair up wrongly, and the run hangs with its
failure unreported. So after each phase of every test (setup, call, teardown) the ranks agree
on its outcome, on a private duplicate of COMM_WORLD:

- every rank posts a non-blocking allreduce of "this rank failed" and polls it (sleeping between
  polls: a waiting rank leaves the cores to the ranks still computing);
- once it completes, every rank knows which ranks failed (their reports are gathered then: every
  rank is in the agreement). A rank that passed marks its own report failed with the failing
  ranks' reports, and every failed report gets a ``ranks`` section naming the failing ranks. So
  the test is reported failed on every rank, a failed setup skips the call on every rank, and the
  next test starts together everywhere;
- a rank that failed waits at most ``AGREE_TIMEOUT_S`` (the environment's ``SSDMPI_TEST_AGREE_S``
  where set) for the others. If they have not all reached the agreement by then (one waits in a
  collective of the failed test for this rank), it prints its report (on the job's console; under
  ``tests/run.py`` also in its own log) and aborts the job (``MPI_Abort``, exit 1): the run ends
  with the failure named instead of hanging;
- a rank that passed and waits at the agreement until pytest-timeout's timer fires (another rank
  is stuck in something else) aborts the same way, naming the test.

A world of one rank is left alone. ``tests/mpi/conftest.py`` imports the hook; a conftest of any
other directory of multi-rank tests can do the same.
"""

from __future__ import annotations

import os
import sys
import time
from array import array

import pytest

AGREE_TIMEOUT_S = 20.0     # how long a failed rank waits for the others to finish the same test
# A descriptor of the job's console, where this rank's own output goes elsewhere (tests/mpi_pytest.py
# sends the output of ranks other than 0 to log files): a rank that aborts the job writes its report there too.
CONSOLE_FD = "SSDMPI_TEST_CONSOLE_FD"


def agree_timeout(environ=None) -> float:
    """``AGREE_TIMEOUT_S``, or the environment's ``SSDMPI_TEST_AGREE_S`` (seconds) where set."""
    value = (os.environ if environ is None else environ).get("SSDMPI_TEST_AGREE_S", "")
    try:
        return float(value) if float(value) > 0 else AGREE_TIMEOUT_S
    except ValueError:
        return AGREE_TIMEOUT_S


class Agreement:
    """The ranks' agreement on each test phase's outcome (see the module docstring). Built by every
    rank at its first test phase (collective: a duplicate of COMM_WORLD)."""

    def __init__(self, MPI):
        self.MPI = MPI
        world = MPI.COMM_WORLD
        self.rank, self.size = world.Get_rank(), world.Get_size()
        self.comm = world.Dup()        # the outcomes, and the reports gathered after them
        self.timeout = agree_timeout()

    def outcome(self, failed: bool, report_text: str, deadline: float | None) -> list | None:
        """``[(rank, report text)]`` of the ranks whose phase failed (empty: none), once every rank
        has reached the agreement; None if ``deadline`` seconds passed first."""
        mine = array("i", [1 if failed else 0])
        total = array("i", [0])
        request = self.comm.Iallreduce(mine, total, op=self.MPI.SUM)
        start, pause = time.monotonic(), 0.0002
        while not request.Test():
            if deadline is not None and time.monotonic() - start > deadline:
                return None
            time.sleep(pause)
            pause = min(2 * pause, 0.005)
        if total[0] == 0:
            return []
        gathered = self.comm.allgather((self.rank, report_text) if failed else None)
        return [g for g in gathered if g is not None]

    def abort(self, message: str) -> None:
        """Print ``message`` (on this rank's output, and on the job's console where that is
        elsewhere: ``CONSOLE_FD``), then end the job with exit code 1."""
        from ssdmpi.comm.abort import abort_job

        sys.stdout.flush()
        console = os.environ.get(CONSOLE_FD, "")
        if console.isdigit():
            try:
                os.write(int(console), f"\nssdmpi tests: rank {self.rank}/{self.size}: {message}\n".encode())
            except OSError:
                pass
        abort_job(message, 1)


_agreement: Agreement | None = None


def _agreement_of_this_world() -> Agreement | None:
    """The session's ``Agreement`` (built at the first call: collective), or None in a world of one rank."""
    global _agreement
    from ssdmpi.comm.abort import launcher_size

    if launcher_size() <= 1:
        return None
    if _agreement is None:
        from ssdmpi.comm.mpi_env import load_mpi

        _agreement = Agreement(load_mpi())
    return _agreement if _agreement.size > 1 else None


_failed: list = []      # the test phases failed so far in this session (every rank's list is the same)


def _describe(item, report) -> str:
    return f"{item.nodeid} ({report.when})"


def _earlier() -> str:
    return "".join(f"\nFAILED {name} (earlier in this run)" for name in _failed)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """After each phase of each test: the ranks agree on its outcome (see the module docstring)."""
    outcome = yield
    agreement = _agreement_of_this_world()
    if agreement is None:
        return
    report = outcome.get_result()
    failed = bool(report.failed)
    text = report.longreprtext if failed else ""
    try:
        failures = agreement.outcome(failed, text, agreement.timeout if failed else None)
    except (Exception, pytest.fail.Exception) as exc:     # pytest-timeout's timer, while the others never came
        agreement.abort(f"{type(exc).__name__}: {exc}\nFAILED {_describe(item, report)}: this rank waited for the "
                        "other ranks to finish the test and they did not (one is stuck in a collective?): "
                        "aborting the job" + _earlier())
        return
    if failures is None:
        agreement.abort(f"{text}\nFAILED {_describe(item, report)} on rank {agreement.rank} of {agreement.size}; "
                        f"the other ranks did not finish the test within {agreement.timeout:g} s (waiting for this "
                        "rank in one of its collectives?): aborting the job" + _earlier())
        return
    if not failures:
        return
    _failed.append(_describe(item, report))
    ranks = ", ".join(str(r) for r, _ in failures)
    if not failed:
        report.outcome = "failed"
        report.longrepr = "\n\n".join(f"failed on rank {r} of {agreement.size} ({report.when}):\n{t}"
                                      for r, t in failures)
    report.sections.append(("ranks", f"{report.when} failed on rank(s) {ranks} of {agreement.size}"))
