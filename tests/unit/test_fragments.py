"""The fragments of localsgd's average (Streaming DiLoCo; ``ssdmpi/algos/fragments.py``): the cut at the model's
layers, the reference twin (ssdmpi/verify/fragments_twin.py) against a transcription of torchft's
``DiLoCo(model_fragments, fragment_sync_delay, fragment_update_alpha)`` and against the plain average's twin,
the end of training, the settings' refusals, the words a run and ``ckpt inspect`` show, the bench forms.
(The MPI code path against the twin: tests/mpi/test_fragments.py.)"""

import numpy as np
import pytest

from ssdmpi.algos import registry
from ssdmpi.algos.fragments import split
from ssdmpi.errors import UserError
from ssdmpi.nn import build_model
from ssdmpi.verify.fragments_twin import FragmentsTwin, fragment_cuts
from ssdmpi.verify.reference import Simulation
from tests.conftest import assert_one_line_error, run_cli

FEATURES, CLASSES, B = 6, 3, 4


def four_layers():
    """Four Linear layers of 6*5+5 = 35, 5*5+5 = 30, 30 and 5*3+3 = 18 parameters."""
    return build_model("mlp", (FEATURES,), CLASSES, widths=(5, 5, 5), dtype=np.float64, seed=2)


def test_the_cut_follows_the_layers_and_evens_the_largest_fragment():
    model = four_layers()
    assert sorted(set(model.layer_offsets)) == [0, 35, 65, 95]     # ReLUs share the next Linear's offset
    n = model.params.size
    assert n == 113
    assert split(model.layer_offsets, n, 1) == [(0, 113)]
    assert split(model.layer_offsets, n, 2) == [(0, 65), (65, 113)]            # 65 | 48 (35 | 78, 95 | 18 worse)
    assert split(model.layer_offsets, n, 3) == [(0, 35), (35, 65), (65, 113)]  # 35 | 30 | 48
    assert split(model.layer_offsets, n, 4) == [(0, 35), (35, 65), (65, 95), (95, 113)]
    assert split([0, 50, 100, 150], 200, 3) == [(0, 50), (50, 100), (100, 200)]   # a tie: the earliest cuts
    with pytest.raises(UserError, match=r"--fragments 5 cuts the model at its layers, and this model has 4 with "
                                        r"parameters; use --fragments 4 or fewer"):
        split(model.layer_offsets, n, 5)


