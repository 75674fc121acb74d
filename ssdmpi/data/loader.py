"""The sharded, seeded, resumable loader, and test-set sharding for evaluation.

Sharding policy (``ShardedLoader``), with W ranks, per-rank batch B and N samples:

* epoch ``e`` visits the samples in the order ``perm_e`` = a permutation of 0..N-1
  drawn from ``numpy.random.default_rng([seed, e])`` — the same on every rank;
* an epoch has ``steps_per_epoch = N // (W*B)`` global steps; global step ``t`` uses
  ``perm_e[t*W*B : (t+1)*W*B]`` and rank ``r`` takes the ``r``-th slice of B of those;
* **remainder**: the last ``N - steps_per_epoch*W*B`` (< W*B) positions of ``perm_e``
  are dropped that epoch; the permutation changes every epoch, so different samples are
  dropped each time and none is dropped systematically;
* within an epoch the shards are disjoint, and their union over the epoch's steps is
  ``perm_e`` minus the remainder;
* the union over ranks of step ``t``'s batches (in rank order) IS the batch of a
  ``world_size=1`` loader with batch ``W*B`` and the same seed, so SSGD on W ranks with
  batch B sees the same data as single-process SGD with batch W*B.

The position is all the state: the epoch and the *global sample offset* into ``perm_e``
(``step * W*B``: the samples every rank together took so far this epoch). Permutation and
augmentation draws are pure functions of (seed, epoch, offset), so
``load_state_dict(state_dict())`` resumes exactly, and prefetching (a background thread
building the next batch) cannot change the sequence. The order does not depend on how the
global batch is split: a loader of ``W'`` ranks x ``W*B/W'`` resumed at the same offset
continues the epoch with the same global batches, no sample dropped or repeated. No MPI
in here: rank and world size are plain integers, so a single-process simulator can build
one loader per simulated rank.

``x`` and ``y`` are arrays, or sample sources whose samples are a pure function of the
seed and the epoch: objects with ``len()`` and ``gather(indices, seed, epoch) -> array``
(the text windows of ``ssdmpi/data/text.py``, which start at a per-epoch offset); the
order, sharding, resume and prefetch above are the same for both.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ssdmpi.data.augment import Augment, parse_augment
from ssdmpi.errors import UserError


def evaluation_shard(n: int, rank: int, world_size: int) -> slice:
    """Rank ``rank``'s contiguous part of ``n`` evaluation samples: every sample once, none dropped.

    Sizes differ by at most one (the first ``n % world_size`` ranks get one more); a rank
    may get an empty slice when ``n < world_size``. Sum per-rank counts (e.g. correct
    predictions and sample counts) with an allreduce to get the global metric.
    """
    if world_size < 1 or not 0 <= rank < world_size or n < 0:
        raise ValueError(f"bad shard request: n={n}, rank={rank}, world_size={world_size}")
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


class ShardedLoader:
    """This rank's mini-batches of ``(x, y)``, epoch after epoch (policy in the module docstring).

    Args:
        x: (N, ...) float32 samples (e.g. ``Dataset.train_x``; not copied, not modified), or a
            sample source (module docstring; e.g. ``TextDataset.train_windows(T)[0]``).
        y: (N,) int64 labels, or a sample source.
        batch_size: per-rank batch size B.
        rank, world_size: this rank and the number of ranks (plain ints; no MPI here).
        seed: the data-order seed; must be the same on every rank.
        augment: an ``Augment``, a spec string such as ``"crop4,flip"``, or None. Needs (N, C, H, W) x.
        prefetch: build the next batch on a background thread while the caller works.

    ``next_batch()`` returns new host arrays ``(xb (B, ...) float32, yb (B,) int64)`` (from sample
    sources: what their ``gather`` returns, e.g. text windows (B, T) int64 each) that the caller
    owns. ``epoch`` and ``step_in_epoch`` give the position of the NEXT batch.
    """

    def __init__(self, x, y, batch_size: int, rank: int, world_size: int, seed: int, augment=None,
                 prefetch: bool = False):
        if len(x) != len(y):
            raise UserError(f"loader: {len(x)} samples but {len(y)} labels")
        if int(batch_size) < 1:
            raise UserError(f"batch size must be >= 1, got {batch_size}")
        if int(world_size) < 1 or not 0 <= int(rank) < int(world_size):
            raise UserError(f"loader: rank {rank} is not in 0..{int(world_size) - 1}")
        if int(seed) < 0:
            raise UserError(f"the data seed must be >= 0, got {seed}")
        self.x, self.y = x, y
        self.batch_size, self.rank, self.world_size, self.seed = int(batch_size), int(rank), int(world_size), int(seed)
        self.global_batch_size = self.batch_size * self.world_size
        self.num_samples = len(x)
        self.steps_per_epoch = self.num_samples // self.global_batch_size
        if self.steps_per_epoch == 0:
            raise UserError(f"{self.num_samples} training samples are fewer than one global batch "
                            f"({self.world_size} ranks x batch {self.batch_size} = {self.global_batch_size}); "
                            "use a smaller batch size or fewer ranks")
        self.augment = parse_augment(augment, None)
        if self.augment is not None and np.ndim(x) != 4:
            raise UserError(f"augmentation '{self.augment.spec()}' needs images (N, C, H, W), got samples "
                            f"of shape {tuple(np.shape(x)[1:])}")
        self.augment_seed = self.seed if self.augment is None or self.augment.seed is None else int(self.augment.seed)
        self.epoch = 0
        self.step_in_epoch = 0
        self._perm_lock = threading.Lock()
        self._perm_cache: dict[int, np.ndarray] = {}
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="ssdmpi-prefetch") if prefetch else None
        self._pending = None   # ((epoch, step), Future) of the prefetched batch

    # ------------------------------------------------------------------ the sequence

    @property
    def dropped_per_epoch(self) -> int:
        """Samples left out of each epoch (the remainder, < world_size * batch_size)."""
        return self.num_samples - self.steps_per_epoch * self.global_batch_size

    @property
    def iteration(self) -> int:
        """Global steps taken so far: epoch * steps_per_epoch + step_in_epoch."""
        return self.epoch * self.steps_per_epoch + self.step_in_epoch

    def permutation(self, epoch: int) -> np.ndarray:
        """The sample order of ``epoch`` (the same on every rank). Read-only; the last two are cached."""
        with self._perm_lock:
            perm = self._perm_cache.get(epoch)
            if perm is None:
                perm = np.random.default_rng([self.seed, int(epoch)]).permutation(self.num_samples)
                perm.flags.writeable = False
                if len(self._perm_cache) >= 2:
                    self._perm_cache.pop(min(self._perm_cache))
                self._perm_cache[epoch] = perm
            return perm

    def indices(self, epoch: int, step: int) -> np.ndarray:
        """The sample indices this rank gets at global step ``step`` of ``epoch``."""
        start = step * self.global_batch_size + self.rank * self.batch_size
        return self.permutation(epoch)[start:start + self.batch_size]

    def batch_at(self, epoch: int, step: int) -> tuple[np.ndarray, np.ndarray]:
        """This rank's batch at (epoch, step), augmented; does not move the position."""
        if not 0 <= step < self.steps_per_epoch or epoch < 0:
            raise ValueError(f"no step {step} in epoch {epoch} (steps_per_epoch={self.steps_per_epoch})")
        idx = self.indices(epoch, step)
        xb, yb = (source.gather(idx, self.seed, epoch) if hasattr(source, "gather") else np.take(source, idx, axis=0)
                  for source in (self.x, self.y))
        if self.augment is not None:
            offsets, flips = Augment.draws(self.augment_seed, epoch, step, self.global_batch_size)
            mine = slice(self.rank * self.batch_size, (self.rank + 1) * self.batch_size)
            xb = self.augment.apply(xb, offsets[mine], flips[mine])
        return xb, yb

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        """This rank's next batch ``(xb, yb)``; advances, rolling over into the next epoch."""
        position = (self.epoch, self.step_in_epoch)
        if self._executor is None:
            batch = self.batch_at(*position)
        else:
            if self._pending is None or self._pending[0] != position:
                self._pending = (position, self._executor.submit(self.batch_at, *position))
            batch = self._pending[1].result()
        self.step_in_epoch += 1
        if self.step_in_epoch == self.steps_per_epoch:
            self.epoch += 1
            self.step_in_epoch = 0
        if self._executor is not None:
            nxt = (self.epoch, self.step_in_epoch)
            self._pending = (nxt, self._executor.submit(self.batch_at, *nxt))
        return batch

    # ------------------------------------------------------------------ save / restore

    def state_dict(self) -> dict:
        """The position (``epoch``, ``sample_offset``; ``step_in_epoch`` = offset / global batch) and
        the settings it depends on, as plain ints (storable as HDF5 attributes)."""
        aug = self.augment
        return {
            "epoch": self.epoch, "sample_offset": self.step_in_epoch * self.global_batch_size,
            "step_in_epoch": self.step_in_epoch, "seed": self.seed,
            "num_samples": self.num_samples, "global_batch_size": self.global_batch_size,
            "batch_size": self.batch_size, "world_size": self.world_size,
            "augment_pad": aug.pad if aug else 0, "augment_flip": int(bool(aug and aug.flip)),
            "augment_seed": self.augment_seed,
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume at the saved position. The sequence must be the same one: UserError if the
        seed, dataset size, global batch (world_size * batch_size) or augmentation differ.

        A different split of the same global batch (e.g. 4 ranks x 32 saved, 2 x 64 resumed)
        is accepted: the global batches, hence the data seen, stay the same.
        """
        mine = self.state_dict()
        for key in ("seed", "num_samples", "global_batch_size", "augment_pad", "augment_flip", "augment_seed"):
            if int(state[key]) != mine[key]:
                raise UserError(f"the saved data-loader state has {key}={int(state[key])}, this run {mine[key]}; "
                                "resume with the same data, seed, global batch and augmentation")
        epoch, step = int(state["epoch"]), int(state["step_in_epoch"])
        if "sample_offset" in state:
            offset = int(state["sample_offset"])
            step = offset // self.global_batch_size if offset % self.global_batch_size == 0 else -1
        if epoch < 0 or not 0 <= step < self.steps_per_epoch:
            raise UserError(f"the saved data-loader position (epoch {epoch}, step {step}) is out of range")
        self.epoch, self.step_in_epoch = epoch, step
        # A batch prefetched for the old position is simply not used (next_batch checks its key).

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Stop the prefetch thread (if any). The loader still works afterwards, without prefetch."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor, self._pending = None, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        executor = getattr(self, "_executor", None)
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
