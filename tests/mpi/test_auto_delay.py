"""``--delay auto`` on N MPI ranks (tests/run.py: 1, 2 and 4).

The oracle: auto changes only WHEN k and the merge delay d are fixed, never the math, so a run
with ``--delay auto`` must equal, bit for bit, the run with the fixed ``--delay K --merge-delay D``
it chose; and every rank must choose the same (K, D). Timings are real in the first test
(whatever (K, D) this machine gives) and injected in the others (rank-dependent and noisy, so that
each rank's own measurements would choose differently; injected per process, so a resumed run
that measured again would choose another (K, D) and be caught).
"""

import json
import os

import numpy as np
import pytest
from mpi4py import MPI

from ssdmpi.algos import AlgoConfig, auto_delay, build_algorithm, registry
from ssdmpi.algos.auto_delay import DelayMeter, choose_period, stable_region
from ssdmpi.cli import main
from ssdmpi.data import ShardedLoader as Loader
from ssdmpi.errors import REQUEUE_EXIT
from tests.checkpoints import fields
from tests.mpi.test_algos import B, communicator, dataset, tiny_mlp  # noqa: F401 (communicator: a fixture)
from tests.mpi.test_resume import all_ranks, newest_checkpoint, shared_tmpdir

SETTINGS = [dict(algo="ssd", comm="period", period_rule="delta-merge"),
            dict(algo="ssd", comm="period", period_rule="delta-merge", merge_delay=2)]
MERGE_MOMENTUM = registry.SETTINGS["merge_momentum"].default     # the runs below keep the default
STABLE = stable_region(registry.RULES["delta-merge"].linear_map, 0.9, "merge_delay", {"merge_momentum": MERGE_MOMENTUM})
WARMUP = 8
# the meter's own method: inject() wraps it, never an earlier inject()'s wrapper (a second inject
# must change what the meter sees, or a resumed run that measured again would go unseen)
ADD = DelayMeter.add


def inject(monkeypatch, compute_s: float, allreduce_s: float, seed: int = 0, skew: float = 0.01, noise: float = 0.02,
           update_s: float = 0.0):
    """Make every rank's meter see these times: compute slower by ``skew`` per rank, both times
    with uniform noise of +-``noise``, and ``update_s`` of update time (exact); the CPU probe still
    runs its allreduces, but reports no CPU time (so the per-period work is ``update_s``)."""
    real_probe = auto_delay.probe_cpu
    monkeypatch.setattr(auto_delay, "probe_cpu", lambda comm, buf, *a, **kw: real_probe(comm, buf, *a, **kw) * 0.0)
    rank = MPI.COMM_WORLD.Get_rank()
    rng = np.random.default_rng(seed + 17 * rank)
    original = ADD

    def add(self, c, T, u=0.0):
        original(self, compute_s * (1 + skew * rank) * rng.uniform(1 - noise, 1 + noise),
                 allreduce_s * rng.uniform(1 - noise, 1 + noise), update_s)

    monkeypatch.setattr(DelayMeter, "add", add)


def trajectory(cfg, comm, steps_after_switch):
    """Run ``cfg`` to the switch plus ``steps_after_switch(k)`` steps (k is known only at the switch);
    return the algorithm and every step's W and L."""
    N, rank = comm.size, comm.rank
    x, y = dataset()
    algo = build_algorithm(cfg, tiny_mlp()(), comm)
    loader = Loader(x, y, B, rank, N, seed=3)
    out = []
    while algo.t < WARMUP or algo.t < WARMUP + steps_after_switch(algo.k):
        algo.step(*loader.next_batch())
        L = algo.local_weights()
        out.append((algo.global_weights().copy(), None if L is None else L.copy()))
    return algo, out


def auto_equals_fixed(cfg, comm):
    """Run auto, then the fixed (k, d) it chose: every step's W and L bitwise equal; return (k, auto)."""
    auto, got = trajectory(AlgoConfig(delay="auto", warmup_steps=WARMUP, lr=0.05, **cfg), comm, lambda k: 4 * k + 2)
    k, d = auto.k, auto.rule_settings["merge_delay"]      # what the rule was built with
    assert all_ranks((k, d)) == [(k, d)] * comm.size, "ranks chose different (k, d)"
    assert (auto.delay_choice.k, auto.delay_choice.d) == (k, d) and auto.delay_choice.step == WARMUP
    assert d == cfg.get("merge_delay", d) and 1 <= d <= k and STABLE(k, d)
    fixed = dict(cfg, merge_delay=d)
    _, want = trajectory(AlgoConfig(delay=k, warmup_steps=WARMUP, lr=0.05, **fixed), comm, lambda _: 4 * k + 2)
    assert len(got) == len(want) == WARMUP + 4 * k + 2
    for t, ((W, L), (W0, L0)) in enumerate(zip(got, want)):
        assert np.array_equal(W, W0), f"W differs at t={t} (k={k})"
        assert (L is None and L0 is None) or np.array_equal(L, L0), f"L differs at t={t} (k={k})"
    return k, auto


