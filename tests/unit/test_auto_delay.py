"""``--delay auto`` (ssdmpi/algos/auto_delay.py): the pure choice of the period k and the merge delay d,
the stable region it keeps to, the meter, the agreement over ranks (simulated), and the settings it
refuses. The MPI side is tests/mpi/test_auto_delay.py."""

import functools
import math
import random
import time

import numpy as np
import pytest

from ssdmpi.algos import AlgoConfig, auto_delay, registry, stability
from ssdmpi.algos.auto_delay import (
    DELAY_RANGE,
    MIN_WARMUP_STEPS,
    SLACK,
    WINDOW,
    DelayChoice,
    DelayMeter,
    choose_period,
    decide,
    stable_region,
    steps_to_hide,
)
from ssdmpi.errors import UserError

RULE = "delta-merge"     # the period rule whose merge delay --delay auto chooses
MAP = registry.RULES[RULE].linear_map


def region(mu, merge_momentum=0.0):
    """delta-merge's stable region at momentum ``mu`` (``--merge-delay`` chosen, the momentum merge fixed)."""
    return stable_region(MAP, mu, "merge_delay", {"merge_momentum": merge_momentum})


def map_threshold(k, d, mu=0.9, merge_momentum=0.0):
    return stability.threshold(MAP, k, mu=mu, merge_delay=d, merge_momentum=merge_momentum)

# --- choose_period: hide (d), amortise (k), stable (k, d) ----------------------------------


