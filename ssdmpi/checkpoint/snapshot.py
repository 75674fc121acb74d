"""Host copies of one rank's checkpointed state, taken while training waits, written afterwards.

``HostBuffers.take(tree, replicated, rank, size)`` copies what this rank writes: every array of
its own state tree, and only its piece of each shared array (``sharded.piece``). The copies go
into buffers kept from one checkpoint to the next (allocated once; pinned host memory on a GPU,
``backend.pinned_empty``). Device arrays are copied device-to-host on the current stream without
waiting (CuPy's ``get(out=, stream=, blocking=False)``, as ``comm/transport.py`` stages): the
kernels that later change them are queued behind the copy, so training goes on at once and the
writer waits for ``Snapshot.ready`` before it reads the copies. The caller must not take the next
snapshot before the previous one is written (``writer.py`` waits for it).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from ssdmpi import backend
from ssdmpi.checkpoint.sharded import piece

WEIGHTS = "model/global_weights"   # the shared name of the model evaluation reads


@dataclasses.dataclass
class Snapshot:
    """What one rank writes: ``state`` (its tree, host copies), ``pieces`` (``{name: (array, start,
    stop, size)}``), ``shared`` (``{name: {"dtype", "size"}}``, every rank's pieces together),
    ``aliases`` (``{name: name stored}``), ``ready`` (an event: the device copies are done),
    ``nbytes`` (bytes copied) and ``copy_s`` (seconds the copying took this thread)."""

    state: dict
    pieces: dict
    shared: dict
    aliases: dict
    ready: object
    nbytes: int
    copy_s: float


class HostBuffers:
    """Host buffers reused across checkpoints, by path in the state tree. ``streams``: where
    ``current_stream()`` and ``new_event()`` come from (``ssdmpi.backend``; tests pass fakes)."""

    def __init__(self, streams=None):
        self.streams = streams if streams is not None else backend
        self._pool: dict = {}

    def take(self, tree: dict, replicated, rank: int, size: int, weights=None) -> Snapshot:
        """Copy this rank's part of ``tree`` (its live state; arrays on the host or the device).

        ``replicated``: paths (``"algo/W"``) of 1-D arrays identical on every rank: only piece
        ``rank`` of ``size`` is copied. ``weights``: the model evaluation reads, when it is not
        ``algo/W`` (the final checkpoint's finalized W; asgd's W), else None: an alias of ``algo/W``.
        """
        t0 = time.perf_counter()
        self._nbytes, self._device = 0, False
        replicated = tuple(replicated)
        own = self._copy_tree("", _without(tree, replicated))
        pieces, shared, aliases = {}, {}, {}
        shared_arrays = {path: _at(tree, path) for path in replicated}
        if weights is not None:
            shared_arrays[WEIGHTS] = weights
        elif "algo/W" in shared_arrays:
            aliases[WEIGHTS] = "algo/W"
        else:
            raise ValueError("checkpoint: no global model to store (pass weights, or replicate algo/W)")
        for name, array in shared_arrays.items():
            if array.ndim != 1:
                raise ValueError(f"checkpoint: shared array {name} must be 1-D, got shape {array.shape}")
            part = piece(array.size, rank, size)
            pieces[name] = (self._copy("shared/" + name, array[part]), part.start, part.stop, array.size)
            shared[name] = {"dtype": np.dtype(array.dtype).str, "size": int(array.size)}
        current = self.streams.current_stream()
        ready = current.record(self.streams.new_event()) if self._device else backend.HostEvent()
        return Snapshot(own, pieces, shared, aliases, ready, self._nbytes, time.perf_counter() - t0)

    def _copy_tree(self, prefix: str, value):
        if isinstance(value, dict):
            return {k: self._copy_tree(f"{prefix}{k}/", v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self._copy_tree(f"{prefix}{i}/", v) for i, v in enumerate(value)]
        if backend.is_device_array(value) or (isinstance(value, np.ndarray) and value.ndim >= 1):
            return self._copy(prefix.rstrip("/"), value)
        if isinstance(value, np.ndarray):
            return value.copy()
        return value

    def _copy(self, key: str, a):
        dtype, shape = np.dtype(a.dtype), tuple(a.shape)
        buf = self._pool.get(key)
        if buf is None or buf.dtype != dtype or buf.shape != shape:
            buf = self._pool[key] = backend.pinned_empty(shape, dtype)
        if backend.is_device_array(a):
            a.get(out=buf, stream=self.streams.current_stream(), blocking=False)
            self._device = True
        else:
            np.copyto(buf, a)
        self._nbytes += buf.nbytes
        return buf


def _at(tree: dict, path: str):
    for key in path.split("/"):
        tree = tree[key]
    return tree


def _without(tree: dict, paths) -> dict:
    """``tree`` without the entries at ``paths`` (shallow copies of the dicts on the way)."""
    out = dict(tree)
    for path in paths:
        node, keys = out, path.split("/")
        for key in keys[:-1]:
            node[key] = dict(node[key])
            node = node[key]
        node.pop(keys[-1])
    return out
