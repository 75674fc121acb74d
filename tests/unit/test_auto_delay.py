"""``--delay auto`` (ssdmpi/algos/auto_delay.py): the pure choice, the meter, the agreement over
ranks (simulated), and the settings it refuses. The MPI side is tests/mpi/test_auto_delay.py."""

import math
import random
import time

import numpy as np
import pytest

from ssdmpi.algos import AlgoConfig, auto_delay
from ssdmpi.algos.auto_delay import (
    DELAY_RANGE,
    MIN_WARMUP_STEPS,
    SLACK,
    WINDOW,
    DelayChoice,
    DelayMeter,
    choose_delay,
    decide,
)
from ssdmpi.errors import UserError

# --- choose_delay --------------------------------------------------------------------------


@pytest.mark.parametrize("c, T, k", [
    (0.1, 0.0, 1),          # nothing to hide
    (0.1, 0.05, 1),         # a fast network: the allreduce hides behind one step
    (0.1, 0.095, 1),        # one step covers it with the 5% margin (0.1 >= 0.09975)
    (0.1, 0.1, 2),          # one step covers it, but not with the margin
    (0.1, 0.3, 4),          # 3 steps: 0.30000000000000004 < 0.315
    (0.085, 1.29, 16),      # BENCHMARKS.md's 1 Gbit/s case: 85 ms compute, 1.29 s allreduce (15.9 steps)
    (0.085, 0.129, 2),      # the same model at 10 Gbit/s
    (0.001, 1.0, 32),       # never hidden within the bound: the longest delay
    (1e-320, 1.0, 32),      # T / c overflows
])
def test_choose_delay_is_the_smallest_k_that_hides_the_allreduce_with_a_margin(c, T, k):
    assert choose_delay(c, T) == k


def test_choose_delay_meets_its_definition_exactly_in_floating_point():
    rng = random.Random(7)
    for _ in range(20000):
        c = 10 ** rng.uniform(-4, 0)
        T = c * rng.choice([rng.uniform(0, 40), float(rng.randint(1, 40))])   # exact multiples too
        k = choose_delay(c, T)
        assert 1 <= k <= 32
        if k < 32:
            assert k * c >= (1 + SLACK) * T, (c, T, k)
        if k > 1:
            assert (k - 1) * c < (1 + SLACK) * T, (c, T, k)


def test_choose_delay_bounds():
    assert choose_delay(0.1, 0.0, lo=3, hi=8) == 3
    assert choose_delay(0.1, 0.5, lo=3, hi=8) == 6
    assert choose_delay(0.1, 5.0, lo=3, hi=8) == 8
    assert DELAY_RANGE == (1, 32)


@pytest.mark.parametrize("c, T", [(0.0, 1.0), (-1.0, 1.0), (0.1, -0.1), (math.nan, 1.0), (0.1, math.inf)])
def test_choose_delay_rejects_nonsense(c, T):
    with pytest.raises(ValueError):
        choose_delay(c, T)


@pytest.mark.parametrize("lo, hi", [(0, 32), (5, 4), (1.0, 32)])
def test_choose_delay_rejects_bad_bounds(lo, hi):
    with pytest.raises(ValueError):
        choose_delay(0.1, 0.5, lo=lo, hi=hi)


@pytest.mark.parametrize("c, T, W, k", [
    (0.0878, 0.1399, 0.0696, 11),   # wide-mlp at 10 Gbit/s (BENCHMARKS.md): hiding needs 2, amortising the CPU 11
    (0.0858, 1.3124, 0.1133, 17),   # 1 Gbit/s: hiding the wire time needs 17, the CPU is amortised by then
    (0.1, 0.05, 0.0, 1),            # no CPU cost in flight (a spare core, offload): the hide rule alone
    (0.1, 0.05, 100.0, 31),         # the CPU cost dominates: k = 31 costs within 5% of the longest delay
])
def test_choose_delay_also_amortises_the_cpu_an_allreduce_in_flight_takes(c, T, W, k):
    assert choose_delay(c, T, W) == k


def test_choose_delay_with_cpu_cost_meets_its_definition():
    """Random inputs: k meets both conditions, and every smaller k fails one (or k is the bound)."""
    rng = random.Random(3)
    lo, hi = DELAY_RANGE

    def ok(k, c, T, W):
        return k * c >= (1 + SLACK) * T and c + W / k <= (1 + SLACK) * (c + W / hi)

    for _ in range(2000):
        c, T, W = rng.uniform(1e-3, 0.5), rng.uniform(0, 3.0), rng.choice([0.0, rng.uniform(0, 1.0)])
        k = choose_delay(c, T, W)
        assert lo <= k <= hi
        assert ok(k, c, T, W) or k == hi
        assert not any(ok(j, c, T, W) for j in range(lo, k))


