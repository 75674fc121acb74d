"""One rank of a PyTorch training run set up like ``ssdmpi train``: the peers of ``ssdmpi bench peers``.

    mpiexec -n 2 python -m ssdmpi.bench.torch_peer --peer ddp --run-dir DIR [ssdmpi train flags]

Launched by ``ssdmpi bench peers`` exactly where an ``ssdmpi train`` run goes (the throttled
namespace, the namespaced cluster, plain mpiexec). It takes ``ssdmpi train``'s flags and
resolves them with ssdmpi's own configuration code, so that, flag for flag, it trains:

- the same model: the engine's model built from ``--model``, its sizes and ``--seed``, its initial
  weights copied into the PyTorch twin (``ssdmpi/verify/torch_ref.py``; a language model's, ``--model
  gpt`` on a text dataset: the nanoGPT twin of ``ssdmpi/verify/torch_gpt.py`` with PyTorch's fused
  attention);
- on the same data in the same order: ssdmpi's ``ShardedLoader`` with the same rank, world
  size and seed gives every rank the samples its ``ssdmpi train`` rank gets, step by step (a text
  dataset's: its windows of ``--context`` tokens, ``TextDataset.loader``; the loss is the mean over
  the batch's tokens);
- with the same update, weight decay on the engine's decayed tensors only, the learning rate from
  the resolved schedule (its linear warm-up included) at every step. ``--optimizer sgd``:
  ALGORITHM.md section 3 (``ssdmpi/optim/optimizers/sgd.py``), ``M <- mu*M - eta(t)*(lam*mask*W +
  G); W <- W + M`` (``SpecSGD``: in as many passes over the weights as ``torch.optim.SGD`` makes, so
  it costs what users' DDP costs; ssdmpi's own update is one fused pass, ``ssdmpi/optim/fused.py``).
  ``--optimizer adamw``: ``torch.optim.AdamW`` with ``--beta1``, ``--beta2``, ``--eps``,
  ``--weight-decay``, the gradient clipped by ``torch.nn.utils.clip_grad_norm_`` at ``--grad-clip``
  (``ssdmpi/verify/torch_optim.py``);
- with the same threads per rank (``ssdmpi/comm/node.py``) and the same evaluation (the
  global model on the whole test split, a language model's on all validation windows, through the
  engine model's own ``evaluate``, after copying the weights back into it; on rank 0, outside the
  training time: ``evaluate_split``), recorded under the names ``ssdmpi train`` uses (``test_acc``,
  ``test_loss``; ``val_loss`` in nats per token, ``val_ppl``, ``val_acc``);

and writes ``metrics.jsonl``, ``summary.json`` and ``config.json`` in the run directory as
``ssdmpi train`` does (``ssdmpi/metrics.py``), so ``ssdmpi plot`` and the benchmark read both alike
(``ssdmpi/rundir.py``).

Peers (``--peer``):

- ``ddp``: ``torch.nn.parallel.DistributedDataParallel`` over gloo, its gradient buckets
  allreduced while the backward pass runs; ``--bucket-size`` is its ``bucket_cap_mb`` (in
  MiB; default DDP's own 25). Run it with ``--algo ssgd`` (the algorithm whose spec names the
  peer: ``AlgorithmSpec.torch_peer``, ``PEERS``).
- ``postlocal``: post-local SGD as PyTorch ships it: DDP with ``post_localSGD_hook``
  (``PostLocalSGDState(start_localSGD_iter=T_w, post_local_gradient_allreduce=False)``:
  global gradient averaging for the ``--warmup-steps`` T_w, then none) and a
  ``PostLocalSGDOptimizer`` whose ``PeriodicModelAverager(period=k)`` averages the models
  every ``k`` = ``--delay`` steps, first at step ``T_w + k - 1`` (``warmup_steps=T_w + k - 1``),
  when ssdmpi's ``localsgd`` averages. Momentum buffers stay per rank in both. At the end a
  partial period is averaged too, as ssdmpi's ``finalize`` does. Run it with ``--algo localsgd``.

The ranks meet through MPI (``mpi4py``: rank 0 opens a ``TCPStore`` and broadcasts its
port), then talk over gloo only: on the interface MPI is told to use (``FI_TCP_IFACE``, set
on the namespaced cluster), else the loopback (one namespace, or no namespace: gloo has no
shared-memory transport, so there it crosses loopback TCP while MPI uses shared memory).

Step records: ``fb_s`` is forward + backward (DDP's exposed allreduce wait is inside it,
at the end of the backward pass); ``update_s`` the optimizer (and the clipping); ``blocked_s``
post-local SGD's blocking model averaging; ``bytes_sent`` the payload handed to the collectives per
step; ``lr`` the learning rate the next step takes (as ``ssdmpi train`` records it); a language
model's add ``tokens_per_s`` (``samples_per_s`` x the context).
PyTorch is a benchmark peer only: without it this prints one line saying what to install
and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from ssdmpi import rundir
from ssdmpi.algos import registry
from ssdmpi.bench.torch_parts import evaluate_split, perplexity, rendezvous, torch_optimizer
from ssdmpi.comm import world
from ssdmpi.errors import UserError

# {peer: the ssdmpi train --algo whose settings it takes}: the algorithms' ``torch_peer``.
PEERS = {spec.torch_peer: name for name, spec in registry.ALGORITHMS.items() if spec.torch_peer}
DDP_DEFAULT_BUCKET_MB = 25
INSTALL = "pip install torch (a benchmark peer only, never needed to train)"


def parse(argv):
    """``(args, peer)``: ssdmpi train's flags plus ``--peer``."""
    from ssdmpi.config import add_arguments

    parser = argparse.ArgumentParser(prog="python -m ssdmpi.bench.torch_peer")
    parser.add_argument("--peer", choices=tuple(PEERS), required=True)
    add_arguments(parser)
    args = parser.parse_args(argv)
    return args, args.peer


