"""The blocking average in fragments (``--fragments``, ``--fragment-delay``, ``--fragment-alpha``: Streaming
DiLoCo) on MPI ranks (``mpiexec -n 1/2/4``): the MPI code path against its reference twin
(ssdmpi/verify/fragments_twin.py) after every iteration, with and without the outer optimizer; its state
through a checkpoint mid-period and with a fragment's sum in flight; a run stopped and resumed through the
command line; a resume on half the ranks; the bytes each fragment's post puts on the wire.

Exactness as tests/mpi/test_algos.py: bitwise at 1 and 2 ranks; at 4 ranks MPI's float64 summation order is
the library's, and a relative 1e-12 is allowed.
"""

import os

import numpy as np
import pytest
from mpi4py import MPI

from ssdmpi.algos import AlgoConfig, build_algorithm
from ssdmpi.algos.fragments import HELD, HELD_MEAN
from ssdmpi.comm.communicator import Communicator
from ssdmpi.comm.gradients import wire_bytes
from ssdmpi.data import ShardedLoader as Loader
from ssdmpi.nn import build_model
from ssdmpi.verify.fragments_twin import FragmentsTwin
from ssdmpi.verify.reference import Simulation
from tests.checkpoints import fields
from tests.mpi.test_algos import (
    CLASSES,
    FEATURES,
    B,
    assert_same,
    cfg_id,
    dataset,
    hdf5_round_trip,
    resumed_run,
    w_hash,
    with_and_without_drain,
)
from tests.mpi.test_resize import WORLD, copied_on_rank_0, train
from tests.mpi.test_resume import COMMON, WARMUP, S, shared_tmpdir, stop_and_resume_differences
from tests.unit.test_resize import BASE, STEPS, STOP


@pytest.fixture
def communicator():
    c = Communicator(MPI.COMM_WORLD)
    yield c
    c.free()


def four_layers(dtype=np.float64, seed=3):
    """An MLP of four Linear layers (88, 72, 72 and 27 parameters): up to four fragments."""
    return lambda: build_model("mlp", (FEATURES,), CLASSES, widths=(8, 8, 8), dtype=dtype, seed=seed)


NESTEROV = dict(outer_optimizer="nesterov", outer_lr=0.7, outer_momentum=0.9)
HEAVY_BALL = dict(outer_optimizer="sgd", outer_lr=0.5, outer_momentum=0.8)
LOCAL = dict(algo="localsgd")

# (k, F, tau, alpha): one fragment delayed; two and four, blocking and delayed; mixing back
SCHEDULES = [(4, 1, 2, 0.0), (4, 2, 0, 0.0), (4, 2, 1, 0.0), (4, 4, 0, 0.0), (8, 4, 1, 0.0), (6, 2, 2, 0.5),
             (4, 2, 0, 0.25), (6, 3, 1, 1.0)]
CONFIGS = [dict(**LOCAL, delay=k, fragments=f, fragment_delay=tau, fragment_alpha=a) for k, f, tau, a in SCHEDULES]
CONFIGS += [dict(**c, **NESTEROV) for c in CONFIGS[1:6]]
CONFIGS += [dict(**LOCAL, delay=4, fragments=2, fragment_delay=1, **HEAVY_BALL, lr_schedule="cosine", total_steps=30),
            dict(**LOCAL, delay=6, fragments=3, fragment_delay=1, fragment_alpha=0.5, optimizer="adamw", lr=0.01,
                 grad_clip=0.3, **NESTEROV)]


def run_both(communicator, cfg, steps, factory, dtype=np.float64, seed=7, check=None):
    """The MPI algorithm and the reference side by side for ``steps`` iterations, then ``finalize``;
    ``check(t, algo, sim)`` after every iteration."""
    N, rank = communicator.size, communicator.rank
    x, y = dataset(dtype=dtype)
    algo = build_algorithm(cfg, factory(), communicator)
    loader = Loader(x, y, B, rank, N, seed=seed)
    sim = Simulation(cfg, factory, [Loader(x, y, B, r, N, seed=seed) for r in range(N)], N)
    for t in range(steps):
        loss = algo.step(*loader.next_batch())
        sim.step()
        assert loss == sim.losses[rank], f"loss at t={t}"
        if check is not None:
            check(t, algo, sim)
    algo.finalize()
    sim.finalize()
    return algo, sim


