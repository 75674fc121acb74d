"""Stand-ins the tests share: a device array and CUDA streams without a GPU, a minimal batch source."""

import threading
from collections import deque

import numpy as np


class FakeDeviceArray:
    """A 1-D 'device' array over host memory, CuPy-like enough for ssdmpi.comm.

    With a ``gpu`` (a ``FakeGPU``), its own arithmetic (``/=``, ``*=``) is a kernel queued on the
    compute stream, as CuPy queues it on the current stream; without one it runs at once.
    """

    def __init__(self, host: np.ndarray, gpu=None):
        self._host, self.gpu = host, gpu

    @property
    def __cuda_array_interface__(self):
        return {"shape": self._host.shape, "typestr": self._host.dtype.str,
                "data": (self._host.ctypes.data, False), "strides": None, "version": 3}

    dtype = property(lambda self: self._host.dtype)
    size = property(lambda self: self._host.size)
    nbytes = property(lambda self: self._host.nbytes)
    ndim = property(lambda self: self._host.ndim)
    shape = property(lambda self: self._host.shape)
    itemsize = property(lambda self: self._host.itemsize)

    def __getitem__(self, index):
        assert isinstance(index, slice)
        return FakeDeviceArray(self._host[index], self.gpu)

    def get(self, out=None, stream=None, blocking=True):
        """Device -> host copy (CuPy's name). On a ``FakeStream`` the copy is queued there and
        reads the device memory when the stream runs it (``blocking``: run the stream now)."""
        if out is None:
            out = np.empty_like(self._host)
        if isinstance(stream, FakeStream):
            stream.launch("D2H", lambda: out.__setitem__(Ellipsis, self._host))
            if blocking:
                stream.synchronize()
        else:
            out[...] = self._host
        return out

    def set(self, host, stream=None):
        """Host -> device copy (CuPy's name); queued on a ``FakeStream``, reading ``host`` when it runs."""
        if isinstance(stream, FakeStream):
            stream.launch("H2D", lambda: self._host.__setitem__(Ellipsis, host))
        else:
            self._host[...] = host

    def __itruediv__(self, other):
        return self._kernel("divide", self._host.__itruediv__, other)

    def __imul__(self, other):
        return self._kernel("multiply", self._host.__imul__, other)

    def _kernel(self, name, op, other):
        """``op(other)`` on the memory: queued on the compute stream with a ``gpu``, else now."""
        if self.gpu is not None:
            self.gpu.compute.launch(name, lambda: op(other))
        else:
            op(other)
        return self


class FakeGPU:
    """Two CUDA streams that run their queued work lazily, logging what ran in ``log`` (in order).

    It offers what ``ssdmpi.comm.transport.Transport`` takes as ``streams``: ``current_stream()``
    (``compute``), ``copy_stream()`` (``copy``) and ``new_event()``. Work queued on a stream
    (``launch``, a ``FakeDeviceArray`` copy given the stream, ``record``, ``wait_event``) runs only
    when a thread waits for it: ``event.synchronize()`` or ``stream.synchronize()`` run that
    stream up to the event, and a ``wait_event`` runs the other stream up to its event first.
    ``event.done`` just reports (the GPU "has not got there yet" until something waits or
    ``run_all`` is called). So a missing ``wait_event`` shows up as a copy or kernel that ran
    before the work it depends on: a wrong value and a wrong ``log``.
    """

    def __init__(self):
        self.log: list[str] = []
        self.lock = threading.RLock()    # the communication thread may run the streams too
        self.compute = FakeStream(self, "compute")
        self.copy = FakeStream(self, "copy")

    def current_stream(self):
        return self.compute

    def copy_stream(self):
        return self.copy

    def new_event(self):
        return FakeEvent()

    def run_all(self) -> None:
        """Time passes: run every stream to its end, the compute stream first (so a consumer
        kernel that does not wait for the copy back runs before it)."""
        self.compute.synchronize()
        self.copy.synchronize()


class FakeEvent:
    """``cupy.cuda.Event``'s ``done`` and ``synchronize``; done until recorded, as in CUDA."""

    def __init__(self):
        self.stream, self.done = None, True

    def synchronize(self) -> None:
        if not self.done:
            self.stream.run(until=self)


class FakeStream:
    """One stream of a ``FakeGPU``: a FIFO of operations (see ``FakeGPU``)."""

    def __init__(self, gpu: FakeGPU, name: str):
        self.gpu, self.name, self.queue = gpu, name, deque()

    def launch(self, what: str, fn=None) -> None:
        """Queue a kernel (``fn()``, logged as ``"<stream>: <what>"`` when it runs)."""
        with self.gpu.lock:
            self.queue.append(("run", what, fn))

    def record(self, event=None):
        event = event if event is not None else FakeEvent()
        with self.gpu.lock:
            event.stream, event.done = self, False
            self.queue.append(("event", event, None))
        return event

    def wait_event(self, event) -> None:
        with self.gpu.lock:
            self.queue.append(("wait", event, None))

    @property
    def done(self) -> bool:
        return not self.queue

    def synchronize(self) -> None:
        self.run()

    def run(self, until=None) -> None:
        """Run queued operations in order, up to the event ``until`` (default: all)."""
        with self.gpu.lock:
            while self.queue:
                kind, item, fn = self.queue.popleft()
                if kind == "run":
                    if fn is not None:
                        fn()
                    self.gpu.log.append(f"{self.name}: {item}")
                elif kind == "wait":
                    item.synchronize()
                else:
                    item.done = True
                    if item is until:
                        return


class ArrayBatches:
    """A minimal batch source for the reference simulator and algorithm tests (no ssdmpi.data).

    Epoch ``e`` uses ``perm_e = default_rng([seed, e]).permutation(n)``; global step ``i`` of
    the epoch uses ``perm_e[i*N*B:(i+1)*N*B]`` and rank ``r`` takes its ``r``-th slice of ``B``;
    an epoch has ``n // (N*B)`` steps (the remainder is dropped).
    """

    def __init__(self, x, y, batch_size: int, rank: int, world_size: int, seed: int = 0):
        self.x, self.y, self.B, self.r, self.N, self.seed = x, y, int(batch_size), int(rank), int(world_size), seed
        self.steps_per_epoch = len(x) // (self.B * self.N)
        if self.steps_per_epoch < 1:
            raise ValueError("dataset smaller than one global batch")
        self.step = 0
        self._perm_epoch, self._perm = None, None

    def next_batch(self):
        e, i = divmod(self.step, self.steps_per_epoch)
        if e != self._perm_epoch:
            self._perm_epoch, self._perm = e, np.random.default_rng([self.seed, e]).permutation(len(self.x))
        perm = self._perm
        start = i * self.N * self.B + self.r * self.B
        idx = perm[start:start + self.B]
        self.step += 1
        return self.x[idx], self.y[idx]

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, d) -> None:
        self.step = int(d["step"])