@pytest.mark.parametrize("W", [-0.1, math.nan, math.inf])
def test_choose_delay_rejects_a_bad_cpu_time(W):
    with pytest.raises(ValueError):
        choose_delay(0.1, 0.5, W)


class FakeHandle:
    """An allreduce that completes on its ``polls``-th ``test()``."""

    def __init__(self, polls):
        self.polls, self.tests, self.waited = polls, 0, False

    def test(self):
        self.tests += 1
        return self.tests >= self.polls

    def wait(self):
        self.waited = True


class FakeComm:
    """One rank: ``allreduce_scalars`` returns its input; records what the probe asks of it."""

    def __init__(self, polls=3):
        self.polls, self.handles, self.barriers, self.scalars = polls, [], 0, []

    def barrier(self):
        self.barriers += 1

    def allreduce_start(self, buf, average=True):
        assert average is False           # a sum: the probe's buffer is scratch
        self.handles.append(FakeHandle(self.polls))
        return self.handles[-1]

    def allreduce_scalars(self, values, op="sum"):
        assert op == "max"
        self.scalars.append(dict(values))
        return dict(values)


def test_probe_cpu_is_the_median_thread_cpu_of_polled_allreduces(monkeypatch):
    cpu = iter([0.0, 0.030, 1.0, 1.010, 2.0, 2.050])     # start/end thread_time of three probes
    monkeypatch.setattr(time, "thread_time", lambda: next(cpu))
    sleeps = []
    monkeypatch.setattr(time, "sleep", sleeps.append)
    comm = FakeComm(polls=3)
    assert auto_delay.probe_cpu(comm, np.zeros(4), repeats=3) == pytest.approx(0.030)
    assert comm.barriers == 3 and all(h.waited and h.tests == 3 for h in comm.handles)
    assert sleeps == [auto_delay.PROBE_POLL_S] * 6         # polled between the tests, never spinning


def test_choose_probes_a_fraction_of_the_gradient_and_scales_its_cpu_up():
    """c = 0.1 s, T = 0.4 s: the probe is a quarter of the gradient (about one step of time); its
    0.02 s of CPU scale to W = 0.08 s for the whole allreduce, and k amortises that."""
    m = DelayMeter()
    for _ in range(10):
        m.add(0.1, 0.4)
    asked = []
    choice = m.choose(FakeComm(), step=10, probe=lambda fraction: asked.append(fraction) or 0.02)
    assert asked == [0.25]
    assert choice.cpu_s == pytest.approx(0.08) and choice.k == choose_delay(0.1, 0.4, 0.08) == 11
    assert choice.record()["allreduce_cpu_s"] == pytest.approx(0.08)
    no_probe = m.choose(FakeComm(), step=10)
    assert no_probe.cpu_s == 0.0 and no_probe.k == 5      # 4 steps cover 0.4 s, but not 0.42


def test_the_period_end_update_counts_with_the_probed_cpu():
    """``u`` (the warm-up's update time) and the probe's CPU time add up to the per-period cost."""
    m = DelayMeter()
    for _ in range(10):
        m.add(0.1, 0.4, 0.03)
    choice = m.choose(FakeComm(), step=10, probe=lambda fraction: 0.02)
    assert choice.update_s == pytest.approx(0.03) and choice.cpu_s == pytest.approx(0.08)
    assert choice.k == choose_delay(0.1, 0.4, 0.08 + 0.03) > choose_delay(0.1, 0.4, 0.08)
    assert choice.record()["update_s"] == pytest.approx(0.03)


def test_warm_up_samples_of_a_checkpoint_from_before_the_update_time_load_with_none():
    m = DelayMeter()
    m.load_state_dict({"auto.samples": np.array([[0.1, 0.2], [0.3, 0.4]])})
    assert m.samples == [(0.1, 0.2, 0.0), (0.3, 0.4, 0.0)]
    again = DelayMeter()
    again.load_state_dict(m.state_dict())
    assert again.samples == m.samples and m.state_dict()["auto.samples"].shape == (2, 3)


def test_a_checkpoint_from_before_the_probe_loads_with_no_cpu_cost():
    choice = DelayChoice(k=7, compute_s=0.08, allreduce_s=0.5, step=40, samples=20, cpu_s=0.03, update_s=0.01)
    state = choice.state()
    assert DelayChoice.from_state(state) == choice
    del state["auto.cpu_s"], state["auto.update_s"]
    assert DelayChoice.from_state(state).cpu_s == DelayChoice.from_state(state).update_s == 0.0