@pytest.mark.parametrize("cfg", SETTINGS, ids=lambda d: "-".join(map(str, d.values())))
def test_auto_with_real_timings_equals_the_fixed_k_it_chose(communicator, cfg):  # noqa: F811
    auto_equals_fixed(cfg, communicator)


@pytest.mark.parametrize("cfg", SETTINGS, ids=lambda d: "-".join(map(str, d.values())))
def test_noisy_ranks_agree_on_one_k_and_auto_equals_that_fixed_k(communicator, cfg, monkeypatch):  # noqa: F811
    # compute 10, 11, 12, 13 ms on ranks 0-3, allreduce 48.5 ms, 2 ms of update: alone, rank 3 would
    # choose d = 4, the others 5 (and k from stability: 16 with d = 5, 17 with d = 4)
    inject(monkeypatch, compute_s=0.010, allreduce_s=0.0485 / (1 + auto_delay.SLACK), skew=0.1, update_s=0.002)
    k, auto = auto_equals_fixed(cfg, communicator)
    summary = auto._meter.summary()
    own = all_ranks(choose_period(summary["c"], summary["T"], summary["u"], stable=STABLE,
                                  d=cfg.get("merge_delay"))[1])
    assert auto.delay_choice.d == min(own) and auto.delay_choice.d in ((4, 5) if "merge_delay" not in cfg else (2,))
    if communicator.size == 4 and "merge_delay" not in cfg:
        assert len(set(own)) > 1, f"the ranks' own medians should disagree here: {own}"


# --- ssdmpi train: resume, records ----------------------------------------------------------

# What the injected times choose before / after the stop: d = 1 (10 ms of compute hide a 5 ms
# allreduce), and k the smallest stable period (the map with the default momentum merge: 12, 14, 15,
# ... at d = 1) that amortises the update time: 2 ms ask for k >= 4, 12 ms for k >= 14.
(K_FIRST, D_FIRST, U_FIRST), (K_OTHER, D_OTHER, U_OTHER) = (12, 1, 0.002), (14, 1, 0.012)
S = 2 * (WARMUP + 3 * K_FIRST + 2)          # 92: S/2 = 46 is m = 38, two steps into a period
ARGS = ["--dataset", "digits", "--model", "mlp", "--widths", "32", "--batch-size", "8", "--lr", "0.05",
        "--seed", "5", "--eval-every", "0", "--log-every", "1000", "--keep-checkpoints", "0", "--no-progress-bar",
        "--algo", "ssd", "--comm", "period", "--warmup-steps", str(WARMUP), "--steps", str(S)]


def times_for(k: int) -> dict:
    """``inject``'s times that its default skew and noise turn into (k, d) = (K_FIRST, D_FIRST) or
    (K_OTHER, D_OTHER) at 1-4 ranks."""
    return dict(compute_s=0.010, allreduce_s=0.005, update_s=U_FIRST if k == K_FIRST else U_OTHER)


def same_final_state(a: str, b: str) -> list:
    """Arrays of the final checkpoints that differ, leaving out the measurements themselves."""
    A, Bs = ({k: v for k, v in fields(os.path.join(d, "checkpoints", newest_checkpoint(d))).items()
              if isinstance(v, np.ndarray) and v.dtype.kind == "f"} for d in (a, b))
    names = sorted(n for n in set(A) | set(Bs) if "auto." not in n)
    return [n for n in names if n not in A or n not in Bs or not np.array_equal(A[n], Bs[n])] or \
        ([] if names else ["no arrays"])


