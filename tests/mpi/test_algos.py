"""Every algorithm on N MPI ranks against the single-process reference simulator, step by step.

Run under ``mpiexec -n 1/2/4`` (``tests/run.py``). Each rank runs the MPI code path on its
shard and, next to it, the pure-NumPy reference simulating all N workers; after every
iteration it checks that its ``W`` and its ``L`` equal the reference's ``W`` and ``L[rank]``,
and that ``W`` hashes the same on every rank.

Exactness: at 1 and 2 ranks the reference performs exactly the same floating-point
operations (an MPI sum of two buffers is one addition, commutative), so the match must
be BITWISE. At 4 ranks MPI's summation order is the library's business, so we allow a
relative 1e-12 in float64: ~40 iterations of a tiny MLP amplify a last-bit difference
by far less than 1e3 (measured: see ``test_reference_match``).
"""

import hashlib

import numpy as np
import pytest
from mpi4py import MPI

from ssdmpi.algos import AlgoConfig, build_algorithm
from ssdmpi.comm.communicator import Communicator
from ssdmpi.data import ShardedLoader as Loader
from ssdmpi.errors import UserError
from ssdmpi.nn import MODELS, build_model
from ssdmpi.verify.reference import Simulation

B = 4                 # per-rank batch
FEATURES, CLASSES = 10, 3
TOL = 1e-12           # relative, float64, 4 ranks only (1-2 ranks: bitwise)


@pytest.fixture
def communicator():
    c = Communicator(MPI.COMM_WORLD)
    yield c
    c.free()


def dataset(n=240, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES)).astype(dtype)
    y = rng.integers(0, CLASSES, size=n)
    return x, y


def tiny_mlp(dtype=np.float64):
    return lambda: build_model("mlp", (FEATURES,), CLASSES, widths=(8,), dtype=dtype, seed=3)


def w_hash(a) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def assert_same(mine, ref, exact: bool, what: str):
    if exact:
        assert np.array_equal(mine, ref), f"{what}: max |diff| {np.abs(mine - ref).max():.3g} (expected bitwise)"
    else:
        scale = max(1.0, float(np.abs(ref).max()))
        assert np.abs(mine - ref).max() <= TOL * scale, f"{what}: max |diff| {np.abs(mine - ref).max():.3g}"


def all_ranks_ok(comm, ok: bool) -> bool:
    return comm.allreduce(bool(ok), op=MPI.LAND)


CONFIGS = []
for k in (1, 2, 5):
    for lu in ("global-momentum", "glu-paper", "sgd"):
        CONFIGS.append(dict(algo="ssd", comm="step", delay=k, local_update=lu))
        CONFIGS.append(dict(algo="ssd", comm="period", period_rule="replay", delay=k, local_update=lu))
    CONFIGS.append(dict(algo="ssd", comm="period", period_rule="delta-own", delay=k))
    for d in sorted({1, min(2, k), k}):
        CONFIGS.append(dict(algo="ssd", comm="period", period_rule="delta-merge", delay=k, merge_delay=d))
        # the momentum merge: none (each rank keeps its own velocity) and half of it (the default: all)
        CONFIGS.append(dict(algo="ssd", comm="period", period_rule="delta-merge", delay=k, merge_delay=d,
                            merge_momentum=0.0 if d == 1 else 0.5))
    CONFIGS.append(dict(algo="localsgd", delay=k))
CONFIGS.append(dict(algo="odsgd"))
CONFIGS.append(dict(algo="ssgd"))
# learning-rate schedules pin down which counter drives which lr (s: global, t: local, m: explicit local)
CONFIGS.append(dict(algo="ssd", comm="step", delay=2, local_update="glu-paper", lr_warmup_steps=2,
                    lr_schedule={"kind": "multistep", "milestones": [5, 9]},
                    local_lr_schedule={"kind": "step", "every": 3, "gamma": 0.5}))