@pytest.mark.parametrize("c, T, d", [
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
def test_d_is_the_smallest_merge_delay_that_hides_the_allreduce_with_a_margin(c, T, d):
    """Without per-period work and with every pair stable, k = d: the shortest period that holds d."""
    assert choose_period(c, T) == (d, d)


def test_steps_to_hide_is_the_fewest_steps_that_cover_the_allreduce_with_the_margin():
    assert steps_to_hide(0.1, 1.0) == 11                # 10 steps give 1.0 < 1.05
    assert steps_to_hide(0.105, 1.0) == 10              # 10 x 0.105 = 1.05 exactly
    assert steps_to_hide(0.2, 0.1) == steps_to_hide(1.0, 0.0) == 1
    assert steps_to_hide(0.1712, 1.1725) == 8           # the exposed-wait note's example: 7.2 steps
    assert steps_to_hide(0.001, 1.0, most=32) == 32 and steps_to_hide(1e-320, 1.0, most=32) == 32


def test_d_meets_its_definition_exactly_in_floating_point():
    rng = random.Random(7)
    for _ in range(20000):
        c = 10 ** rng.uniform(-4, 0)
        T = c * rng.choice([rng.uniform(0, 40), float(rng.randint(1, 40))])   # exact multiples too
        k, d = choose_period(c, T)
        assert 1 <= d <= k <= 32
        if d < 32:
            assert d * c >= (1 + SLACK) * T, (c, T, d)
        if d > 1:
            assert (d - 1) * c < (1 + SLACK) * T, (c, T, d)


def test_bounds():
    assert choose_period(0.1, 0.0, lo=3, hi=8) == (3, 3)
    assert choose_period(0.1, 0.5, lo=3, hi=8) == (6, 6)
    assert choose_period(0.1, 5.0, lo=3, hi=8) == (8, 8)
    assert DELAY_RANGE == (1, 32)


@pytest.mark.parametrize("c, T", [(0.0, 1.0), (-1.0, 1.0), (0.1, -0.1), (math.nan, 1.0), (0.1, math.inf)])
def test_choose_period_rejects_nonsense(c, T):
    with pytest.raises(ValueError):
        choose_period(c, T)


@pytest.mark.parametrize("lo, hi, d", [(0, 32, None), (5, 4, None), (1.0, 32, None), (1, 8, 9), (1, 8, 0)])
def test_choose_period_rejects_bad_bounds(lo, hi, d):
    with pytest.raises(ValueError):
        choose_period(0.1, 0.5, lo=lo, hi=hi, d=d)


@pytest.mark.parametrize("c, T, W, k, d", [
    (0.0878, 0.1399, 0.0696, 11, 2),   # wide-mlp at 10 Gbit/s (BENCHMARKS.md): hiding needs 2, amortising the CPU 11
    (0.0858, 1.3124, 0.1133, 17, 17),  # 1 Gbit/s: hiding the wire time needs 17, the CPU is amortised by then
    (0.1, 0.05, 0.0, 1, 1),            # no CPU cost in flight (a spare core, offload): the hide rule alone
    (0.1, 0.05, 100.0, 31, 1),         # the CPU cost dominates: k = 31 costs within 5% of the longest period
])
def test_k_also_amortises_the_cpu_an_allreduce_in_flight_takes(c, T, W, k, d):
    assert choose_period(c, T, W) == (k, d)


def test_choose_period_meets_its_definition():
    """Random inputs and a random stable region, against the properties the docstring states: d hides
    (or no larger d up to the hiding one has a stable k); k >= d amortises the per-period work (with the
    wait d leaves exposed) and is the smallest stable such k; failing all that, d = 1 and the longest
    stable k below the amortising one, or the amortising one."""
    rng = random.Random(3)
    lo, hi = DELAY_RANGE

    def amortising(d, c, T, W):
        work = W + max(0.0, T - d * c)
        return next(k for k in range(lo, hi + 1) if c + work / k <= (1 + SLACK) * (c + work / hi) or k == hi)

    for _ in range(2000):
        c, T, W = rng.uniform(1e-3, 0.5), rng.uniform(0, 3.0), rng.choice([0.0, rng.uniform(0, 1.0)])
        bad = {(rng.randint(1, 32), rng.randint(1, 32)) for _ in range(rng.choice([0, 50, 400, 1100]))}
        stable = functools.partial(lambda bad, k, d: (k, d) not in bad, bad)
        k, d = choose_period(c, T, W, stable=stable)
        d_hide = next((j for j in range(lo, hi + 1) if j * c >= (1 + SLACK) * T), hi)

        def found(dd, c=c, T=T, W=W, stable=stable):
            return [j for j in range(max(amortising(dd, c, T, W), dd), hi + 1) if stable(j, dd)]

        assert lo <= d <= d_hide and d <= k <= hi
        assert not any(found(dd) for dd in range(d + 1, d_hide + 1))
        if found(d):
            assert k == found(d)[0]
        else:
            assert d == lo
            below = [j for j in range(lo, max(amortising(lo, c, T, W), lo)) if stable(j, lo)]
            assert k == (below[-1] if below else max(amortising(lo, c, T, W), lo))


def test_an_unstable_pair_is_passed_over_for_a_longer_period_then_a_shorter_merge_delay():
    """d = 4 hides; (k, 4) is stable only from k = 20: k = 20. With nothing stable for d = 4, d = 3 (its
    0.05 s of exposed wait amortised from k = 8; stable from 10)."""
    assert choose_period(0.1, 0.35, stable=lambda k, d: k >= 20) == (20, 4)
    assert choose_period(0.1, 0.35, stable=lambda k, d: d < 4 and k >= 10) == (10, 3)
    assert choose_period(0.1, 0.35, stable=lambda k, d: False) == (19, 1)     # the wait amortised, stability aside
    assert choose_period(0.1, 0.35, stable=lambda k, d: k == 3) == (3, 1)     # shorter than that, but stable
    # --merge-delay 2 leaves 0.15 s of the allreduce exposed per period: amortised from k = 16
    assert choose_period(0.1, 0.35, d=2, stable=lambda k, d: k >= 7) == (16, 2)
    assert choose_period(0.1, 0.35, d=2, stable=lambda k, d: k < 9) == (8, 2)
    assert choose_period(0.1, 0.35, d=2, stable=lambda k, d: False) == (16, 2)


def test_the_stable_region_is_the_maps_at_half_of_momentum_sgds_limit():
    """``stable_region(mu)`` against ``ssdmpi.algos.stability.threshold`` (scanned independently, finer):
    the default (k, d) = (5, 1) is in; delta-own's timing (d = k) and d = 2 at k = 5 are out."""

    stable = region(0.9)
    bound = auto_delay.AUTO_STABILITY * 2 * 1.9
    assert bound == pytest.approx(1.9)
    for k, d in [(5, 1), (5, 2), (5, 5), (10, 2), (20, 3), (20, 6), (32, 8), (4, 1), (7, 1)]:
        fine = map_threshold(k, d)
        assert stable(k, d) == (fine >= bound), (k, d, fine)
    assert stable(5, 1) and not stable(5, 5) and not stable(5, 2) and stable(20, 3)
    for k, d in [(5, 1), (10, 3), (20, 3)]:                  # another momentum: its own map and bound (1.5)
        assert region(0.5)(k, d) == (map_threshold(k, d, mu=0.5) >= 1.5), (k, d)
    merged = region(0.9, 1.0)                   # the momentum merge: its own map
    for k, d in [(5, 1), (10, 1), (17, 2), (20, 1), (20, 3), (24, 2), (32, 8)]:
        assert merged(k, d) == (map_threshold(k, d, merge_momentum=1.0) >= bound), (k, d)
    assert stable(5, 1) and not merged(5, 1) and merged(20, 3)


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


STABLE = region(0.9)     # momentum SGD's default momentum


def test_choose_probes_a_fraction_of_the_gradient_and_scales_its_cpu_up():
    """c = 0.1 s, T = 0.4 s: the probe is a quarter of the gradient (about one step of time); its
    0.02 s of CPU scale to W = 0.08 s for the whole allreduce, and k amortises that."""
    m = DelayMeter(stable=STABLE)
    for _ in range(10):
        m.add(0.1, 0.4)
    asked = []
    choice = m.choose(FakeComm(), step=10, probe=lambda fraction: asked.append(fraction) or 0.02)
    assert asked == [0.25]
    assert choice.cpu_s == pytest.approx(0.08)
    assert (choice.k, choice.d) == choose_period(0.1, 0.4, 0.08, stable=STABLE) == (17, 5)   # amortised: 11
    assert choice.record()["allreduce_cpu_s"] == pytest.approx(0.08) and choice.record()["window"] == 5
    no_probe = m.choose(FakeComm(), step=10)
    assert no_probe.cpu_s == 0.0 and no_probe.d == 5      # 4 steps cover 0.4 s, but not 0.42


def test_the_period_end_update_counts_with_the_probed_cpu():
    """``u`` (the warm-up's update time) and the probe's CPU time add up to the per-period cost."""
    m = DelayMeter(stable=STABLE)
    for _ in range(10):
        m.add(0.1, 0.4, 0.03)
    choice = m.choose(FakeComm(), step=10, probe=lambda fraction: 0.02)
    assert choice.update_s == pytest.approx(0.03) and choice.cpu_s == pytest.approx(0.08)
    assert choose_period(0.1, 0.4, 0.08 + 0.03)[0] > choose_period(0.1, 0.4, 0.08)[0]      # stability aside
    assert (choice.k, choice.d) == choose_period(0.1, 0.4, 0.08 + 0.03, stable=STABLE)
    assert choice.record()["update_s"] == pytest.approx(0.03)


def test_warm_up_samples_of_a_checkpoint_from_before_the_update_time_load_with_none():
    m = DelayMeter(stable=STABLE)
    m.load_state_dict({"auto.samples": np.array([[0.1, 0.2], [0.3, 0.4]])})
    assert m.samples == [(0.1, 0.2, 0.0), (0.3, 0.4, 0.0)]
    again = DelayMeter(stable=STABLE)
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
    """c = 0.1 s, T = 0.95 s: hiding needs d = 10, stable from k = 21. ``--delay-max 6`` leaves no stable
    (k, d) with d > 1 (the map: d >= 2 needs k >= 17): d = 1, most of the allreduce exposed; amortising
    that asks for k = 6, which is unstable (1.67 < 1.9): k = 5. With W = 1 s of CPU per period,
    amortising asks for k = 27, or 8 at the cap."""
    m = DelayMeter(hi=6, stable=STABLE)
    for _ in range(10):
        m.add(0.1, 0.95)
    capped = m.choose(FakeComm(), step=10)
    assert (capped.k, capped.d, capped.hi) == (5, 1, 6) and "1-6" in capped.text()
    uncapped = decide({"c": 0.1, "T": 0.95, "fewest": -10}, 10, stable=STABLE)
    assert (uncapped.k, uncapped.d) \
        == choose_period(0.1, 0.95, stable=STABLE) == (21, 10)
    free = decide({"c": 0.1, "T": 0.2, "cpu": 1.0, "fewest": -10}, 10, stable=STABLE)
    at_cap = decide({"c": 0.1, "T": 0.2, "cpu": 1.0, "fewest": -10}, 10, hi=8, stable=STABLE)
    assert (free.k, free.d) == choose_period(0.1, 0.2, 1.0, stable=STABLE) == (27, 3)
    assert (at_cap.k, at_cap.d) == choose_period(0.1, 0.2, 1.0, hi=8, stable=STABLE) == (8, 1)
    zero = decide({"c": 0.0, "T": 0.2, "fewest": -10}, 10, hi=8, stable=STABLE)     # nothing hides it: d = 1, amortised
    assert (zero.k, zero.d) == (8, 1) and STABLE(8, 1)


def test_a_fixed_merge_delay_is_kept_and_k_chosen_around_it():
    m = DelayMeter(d=3, stable=STABLE)
    for _ in range(10):
        m.add(0.1, 0.05)
    choice = m.choose(FakeComm(), step=10)
    assert (choice.k, choice.d) == choose_period(0.1, 0.05, d=3, stable=STABLE) and choice.d == 3 <= choice.k
    assert STABLE(choice.k, 3) and not any(STABLE(k, 3) for k in range(3, choice.k))


# --- the meter and the agreement ------------------------------------------------------------

def agree(meters, step=10):
    """What every rank gets: each meter's summary reduced with max, as allreduce_scalars does."""
    summaries = [m.summary() for m in meters]
    agreed = {key: max(s[key] for s in summaries) for key in summaries[0]}
    return [decide(agreed, step, stable=STABLE) for _ in meters]


def test_noisy_ranks_that_would_choose_differently_alone_agree_on_one_k():
    rng = np.random.default_rng(0)
    meters, alone = [], set()
    for rank in range(4):
        m = DelayMeter(stable=STABLE)
        c0 = 0.010 * (1 + 0.1 * rank)           # ranks differ in speed
        for _ in range(30):
            m.add(c0 * rng.uniform(0.9, 1.1), 0.0485 * rng.uniform(0.9, 1.1))
        meters.append(m)
        s = m.summary()
        alone.add(choose_period(s["c"], s["T"])[1])
    assert len(alone) > 1, "the test needs ranks whose own medians choose different k"
    choices = agree(meters)
    assert len({c.k for c in choices}) == 1
    slowest = max(m.summary()["c"] for m in meters)
    assert choices[0].compute_s == slowest
    assert (choices[0].k, choices[0].d) == choose_period(slowest, choices[0].allreduce_s, stable=STABLE)


def test_median_of_the_last_window_ignores_a_cold_first_step_and_a_pause():
    m = DelayMeter(stable=STABLE)
    m.add(5.0, 9.0)                              # cold first step
    for i in range(WINDOW + 5):
        m.add(0.1, 0.45 if i != 12 else 30.0)    # one pause in the allreduce
    assert len(m.samples) == WINDOW
    (choice,) = agree([m], step=25)
    assert (choice.d, choice.compute_s, choice.allreduce_s, choice.samples, choice.step) == (5, 0.1, 0.45, WINDOW, 25)
    assert (choice.k, choice.d) == choose_period(0.1, 0.45, stable=STABLE)


def test_fewest_samples_is_reported_and_a_zero_compute_clock_gives_the_longest_delay():
    a, b = DelayMeter(stable=STABLE), DelayMeter(stable=STABLE)
    for _ in range(3):
        a.add(0.0, 0.2)
    for _ in range(7):
        b.add(0.0, 0.1)
    choice = agree([a, b])[0]
    assert choice.samples == 3 and choice.k == DELAY_RANGE[1]
    assert decide({"c": 0.0, "T": 0.0, "fewest": -5}, 5, stable=STABLE).k == DELAY_RANGE[0]


def test_meter_and_choice_round_trip_through_their_state():
    m = DelayMeter(stable=STABLE)
    assert m.state_dict() == {}
    for i in range(4):
        m.add(0.1 * i, 0.2 * i)
    again = DelayMeter(stable=STABLE)
    again.load_state_dict(m.state_dict())
    assert again.samples == m.samples
    choice = DelayChoice(k=7, compute_s=0.08, allreduce_s=0.5, step=40, samples=20)
    assert DelayChoice.from_state(choice.state()) == choice
    record = choice.record()
    assert record["kind"] == "delay" and record["delay"] == 7 and record["step"] == 40
    assert "k = 7" in choice.text()
    with_d = DelayChoice(k=7, compute_s=0.08, allreduce_s=0.5, step=40, samples=20, d=2)
    assert DelayChoice.from_state(with_d.state()) == with_d and with_d.state()["auto.d"] == 2
    assert with_d.record()["window"] == 2 and "k = 7, d = 2" in with_d.text()


# --- settings --------------------------------------------------------------------------------

@pytest.mark.parametrize("settings, words", [
    (dict(algo="ssgd"), "does not apply to --algo ssgd"),
    (dict(algo="asgd"), "does not apply to --algo asgd"),
    (dict(algo="odsgd"), "odsgd is ssd with --delay 1"),
    (dict(algo="ssd", warmup_steps=0), f"needs --warmup-steps >= {MIN_WARMUP_STEPS} (got 0)"),
    (dict(algo="ssd", comm="period", period_rule="delta-merge", warmup_steps=MIN_WARMUP_STEPS - 1),
     "lengthen the warm-up"),
    (dict(algo="localsgd"), "--delay auto does not apply to --algo localsgd"),
    (dict(algo="ssd", comm="step"), "--delay auto does not apply to --comm step"),
    (dict(algo="ssd", comm="step", local_update="glu-paper"), "--delay auto does not apply to --comm step"),
    (dict(algo="ssd", comm="period", period_rule="delta-own"), "--period-rule delta-own has no merge delay"),
    (dict(algo="ssd", comm="period", period_rule="replay"), "--period-rule replay has no merge delay"),
])
def test_auto_is_refused_where_it_cannot_apply(settings, words):
    with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)")):
        AlgoConfig(delay="auto", **{"warmup_steps": 50, **settings}).validate(world_size=2)


@pytest.mark.parametrize("settings", [dict(algo="ssd"), dict(algo="ssd", comm="period"),
                                      dict(algo="ssd", comm="period", period_rule="delta-merge"),
                                      dict(algo="ssd", comm="period", period_rule="delta-merge", merge_delay=3)])
def test_auto_is_kept_by_validate_for_delta_merge(settings):
    cfg = AlgoConfig(delay="auto", warmup_steps=MIN_WARMUP_STEPS, **settings).validate(world_size=2)
    assert cfg.delay == "auto" and cfg.period_rule == "delta-merge"


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
    (["--comm", "step", "--delay", "auto"], "--delay auto does not apply to --comm step"),
    (["--algo", "localsgd", "--delay", "auto"], "--delay auto does not apply to --algo localsgd"),
    (["--period-rule", "delta-own", "--delay", "auto"], "--period-rule delta-own has no merge delay"),
    (["--merge-delay", "6"], "--merge-delay 6 is longer than the period --delay 5"),
    (["--period-rule", "delta-own", "--merge-delay", "2"], "--merge-delay applies only to --comm period "
                                                           "--period-rule delta-merge"),
])
def test_bad_auto_settings_are_one_line_and_exit_2(args, needle):
    from tests.conftest import assert_one_line_error, run_cli

    assert_one_line_error(run_cli(["train", "--no-progress-bar"] + args, ranks=2, timeout=120), needle)