@pytest.mark.parametrize("settings", CONFIGS, ids=cfg_id)
def test_matches_the_twin_after_every_iteration(communicator, settings):
    """``W``, this rank's ``L``, the outer buffer and the counters equal the twin's after every iteration
    (warm-up, switch, four periods and part of a fifth) and after ``finalize``; replicas of ``W`` hash the same."""
    N, rank = communicator.size, communicator.rank
    exact = N <= 2
    cfg = AlgoConfig(**{"warmup_steps": 3, "lr": 0.05, **settings})
    k = settings["delay"]

    def check(t, algo, sim):
        assert (algo.t, algo.s, algo.stage) == (sim.t, sim.s, sim.stage), f"counters at t={t}"
        assert_same(algo.global_weights(), sim.W, exact, f"W at t={t}")
        if sim.outer is not None:
            assert_same(algo.B, sim.B, exact, f"outer momentum at t={t}")
        if sim.stage == "delay":
            assert_same(algo.local_weights(), sim.L[rank], exact, f"L[{rank}] at t={t}")
        assert len(set(MPI.COMM_WORLD.allgather(w_hash(algo.global_weights())))) == 1, f"replicas of W at t={t}"

    algo, sim = run_both(communicator, cfg, 3 + 4 * k + k // 2 + 1, four_layers(), check=check)
    assert isinstance(sim.twin, FragmentsTwin)
    assert [hi - lo for lo, hi in algo.cuts] == [hi - lo for lo, hi in sim.twin.cuts]
    assert algo.s == sim.s
    assert_same(algo.global_weights(), sim.W, exact, "W after finalize")
    assert_same(algo.local_weights(), sim.L[rank], exact, "L after finalize")
    if sim.outer is not None:
        assert_same(algo.B, sim.B, exact, "outer momentum after finalize")


@pytest.mark.parametrize("settings", [CONFIGS[2], CONFIGS[5], CONFIGS[10]], ids=cfg_id)
def test_float32_is_bitwise_up_to_two_ranks(communicator, settings):
    if communicator.size > 2:
        pytest.skip("bitwise float32 comparison needs a summation order MPI fixes only for <= 2 ranks")
    rank = communicator.rank
    cfg = AlgoConfig(warmup_steps=2, lr=0.05, **settings)

    def check(t, algo, sim):
        assert np.array_equal(algo.global_weights(), sim.W), f"W at t={t}"
        if sim.stage == "delay":
            assert np.array_equal(algo.local_weights(), sim.L[rank]), f"L at t={t}"

    algo, sim = run_both(communicator, cfg, 3 * settings["delay"] + 3, four_layers(np.float32), dtype=np.float32,
                         seed=1, check=check)
    assert np.array_equal(algo.global_weights(), sim.W)


@pytest.mark.parametrize("outer", [{}, NESTEROV], ids=["plain", "outer"])
def test_one_fragment_at_once_is_the_plain_average_s_twin_bit_for_bit(communicator, outer):
    """The defaults (one fragment, no delay, no mixing) run against the plain average's own twin, and naming
    them changes no bit."""
    N, rank = communicator.size, communicator.rank
    exact = N <= 2
    runs = []
    for named in ({}, dict(fragments=1, fragment_delay=0, fragment_alpha=0.0)):
        cfg = AlgoConfig(**LOCAL, warmup_steps=2, lr=0.05, delay=3, **outer, **named)
        algo, sim = run_both(communicator, cfg, 14, four_layers())
        assert type(sim.twin).__name__ == "LocalSGDTwin" and algo.state_dict().keys().isdisjoint({HELD, HELD_MEAN})
        assert_same(algo.global_weights(), sim.W, exact, "W")
        assert_same(algo.local_weights(), sim.L[rank], exact, "L")
        runs.append(np.array(algo.global_weights()))
    assert np.array_equal(runs[0], runs[1])


@pytest.mark.parametrize("buckets", [None, 256], ids=["fused", "buckets"])
def test_every_progress_strategy_gives_the_twin_s_bits(make_comm, buckets):
    """A fragment's sum in flight over a few steps moves under each progress strategy (blocking, test, poll,
    thread), in one request or in buckets, and lands the twin's bits."""
    communicator = make_comm(bucket_bytes=buckets)
    rank, exact = communicator.rank, communicator.size <= 2
    cfg = AlgoConfig(**LOCAL, warmup_steps=2, lr=0.05, delay=8, fragments=2, fragment_delay=3, **NESTEROV)

    def check(t, algo, sim):
        assert_same(algo.global_weights(), sim.W, exact, f"W at t={t}")
        if sim.stage == "delay":
            assert_same(algo.local_weights(), sim.L[rank], exact, f"L at t={t}")

    run_both(communicator, cfg, 2 + 2 * 8 + 5, four_layers(), check=check)


def test_each_fragment_post_puts_its_own_bytes_on_the_wire(communicator):
    """Every delay iteration that posts a fragment records one allreduce of that fragment's bytes (``2 (N-1)/N``
    of them), and a period's posts add up to one allreduce of the whole model."""
    N, rank = communicator.size, communicator.rank
    cfg = AlgoConfig(**LOCAL, warmup_steps=2, lr=0.05, delay=8, fragments=4, fragment_delay=1)
    x, y = dataset()
    algo = build_algorithm(cfg, four_layers()(), communicator)
    loader = Loader(x, y, B, rank, N, seed=2)
    for _ in range(2):
        algo.step(*loader.next_batch())
    sizes = [(hi - lo) * 8 for lo, hi in algo.cuts]
    assert sizes == [88 * 8, 72 * 8, 72 * 8, 27 * 8]
    seen = []
    for _ in range(8):
        communicator.stats.reset()
        algo.step(*loader.next_batch())
        seen.append(communicator.stats.snapshot()["bytes_sent"])
    # fragment f posted after q = 2f + 1 local steps, merged (its bytes recorded) one step later
    assert seen == [0, wire_bytes(sizes[0], N), 0, wire_bytes(sizes[1], N), 0, wire_bytes(sizes[2], N), 0,
                    wire_bytes(sizes[3], N)]
    assert sum(seen) == sum(wire_bytes(s, N) for s in sizes)


STATES = [dict(**LOCAL, delay=4, fragments=2, fragment_delay=1), dict(**LOCAL, delay=6, fragments=3, fragment_delay=1,
                                                                        fragment_alpha=0.5, **NESTEROV),
          dict(**LOCAL, delay=4, fragments=1, fragment_delay=3, optimizer="adamw", lr=0.01, **NESTEROV),
          dict(**LOCAL, delay=4, fragments=4, **HEAVY_BALL)]


@pytest.mark.parametrize("settings", STATES, ids=cfg_id)
@pytest.mark.parametrize("stop_at", [2, 8, 9, 10, 12])
def test_state_round_trip_continues_bitwise(communicator, settings, stop_at):
    """Exported mid-run (mid-period; with a fragment's sum in flight: held, its mean replicated) through HDF5
    into a fresh algorithm on another initialisation: the run goes on as if it had never stopped, every field
    of the final state equal."""
    N, rank = communicator.size, communicator.rank
    cfg = AlgoConfig(**{"lr": 0.05, "warmup_steps": 3, **settings})
    x, y = dataset()
    total = 22

    straight = build_algorithm(cfg, four_layers()(), communicator)
    loader = Loader(x, y, B, rank, N, seed=4)
    for _ in range(total):
        straight.step(*loader.next_batch())

    first = build_algorithm(cfg, four_layers()(), communicator)
    loader = Loader(x, y, B, rank, N, seed=4)
    for _ in range(stop_at):
        first.step(*loader.next_batch())
    state = first.state_dict()
    tau, h = settings.get("fragment_delay", 0), settings["delay"] // settings.get("fragments", 1)
    q = (stop_at - 3) % settings["delay"]
    in_flight = stop_at > 3 and tau and h - tau <= q % h < h
    if tau and stop_at >= 3:
        assert (int(state[HELD]) >= 0) == bool(in_flight), (state[HELD], q)
    if in_flight:
        assert HELD_MEAN in first.replicated()
        assert len(set(MPI.COMM_WORLD.allgather(w_hash(state[HELD_MEAN])))) == 1
    loader_state = loader.state_dict()
    del first
    state = hdf5_round_trip(state)

    resumed = resumed_run(cfg, four_layers(seed=99)(), communicator, state, loader_state, x, y, total - stop_at)
    a, b = resumed.state_dict(), straight.state_dict()
    assert set(a) == set(b)
    assert [key for key in a if not np.array_equal(a[key], b[key])] == []


def test_drain_after_every_iteration_changes_nothing(communicator):
    cfg = AlgoConfig(**LOCAL, warmup_steps=2, lr=0.05, delay=6, fragments=3, fragment_delay=1, **NESTEROV)
    plain, drained = with_and_without_drain(cfg, four_layers(), communicator, 17, "finalize", *dataset())
    assert np.array_equal(plain.global_weights(), drained.global_weights())
    assert np.array_equal(plain.local_weights(), drained.local_weights())
    assert np.array_equal(plain.B, drained.B) and plain.s == drained.s


STREAMING = ["--algo", "localsgd", "--delay", "4", "--fragments", "2", "--fragment-delay", "1", "--warmup-steps",
             str(WARMUP), "--outer-optimizer", "nesterov", "--outer-lr", "0.7", "--outer-momentum", "0.9"]


@pytest.mark.timeout(300)
def test_a_run_stopped_with_a_fragment_in_flight_and_resumed_matches_the_uninterrupted_one_in_every_field():
    """``ssdmpi train`` stopped at step 27 (17 delay iterations: one step into the fifth period, the first
    fragment's sum posted after it, in flight: held in the checkpoint) and resumed, against one run of 54
    steps: every saved field of the final checkpoint bitwise equal."""
    diff, compared = stop_and_resume_differences(COMMON + ["--steps", str(S)] + STREAMING, S, WARMUP, 4)
    assert diff == [], f"not bitwise identical after resume: {diff}"
    last = f"rank_{MPI.COMM_WORLD.Get_size() - 1:04d}"
    assert {"shared/algo/W", "shared/algo/outer.momentum", f"{last}/algo/L", f"{last}/algo/V",
            f"{last}/algo/{HELD}", f"{last}/loader/sample_offset"} <= set(compared)


@pytest.mark.skipif(WORLD.Get_size() % 2 or WORLD.Get_size() < 2, reason="resumes on half of the ranks")
@pytest.mark.timeout(300)
def test_a_resume_on_half_the_ranks_keeps_the_sum_in_flight_and_averages_the_local_state():
    """A run of ``N`` ranks stopped at step 27 with the first fragment's sum in flight, resumed on ``N/2``:
    ``W``, the outer buffer and the held mean exactly as saved, ``L`` and ``V`` the old ranks' mean; then the
    run goes on to its end."""
    size = WORLD.Get_size()
    tmp = shared_tmpdir()
    args = BASE + STREAMING
    run = os.path.join(tmp, "run-{part}")
    codes = train(["--run-dir", run, "--stop-at-step", str(STOP), "--steps", str(STEPS), "--batch-size",
                   str(16 // size)] + args)
    assert codes == [85] * size
    saved = os.path.join(tmp, "saved")
    copied_on_rank_0(os.path.join(tmp, "run-0", "checkpoints", f"ckpt-{STOP:08d}"), saved)
    assert train(["--resume", saved, "--run-dir", os.path.join(tmp, "rebuilt-{part}"), "--steps", str(STOP)] + args,
                 2) == [0] * size
    if WORLD.Get_rank() == 0:
        old = fields(saved)
        assert old[f"rank_0000/algo/{HELD}"] == 0
        for part in range(2):
            new = fields(os.path.join(tmp, f"rebuilt-{part}", "checkpoints", f"ckpt-{STOP:08d}"))
            for key in ("W", "outer.momentum", HELD_MEAN):
                assert np.array_equal(new[f"shared/algo/{key}"], old[f"shared/algo/{key}"]), key
            for r in range(size // 2):
                assert new[f"rank_{r:04d}/algo/{HELD}"] == 0
                for key in ("L", "V"):
                    mean = np.mean([old[f"rank_{o:04d}/algo/{key}"].astype(np.float64) for o in range(size)], axis=0)
                    assert np.allclose(new[f"rank_{r:04d}/algo/{key}"], mean, rtol=1e-5, atol=1e-6), key
    WORLD.Barrier()
    copied_on_rank_0(os.path.join(tmp, "run-0"), os.path.join(tmp, "run-1"))      # each half goes on with a copy
    assert train(["--run-dir", run, "--resume", "auto", "--steps", str(STEPS), "--batch-size",
                  str(16 // (size // 2))] + args, 2) == [0] * size