CONFIGS.append(dict(algo="ssd", comm="period", period_rule="replay", delay=2, lr_schedule="cosine", total_steps=14))
CONFIGS.append(dict(algo="ssd", comm="period", period_rule="delta-own", delay=2, lr_schedule="poly", total_steps=14))
CONFIGS.append(dict(algo="ssd", comm="period", period_rule="delta-merge", delay=3, merge_delay=2, lr_schedule="cosine",
                    total_steps=20))
CONFIGS.append(dict(algo="localsgd", delay=2, lr_schedule={"kind": "step", "every": 4}))

# --optimizer adamw with every algorithm and rule (its lr and weight decay; --grad-clip small enough to
# clip most steps of the tiny MLP, on the averaged gradient of a global update and on a rank's own otherwise)
ADAMW = dict(optimizer="adamw", lr=0.01)
ADAMW_CONFIGS = [dict(algo="ssgd", **ADAMW), dict(algo="ssgd", grad_clip=0.3, **ADAMW), dict(algo="odsgd", **ADAMW)]
for k in (1, 3):
    ADAMW_CONFIGS.append(dict(algo="ssd", comm="step", delay=k, **ADAMW))
    ADAMW_CONFIGS.append(dict(algo="ssd", comm="period", period_rule="replay", delay=k, **ADAMW))
    ADAMW_CONFIGS.append(dict(algo="ssd", comm="period", period_rule="delta-own", delay=k, **ADAMW))
    for d in sorted({1, k}):
        for a in (0.0, 1.0):
            ADAMW_CONFIGS.append(dict(algo="ssd", comm="period", period_rule="delta-merge", delay=k, merge_delay=d,
                                      merge_momentum=a, **ADAMW))
    ADAMW_CONFIGS.append(dict(algo="localsgd", delay=k, **ADAMW))
ADAMW_CONFIGS += [
    dict(algo="ssd", comm="step", delay=2, grad_clip=0.3, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.05,
         lr_schedule={"kind": "multistep", "milestones": [5, 9]}, **ADAMW),
    dict(algo="ssd", comm="period", period_rule="replay", delay=2, grad_clip=0.3, lr_schedule="cosine", total_steps=14,
         **ADAMW),
    dict(algo="ssd", comm="period", period_rule="delta-own", delay=2, grad_clip=0.3, lr_schedule="poly",
         total_steps=14, **ADAMW),
    dict(algo="ssd", comm="period", period_rule="delta-merge", delay=3, merge_delay=2, merge_momentum=0.5,
         grad_clip=0.3, lr_schedule="cosine", total_steps=20, **ADAMW),
    dict(algo="localsgd", delay=2, grad_clip=0.3, lr_schedule={"kind": "step", "every": 4}, **ADAMW)]


# AdamW in float32 (its lr from the test), every algorithm and rule, clipping in some
ADAMW_FLOAT32 = [dict(algo="ssd", comm="step", optimizer="adamw"),
                 dict(algo="ssd", comm="step", optimizer="adamw", grad_clip=0.3),
                 dict(algo="ssd", comm="period", period_rule="replay", optimizer="adamw"),
                 dict(algo="ssd", comm="period", period_rule="delta-own", optimizer="adamw", grad_clip=0.3),
                 dict(algo="ssd", comm="period", period_rule="delta-merge", merge_delay=2, optimizer="adamw"),
                 dict(algo="ssd", comm="period", period_rule="delta-merge", merge_delay=1, merge_momentum=0.0,
                      optimizer="adamw"),
                 dict(algo="localsgd", optimizer="adamw", grad_clip=0.3)]


def cfg_id(d):
    return "-".join(f"{v}" if not isinstance(v, dict) else v["kind"] for v in d.values())


