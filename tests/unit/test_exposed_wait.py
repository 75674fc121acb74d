"""The note a fixed-k ``ssd --comm period`` run prints once when its ranks wait on the allreduce
(ssdmpi/run/report.py: ``exposed_wait_note``, ``ExposedWait``)."""

from types import SimpleNamespace

from ssdmpi.run.report import ExposedWait, exposed_wait_note

# wide-mlp at 1 Gbit/s, k = 5, d = 1 (BENCHMARKS.md, communication-bound, seed 0): a 372.8 ms step
# waits 198.3 ms; 171.2 ms of compute; 234.5 ms in flight per step, so 1172.5 ms per allreduce.
SLOW = {"step_s": 0.3728, "wait_s": 0.1983, "compute_s": 0.1712, "inflight_s": 0.2345}


def test_the_note_says_how_long_each_step_waits_and_what_would_hide_the_allreduce():
    note = exposed_wait_note(SLOW, 5, 1)
    assert note.startswith("note: each step waits 198 ms (53% of it) for the period's allreduce, in flight 1172 ms "
                           "against 171 ms of compute per step; --merge-delay 1 lets 1 step of compute hide it, "
                           "about 8 would. --delay auto chooses k")          # 1.05 x 1172.5 / 171.2 = 7.2
    assert "\n" not in note


def test_a_rule_merged_at_the_next_periods_end_hides_it_behind_the_period():
    note = exposed_wait_note(SLOW, 5, None)
    assert "the period of 5 steps hides it, about 8 would." in note
    at_10 = exposed_wait_note({**SLOW, "inflight_s": 0.11725}, 10, None)       # 1172.5 ms per allreduce again
    assert "the period of 10 steps hides it. --delay auto" in at_10           # 10 steps would do


def test_no_note_when_the_wait_is_a_small_share_of_the_step():
    assert exposed_wait_note({**SLOW, "wait_s": 0.07}, 5, 1) is None           # 19% of the step
    assert exposed_wait_note({**SLOW, "wait_s": 0.08}, 5, 1) is not None       # 21%
    assert exposed_wait_note({**SLOW, "step_s": None}, 5, 1) is None


def job(algo="ssd", comm="period", k=5, d=1, auto=False):
    return SimpleNamespace(cfg=SimpleNamespace(algo=algo), algo=SimpleNamespace(auto=auto, k=k, d=d),
                           algo_cfg=SimpleNamespace(comm=comm, delay="auto" if auto else k))


def records(watch, stage, steps, **values):
    """Feed ``watch`` one record per end step of ``steps``; the notes it returned."""
    return [watch.check({**SLOW, **values, "stage": stage, "step": step}) for step in steps]


def test_once_per_run_after_four_periods_wholly_in_the_delay_stage():
    watch = ExposedWait(job())                                              # k = 5: 20 steps
    assert records(watch, "warmup", [195]) == [None]
    assert records(watch, "delay", [200]) == [None]                         # the interval ending at the switch
    notes = records(watch, "delay", [205, 210, 215, 220, 225, 230, 235, 240])
    assert notes[:3] == [None] * 3 and notes[4:] == [None] * 4              # at 220, and only once
    assert notes[3].startswith("note: each step waits 198 ms (53% of it)")


def test_the_means_span_whole_periods_when_records_are_shorter_than_one():
    """--log-every 5 at k = 10: a record holds the period end or not; over 40 steps the means are
    wait 200 ms of a 300 ms step, 150 ms in flight per step, 1500 ms per allreduce: 16 steps of 100 ms
    would hide it (1.05 x 1500 / 100 = 15.75). The first record alone would say 3000 ms."""
    watch = ExposedWait(job(k=10))
    end = {"step_s": 0.5, "wait_s": 0.4, "compute_s": 0.1, "inflight_s": 0.3}
    rest = {"step_s": 0.1, "wait_s": 0.0, "compute_s": 0.1, "inflight_s": 0.0}
    notes = [watch.check({**(end if i % 2 else rest), "stage": "delay", "step": 200 + 5 * i}) for i in range(9)]
    assert notes[:8] == [None] * 8
    assert notes[8].startswith("note: each step waits 200 ms (67% of it) for the period's allreduce, in flight "
                               "1500 ms against 100 ms of compute per step; --merge-delay 1 lets 1 step of "
                               "compute hide it, about 16 would.")


def test_a_window_with_little_wait_says_nothing_and_the_next_is_judged_afresh():
    watch = ExposedWait(job())
    assert records(watch, "delay", [200, 205, 210, 215, 220], wait_s=0.01) == [None] * 5
    assert records(watch, "delay", [225, 230, 235]) == [None] * 3
    assert records(watch, "delay", [240])[0].startswith("note: each step waits 198 ms")


def test_no_note_for_delay_auto_comm_step_or_other_algorithms():
    asgd = SimpleNamespace(cfg=SimpleNamespace(algo="asgd"), algo=SimpleNamespace(auto=False),   # no k, no d
                           algo_cfg=SimpleNamespace(comm=None, delay=None))
    for j in (job(auto=True, k=None, d=None), job(comm="step"), job(algo="ssgd"), job(algo="localsgd"), asgd):
        watch = ExposedWait(j)
        assert records(watch, "delay", range(200, 300, 5)) == [None] * 20
