"""``--period-rule eager`` on MPI ranks (``mpiexec -n 1/2/4``): the MPI code path against its reference twin
(ssdmpi/verify/eager_twin.py) after every iteration, its state through a checkpoint, a run stopped and resumed
through the command line, and a resume on another number of ranks.

Exactness as tests/mpi/test_algos.py: bitwise at 1 and 2 ranks (and at every rank count when every sum is the
compressed transport's, added in rank order); at 4 ranks MPI's float64 summation order is the library's, and
a relative 1e-12 is allowed.
"""

import os

import numpy as np
import pytest
from mpi4py import MPI

from ssdmpi.algos import AlgoConfig, build_algorithm
from ssdmpi.comm.communicator import Communicator
from ssdmpi.data import ShardedLoader as Loader
from ssdmpi.nn import build_model
from ssdmpi.verify.reference import Simulation
from tests.checkpoints import fields
from tests.mpi.test_algos import (
    CLASSES,
    FEATURES,
    B,
    assert_same,
    dataset,
    hdf5_round_trip,
    resumed_run,
    tiny_mlp,
    w_hash,
    with_and_without_drain,
)
from tests.mpi.test_resize import WORLD, copied_on_rank_0, train
from tests.mpi.test_resume import COMMON, WARMUP, K, S, shared_tmpdir, stop_and_resume_differences
from tests.unit.test_resize import BASE, STEPS, STOP, check_state


@pytest.fixture
def communicator():
    c = Communicator(MPI.COMM_WORLD)
    yield c
    c.free()


RULE = dict(algo="ssd", comm="period", period_rule="eager")
FLAGS = ["--algo", "ssd", "--comm", "period", "--period-rule", "eager", "--delay", str(K),
         "--warmup-steps", str(WARMUP)]

# (settings, parameter dtype): momentum SGD (a cosine lr) and AdamW in float64; float32; the int8
# transport with no warm-up (every sum the compressed one: bitwise at every rank count).
CONFIGS = [(dict(delay=3, warmup_steps=3, lr_schedule="cosine", total_steps=20), np.float64),
           (dict(delay=2, warmup_steps=2, optimizer="adamw", lr=0.01, grad_clip=0.3), np.float64),
           (dict(delay=3, warmup_steps=2), np.float32),
           (dict(delay=3, warmup_steps=0, comm_dtype="int8"), np.float32)]


@pytest.mark.parametrize("settings, dtype", CONFIGS, ids=["sgd", "adamw", "float32", "int8"])
def test_matches_the_twin_after_every_iteration(communicator, settings, dtype):
    """``W``, this rank's ``L`` and the counters equal the twin's after every iteration (warm-up, switch, five
    periods and part of a sixth), the replicas of ``W`` hash the same, and ``finalize`` ends where the twin's
    does."""
    N, rank = communicator.size, communicator.rank
    if dtype == np.float32 and "comm_dtype" not in settings and N > 2:
        pytest.skip("bitwise float32 needs a summation order MPI fixes only for <= 2 ranks")
    cfg = AlgoConfig(**{"lr": 0.05, **RULE, **settings})
    exact = N <= 2 or "comm_dtype" in settings
    x, y = dataset(dtype=dtype)
    factory = tiny_mlp(dtype)
    algo = build_algorithm(cfg, factory(), communicator)
    loader = Loader(x, y, B, rank, N, seed=7)
    sim = Simulation(cfg, factory, [Loader(x, y, B, r, N, seed=7) for r in range(N)], N)
    k, T_w = settings["delay"], settings["warmup_steps"]
    for t in range(T_w + 5 * k + 1):
        loss = algo.step(*loader.next_batch())
        sim.step()
        assert loss == sim.losses[rank]
        assert (algo.t, algo.s, algo.stage) == (sim.t, sim.s, sim.stage), f"counters at t={t}"
        assert_same(algo.global_weights(), sim.W, exact, f"W at t={t}")
        if sim.stage == "delay":
            assert_same(algo.local_weights(), sim.L[rank], exact, f"L[{rank}] at t={t}")
        assert len(set(MPI.COMM_WORLD.allgather(w_hash(algo.global_weights())))) == 1, f"replicas of W at t={t}"
    assert sim.s == T_w + 4 * k                       # the fifth period's sum is in flight
    algo.finalize()
    sim.finalize()
    assert algo.s == sim.s == T_w + 5 * k
    if exact or dtype == np.float64:
        assert_same(algo.global_weights(), sim.W, exact, "W after finalize")
    else:                                             # the partial period's float32 mean: MPI's order at 4 ranks
        assert np.abs(algo.global_weights() - sim.W).max() <= 1e-6 * np.abs(sim.W).max(), "W after finalize"


STATES = [dict(), dict(optimizer="adamw", lr=0.01), dict(comm_dtype="bfloat16")]