def test_the_cap_is_checkpointed_and_a_checkpoint_from_before_it_loads_with_the_default():
    choice = DelayChoice(k=4, compute_s=0.08, allreduce_s=0.5, step=40, samples=20, hi=4)
    state = choice.state()
    assert DelayChoice.from_state(state) == choice and choice.record()["range"] == [1, 4]
    del state["auto.hi"]
    assert DelayChoice.from_state(state).hi == DELAY_RANGE[1]


def test_delay_max_caps_the_choice_and_the_amortise_condition_is_judged_against_the_cap():
    """c = 0.1 s, T = 0.95 s: hiding needs k = 10. ``--delay-max 6`` takes 6 (part of the allreduce
    exposed); with W = 1 s of CPU per period and no cap, amortising asks for more than hiding does."""
    m = DelayMeter(hi=6)
    for _ in range(10):
        m.add(0.1, 0.95)
    capped = m.choose(FakeComm(), step=10)
    assert capped.k == 6 and capped.hi == 6 and "1-6" in capped.text()
    assert decide({"c": 0.1, "T": 0.95, "fewest": -10}, 10).k == 10
    free = decide({"c": 0.1, "T": 0.2, "cpu": 1.0, "fewest": -10}, 10)
    at_cap = decide({"c": 0.1, "T": 0.2, "cpu": 1.0, "fewest": -10}, 10, hi=8)
    assert free.k == choose_delay(0.1, 0.2, 1.0) > 8 >= at_cap.k == choose_delay(0.1, 0.2, 1.0, hi=8) >= 3
    assert decide({"c": 0.0, "T": 0.2, "fewest": -10}, 10, hi=8).k == 8     # "the longest delay" is the cap


# --- the meter and the agreement ------------------------------------------------------------

def agree(meters, step=10):
    """What every rank gets: each meter's summary reduced with max, as allreduce_scalars does."""
    summaries = [m.summary() for m in meters]
    agreed = {key: max(s[key] for s in summaries) for key in summaries[0]}
    return [decide(agreed, step) for _ in meters]


def test_noisy_ranks_that_would_choose_differently_alone_agree_on_one_k():
    rng = np.random.default_rng(0)
    meters, alone = [], set()
    for rank in range(4):
        m = DelayMeter()
        c0 = 0.010 * (1 + 0.1 * rank)           # ranks differ in speed
        for _ in range(30):
            m.add(c0 * rng.uniform(0.9, 1.1), 0.0485 * rng.uniform(0.9, 1.1))
        meters.append(m)
        s = m.summary()
        alone.add(choose_delay(s["c"], s["T"]))
    assert len(alone) > 1, "the test needs ranks whose own medians choose different k"
    choices = agree(meters)
    assert len({c.k for c in choices}) == 1
    slowest = max(m.summary()["c"] for m in meters)
    assert choices[0].compute_s == slowest and choices[0].k == choose_delay(slowest, choices[0].allreduce_s)


def test_median_of_the_last_window_ignores_a_cold_first_step_and_a_pause():
    m = DelayMeter()
    m.add(5.0, 9.0)                              # cold first step
    for i in range(WINDOW + 5):
        m.add(0.1, 0.45 if i != 12 else 30.0)    # one pause in the allreduce
    assert len(m.samples) == WINDOW
    (choice,) = agree([m], step=25)
    assert (choice.k, choice.compute_s, choice.allreduce_s, choice.samples, choice.step) == (5, 0.1, 0.45, WINDOW, 25)


def test_fewest_samples_is_reported_and_a_zero_compute_clock_gives_the_longest_delay():
    a, b = DelayMeter(), DelayMeter()
    for _ in range(3):
        a.add(0.0, 0.2)
    for _ in range(7):
        b.add(0.0, 0.1)
    choice = agree([a, b])[0]
    assert choice.samples == 3 and choice.k == DELAY_RANGE[1]
    assert decide({"c": 0.0, "T": 0.0, "fewest": -5}, 5).k == DELAY_RANGE[0]


def test_meter_and_choice_round_trip_through_their_state():
    m = DelayMeter()
    assert m.state_dict() == {}
    for i in range(4):
        m.add(0.1 * i, 0.2 * i)
    again = DelayMeter()
    again.load_state_dict(m.state_dict())
    assert again.samples == m.samples
    choice = DelayChoice(k=7, compute_s=0.08, allreduce_s=0.5, step=40, samples=20)
    assert DelayChoice.from_state(choice.state()) == choice
    record = choice.record()
    assert record["kind"] == "delay" and record["delay"] == 7 and record["step"] == 40
    assert "k = 7" in choice.text()


# --- settings --------------------------------------------------------------------------------