@pytest.mark.parametrize("settings", CONFIGS + ADAMW_CONFIGS, ids=cfg_id)
def test_reference_match(communicator, settings):
    """W and every rank's L equal the reference after every iteration (warm-up, switch, >= 4 periods)."""
    N, rank = communicator.size, communicator.rank
    cfg = AlgoConfig(**{"warmup_steps": 3, "lr": 0.05, **settings})
    k = cfg.validate(N).delay or 1
    steps = 3 + 4 * k + 2            # warm-up, switch, four periods and part of a fifth
    x, y = dataset()
    factory = tiny_mlp()
    model = factory()
    algo = build_algorithm(cfg, model, communicator)
    loader = Loader(x, y, B, rank, N, seed=7)
    sim = Simulation(cfg, factory, [Loader(x, y, B, r, N, seed=7) for r in range(N)], N)
    exact = N <= 2
    for t in range(steps):
        loss = algo.step(*loader.next_batch())
        sim.step()
        assert loss == sim.losses[rank]
        assert (algo.t, algo.s, algo.stage) == (sim.t, sim.s, sim.stage), f"counters at t={t}"
        assert_same(algo.global_weights(), sim.W, exact, f"W at t={t}")
        if sim.stage == "delay":
            assert_same(algo.local_weights(), sim.L[rank], exact, f"L[{rank}] at t={t}")
        else:
            assert algo.local_weights() is None
        hashes = MPI.COMM_WORLD.allgather(w_hash(algo.global_weights()))
        assert len(set(hashes)) == 1, f"replicas of W differ at t={t}"
    algo.finalize()
    sim.finalize()
    assert algo.s == sim.s
    assert_same(algo.global_weights(), sim.W, exact, "W after finalize")
    if settings.get("optimizer") == "adamw":          # the global state too: m, v and the integer count
        assert algo.M["count"] == sim.M["count"]
        assert_same(algo.M["m"], sim.M["m"], exact, "m")
        assert_same(algo.M["v"], sim.M["v"], exact, "v")


@pytest.mark.parametrize("settings", [dict(algo="ssd", comm="step", local_update="glu-paper"),
                                      dict(algo="ssd", comm="period", period_rule="replay"),
                                      dict(algo="ssd", comm="period", period_rule="delta-own"),
                                      dict(algo="ssd", comm="period", period_rule="delta-merge", merge_delay=1),
                                      dict(algo="ssd", comm="period", period_rule="delta-merge", merge_delay=2),
                                      dict(algo="ssd", comm="period", period_rule="delta-merge", merge_delay=2,
                                           merge_momentum=0.5),
                                      dict(algo="ssd", comm="period", period_rule="delta-merge", merge_delay=1,
                                           merge_momentum=0.0),
                                      *ADAMW_FLOAT32],
                         ids=cfg_id)
def test_reference_match_float32_is_bitwise_up_to_two_ranks(communicator, settings):
    """In float32 too: at 1-2 ranks the MPI path and the reference do the same operations."""
    N, rank = communicator.size, communicator.rank
    if N > 2:
        pytest.skip("bitwise float32 comparison needs a summation order MPI fixes only for <= 2 ranks")
    cfg = AlgoConfig(warmup_steps=2, lr=0.05, delay=3, **settings)
    x, y = dataset(dtype=np.float32)
    factory = tiny_mlp(np.float32)
    algo = build_algorithm(cfg, factory(), communicator)
    loader = Loader(x, y, B, rank, N, seed=1)
    sim = Simulation(cfg, factory, [Loader(x, y, B, r, N, seed=1) for r in range(N)], N)
    for t in range(14):
        algo.step(*loader.next_batch())
        sim.step()
        assert np.array_equal(algo.global_weights(), sim.W), f"W at t={t}"
        if sim.stage == "delay":
            assert np.array_equal(algo.local_weights(), sim.L[rank]), f"L at t={t}"


def single_process_sgd(model_name, shape, x, y, N, steps, dtype):
    """SGD with batch N*B on one process (a size-1 communicator over MPI.COMM_SELF)."""
    self_comm = Communicator(MPI.COMM_SELF)
    try:
        model = build_model(model_name, shape, CLASSES if model_name == "mlp" else 10, dtype=dtype, seed=5,
                            **({"widths": (8,)} if model_name == "mlp" else {}))
        algo = build_algorithm(AlgoConfig(algo="ssgd", lr=0.05), model, self_comm)
        loader = Loader(x, y, N * B, 0, 1, seed=2)
        for _ in range(steps):
            algo.step(*loader.next_batch())
        return np.array(algo.global_weights())
    finally:
        self_comm.free()


