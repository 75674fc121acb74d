"""How GPU buffers reach MPI: staged through pinned host memory, or passed as device buffers.

A buffer is a *device buffer* when it exposes ``__cuda_array_interface__`` (CuPy arrays, or
the fake device arrays the tests use). Host (NumPy) buffers always go to MPI as they are.
For device buffers:

- ``host``: copy device -> pinned host staging buffer (``backend.pinned_empty``, cached per
  device buffer), run MPI on the host copy, copy back. Safe with every MPI library.
- ``cuda-aware``: hand the device buffer to MPI (mpi4py reads ``__cuda_array_interface__``).
  Needs an MPI built with CUDA support that also supports the call (Open MPI documents
  ``Iallreduce`` on device buffers as unsupported).
- ``auto``: ``SSDMPI_TRANSPORT`` if set, else ``host`` (conservative).

Ordering without stalling the compute stream (MPI knows nothing of CUDA streams). ``stage(buf)``
returns at once; the caller's thread never waits for the GPU:

1. an event is recorded on the *current* (compute) stream, after the kernel that wrote ``buf``;
2. ``host``: the dedicated copy stream (``backend.copy_stream()``, non-blocking) waits on that
   event, then copies ``buf`` into its pinned staging buffer asynchronously, and records a
   second event: the staging's *ready* event. ``cuda-aware``: the first event is the ready one;
3. the Communicator posts MPI only once the ready event completed: the communication thread
   waits on it, the ``test`` strategy polls it (``Staged.ready``) from ``progress``/``test``,
   ``blocking`` waits on it;
4. ``from_mpi`` (after MPI finished) queues the copy back on the copy stream and makes the
   current stream wait on its event, so the consumer's kernels read the result, not the old
   values, while the host goes on at once.

The copy stream's FIFO order also keeps a staging buffer from being refilled before its copy
back has read it. Streams and events come from ``backend`` (``current_stream``, ``copy_stream``,
``new_event``; harmless stand-ins on NumPy), or from a fake passed as ``streams`` (tests).
Device arrays are driven through CuPy's own method names (``get(out=, stream=, blocking=False)``,
``set(host, stream=)``), so this module never imports CuPy.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from ssdmpi.errors import UserError

TRANSPORTS = ("auto", "cuda-aware", "host")


def _open_mpi_built_with_cuda() -> bool | None:
    """Open MPI's own answer (``ompi_info``), or None when it cannot be asked."""
    tool = shutil.which("ompi_info")
    if tool is None:
        return None
    try:
        out = subprocess.run([tool, "--parsable", "--all"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        if "mpi_built_with_cuda_support:value" in line:
            return line.strip().endswith("true")
    return None


def cuda_aware_verdict(transport: str = "auto") -> str:
    """One line: whether device buffers go to MPI directly, and on whose word.

    An explicit ``--transport`` or ``SSDMPI_TRANSPORT`` decides. ``auto`` is conservative:
    Open MPI documents ``Iallreduce`` on GPU buffers as unsupported even when built with
    CUDA, so ``auto`` stages through pinned host memory unless told otherwise.
    """
    explicit = transport if transport != "auto" else os.environ.get("SSDMPI_TRANSPORT", "auto")
    if explicit == "cuda-aware":
        return "yes (explicit setting: cuda-aware; device buffers are passed to MPI)"
    if explicit == "host":
        return "no (explicit setting: host; staged through pinned host memory)"
    built = _open_mpi_built_with_cuda()
    if built is None:
        return "unknown — host staging will be used"
    return (f"Open MPI built with CUDA support: {'yes' if built else 'no'} — host staging will be used "
            "(auto is conservative; pass --transport cuda-aware to use device buffers)")


def resolve_transport(transport: str = "auto") -> str:
    """``"host"`` or ``"cuda-aware"``: what ``transport`` (or ``SSDMPI_TRANSPORT`` under auto) means."""
    if transport not in TRANSPORTS:
        raise UserError(f"unknown transport {transport!r}; choose one of {', '.join(TRANSPORTS)}")
    if transport == "auto":
        transport = os.environ.get("SSDMPI_TRANSPORT", "auto") or "auto"
        if transport not in TRANSPORTS:
            raise UserError(f"SSDMPI_TRANSPORT={transport!r} is not one of {', '.join(TRANSPORTS)}")
    return "cuda-aware" if transport == "cuda-aware" else "host"


class Staged:
    """One buffer on its way to MPI: ``work`` is the buffer MPI reads and writes (``buf`` itself,
    or its pinned host copy); MPI may touch it once ``ready()`` (the ready event completed)."""

    __slots__ = ("buf", "work", "event")

    def __init__(self, buf, work, event=None):
        self.buf, self.work, self.event = buf, work, event

    def ready(self) -> bool:
        """True when MPI may use ``work`` (does not wait)."""
        return self.event is None or bool(self.event.done)

    def wait_ready(self) -> None:
        """Block this thread (only) until MPI may use ``work``."""
        if self.event is not None:
            self.event.synchronize()


class Transport:
    """Turns a caller's buffer into the buffer MPI works on, and back (see the module docstring).

    ``stage(buf)`` (caller's thread, before MPI starts; returns at once): a ``Staged``.
    ``to_mpi(buf)``: ``stage`` and wait until ready; the blocking form (broadcasts, point-to-point).
    ``from_mpi(buf, work)`` (caller's thread, after MPI finished): queue the copy back, if any,
    ordered before the caller's next kernels.
    ``streams``: where ``current_stream()``, ``copy_stream()`` and ``new_event()`` come from
    (default ``ssdmpi.backend``; tests pass fakes that record the order of operations).
    """

    def __init__(self, transport: str = "auto", streams=None):
        from ssdmpi import backend

        self.name = resolve_transport(transport)
        self._backend = backend
        self.streams = streams if streams is not None else backend
        self._staging: dict = {}

    def is_device(self, buf) -> bool:
        """True for buffers in GPU memory."""
        return self._backend.is_device_array(buf)

    def stages(self, buf) -> bool:
        """True when ``buf`` travels through a host copy."""
        return self.name == "host" and self.is_device(buf)

    def stage(self, buf) -> Staged:
        """Start ``buf``'s trip to MPI without waiting for the GPU (steps 1-2 of the module docstring)."""
        if not self.is_device(buf):
            return Staged(buf, buf)
        streams = self.streams
        produced = streams.current_stream().record(streams.new_event())
        if self.name == "cuda-aware":
            return Staged(buf, buf, produced)
        copy = streams.copy_stream()
        host = self._staging_for(buf)
        copy.wait_event(produced)
        buf.get(out=host, stream=copy, blocking=False)
        return Staged(buf, host, copy.record(streams.new_event()))

    def to_mpi(self, buf):
        """The buffer MPI should read and write for ``buf``, once it may (blocks this thread only)."""
        staged = self.stage(buf)
        staged.wait_ready()
        return staged.work

    def from_mpi(self, buf, work) -> None:
        """Copy MPI's result in ``work`` back into ``buf`` when they differ (step 4)."""
        if work is not buf:
            streams = self.streams
            copy = streams.copy_stream()
            buf.set(work, stream=copy)
            streams.current_stream().wait_event(copy.record(streams.new_event()))

    def _staging_for(self, buf):
        """A pinned host buffer for this device buffer, reused across calls."""
        cai = buf.__cuda_array_interface__
        key = (cai["data"][0], tuple(cai["shape"]), buf.dtype.str)
        host = self._staging.get(key)
        if host is None:
            if len(self._staging) >= 16:   # a caller cycling through many buffers: do not hoard pinned memory
                self.streams.copy_stream().synchronize()   # no copy may still use a buffer we let go
                self._staging.clear()
            host = self._staging[key] = self._backend.pinned_empty(tuple(cai["shape"]), buf.dtype)
        return host