def test_bench_train_knows_the_auto_variant():
    from ssdmpi.bench.train import parse_variant

    v = parse_variant("ssd:period:auto")
    assert (v.name, v.train_flags()) == ("ssd-period-kauto", ["--algo", "ssd", "--comm", "period", "--delay", "auto"])
    v = parse_variant("ssd:period:auto:5")
    assert (v.name, v.train_flags()) == ("ssd-period-kauto-max5", ["--algo", "ssd", "--comm", "period", "--delay",
                                                                   "auto", "--delay-max", "5"])
    v = parse_variant("ssd:period:20:d3")
    assert (v.name, v.train_flags()) == ("ssd-period-k20-d3", ["--algo", "ssd", "--comm", "period", "--delay", "20",
                                                               "--merge-delay", "3"])
    for bad in ("ssd:step:auto", "localsgd:auto", "ssd:period:3:d4", "ssd:period:5:d0", "ssd:step:5:d1"):
        with pytest.raises(UserError, match="ssd:period also takes auto"):
            parse_variant(bad)


def test_summary_text_names_the_chosen_k():
    from ssdmpi.metrics import summary_text

    choice = DelayChoice(k=7, compute_s=0.08, allreduce_s=0.5, step=40, samples=20, cpu_s=0.03, update_s=0.01, d=3)
    text = summary_text({"algo": "ssd", "step": 100, "delay_auto": choice.record()})
    assert ("delay auto: k = 7, d = 3 (chosen at step 40: compute 80.0 ms, allreduce 500.0 ms per step, "
            "30.0 ms CPU in flight, update 10.0 ms)") in text
    assert "delay auto" not in summary_text({"algo": "ssd", "step": 100})