@pytest.mark.parametrize("model_name", ["mlp", "lenet5"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_ssgd_equals_single_process_sgd_with_global_batch(communicator, model_name, dtype):
    """SSGD on N ranks x batch B == one process with batch N*B over the same samples."""
    if model_name not in MODELS:
        pytest.skip(f"{model_name} is not in the model registry yet")
    N, rank = communicator.size, communicator.rank
    if model_name == "mlp":
        shape, (x, y) = (FEATURES,), dataset(dtype=dtype)
    else:
        shape = (1, 28, 28)
        rng = np.random.default_rng(0)
        x, y = rng.normal(size=(64, 1, 28, 28)).astype(dtype), rng.integers(0, 10, size=64)
    steps = 6 if model_name == "mlp" else 3
    model = build_model(model_name, shape, CLASSES if model_name == "mlp" else 10, dtype=dtype, seed=5,
                        **({"widths": (8,)} if model_name == "mlp" else {}))
    algo = build_algorithm(AlgoConfig(algo="ssgd", lr=0.05), model, communicator)
    loader = Loader(x, y, B, rank, N, seed=2)
    for _ in range(steps):
        algo.step(*loader.next_batch())
    expected = single_process_sgd(model_name, shape, x, y, N, steps, dtype)
    # The mean of N per-rank means vs one mean over N*B differ by rounding only:
    # float64 ~1e-16 per op, float32 ~1e-7; a few steps amplify it little.
    tol = 1e-12 if dtype == np.float64 else 2e-5
    diff = np.abs(algo.global_weights() - expected).max()
    assert diff <= tol * max(1.0, np.abs(expected).max()), f"max |diff| {diff:.3g}"
    assert len(set(MPI.COMM_WORLD.allgather(w_hash(algo.global_weights())))) == 1


def hdf5_round_trip(state: dict) -> dict:
    """Write ``state`` to an HDF5 file (arrays as datasets, scalars as attributes) and read it back."""
    import os
    import tempfile

    h5py = pytest.importorskip("h5py")
    with tempfile.TemporaryDirectory() as tmp:          # per rank: ranks are separate processes
        path = os.path.join(tmp, "state.h5")
        with h5py.File(path, "w") as f:
            for key, value in state.items():
                if isinstance(value, np.ndarray):
                    f.create_dataset(key, data=value)
                else:
                    f.attrs[key] = value
        with h5py.File(path, "r") as f:
            out = {key: f[key][...] for key in f}
            out.update({key: f.attrs[key] for key in f.attrs})
    assert set(out) == set(state)
    return out


STATE_CONFIGS = [dict(algo="ssd", comm="step", local_update="glu-paper"),
                 dict(algo="ssd", comm="step", local_update="global-momentum"),
                 dict(algo="ssd", comm="period", period_rule="replay", local_update="glu-paper"),
                 dict(algo="ssd", comm="period", period_rule="replay"),
                 dict(algo="ssd", comm="period", period_rule="delta-own"),
                 dict(algo="ssd", comm="period", period_rule="delta-merge", merge_delay=2),
                 dict(algo="ssd", comm="period", period_rule="delta-merge", merge_delay=1),
                 dict(algo="ssd", comm="period", period_rule="delta-merge", merge_delay=2, merge_momentum=0.0),
                 dict(algo="localsgd"), dict(algo="odsgd"), dict(algo="ssgd"),
                 # AdamW: the state m, v and the integer count (M.m, M.v, M.count; U.* and V.* per rank)
                 dict(algo="ssd", comm="step", optimizer="adamw", grad_clip=0.3),
                 dict(algo="ssd", comm="period", period_rule="replay", optimizer="adamw"),
                 dict(algo="ssd", comm="period", period_rule="delta-own", optimizer="adamw"),
                 dict(algo="ssd", comm="period", period_rule="delta-merge", merge_delay=2, optimizer="adamw",
                      grad_clip=0.3),
                 dict(algo="localsgd", optimizer="adamw"), dict(algo="ssgd", optimizer="adamw")]

def resumed_run(cfg, model, communicator, state: dict, loader_state: dict, x, y, steps: int):
    """An algorithm on ``model`` that loads ``state`` (a ``state_dict``, through ``hdf5_round_trip``), with a
    loader over ``x, y`` at ``loader_state``, then trains ``steps`` more iterations; returns the algorithm."""
    resumed = build_algorithm(cfg, model, communicator)
    resumed.load_state_dict(state)
    loader = Loader(x, y, B, communicator.rank, communicator.size, seed=4)
    loader.load_state_dict(loader_state)
    for _ in range(steps):
        resumed.step(*loader.next_batch())
    return resumed


def with_and_without_drain(cfg, factory, communicator, steps: int, end: str, x, y) -> list:
    """Two runs of ``steps`` iterations from ``factory()``'s model, the second draining after every
    iteration, each closed by its ``end`` method (``drain`` or ``finalize``); the two algorithms."""
    runs = []
    for drain in (False, True):
        algo = build_algorithm(cfg, factory(), communicator)
        loader = Loader(x, y, B, communicator.rank, communicator.size, seed=4)
        for _ in range(steps):
            algo.step(*loader.next_batch())
            if drain:
                algo.drain()
        getattr(algo, end)()
        runs.append(algo)
    return runs



@pytest.mark.parametrize("settings", STATE_CONFIGS, ids=cfg_id)
# delay 3, T_w 3: warm-up; right after a period end; one and two iterations later (delta-merge d=2:
# mid-delay both, the sum in flight; d=1: after its merge)
@pytest.mark.parametrize("stop_at", [2, 9, 10, 11])
def test_state_round_trip_continues_bitwise(communicator, settings, stop_at):
    """Export mid-run (drains), import into fresh objects, continue == never stopping."""
    N, rank = communicator.size, communicator.rank
    cfg = AlgoConfig(warmup_steps=3, lr=0.05, **({"delay": 3} if settings["algo"] not in ("odsgd", "ssgd") else {}),
                     **settings)
    x, y = dataset()
    factory, total = tiny_mlp(), 20

    straight = build_algorithm(cfg, factory(), communicator)
    loader = Loader(x, y, B, rank, N, seed=4)
    for _ in range(total):
        straight.step(*loader.next_batch())

    first = build_algorithm(cfg, factory(), communicator)
    loader = Loader(x, y, B, rank, N, seed=4)
    for _ in range(stop_at):
        first.step(*loader.next_batch())
    state = first.state_dict()
    assert all(isinstance(v, (np.ndarray, int, str)) for v in state.values()), \
        {k: type(v) for k, v in state.items()}
    loader_state = loader.state_dict()
    del first
    state = hdf5_round_trip(state)                 # what a checkpoint does to it

    model = build_model("mlp", (FEATURES,), CLASSES, widths=(8,), dtype=np.float64, seed=99)  # other init
    resumed = resumed_run(cfg, model, communicator, state, loader_state, x, y, total - stop_at)
    assert (resumed.t, resumed.s, resumed.stage) == (straight.t, straight.s, straight.stage)
    assert np.array_equal(resumed.global_weights(), straight.global_weights())
    if straight.stage == "delay":
        assert np.array_equal(resumed.local_weights(), straight.local_weights())
    if settings.get("optimizer") == "adamw":           # every saved field: m, v and the integer counts
        a, b = resumed.state_dict(), straight.state_dict()
        assert set(a) == set(b) and {"M.m", "M.v", "M.count"} <= set(a)
        assert [key for key in a if not np.array_equal(a[key], b[key])] == []


@pytest.mark.parametrize("settings", STATE_CONFIGS[:7], ids=cfg_id)
def test_drain_then_continue_is_bitwise_the_same(communicator, settings):
    """Draining after every iteration does not change the trajectory."""
    cfg = AlgoConfig(warmup_steps=2, lr=0.05, delay=3, **settings)
    plain, drained = with_and_without_drain(cfg, tiny_mlp(), communicator, 16, "drain", *dataset())
    assert np.array_equal(plain.global_weights(), drained.global_weights())
    assert np.array_equal(plain.local_weights(), drained.local_weights())
    assert plain.s == drained.s


@pytest.mark.parametrize("settings", CONFIGS[::3] + [dict(algo="odsgd")], ids=cfg_id)
def test_before_warmup_end_every_algorithm_is_ssgd(communicator, settings):
    """The first T_w iterations are SSGD whatever the algorithm: the MPI algorithm's W, loss and
    counters equal the reference simulator's SSGD (independent code) after every iteration."""
    N, rank = communicator.size, communicator.rank
    T_w = 6
    x, y = dataset()
    lr_settings = {k: v for k, v in settings.items() if k in ("lr_schedule", "lr_warmup_steps", "total_steps")}
    cfg = AlgoConfig(warmup_steps=T_w, lr=0.05, **settings) if settings["algo"] != "ssgd" \
        else AlgoConfig(lr=0.05, **settings)
    algo = build_algorithm(cfg, tiny_mlp()(), communicator)
    loader = Loader(x, y, B, rank, N, seed=3)
    oracle = Simulation(AlgoConfig(algo="ssgd", lr=0.05, **lr_settings), tiny_mlp(),
                        [Loader(x, y, B, r, N, seed=3) for r in range(N)], N)
    for t in range(T_w):
        loss = algo.step(*loader.next_batch())
        oracle.step()
        assert loss == oracle.losses[rank], f"loss at t={t}"
        assert (algo.s, algo.t) == (oracle.s, oracle.t) == (t + 1, t + 1)
        assert_same(algo.global_weights(), oracle.W, N <= 2, f"W at t={t}")
    assert algo.stage == ("warmup" if settings["algo"] == "ssgd" else "delay")


def test_load_state_dict_rejects_a_state_that_does_not_fit(communicator):
    cfg = AlgoConfig(warmup_steps=1, delay=2, lr=0.05)
    x, y = dataset()
    algo = build_algorithm(cfg, tiny_mlp()(), communicator)
    loader = Loader(x, y, B, communicator.rank, communicator.size, seed=0)
    for _ in range(3):
        algo.step(*loader.next_batch())
    state = algo.state_dict()
    bigger = build_model("mlp", (FEATURES,), CLASSES, widths=(9,), dtype=np.float64, seed=3)
    with pytest.raises(UserError, match="does not fit this model"):
        build_algorithm(cfg, bigger, communicator).load_state_dict(state)
    with pytest.raises(UserError, match="algorithm 'ssd', not 'localsgd'"):
        build_algorithm(AlgoConfig(algo="localsgd", warmup_steps=1), tiny_mlp()(), communicator).load_state_dict(state)


def test_a_merge_with_nothing_to_add_leaves_the_momentum_alone(communicator):
    """A resume on another number of ranks merges a sum in flight mid-delay into ``W`` at once
    (``resize.merge_displacements``); the merge iteration then finds nothing to add, and the momentum
    merge must change nothing either: from that state, ``--merge-momentum 1`` and ``0`` take bitwise
    the same next steps (the momentum merge of an empty buffer would zero every velocity)."""
    from ssdmpi.algos import resize

    N, rank = communicator.size, communicator.rank
    x, y = dataset()
    settings = dict(algo="ssd", comm="period", period_rule="delta-merge", delay=3, merge_delay=2, warmup_steps=3,
                    lr=0.05)
    first = build_algorithm(AlgoConfig(merge_momentum=1.0, **settings), tiny_mlp()(), communicator)
    loader = Loader(x, y, B, rank, N, seed=7)
    for _ in range(3 + 4):                      # warm-up, then m = 0..3: posted at m = 2, merged at m = 4
        first.step(*loader.next_batch())
    state = first.state_dict()
    assert int(state["period.has_Rp"]) == 1
    resize.merge_displacements(state, 3)         # what the resume on another rank count builds
    batches = [loader.next_batch() for _ in range(3)]
    runs = []
    for a in (1.0, 0.0):
        algo = build_algorithm(AlgoConfig(merge_momentum=a, **settings), tiny_mlp()(), communicator)
        algo.load_state_dict(dict(state))
        for xb, yb in batches:                  # m = 4 (the merge iteration, nothing to add), 5 (a post), 6
            algo.step(xb, yb)
        runs.append((algo.global_weights().copy(), algo.local_weights().copy(),
                     *(u.copy() for u in algo.rule.U.buffers())))
    same = all(np.array_equal(p, q) for p, q in zip(*runs))
    assert all_ranks_ok(MPI.COMM_WORLD, same), "the momentum merge changed a merge that had nothing to add"


# --comm-dtype: every period rule in each compressed dtype, float32 parameters. Each element of a sum is
# added by its shard's owner, in rank order (ssdmpi/comm/compressed.py), not by MPI: with no warm-up every
# sum of the run is one of those, and the match is bitwise at every rank count; after an SSGD warm-up (MPI's
# float32 sums) at 1-2 ranks, as above. The end of training's partial period is a float32 MPI mean.
COMPRESSED_CONFIGS = [dict(algo="ssd", comm="period", period_rule=rule, comm_dtype=dtype, **extra)
                      for dtype in ("bfloat16", "float16", "int8")
                      for rule, extra in (("replay", {}), ("delta-own", {}), ("delta-merge", {"merge_delay": 2}),
                                          ("delta-merge", {"merge_delay": 1, "merge_momentum": 0.0}))]


@pytest.mark.parametrize("warmup", [0, 2])
@pytest.mark.parametrize("settings", COMPRESSED_CONFIGS, ids=cfg_id)
def test_compressed_transport_matches_the_reference(communicator, settings, warmup):
    """W and L equal the reference's own quantizing simulation (ssdmpi/verify/quantize.py) after every
    iteration, and the replicas of W stay bitwise equal."""
    N, rank = communicator.size, communicator.rank
    if warmup and N > 2:
        pytest.skip("the float32 warm-up's sums are bitwise the reference's only up to two ranks")
    cfg = AlgoConfig(warmup_steps=warmup, lr=0.05, delay=3, **settings)
    x, y = dataset(dtype=np.float32)
    factory = tiny_mlp(np.float32)
    algo = build_algorithm(cfg, factory(), communicator)
    loader = Loader(x, y, B, rank, N, seed=1)
    sim = Simulation(cfg, factory, [Loader(x, y, B, r, N, seed=1) for r in range(N)], N)
    for t in range(warmup + 13):                 # four periods posted, and one iteration into a fifth
        algo.step(*loader.next_batch())
        sim.step()
        assert np.array_equal(algo.global_weights(), sim.W), f"W at t={t}: max |diff| " \
            f"{np.abs(algo.global_weights() - sim.W).max():.3g}"
        if sim.stage == "delay":
            assert np.array_equal(algo.local_weights(), sim.L[rank]), f"L at t={t}"
        assert len(set(MPI.COMM_WORLD.allgather(w_hash(algo.global_weights())))) == 1, f"replicas at t={t}"
    assert np.abs(sim.wire.owed[rank]).max() > 0, "nothing was owed: the transport did not compress"
    algo.finalize()
    sim.finalize()
    mine, ref = algo.global_weights(), sim.W
    if N <= 2:
        assert np.array_equal(mine, ref), "W after finalize"
    else:
        assert np.abs(mine - ref).max() <= 1e-6 * np.abs(ref).max(), "W after finalize"
