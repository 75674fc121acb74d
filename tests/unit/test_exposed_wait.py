"""The note a fixed-k ``ssd --comm period`` run prints once when its ranks wait on the allreduce
(ssdmpi/run/report.py: ``exposed_wait_note``, ``ExposedWait``)."""

from types import SimpleNamespace

from ssdmpi.run.report import ExposedWait, exposed_wait_note

# wide-mlp at 1 Gbit/s, k = 5, d = 1 (BENCHMARKS.md, communication-bound, seed 0): a 372.8 ms step
# waits 198.3 ms; 171.2 ms of compute; 234.5 ms in flight per step, so 1172.5 ms per allreduce.
SLOW = {"step_s": 0.3728, "wait_s": 0.1983, "compute_s": 0.1712, "inflight_s": 0.2345}


def test_the_note_says_how_long_each_step_waits_and_what_would_hide_the_allreduce():
    note = exposed_wait_note(SLOW, 5, 1, "--merge-delay")
    assert note == ("note: steps wait 198 ms (53%) on the period's allreduce (1172 ms in flight, 171 ms compute per "
                    "step); --merge-delay 8 would hide it (now 1), or --delay auto")   # 1.05 x 1172.5 / 171.2 = 7.2
    assert len(note) <= 160


def test_a_rule_merged_at_the_next_periods_end_hides_it_behind_the_period():
    note = exposed_wait_note(SLOW, 5, 5, "--delay")
    assert note.endswith("; --delay 8 would hide it (now 5), or --delay auto")
    at_10 = exposed_wait_note({**SLOW, "inflight_s": 0.11725}, 10, 10, "--delay")       # 1172.5 ms per allreduce again
    assert at_10.endswith("; --delay 10 should hide it, or --delay auto")      # 10 steps would do


def test_a_sub_millisecond_wait_is_shown_to_the_hundredth_and_gets_no_delay_auto():
    """The default digits run: a 1.5 ms step waits 0.42 ms (28%); 2.1 ms in flight per allreduce
    (0.42 ms per step at k = 5), 0.76 ms of compute: 1.05 x 2.1 / 0.76 = 2.9, so 3 steps hide it."""
    note = exposed_wait_note({"step_s": 0.0015, "wait_s": 0.00042, "compute_s": 0.00076, "inflight_s": 0.00042}, 5, 1,
                             "--merge-delay")
    assert note == ("note: steps wait 0.42 ms (28%) on the period's allreduce (2.1 ms in flight, 0.76 ms compute per "
                    "step); --merge-delay 3 would hide it (now 1)")


def test_no_note_when_the_wait_is_a_small_share_of_the_step():
    assert exposed_wait_note({**SLOW, "wait_s": 0.07}, 5, 1, "--merge-delay") is None           # 19% of the step
    assert exposed_wait_note({**SLOW, "wait_s": 0.08}, 5, 1, "--merge-delay") is not None       # 21%
    assert exposed_wait_note({**SLOW, "step_s": None}, 5, 1, "--merge-delay") is None


def job(k=5, d=1, window=True):
    """A job whose algorithm has a fixed period ``k`` merged ``d`` steps after each post (``d`` None: at the
    next period's end); ``window=False``: no such schedule (another algorithm, ``--comm step``, ``--delay auto``)."""
    flag = "--delay" if d is None else "--merge-delay"
    return SimpleNamespace(algo=SimpleNamespace(allreduce_window=lambda: (k, k if d is None else d, flag)
                                                if window else None))


def records(watch, stage, steps, **values):
    """Feed ``watch`` one record per end step of ``steps``; the notes it returned."""
    return [watch.check({**SLOW, **values, "stage": stage, "step": step}) for step in steps]


def test_once_per_run_after_four_periods_wholly_in_the_delay_stage():
    watch = ExposedWait(job())                                              # k = 5: 20 steps
    assert records(watch, "warmup", [195]) == [None]
    assert records(watch, "delay", [200]) == [None]                         # the interval ending at the switch
    notes = records(watch, "delay", [205, 210, 215, 220, 225, 230, 235, 240])
    assert notes[:3] == [None] * 3 and notes[4:] == [None] * 4              # at 220, and only once
    assert notes[3].startswith("note: steps wait 198 ms (53%)")


def test_the_means_span_whole_periods_when_records_are_shorter_than_one():
    """--log-every 5 at k = 10: a record holds the period end or not; over 40 steps the means are
    wait 200 ms of a 300 ms step, 150 ms in flight per step, 1500 ms per allreduce: 16 steps of 100 ms
    would hide it (1.05 x 1500 / 100 = 15.75). The first record alone would say 3000 ms."""
    watch = ExposedWait(job(k=10))
    end = {"step_s": 0.5, "wait_s": 0.4, "compute_s": 0.1, "inflight_s": 0.3}
    rest = {"step_s": 0.1, "wait_s": 0.0, "compute_s": 0.1, "inflight_s": 0.0}
    notes = [watch.check({**(end if i % 2 else rest), "stage": "delay", "step": 200 + 5 * i}) for i in range(9)]
    assert notes[:8] == [None] * 8
    assert notes[8].startswith("note: steps wait 200 ms (67%) on the period's allreduce (1500 ms in flight, "
                               "100 ms compute per step); --merge-delay 16 would hide it (now 1)")


def test_a_window_with_little_wait_says_nothing_and_the_next_is_judged_afresh():
    watch = ExposedWait(job())
    assert records(watch, "delay", [200, 205, 210, 215, 220], wait_s=0.01) == [None] * 5
    assert records(watch, "delay", [225, 230, 235]) == [None] * 3
    assert records(watch, "delay", [240])[0].startswith("note: steps wait 198 ms")


def test_no_note_without_a_fixed_period_schedule():
    watch = ExposedWait(job(window=False))
    assert records(watch, "delay", range(200, 300, 5)) == [None] * 20


def test_the_algorithms_say_which_schedule_has_a_window():
    """What the algorithms answer (``allreduce_window``): a fixed-k period rule with a merge delay, one
    merged at the next period's end, and nothing for ``--comm step``, ``--delay auto`` and the others."""
    import numpy as np
    from mpi4py import MPI

    from ssdmpi.algos import AlgoConfig, build_algorithm
    from ssdmpi.comm.communicator import Communicator
    from ssdmpi.nn import build_model

    def window(**settings):
        comm = Communicator(MPI.COMM_SELF, progress="blocking")
        try:
            model = build_model("mlp", (4,), 2, widths=(3,), dtype=np.float64)
            return build_algorithm(AlgoConfig(warmup_steps=10, **settings), model, comm).allreduce_window()
        finally:
            comm.free()

    assert window(algo="ssd", comm="period", delay=5, merge_delay=2) == (5, 2, "--merge-delay")
    assert window(algo="ssd", comm="period", delay=4, period_rule="delta-own") == (4, 4, "--delay")
    assert window(algo="ssd", comm="period", delay="auto") is None
    for settings in (dict(algo="ssd", comm="step"), dict(algo="ssgd"), dict(algo="localsgd"), dict(algo="odsgd")):
        assert window(**settings) is None, settings
