"""The PyTorch peers of ``ssdmpi bench peers`` (ssdmpi/bench/torch_peer.py) train what ssdmpi trains.

From the same flags, start and data, the DDP peer and ssdmpi's ssgd must reach the same
weights, and the post-local SGD peer the same as ssdmpi's localsgd (its averaging aligned to
localsgd's periods), after every step, at 1, 2 and 4 ranks: same samples per rank and step
(ssdmpi's loader), same update rule (ALGORITHM.md 3, decay on weights only), same learning rate
per step. Also on the language model (``--preset text-gpt`` on a small gpt: the nanoGPT twin on
the same token windows, torch's AdamW with the engine's decay groups against ssdmpi's, the gradient
clipped by ``clip_grad_norm_``, the lr warm-up and cosine decay). Float64, so that what differs --
PyTorch's GEMMs against NumPy's, gloo's summation order against MPI's, DDP's division before the
sum -- stays near 1e-16 per operation: a relative 1e-10 after a few steps; a wrong mask, learning
rate, sample or period is >= 1e-6. Skipped with the reason when PyTorch is missing.
"""

import numpy as np
import pytest
from mpi4py import MPI

from ssdmpi.algos import build_algorithm
from ssdmpi.comm.communicator import Communicator
from ssdmpi.config.settings import model_options
from ssdmpi.data import ShardedLoader
from ssdmpi.nn import build_model

torch = pytest.importorskip("torch", reason="the PyTorch peers need PyTorch (pip install torch)")
torch_peer = pytest.importorskip("ssdmpi.bench.torch_peer")

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")   # torch.distributed's own imports
TOL = 1e-10
FLAGS = ["--dataset", "digits", "--model", "mlp", "--widths", "24,16", "--batch-size", "8", "--lr", "0.1",
         "--dtype", "float64", "--seed", "3", "--lr-schedule", "cosine", "--steps", "10", "--weight-decay", "0.01"]
# The preset's recipe (AdamW, --grad-clip 1, cosine) on a gpt of one block, windows of 8 tokens; an lr
# warm-up of 0.0003 of an epoch (19,182 steps per epoch at one rank of 2 windows): 6, 3 or 1 steps at
# 1, 2 or 4 ranks.
GPT_FLAGS = ["--preset", "text-gpt", "--n-layer", "1", "--n-head", "2", "--d-model", "16", "--context", "8",
             "--batch-size", "2", "--dtype", "float64", "--seed", "3", "--steps", "10", "--lr-warmup-epochs", "0.0003"]


@pytest.fixture
def communicator():
    c = Communicator(MPI.COMM_WORLD)
    yield c
    c.free()


def ssdmpi_twin(peer, comm):
    """ssdmpi's own algorithm, model and loader for the peer's resolved settings (a text dataset's: its
    windows of ``--context`` tokens)."""
    cfg, data = peer.cfg, peer.dataset
    text = data.kind == "text"
    inputs = data.model_inputs(cfg.context) if text else (data.input_shape, data.num_classes)
    model = build_model(cfg.model, *inputs, dtype=np.dtype(cfg.dtype), seed=cfg.seed, **model_options(cfg))
    comm.broadcast(model.params, root=0)
    loader = data.loader(cfg.context, cfg.batch_size, comm.rank, comm.size, seed=cfg.seed) if text else \
        ShardedLoader(data.train_x, data.train_y, cfg.batch_size, comm.rank, comm.size, seed=cfg.seed)
    return build_algorithm(peer.algo, model, comm), loader


def all_ranks(ok: bool) -> bool:
    return MPI.COMM_WORLD.allreduce(bool(ok), op=MPI.LAND)


@pytest.mark.parametrize("peer_name,flags", [
    ("ddp", FLAGS + ["--algo", "ssgd"]),
    ("postlocal", FLAGS + ["--algo", "localsgd", "--delay", "3", "--warmup-steps", "2"]),
    ("ddp", GPT_FLAGS + ["--algo", "ssgd"]),
    ("postlocal", GPT_FLAGS + ["--algo", "localsgd", "--delay", "3", "--warmup-steps", "2"]),
], ids=["ddp-vs-ssgd", "postlocal-vs-localsgd", "ddp-vs-ssgd-gpt", "postlocal-vs-localsgd-gpt"])
def test_the_peer_reaches_ssdmpis_weights_step_by_step(communicator, tmp_path, peer_name, flags):
    peer = torch_peer.Peer(["--peer", peer_name, "--run-dir", str(tmp_path / "peer"), *flags])
    peer.setup()
    try:
        algo, loader = ssdmpi_twin(peer, communicator)
        # the lr changes from step to step (the warm-up's last step and the decay's first take the same)
        lrs = [algo.schedule(t) for t in range(10)]
        assert peer.total_steps == 10 and sum(a != b for a, b in zip(lrs, lrs[1:])) >= 8
        for t in range(peer.total_steps):
            mine, _, _, _, _ = peer.step(t)
            xb, yb = loader.next_batch()
            theirs = algo.step(xb if peer.context else xb.astype(np.float64), yb)   # as the trainer casts
            assert abs(mine - theirs) <= TOL * max(1.0, abs(theirs)), f"loss at t={t}"
            W, ref = peer.global_weights(), np.asarray(algo.global_weights())
            diff = np.abs(W - ref).max()
            assert all_ranks(diff <= TOL * max(1.0, np.abs(ref).max())), f"W at t={t}: max |diff| {diff:.3g}"
            if algo.stage == "delay":     # post-local SGD: each rank's local model too
                local = peer.flat(list(peer.ddp.module.parameters()))
                assert np.abs(local - np.asarray(algo.local_weights())).max() <= TOL, f"L at t={t}"
        peer.finalize()
        algo.finalize()
        diff = np.abs(peer.global_weights() - np.asarray(algo.global_weights())).max()
        assert all_ranks(diff <= TOL), f"W after finalize: {diff:.3g}"
    finally:
        peer.dist.destroy_process_group()