@pytest.mark.parametrize("seed", range(20))
def test_the_cut_is_the_brute_force_one(seed):
    """On random layer tables the dynamic programme finds the cut the twin finds by trying every one."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 60, size=int(rng.integers(1, 9)))
    offsets = [0, *np.cumsum(sizes)[:-1].tolist()]
    count = int(rng.integers(1, len(sizes) + 1))
    assert split(offsets, int(sizes.sum()), count) == fragment_cuts(offsets, int(sizes.sum()), count)


def data(N, steps):
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(N * steps * B, FEATURES)), rng.integers(0, CLASSES, size=N * steps * B)
    return lambda r, t: (x[(t * N + r) * B:(t * N + r + 1) * B], y[(t * N + r) * B:(t * N + r + 1) * B])


def streaming_diloco(N, steps, T_w, k, F, tau, alpha, lr, mu, outer_lr, outer_mu, nesterov):
    """torchft's DiLoCo with fragments, transcribed on the same model and batches: each replica keeps the
    fragments' ``original`` parameters; every ``h = k/F`` inner steps the next fragment (in turn) syncs:
    ``h - tau`` steps in its pseudo-gradient ``original - local`` is averaged over the replicas; at ``h`` the
    replica restores ``original``, steps the outer SGD from it with the averaged pseudo-gradient, saves the
    result as ``original`` and lerps it towards its own parameters of that moment by ``alpha``. The inner
    optimizer is momentum SGD (the warm-up's velocity carried on per replica), the warm-up synchronous SGD.
    Returns the list of ``(original, [local_r])`` after every iteration."""
    model, batch = four_layers(), data(N, steps)
    W, M = np.array(model.params), np.zeros(model.params.size)

    def grad(weights, r, t):
        model.params[...] = weights
        model.loss_and_grad(*batch(r, t))
        return np.array(model.grads)

    cuts = split(model.layer_offsets, model.params.size, F)
    h, out, local, velocity, pending, buffers = k // F, [], None, None, None, np.zeros_like(W)
    local_step, syncs = 0, 0
    for t in range(steps):
        if t < T_w:
            g = sum(grad(W, r, t) for r in range(N)) / N
            M = mu * M - lr * g
            W = W + M
            if t + 1 == T_w:
                local, velocity, original = [W.copy() for _ in range(N)], [M.copy() for _ in range(N)], W.copy()
            out.append((W.copy(), None))
            continue
        for r in range(N):
            velocity[r] = mu * velocity[r] - lr * grad(local[r], r, t)
            local[r] = local[r] + velocity[r]
        local_step += 1
        lo, hi = cuts[syncs % F]
        if local_step == h - tau:
            pending = sum(original[lo:hi] - L[lo:hi] for L in local) / N
        if local_step == h:
            grad_outer = pending
            buffers[lo:hi] = outer_mu * buffers[lo:hi] + grad_outer
            step = grad_outer + outer_mu * buffers[lo:hi] if nesterov else buffers[lo:hi]
            original[lo:hi] = original[lo:hi] - outer_lr * step
            for L in local:
                L[lo:hi] = original[lo:hi] + alpha * (L[lo:hi] - original[lo:hi])
            syncs, local_step = syncs + 1, 0
        out.append((original.copy(), [L.copy() for L in local]))
    return out


@pytest.mark.parametrize("N", [1, 2, 4])
@pytest.mark.parametrize("k, F, tau, alpha, outer", [
    (4, 2, 1, 0.0, (1.0, 0.0, False)), (4, 4, 0, 0.0, (0.7, 0.9, True)), (6, 3, 1, 0.5, (0.7, 0.9, True)),
    (8, 2, 3, 0.5, (0.5, 0.8, False)), (4, 1, 2, 0.0, (0.7, 0.9, True))])
def test_the_twin_is_torchft_s_streaming_diloco(N, k, F, tau, alpha, outer):
    """The twin after every iteration against the transcription above, to 1e-12 relative (the twin averages
    the models, torchft averages ``original - local``: the same in exact arithmetic)."""
    steps, T_w, lr, mu = 3 + 4 * k, 3, 0.05, 0.9
    outer_lr, outer_mu, nesterov = outer
    settings = dict(algo="localsgd", delay=k, fragments=F, fragment_delay=tau, fragment_alpha=alpha, lr=lr,
                    momentum=mu, weight_decay=0.0, warmup_steps=T_w)
    if (outer_lr, outer_mu) != (1.0, 0.0):
        settings.update(outer_optimizer="nesterov" if nesterov else "sgd", outer_lr=outer_lr, outer_momentum=outer_mu)
    sim = Simulation(registry.AlgoConfig(**settings), four_layers, data(N, steps), N)
    assert isinstance(sim.twin, FragmentsTwin)
    expected = streaming_diloco(N, steps, T_w, k, F, tau, alpha, lr, mu, outer_lr, outer_mu, nesterov)
    for t, (W, L) in enumerate(expected):
        sim.step()
        assert np.allclose(sim.W, W, rtol=1e-12, atol=1e-14), f"W at t={t}"
        for r in range(N) if L is not None else ():
            assert np.allclose(sim.L[r], L[r], rtol=1e-12, atol=1e-14), f"L[{r}] at t={t}"


@pytest.mark.parametrize("outer", [{}, dict(outer_optimizer="nesterov", outer_lr=0.7, outer_momentum=0.9)])
@pytest.mark.parametrize("steps", [13, 15])          # ends mid-period, and on a period's end
def test_one_fragment_at_once_is_the_plain_average_bit_for_bit(outer, steps):
    """The fragment twin with one fragment, no delay and no mixing computes what the plain average's twin
    computes, bit for bit, through ``finalize``."""
    base = dict(algo="localsgd", delay=4, lr=0.05, warmup_steps=3, **outer)
    plain = Simulation(registry.AlgoConfig(**base), four_layers, data(2, steps), 2)
    streamed = Simulation(registry.AlgoConfig(**base), four_layers, data(2, steps), 2)
    streamed.twin = FragmentsTwin(streamed)
    for _ in range(steps):
        plain.step()
        streamed.step()
        assert np.array_equal(plain.W, streamed.W)
        assert plain.L is None or all(map(np.array_equal, plain.L, streamed.L))
    assert np.array_equal(plain.finalized_W(), streamed.finalized_W())
    plain.finalize()
    streamed.finalize()
    assert np.array_equal(plain.W, streamed.W) and np.array_equal(plain.B, streamed.B)


def test_the_end_of_training_merges_what_is_in_flight_then_averages_every_fragment_with_progress():
    """``k = 8``, 4 fragments, ``tau = 1``: stopped after 5 local steps of a period (fragment 2 posted, not merged;
    fragments 0 and 1 merged at 2 and 4, with steps since; fragment 3 last merged a period ago). ``finalize``:
    fragment 2 takes its posted mean, then every fragment the mean of the workers' models now; fragment 2,
    merged with ``alpha = 0``, is then W's on every worker and is left as it is."""
    N, k, T_w = 2, 8, 2
    cfg = registry.AlgoConfig(algo="localsgd", delay=k, fragments=4, fragment_delay=1, lr=0.05, warmup_steps=T_w)
    sim = Simulation(cfg, four_layers, data(N, 40), N)
    for _ in range(T_w + k + 5):
        sim.step()
    cuts = sim.twin.cuts
    assert sim.twin.kept is not None and sim.twin.kept[0] == 2
    posted = sim.twin.kept[1]
    mean_now = (sim.L[0] + sim.L[1]) / 2
    W = sim.finalized_W()
    for f, (lo, hi) in enumerate(cuts):
        assert np.array_equal(W[lo:hi], posted if f == 2 else mean_now[lo:hi]), f
    assert sim.twin.kept is not None        # finalized_W left the simulation as it was


# --- the settings ---------------------------------------------------------------------------------------

def test_the_settings_apply_to_the_blocking_average_only():
    applies = {name: registry.resolve({"warmup_steps": 1, **values}, 2).fragments
               for name, values in {"localsgd": {"algo": "localsgd"}, "ssd": {"algo": "ssd"},
                                    "step": {"algo": "ssd", "comm": "step"}, "ssgd": {"algo": "ssgd"}}.items()}
    assert applies == {"localsgd": 1, "ssd": None, "step": None, "ssgd": None}


REFUSED = [
    (["--fragments", "2"], "--fragments applies only to --algo localsgd (Streaming DiLoCo's fragments of the blocking "
     "average of the local models; the period rules post one sum a period and already overlap it with "
     "their merge delay); drop it"),
    (["--algo", "ssd", "--comm", "period", "--fragment-alpha", "0.5"], "--fragment-alpha applies only to --algo "
     "localsgd"),
    (["--algo", "localsgd", "--fragments", "3"], "--fragments 3 must divide --delay 5 (each fragment syncs once per "
     "period, one every k/F steps); use a --delay that is a multiple of 3, or another --fragments"),
    (["--algo", "localsgd", "--delay", "6", "--fragments", "3", "--fragment-delay", "2"], "--fragment-delay 2 must be "
     "less than --delay / --fragments = 2 (the steps between two fragments' syncs: a fragment's sum lands before the "
     "next fragment is posted); use --fragment-delay 1 or less"),
    (["--algo", "localsgd", "--fragment-alpha", "1.5"], "--fragment-alpha must be <= 1.0, got 1.5"),
    (["--algo", "localsgd", "--delay", "6", "--fragments", "3", "--widths", "16"], "--fragments 3 cuts the model at "
     "its layers, and this model has 2 with parameters; use --fragments 2 or fewer"),
]


@pytest.mark.parametrize("argv, message", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_a_setting_where_it_means_nothing_or_a_bad_value_is_one_line(argv, message):
    assert_one_line_error(run_cli(["train", "--steps", "1"] + argv), message)


def test_the_run_s_line_and_ckpt_inspect_name_the_fragments():
    spec = registry.ALGORITHMS["localsgd"]
    cfg = {"algo": "localsgd", "delay": 8, "fragments": 4, "fragment_delay": 1, "fragment_alpha": 0.5}
    assert spec.inspect(cfg) == "k=8, 4 fragments, delay 1, alpha 0.5"
    assert spec.inspect({"delay": 5, "fragments": 1, "fragment_delay": 0, "fragment_alpha": 0.0}) == "k=5"
    assert spec.describe(registry.AlgoConfig(**cfg).validate(2), 2) == "localsgd (k=8, 4 fragments, delay 1, alpha 0.5)"


def test_bench_train_variants_take_the_fragments_by_their_tags():
    from ssdmpi.bench.variants import forms_text, parse_variant

    v = parse_variant("localsgd:8:f4:tau1:alpha0.5")
    assert v.name == "localsgd-k8-f4-tau1-alpha0.5"
    assert v.train_flags() == ["--algo", "localsgd", "--delay", "8", "--fragments", "4", "--fragment-delay", "1",
                               "--fragment-alpha", "0.5"]
    assert "localsgd:K:fF (--fragments F)" in forms_text()
    with pytest.raises(UserError):
        parse_variant("localsgd:5:f2")          # 2 does not divide 5: the run would refuse it


def test_bench_model_has_no_formula_for_a_delayed_fragment_merge():
    from ssdmpi.bench.bounds import _pattern
    from ssdmpi.bench.variants import parse_variant

    assert _pattern(parse_variant("localsgd:8:f4")) == ("averaging", 8)
    assert _pattern(parse_variant("localsgd:8:f4:tau1")) is None        # no bound for it in bench train's table
    spec = registry.ALGORITHMS["localsgd"]
    assert spec.pattern(registry.Run(delay=8)) == ("averaging", 8)
    assert spec.pattern(registry.Run(delay=8, fragments=4)) == ("averaging", 8)
    assert spec.pattern(registry.Run(delay=8, fragments=4, fragment_delay=1)) is None
