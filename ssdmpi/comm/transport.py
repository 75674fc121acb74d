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

Either way the producing stream is synchronised before MPI (or the staging copy) touches the
buffer, because MPI knows nothing of CUDA streams. Device arrays are driven through CuPy's
own method names (``get(out=host)``, ``set(host)``), so this module never imports CuPy.
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


class Transport:
    """Turns a caller's buffer into the buffer MPI works on, and back.

    ``to_mpi(buf)`` (caller's thread, before MPI starts): synchronise if ``buf`` is a device
    buffer, then return the 1-D buffer MPI should use (``buf`` itself, or a pinned host copy).
    ``from_mpi(buf, work)`` (caller's thread, after MPI finished): copy a host copy back.
    """

    def __init__(self, transport: str = "auto", synchronize=None):
        from ssdmpi import backend

        self.name = resolve_transport(transport)
        self._backend = backend
        # The hook that waits for the stream producing device buffers; tests replace it to
        # check it runs before MPI sees the buffer.
        self.synchronize = synchronize if synchronize is not None else backend.synchronize
        self._staging: dict = {}

    def is_device(self, buf) -> bool:
        """True for buffers in GPU memory."""
        return self._backend.is_device_array(buf)

    def stages(self, buf) -> bool:
        """True when ``buf`` travels through a host copy."""
        return self.name == "host" and self.is_device(buf)

    def to_mpi(self, buf):
        """The buffer MPI should read and write for ``buf`` (see the class contract)."""
        if not self.is_device(buf):
            return buf
        self.synchronize()
        if self.name == "cuda-aware":
            return buf
        host = self._staging_for(buf)
        buf.get(out=host)
        return host

    def from_mpi(self, buf, work) -> None:
        """Copy MPI's result in ``work`` back into ``buf`` when they differ."""
        if work is not buf:
            buf.set(work)

    def _staging_for(self, buf):
        """A pinned host buffer for this device buffer, reused across calls."""
        cai = buf.__cuda_array_interface__
        key = (cai["data"][0], tuple(cai["shape"]), buf.dtype.str)
        host = self._staging.get(key)
        if host is None:
            if len(self._staging) >= 16:   # a caller cycling through many buffers: do not hoard pinned memory
                self._staging.clear()
            host = self._staging[key] = self._backend.pinned_empty(tuple(cai["shape"]), buf.dtype)
        return host