@pytest.mark.parametrize("settings", STATES, ids=["sgd", "adamw", "bfloat16"])
# delay 3, T_w 3: in the warm-up; right after a period end (its sum in flight); one and two iterations later
@pytest.mark.parametrize("stop_at", [2, 9, 10, 11])
def test_state_round_trip_continues_bitwise(communicator, settings, stop_at):
    """Export mid-run (drains: the sum in flight held), through HDF5, into fresh objects: the run goes on as if it
    had never stopped, every field of the final state equal; the held sum is in the state, and is the same on
    every rank."""
    N, rank = communicator.size, communicator.rank
    dtype = np.float32 if "comm_dtype" in settings else np.float64
    cfg = AlgoConfig(**{"lr": 0.05, "warmup_steps": 3, "delay": 3, **RULE, **settings})
    x, y = dataset(dtype=dtype)
    factory, total = tiny_mlp(dtype), 20

    straight = build_algorithm(cfg, factory(), communicator)
    loader = Loader(x, y, B, rank, N, seed=4)
    for _ in range(total):
        straight.step(*loader.next_batch())

    first = build_algorithm(cfg, factory(), communicator)
    loader = Loader(x, y, B, rank, N, seed=4)
    for _ in range(stop_at):
        first.step(*loader.next_batch())
    state = first.state_dict()
    if stop_at >= 6:                                  # after the second period end: a sum in flight, held
        assert int(state["period.has_Rp"]) == 1 and "period.Rp" in first.replicated()
        assert len(set(MPI.COMM_WORLD.allgather(w_hash(state["period.Rp"])))) == 1
        assert {"period.U", "period.S"} <= set(state) or {"period.U.m", "period.S"} <= set(state)
        if "comm_dtype" in settings:
            assert {"period.ef.residual", "period.ef.shard_residual"} <= set(state)
    loader_state = loader.state_dict()
    del first
    state = hdf5_round_trip(state)

    model = build_model("mlp", (FEATURES,), CLASSES, widths=(8,), dtype=dtype, seed=99)   # another init
    resumed = resumed_run(cfg, model, communicator, state, loader_state, x, y, total - stop_at)
    a, b = resumed.state_dict(), straight.state_dict()
    assert set(a) == set(b)
    assert [key for key in a if not np.array_equal(a[key], b[key])] == []


def test_drain_after_every_iteration_changes_nothing(communicator):
    cfg = AlgoConfig(**RULE, warmup_steps=2, lr=0.05, delay=3)
    plain, drained = with_and_without_drain(cfg, tiny_mlp(), communicator, 16, "finalize", *dataset())
    assert np.array_equal(plain.global_weights(), drained.global_weights())
    assert np.array_equal(plain.local_weights(), drained.local_weights())
    assert plain.s == drained.s


@pytest.mark.timeout(300)
def test_a_run_stopped_mid_period_and_resumed_matches_the_uninterrupted_one_in_every_field():
    """``ssdmpi train`` stopped at step 27 (``m = 17``, two steps into a period, the sum posted at ``m = 14`` in
    flight: held in the checkpoint) and resumed, against one run of 54 steps: every saved field of the final
    checkpoint bitwise equal (``W``, ``M``, every rank's ``L``, ``U``, ``S``, the counters, the loader)."""
    diff, compared = stop_and_resume_differences(COMMON + ["--steps", str(S)] + FLAGS, S, WARMUP, K, held=True)
    assert diff == [], f"not bitwise identical after resume: {diff}"
    last = f"rank_{MPI.COMM_WORLD.Get_size() - 1:04d}"
    assert {"shared/algo/W", "shared/algo/M", f"{last}/algo/L", f"{last}/algo/period.U", f"{last}/algo/period.S",
            f"{last}/algo/t", f"{last}/loader/sample_offset"} <= set(compared)


@pytest.mark.skipif(WORLD.Get_size() % 2 or WORLD.Get_size() < 2, reason="resumes on half of the ranks")
@pytest.mark.timeout(300)
def test_a_resume_on_half_the_ranks_merges_what_is_in_flight_and_restarts_the_period():
    """A run of ``N`` ranks stopped at step 27 with a sum in flight, resumed on ``N/2``: ``W`` gets the held mean
    and the old ranks' mean progress since the period began, ``L = S = W``, ``U`` averaged (the rules of
    ssdmpi/algos/resize.py, checked from the saved arrays by tests/unit/test_resize.py's ``check_state``);
    then the run goes on to its end."""
    size = WORLD.Get_size()
    tmp = shared_tmpdir()
    args = BASE + FLAGS
    run = os.path.join(tmp, "run-{part}")
    codes = train(["--run-dir", run, "--stop-at-step", str(STOP), "--steps", str(STEPS), "--batch-size",
                   str(16 // size)] + args)
    assert codes == [85] * size
    saved = os.path.join(tmp, "saved")
    copied_on_rank_0(os.path.join(tmp, "run-0", "checkpoints", f"ckpt-{STOP:08d}"), saved)
    assert train(["--resume", saved, "--run-dir", os.path.join(tmp, "rebuilt-{part}"), "--steps", str(STOP)] + args,
                 2) == [0] * size
    for part in range(2):
        rebuilt = os.path.join(tmp, f"rebuilt-{part}", "checkpoints", f"ckpt-{STOP:08d}")
        check_state("ssd-period-eager", fields(saved), fields(rebuilt), size, size // 2)
    copied_on_rank_0(os.path.join(tmp, "run-0"), os.path.join(tmp, "run-1"))      # each half goes on with a copy
    assert train(["--run-dir", run, "--resume", "auto", "--steps", str(STEPS), "--batch-size",
                  str(16 // (size // 2))] + args, 2) == [0] * size