@pytest.mark.parametrize("settings, words", [
    (dict(algo="ssgd"), "does not apply to --algo ssgd"),
    (dict(algo="asgd"), "does not apply to --algo asgd"),
    (dict(algo="odsgd"), "odsgd is ssd with --delay 1"),
    (dict(algo="ssd", warmup_steps=0), f"needs --warmup-steps >= {MIN_WARMUP_STEPS} (got 0)"),
    (dict(algo="localsgd", warmup_steps=MIN_WARMUP_STEPS - 1), "lengthen the warm-up"),
])
def test_auto_is_refused_where_it_cannot_apply(settings, words):
    with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)")):
        AlgoConfig(delay="auto", **settings).validate(world_size=2)


@pytest.mark.parametrize("settings", [dict(algo="ssd"), dict(algo="ssd", comm="step"), dict(algo="localsgd"),
                                      dict(algo="ssd", comm="period", period_rule="replay")])
def test_auto_is_kept_by_validate_for_algorithms_with_a_delay(settings):
    cfg = AlgoConfig(delay="auto", warmup_steps=MIN_WARMUP_STEPS, **settings).validate(world_size=2)
    assert cfg.delay == "auto"


def test_delay_max_resolves_to_the_range_with_auto_and_is_refused_without_it():
    assert AlgoConfig(delay="auto", warmup_steps=50).validate(world_size=2).delay_max == DELAY_RANGE[1]
    assert AlgoConfig(delay="auto", delay_max=5, warmup_steps=50).validate(world_size=2).delay_max == 5
    assert AlgoConfig(delay=5, warmup_steps=50).validate(world_size=2).delay_max is None
    for settings, words in [(dict(delay=5), "applies only to --delay auto"), (dict(), "applies only to --delay auto"),
                            (dict(delay="auto", algo="asgd"), "does not apply to --algo asgd"),
                            (dict(delay="auto"), "positive integer")]:
        with pytest.raises(UserError, match=words):
            AlgoConfig(delay_max=0 if words == "positive integer" else 5, warmup_steps=50,
                       **settings).validate(world_size=2)


def test_other_strings_are_still_refused():
    with pytest.raises(UserError, match="positive integer or auto"):
        AlgoConfig(delay="fast", warmup_steps=50).validate(world_size=2)


# --- ssdmpi train: bad input is one line, exit 2 ---------------------------------------------

@pytest.mark.parametrize("args, needle", [
    (["--delay", "auto", "--warmup-steps", "0"], "--delay auto measures compute and allreduce times during the SSGD "
                                                 "warm-up and needs --warmup-steps >= 5 (got 0)"),
    (["--delay", "auto", "--warmup-epochs", "0.001"], "needs --warmup-steps >= 5 (got 0)"),
    (["--algo", "ssgd", "--delay", "auto"], "--delay does not apply to --algo ssgd"),
    (["--algo", "asgd", "--delay", "auto"], "--delay does not apply to --algo asgd"),
    (["--delay", "5", "--delay-max", "8"], "--delay-max applies only to --delay auto (it caps the k auto chooses)"),
    (["--delay", "auto", "--delay-max", "0"], "--delay-max must be a positive integer, got 0"),
])
def test_bad_auto_settings_are_one_line_and_exit_2(args, needle):
    from tests.conftest import run_cli
    from tests.unit.test_train_cli import assert_one_line_error

    assert_one_line_error(run_cli(["train", "--no-progress-bar"] + args, ranks=2, timeout=120), needle)


def test_bench_train_knows_the_auto_variant():
    from ssdmpi.bench.train import parse_variant

    v = parse_variant("ssd:period:auto")
    assert (v.name, v.train_flags()) == ("ssd-period-kauto", ["--algo", "ssd", "--comm", "period", "--delay", "auto"])
    v = parse_variant("ssd:period:auto:5")
    assert (v.name, v.train_flags()) == ("ssd-period-kauto-max5", ["--algo", "ssd", "--comm", "period", "--delay",
                                                                   "auto", "--delay-max", "5"])
    assert parse_variant("ssd:step:auto").train_flags()[-2:] == ["--delay", "auto"]
    assert parse_variant("localsgd:auto").train_flags() == ["--algo", "localsgd", "--delay", "auto"]
    with pytest.raises(UserError, match="ssd also takes auto"):
        parse_variant("asgd:auto")


def test_summary_text_names_the_chosen_k():
    from ssdmpi.metrics import summary_text

    choice = DelayChoice(k=7, compute_s=0.08, allreduce_s=0.5, step=40, samples=20, cpu_s=0.03, update_s=0.01)
    text = summary_text({"algo": "ssd", "step": 100, "delay_auto": choice.record()})
    assert ("delay auto: k = 7 (chosen at step 40: compute 80.0 ms, allreduce 500.0 ms per step, "
            "30.0 ms CPU in flight, update 10.0 ms)") in text
    assert "delay auto" not in summary_text({"algo": "ssd", "step": 100})