def resolve(args):
    """The frozen ``TrainConfig`` ``ssdmpi train`` resolves these flags to (the public
    ``ssdmpi.config.resolve``: the preset's ``widths`` dropped for a model other than mlp, ...); no
    checkpoint, no run directory made."""
    from ssdmpi import config as configuration

    return configuration.resolve(args)


def algorithm_settings(cfg, steps_per_epoch: int, total_steps: int, world_size: int):
    """The algorithm's settings in steps (``AlgoConfig``) of ``cfg`` for this run's length and ranks (the
    public ``ssdmpi.config.algo_config``, as ``ssdmpi train`` builds its algorithm's)."""
    from ssdmpi import config as configuration

    return configuration.algo_config(cfg, steps_per_epoch, total_steps, world_size)


class Peer:
    """One rank's PyTorch run (module docstring): ``run()`` trains and writes the run directory."""

    def __init__(self, argv):
        self.args, self.peer = parse(argv)

    def setup(self) -> None:
        import numpy as np
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        from ssdmpi.comm import node
        from ssdmpi.config.settings import model_options
        from ssdmpi.data import ShardedLoader, load_dataset
        from ssdmpi.nn import build_model
        from ssdmpi.nn.transformer import nanogpt_name
        from ssdmpi.verify.torch_optim import same_name
        from ssdmpi.verify.torch_ref import build_torch_model

        args = self.args
        cfg = resolve(args)
        self.cfg = cfg
        if cfg.algo != PEERS[self.peer]:
            raise UserError(f"--peer {self.peer} takes the settings of --algo {PEERS[self.peer]}, not {cfg.algo}")
        if not cfg.run_dir:
            raise UserError("--run-dir is required")
        if rundir.has_metrics(cfg.run_dir):
            raise UserError(f"run directory {cfg.run_dir} already holds a run; choose another --run-dir")
        self.placement = node.place(node.discover(), "cpu", cfg.threads, None)
        if self.placement.threads:
            torch.set_num_threads(self.placement.threads)
        self.rank, self.size = rendezvous()
        self.dist = dist
        self.dataset = data = load_dataset(cfg.dataset, cfg.data_path)
        self.context = cfg.context if data.kind == "text" else None      # a language model's windows
        inputs = data.model_inputs(cfg.context) if self.context else (data.input_shape, data.num_classes)
        self.engine = build_model(cfg.model, *inputs, dtype=np.dtype(cfg.dtype), seed=cfg.seed, **model_options(cfg))
        if (self.engine.input_kind == "tokens") != bool(self.context):
            raise UserError(f"--model {cfg.model} does not take what dataset {data.name} holds: use --model gpt "
                            "with a text dataset, an image or tabular model with the others")
        if self.context:
            self.loader = data.loader(cfg.context, cfg.batch_size, self.rank, self.size, seed=cfg.seed)
            self.split = data.val_windows(cfg.context)
        else:
            self.loader = ShardedLoader(data.train_x, data.train_y, cfg.batch_size, self.rank, self.size,
                                        seed=cfg.seed, augment=None if cfg.augment == "none" else cfg.augment)
            self.split = (data.test_x, data.test_y)
        self.name = nanogpt_name if self.context else same_name    # the twin's name of an engine tensor
        self.E = self.loader.steps_per_epoch
        self.total_steps = cfg.total_steps(self.E)
        self.algo = algorithm_settings(cfg, self.E, self.total_steps, self.size)
        self.schedule = self.algo.global_schedule()
        twin = build_torch_model(self.engine)
        bucket_mb = cfg.bucket_size / 2**20 if cfg.bucket_size else DDP_DEFAULT_BUCKET_MB
        self.bucket_mb = bucket_mb
        self.ddp = DistributedDataParallel(twin, bucket_cap_mb=bucket_mb)
        self.opt = torch_optimizer(self.ddp.module, self.engine, self.algo, self.name)
        self.grad_clip = self.algo.grad_clip
        self.nbytes = sum(p.numel() * p.element_size() for p in self.ddp.module.parameters())
        self.averaged_s = 0.0
        self.T_w, self.k = 0, None
        if self.peer == "postlocal":
            self._post_local()

    def _post_local(self) -> None:
        """The post-local SGD hook and optimizer (module docstring), aligned with ssdmpi's localsgd."""
        from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
            PostLocalSGDState,
            post_localSGD_hook,
        )
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
        from torch.distributed.optim import PostLocalSGDOptimizer

        self.T_w, self.k = int(self.algo.warmup_steps), int(self.algo.delay)
        state = PostLocalSGDState(process_group=None, subgroup=None, start_localSGD_iter=self.T_w,
                                  post_local_gradient_allreduce=False)
        self.ddp.register_comm_hook(state, post_localSGD_hook)
        self.averager = PeriodicModelAverager(period=self.k, warmup_steps=self.T_w + self.k - 1)
        average = self.averager.average_parameters

        def timed(params):
            t0 = time.perf_counter()
            average(params)
            self.averaged_s += time.perf_counter() - t0
        self.averager.average_parameters = timed
        self.opt = PostLocalSGDOptimizer(optim=self.opt, averager=self.averager)
        self.W = None          # the last averaged model (a copy), once the delay stage started

    # -- the loop --------------------------------------------------------------------------
    def run(self) -> int:
        """Train ``total_steps``, logging and evaluating as ``ssdmpi train`` does; write the run directory."""
        self.setup()
        cfg = self.cfg
        log = self._open_run_dir()
        interval = dict.fromkeys(("steps", "loss", "fb", "update", "data", "blocked", "sync"), 0.0)
        train_s, t_interval, last_eval = 0.0, time.perf_counter(), {}
        for t in range(self.total_steps):
            for key, value in zip(("loss", "data", "fb", "update", "blocked"), self.step(t)):
                interval[key] += value
            interval["steps"] += 1
            step = t + 1
            epoch_end = step % self.E == 0
            if step % cfg.log_every and not epoch_end and step != self.total_steps:
                continue
            t_sync = time.perf_counter()
            sums = self._reduce(interval)
            wall = t_sync - t_interval
            train_s += wall
            if self.rank == 0:
                log.write(self._step_record(step, sums, wall, train_s))
            interval = dict.fromkeys(interval, 0.0)
            interval["sync"] = time.perf_counter() - t_sync       # counted in the next interval, as ssdmpi does
            t_interval = time.perf_counter() - interval["sync"]
            if epoch_end and cfg.eval_every and (step // self.E) % cfg.eval_every == 0 and step < self.total_steps:
                last_eval = self._evaluate(log, step, train_s)
                t_interval = time.perf_counter() - interval["sync"]
        self.finalize()
        last_eval = self._evaluate(log, self.total_steps, train_s)
        if self.rank == 0:
            self._write_summary(train_s, last_eval)
            log.close()
        self._close()
        return 0

    def _close(self) -> None:
        """Release every gloo group on every rank before any rank exits. The DDP hook's state, the
        averager and the optimizer hold groups (post-local SGD's subgroup too) whose threads abort
        their process ("terminate called without an active exception") when they outlive the group's
        peers, e.g. once rank 0, the store's host, has exited; so drop them, destroy the groups, and
        leave only when every rank has."""
        import gc

        self.ddp = self.opt = self.averager = None
        gc.collect()
        self.dist.destroy_process_group()
        world.agree(lambda: None)          # a barrier: every rank has released its groups

    def step(self, t: int) -> tuple:
        """Iteration ``t`` on this rank's next batch: ``(loss, data_s, fb_s, update_s, blocked_s)``."""
        import torch
        import torch.nn.functional as F

        from ssdmpi.verify.torch_optim import clip, token_loss

        t0 = time.perf_counter()
        xb, yb = self.loader.next_batch()
        x = torch.from_numpy(xb if self.context else xb.astype(self.engine.dtype, copy=False))
        y = torch.from_numpy(yb)
        t1 = time.perf_counter()
        loss = (token_loss if self.context else F.cross_entropy)(self.ddp(x), y)
        loss.backward()
        t2 = time.perf_counter()
        clip(self.ddp.module, self.grad_clip)
        for group in self.opt.param_groups:
            group["lr"] = self.schedule(t)
        before = self.averaged_s
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.peer == "postlocal" and (t + 1 - self.T_w) % self.k == 0 and t + 1 >= self.T_w:
            self.W = [p.detach().clone() for p in self.ddp.module.parameters()]    # the global model
        t3 = time.perf_counter()
        blocked = self.averaged_s - before
        return float(loss.detach()), t1 - t0, t2 - t1, t3 - t2 - blocked, blocked

    def global_weights(self):
        """The global model as one flat host array in the engine's layout."""
        return self.flat(self._global_params())

    def flat(self, tensors):
        """``tensors`` (one per parameter, in the twin's order) packed in the engine's flat layout."""
        import numpy as np

        params = dict(zip([n for n, _ in self.ddp.module.named_parameters()], tensors))
        out = np.empty(self.engine.num_params, dtype=self.engine.dtype)
        for spec in self.engine.flat.specs:
            out[spec.offset:spec.offset + spec.size] = params[self.name(spec.name)].detach().numpy().reshape(-1)
        return out

    def _reduce(self, interval: dict) -> dict:
        """Sums over ranks of the interval's numbers (one small gloo allreduce)."""
        import torch

        keys = sorted(interval)
        data = torch.tensor([interval[k] for k in keys], dtype=torch.float64)
        self.dist.all_reduce(data)
        return dict(zip(keys, data.tolist()))

    def _bytes_per_step(self, step: int) -> float:
        """Payload per step per rank: the gradient every step; post-local SGD after its warm-up: the
        model once every k steps."""
        if self.peer == "postlocal" and step > self.T_w:
            return self.nbytes / self.k
        return float(self.nbytes)

    def _step_record(self, step: int, sums: dict, wall: float, train_s: float) -> dict:
        from ssdmpi.phases import breakdown

        n = max(1.0, sums["steps"])                 # rank-steps
        per_rank = sums["steps"] / self.size
        step_s = wall / max(1.0, per_rank)
        means = {"fb_s": sums["fb"] / n, "update_s": sums["update"] / n, "data_s": sums["data"] / n,
                 "wait_s": sums["blocked"] / n, "progress_s": 0.0, "sync_s": sums["sync"] / n}
        stage = "delay" if self.peer == "postlocal" and step > self.T_w else "warmup" if self.peer == "postlocal" \
            else self.peer
        sps = per_rank * self.cfg.batch_size * self.size / wall if wall > 0 else None
        tokens = {"tokens_per_s": sps * self.context if sps is not None else None} if self.context else {}
        return {"kind": "step", "step": step, "epoch": step / self.E, "stage": stage,
                "time": time.perf_counter() - self._t_start, "train_s": train_s,
                "loss": sums["loss"] / n, "lr": self.schedule(step), "samples_per_s": sps, **tokens,
                "step_s": step_s, "compute_s": step_s - means["wait_s"], "wait_s": means["wait_s"],
                "bytes_sent": self._bytes_per_step(step), **breakdown(step_s, means)}

    def finalize(self) -> None:
        """Post-local SGD: average a partial last period, as ssdmpi's localsgd ``finalize`` does."""
        if self.peer == "postlocal" and self.total_steps > self.T_w and (self.total_steps - self.T_w) % self.k:
            from torch.distributed.algorithms.model_averaging.utils import average_parameters

            average_parameters(iter(list(self.ddp.module.parameters())), self.dist.group.WORLD)
            self.W = None

    def _global_params(self):
        """The global model's tensors: the live ones, or post-local SGD's last average in its delay stage."""
        if self.peer == "postlocal" and getattr(self, "W", None) is not None:
            return self.W
        return [p.detach() for p in self.ddp.module.parameters()]

    def _evaluate(self, log, step: int, train_s: float) -> dict:
        """Rank 0: the global model on the whole test split or all validation windows
        (``evaluate_split``); the others wait."""
        result = {}
        if self.rank == 0:
            t0 = time.perf_counter()
            self.engine.params[...] = self.global_weights()
            state = self.ddp.module.state_dict()
            for key, value in self.engine.buffers().items():
                if key in state:
                    value[...] = state[key].numpy()
            loss, acc = evaluate_split(self.engine, *self.split)
            if self.context:
                result = {"val_loss": loss, "val_ppl": perplexity(loss), "val_acc": acc}
                text, seen = f"val loss {loss:.4f}  ppl {result['val_ppl']:.2f}", {"tokens": self._tokens(step)}
            else:
                result = {"test_acc": acc, "test_loss": loss}
                text, seen = f"test acc {acc:.2%}  loss {loss:.4f}", {}
            log.write({"kind": "eval", "step": step, "epoch": step / self.E,
                       "time": time.perf_counter() - self._t_start, "train_s": train_s, **seen,
                       "eval_s": time.perf_counter() - t0, **result})
            print(f"eval  step {step}  epoch {step / self.E:.2f}  {text}", flush=True)
        self.dist.barrier()
        return result

    def _tokens(self, step: int) -> int:
        """A language model's training tokens after ``step`` steps: step x global batch x context."""
        return int(step) * self.cfg.batch_size * self.size * int(self.context)

    # -- the run directory -----------------------------------------------------------------
    def _open_run_dir(self):
        from ssdmpi.metrics import MetricsLog

        self._t_start = time.perf_counter()
        run_dir = self.cfg.run_dir
        if self.rank != 0:
            return None
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, rundir.PEER_CONFIG), "w") as f:
            json.dump(self._settings(), f, indent=2)
        log = MetricsLog(rundir.metrics_path(run_dir))
        log.write({"kind": "start", "world_size": self.size, "peer": self.peer, "config": self._settings(),
                   "steps_per_epoch": self.E, "total_steps": self.total_steps, "placement": self.placement.describe()})
        return log

    def _settings(self) -> dict:
        import torch

        from ssdmpi.config.settings import model_options

        cfg = self.cfg
        optimizer = registry.own_settings(registry.OPTIMIZERS[cfg.optimizer].settings, self.algo)
        return {"algo": "ddp" if self.peer == "ddp" else "post-local-sgd", "peer": self.peer,
                "delay": self.k, "warmup_steps": self.T_w if self.peer == "postlocal" else None,
                "model": cfg.model, **model_options(cfg), "dataset": cfg.dataset,
                **({"context": self.context} if self.context else {}), "batch_size": cfg.batch_size, "lr": cfg.lr,
                "lr_schedule": cfg.lr_schedule, "lr_warmup_steps": self.algo.lr_warmup_steps,
                "optimizer": cfg.optimizer, **optimizer, "seed": cfg.seed, "bucket_cap_mb": self.bucket_mb,
                "backend": "gloo", "torch": torch.__version__, "threads": torch.get_num_threads()}

    def _write_summary(self, train_s: float, last_eval: dict) -> None:
        """Rank 0: ``summary.json`` (the keys ``ssdmpi train`` writes that apply) and one line."""
        settings = self._settings()
        sps = self.total_steps * self.cfg.batch_size * self.size / train_s if train_s else 0.0
        tokens = {"tokens_per_s": sps * self.context, "tokens": self._tokens(self.total_steps)} if self.context else {}
        summary = {"status": "done", "algo": settings["algo"], "world_size": self.size, "model": self.cfg.model,
                   "num_params": int(self.engine.num_params), "dataset": self.dataset.name,
                   "step": self.total_steps, "epoch": self.total_steps / self.E,
                   "time": time.perf_counter() - self._t_start, "train_time": train_s, "samples_per_s": sps,
                   **tokens, **last_eval, "run_dir": self.cfg.run_dir, "placement": self.placement.describe(),
                   "config": settings}
        path = os.path.join(self.cfg.run_dir, rundir.SUMMARY)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)
        os.replace(path + ".tmp", path)
        if self.context:
            speed = f"{summary['tokens_per_s']:.0f} tokens/s"
            score = f"validation loss {last_eval.get('val_loss', float('nan')):.4f}"
        else:
            speed, score = f"{sps:.0f} samples/s", f"test accuracy {last_eval.get('test_acc', float('nan')):.2%}"
        print(f"{settings['algo']} on {self.size} ranks: {self.total_steps} steps, {speed}, {score}; {path}",
              flush=True)


def main(argv=None) -> int:
    try:
        import torch  # noqa: F401
    except Exception as exc:     # ImportError, or a broken install
        print(f"ssdmpi bench peers: the PyTorch peers need PyTorch ({type(exc).__name__}: {exc}); {INSTALL}",
              file=sys.stderr, flush=True)
        return 2
    try:
        return Peer(sys.argv[1:] if argv is None else argv).run()
    except UserError as exc:
        print(f"ssdmpi bench peers: error: {exc}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
