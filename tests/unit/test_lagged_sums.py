"""``loop.LaggedSums``: an asynchronous algorithm's sync points complete the reduction started at
the previous one, and complete their own at once where the ranks meet anyway or a stop is due.

One rank, a fake communicator whose nonblocking reductions record when they are waited for."""

import types

from ssdmpi.comm.stats import CommStats
from ssdmpi.phases import Phases
from ssdmpi.run.loop import Interval, LaggedSums, interval_end


class Handle:
    def __init__(self, log, n, values):
        self.log, self.n, self.values = log, n, values

    def wait(self):
        self.log.append(("wait", self.n))
        return dict(self.values)


class FakeComm:
    """``allreduce_scalars_start`` of one rank: the sums are this rank's values."""

    def __init__(self):
        self.stats, self.log = CommStats(), []

    def allreduce_scalars_start(self, values, op="sum"):
        n = sum(1 for event in self.log if event[0] == "start")
        self.log.append(("start", n))
        return Handle(self.log, n, values)


def no_signals():
    """The trainer's signal flags, none set."""
    return types.SimpleNamespace(preempt=0, interrupt=0)


def algo():
    return types.SimpleNamespace(phases=Phases(), stage="async", has_delay_stage=True, lr_global=0.1, lr_local=None,
                                 interval_staleness=dict)       # nothing stale (the contract's default)


def sync_point(lagged, comm, stop, step, settle=False, loss=1.0):
    interval = Interval()
    interval.add(loss)
    job = types.SimpleNamespace(algo=algo(), E=100, state=types.SimpleNamespace(step=step, time_s=lambda: 0.0))
    return lagged.exchange(interval, comm, stop, job.algo, interval_end(job), settle=settle)


def test_each_sync_point_completes_the_previous_reduction():
    comm, lagged, stop = FakeComm(), LaggedSums(), no_signals()
    assert sync_point(lagged, comm, stop, 10) == []                    # nothing to complete yet
    assert comm.log == [("start", 0)]
    (done,) = sync_point(lagged, comm, stop, 20)
    assert comm.log == [("start", 0), ("start", 1), ("wait", 0)]      # started its own before waiting
    sums, steps, at = done
    assert at["step"] == 10 and steps == 1 and sums["loss"] == 1.0 and sums["my_steps"] == 1
    assert lagged.pending is not None


def test_settle_completes_the_reduction_just_started():
    comm, lagged, stop = FakeComm(), LaggedSums(), no_signals()
    sync_point(lagged, comm, stop, 10)
    done = sync_point(lagged, comm, stop, 20, settle=True)            # a checkpoint, the last step, ...
    assert [at["step"] for _, _, at in done] == [10, 20] and lagged.pending is None
    assert comm.log[-2:] == [("wait", 0), ("wait", 1)]


def test_a_stop_flag_of_the_previous_interval_settles_the_current_one():
    comm, lagged, stop = FakeComm(), LaggedSums(), no_signals()
    stop.preempt = 1                                                  # SIGUSR1 during the first interval
    sync_point(lagged, comm, stop, 10)
    stop.preempt = 0
    done = sync_point(lagged, comm, stop, 20)
    assert [at["step"] for _, _, at in done] == [10, 20] and lagged.pending is None
    assert LaggedSums.flags(done) == {"bad": 0, "preempt": 1, "interrupt": 0}


def test_a_non_finite_loss_settles_too():
    comm, lagged, stop = FakeComm(), LaggedSums(), no_signals()
    sync_point(lagged, comm, stop, 10, loss=float("nan"))
    done = sync_point(lagged, comm, stop, 20)
    assert lagged.pending is None and LaggedSums.flags(done)["bad"] == 1