class TimedComm(FakeComm):
    """``FakeComm`` whose allreduces take ``seconds[kind]`` of the (fake) clock: a float32 one, or one
    started with a compressor (``--comm-dtype``)."""

    def __init__(self, clock, seconds):
        super().__init__(polls=1)
        self.clock, self.seconds, self.kinds = clock, seconds, []

    def allreduce_start(self, buf, average=True, compressor=None):
        kind = "float32" if compressor is None else compressor
        self.kinds.append(kind)
        self.clock[0] += self.seconds[kind]
        return super().allreduce_start(buf, average)


def test_probe_ratio_is_the_compressed_sums_median_time_over_float32s(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    comm = TimedComm(clock, {"float32": 0.2, "int8": 0.05})
    assert auto_delay.probe_ratio(comm, np.zeros(4, np.float32), "int8", repeats=3) == pytest.approx(0.25)
    assert comm.kinds == ["float32", "int8"] * 3 and comm.barriers == 6     # interleaved, every rank together


def test_choose_scales_the_allreduce_time_by_the_ratio_and_records_it():
    """T = 0.4 s of float32 in the warm-up, the compressed sum a quarter of that: d hides 0.1 s."""
    m = DelayMeter(stable=STABLE)
    for _ in range(10):
        m.add(0.1, 0.4)
    choice = m.choose(FakeComm(), step=10, ratio=lambda: 0.25)
    assert choice.allreduce_s == pytest.approx(0.1) and choice.comm_ratio == 0.25
    assert (choice.k, choice.d) == choose_period(0.1, 0.1, 0.0, stable=STABLE)
    assert choice.d < m.choose(FakeComm(), step=10).d
    assert choice.record()["comm_ratio"] == 0.25 and "float32 x 0.25, measured" in choice.text()
    assert DelayChoice.from_state(choice.state()) == choice
    plain = m.choose(FakeComm(), step=10)
    assert plain.comm_ratio == 1.0 and "auto.comm_ratio" not in plain.state()