def delay_records(run_dir: str) -> list:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["kind"] == "delay"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("stop_at", [S // 2, WARMUP - 3], ids=["after-the-choice", "inside-the-warm-up"])
def test_a_two_part_auto_run_equals_one_fixed_run_and_resume_keeps_k(monkeypatch, stop_at):
    """Stopped after the choice, the resumed run keeps k (a new measurement would give K_OTHER); stopped
    inside the warm-up, it measures on with the checkpointed samples (5 of the 8 say K_FIRST, so the
    medians do). Either way the result is bitwise the fixed --delay K_FIRST run."""
    size, ok = MPI.COMM_WORLD.Get_size(), [0] * MPI.COMM_WORLD.Get_size()
    for k, d in ((K_FIRST, D_FIRST), (K_OTHER, D_OTHER)):
        t = times_for(k)
        for c, T in ((t["compute_s"] * 1.03 * 1.02, t["allreduce_s"] * 0.98), (t["compute_s"] * 0.98,
                                                                                 t["allreduce_s"] * 1.02)):
            assert choose_period(c, T, t["update_s"], stable=STABLE) == (k, d)
    tmp = shared_tmpdir()
    fixed, split = os.path.join(tmp, "fixed"), os.path.join(tmp, "split")
    assert all_ranks(main(["train", "--run-dir", fixed, "--delay", str(K_FIRST), "--merge-delay", str(D_FIRST)]
                          + ARGS)) == ok

    inject(monkeypatch, **times_for(K_FIRST), seed=1)
    codes = all_ranks(main(["train", "--run-dir", split, "--delay", "auto", "--stop-at-step", str(stop_at)] + ARGS))
    assert codes == [REQUEUE_EXIT] * size
    inject(monkeypatch, **times_for(K_OTHER), seed=2)      # what a second measurement would see
    assert all_ranks(main(["train", "--run-dir", split, "--delay", "auto", "--resume", "auto"] + ARGS)) == ok

    want = K_FIRST
    if MPI.COMM_WORLD.Get_rank() == 0:
        records = delay_records(split)
        assert [(r["delay"], r["window"]) for r in records] == [(want, D_FIRST)] and records[0]["step"] == WARMUP
        with open(os.path.join(split, "summary.json")) as f:
            summary = json.load(f)
        assert summary["delay_auto"]["delay"] == want and summary["config"]["delay"] == "auto"
        with open(os.path.join(split, "config.yaml")) as f:
            text = f.read()
        assert "\ndelay: auto\n" in text and f"# delay auto: k = {want}, d = {D_FIRST} " in text
    diff = MPI.COMM_WORLD.bcast(same_final_state(fixed, split) if MPI.COMM_WORLD.Get_rank() == 0 else None)
    assert diff == [], f"the auto run is not bitwise the fixed --delay {K_FIRST} run: {diff}"


@pytest.mark.timeout(300)
def test_resumed_inside_the_warm_up_measures_with_the_samples_it_had(monkeypatch):
    """The samples before the stop are checkpointed: the resumed run's medians include them."""
    size = MPI.COMM_WORLD.Get_size()
    tmp = shared_tmpdir()
    run = os.path.join(tmp, "run")
    seen = []
    original = auto_delay.decide
    monkeypatch.setattr(auto_delay, "decide",
                        lambda agreed, *a, **kw: seen.append(agreed) or original(agreed, *a, **kw))
    inject(monkeypatch, **times_for(K_OTHER), seed=3)
    assert all_ranks(main(["train", "--run-dir", run, "--delay", "auto", "--stop-at-step", "5"] + ARGS)) == \
        [REQUEUE_EXIT] * size
    assert all_ranks(main(["train", "--run-dir", run, "--delay", "auto", "--resume", "auto"] + ARGS)) == [0] * size
    assert len(seen) == 1 and seen[0]["fewest"] == -WARMUP     # 5 steps before the stop + 3 after


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cap", [13, 12])
def test_delay_max_caps_the_choice_and_the_capped_run_equals_that_fixed_k(monkeypatch, cap):
    """``--delay-max 13`` (or 12) where the measurements ask for (14, 1): amortised against the cap,
    k = 9 (or 8) would do, which is unstable at d = 1 (the map with the default momentum merge: 12 is
    the one stable k up to 13), so every rank takes 12 (at ``--delay-max 12``: the cap itself); the
    record and ``config.yaml`` say so, and the run is bitwise the fixed ``--delay 12 --merge-delay 1``
    run."""
    size = MPI.COMM_WORLD.Get_size()
    tmp = shared_tmpdir()
    fixed, capped = os.path.join(tmp, "fixed"), os.path.join(tmp, "capped")
    assert all_ranks(main(["train", "--run-dir", fixed, "--delay", "12", "--merge-delay", "1"] + ARGS)) == [0] * size
    inject(monkeypatch, **times_for(K_OTHER), seed=4)
    assert all_ranks(main(["train", "--run-dir", capped, "--delay", "auto", "--delay-max", str(cap)] + ARGS)) == \
        [0] * size
    if MPI.COMM_WORLD.Get_rank() == 0:
        (record,) = delay_records(capped)
        assert (record["delay"], record["window"]) == (12, 1) and record["range"] == [1, cap], record
        with open(os.path.join(capped, "config.yaml")) as f:
            assert f"\ndelay_max: {cap}\n" in f.read()
    diff = MPI.COMM_WORLD.bcast(same_final_state(fixed, capped) if MPI.COMM_WORLD.Get_rank() == 0 else None)
    assert diff == [], f"the capped auto run is not bitwise the fixed --delay 12 run: {diff}"
