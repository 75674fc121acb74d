"""What the PyTorch peers of ``ssdmpi bench peers`` (``ssdmpi/bench/torch_peer.py``) are built from:
the gloo process group of the MPI ranks (``rendezvous``), ssdmpi's global update as a
``torch.optim.Optimizer`` (``spec_sgd``, also the compute probe's: ``ssdmpi/bench/probe.py``; AdamW,
clipping and the token loss are ``ssdmpi/verify/torch_optim.py``'s, shared with the recipe check), and
the evaluation of the engine's model on a whole split (``evaluate_split``: a test split, or a language
model's validation windows). PyTorch is imported only inside the functions that need it.
"""

from __future__ import annotations

import fcntl
import math
import os
import socket
import struct

from ssdmpi.comm import world
from ssdmpi.errors import UserError
from ssdmpi.verify.torch_optim import decay_groups, same_name

EVAL_BATCH = 1000     # samples per forward pass in evaluation (memory, not semantics)
EVAL_TOKENS = 8192    # a language model's: tokens per forward pass in evaluation (64 windows of 128)


def interface_address(name: str) -> str:
    """The IPv4 address of network interface ``name`` (Linux ``SIOCGIFADDR``)."""
    if name == "lo":
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
    return socket.inet_ntoa(packed[20:24])


def rendezvous():
    """The gloo process group of the MPI ranks (rank 0 hosts the store); ``(rank, size)``."""
    import torch.distributed as dist

    rank, size = world.rank_and_size()
    iface = os.environ.get("GLOO_SOCKET_IFNAME") or os.environ.get("FI_TCP_IFACE") or "lo"
    os.environ["GLOO_SOCKET_IFNAME"] = iface
    hosted = []

    def host_store():
        host = interface_address(iface)
        hosted.append(dist.TCPStore(host, 0, size, is_master=True, wait_for_workers=False))
        return host, hosted[0].port

    where = world.on_root(host_store)       # rank 0 hosts the store; everyone learns where
    store = hosted[0] if rank == 0 else None
    if rank != 0:
        store = dist.TCPStore(where[0], where[1], size, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size)
    return rank, size


def spec_sgd_class():
    """``SpecSGD``: ssdmpi's global update (ALGORITHM.md 3) as a ``torch.optim.Optimizer``, built late
    (torch is imported only when a peer runs)."""
    import torch

    class SpecSGD(torch.optim.Optimizer):
        """Per parameter ``p`` with gradient ``g`` (``MomentumSGD``'s rule, in the passes
        ``torch.optim.SGD`` makes for momentum and weight decay)::

            tmp = g + decay*p;  M = mu*M - lr*tmp;  p = p + M

        ``decay`` is the group's ``weight_decay`` (lam on the engine's decayed tensors, 0 elsewhere);
        ``lr`` is set on the groups before each step."""

        def __init__(self, groups, momentum: float):
            super().__init__(groups, {"lr": 0.0, "weight_decay": 0.0, "momentum": momentum})

        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                lr, mu, decay = group["lr"], group["momentum"], group["weight_decay"]
                for p in group["params"]:
                    state = self.state[p]
                    if "M" not in state:
                        state["M"], state["tmp"] = torch.zeros_like(p), torch.empty_like(p)
                    M, tmp = state["M"], state["tmp"]
                    torch.add(p.grad, p, alpha=decay, out=tmp)
                    M.mul_(mu).add_(tmp, alpha=-lr)
                    p.add_(M)

    return SpecSGD


def spec_sgd(module, engine, momentum: float, weight_decay: float, name=same_name):
    """A ``SpecSGD`` over ``module``'s parameters (the twin of ``engine``; ``name``: the twin's name of an
    engine tensor): weight decay on the tensors the engine decays, none on the others (``decay_groups``)."""
    return spec_sgd_class()(decay_groups(module, engine, weight_decay, name), momentum)


def torch_optimizer(module, engine, algo, name=same_name):
    """The PyTorch optimizer of ``module`` (the twin of ``engine``; ``name`` as ``decay_groups`` takes it) that
    takes the steps ``algo`` (the run's ``AlgoConfig``) gives its inner optimizer: ``SpecSGD`` for
    momentum SGD, ``torch.optim.AdamW`` for AdamW (its clipping is the caller's: ``torch_optim.clip`` at
    ``algo.grad_clip``); ``UserError`` for another. The learning rate is set on its groups before each step."""
    from ssdmpi.optim.optimizers import adamw as adamw_spec
    from ssdmpi.optim.optimizers import sgd as sgd_spec
    from ssdmpi.verify.torch_optim import adamw

    if algo.optimizer == sgd_spec.SPEC.name:
        return spec_sgd(module, engine, algo.momentum, algo.weight_decay, name)
    if algo.optimizer == adamw_spec.SPEC.name:
        return adamw(module, engine, algo.lr, algo.beta1, algo.beta2, algo.eps, algo.weight_decay, name)
    raise UserError(f"the PyTorch peers have no twin of --optimizer {algo.optimizer}; use "
                    f"{sgd_spec.SPEC.name} or {adamw_spec.SPEC.name}")


def perplexity(loss: float) -> float:
    """``exp(loss)`` of a loss in nats per token (inf past the largest float)."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def evaluate_split(model, x, y, batch_size: int | None = None) -> tuple[float, float]:
    """``(mean loss, accuracy)`` per target of the engine's ``model`` on the whole split ``(x, y)`` (host
    arrays; a language model's: its windows of token ids, one target per token), in inference mode,
    batch by batch (``batch_size`` samples; None: ``EVAL_BATCH``, a language model's ``EVAL_TOKENS``
    worth of windows) through the model's own ``evaluate``. Serial; blocking."""
    import numpy as np

    tokens = model.input_kind == "tokens"
    batch_size = batch_size or (max(1, EVAL_TOKENS // model.targets_per_sample) if tokens else EVAL_BATCH)
    dtype = None if tokens else model.dtype          # token ids stay integers
    loss_sum, correct, n = 0.0, 0, 0
    for start in range(0, len(x), batch_size):
        xb = np.ascontiguousarray(x[start:start + batch_size], dtype=dtype)
        yb = np.ascontiguousarray(y[start:start + batch_size])
        batch_loss, batch_correct = model.evaluate(xb, yb)
        loss_sum += float(batch_loss)
        correct += int(batch_correct)
        n += int(yb.size)
    return (loss_sum / n, correct / n) if n else (float("nan"), float("nan"))
