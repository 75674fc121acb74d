"""Array backend: NumPy on the CPU, CuPy on a GPU, behind one name, ``xp``.

This is the only module that imports CuPy. Everything else asks for ``get_xp()``
(or ``array_module(a)``) and writes ``xp.`` code, so it never branches on whether
CuPy is installed or a GPU is present.

``select("auto")`` uses CuPy only if ``import cupy`` succeeds AND a first device
allocation succeeds: on a machine without a GPU ``import cupy`` works but the first
allocation raises ``RuntimeError`` (``CUDARuntimeError``), and we fall back to NumPy.
"""

from __future__ import annotations

import numpy as np

from ssdmpi.errors import UserError

DEVICES = ("auto", "cpu", "gpu")

_xp = np
_device = "cpu"
_reason = "NumPy selected (default; no backend chosen yet)"
_cupy_probe: tuple | None = None   # cached (cupy module or None, reason)


def probe_cupy():
    """Return ``(cupy, reason)``: the CuPy module if a GPU allocation works, else ``(None, why not)``."""
    global _cupy_probe
    if _cupy_probe is None:
        try:
            import cupy
        except Exception as exc:  # ImportError, or a broken CUDA install raising anything
            _cupy_probe = (None, f"CuPy missing ({type(exc).__name__}: {exc})")
        else:
            try:
                cupy.zeros(1, dtype=cupy.float32).sum().item()
                name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
                if isinstance(name, bytes):
                    name = name.decode()
                _cupy_probe = (cupy, f"GPU found: {name} (CuPy {cupy.__version__})")
            except Exception as exc:  # CUDARuntimeError is a RuntimeError; be broad anyway
                first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                _cupy_probe = (None, f"no GPU (CuPy {cupy.__version__} imported, "
                                     f"first allocation failed: {first_line})")
    return _cupy_probe


def gpu_count() -> int:
    """How many CUDA devices CuPy sees (0 without CuPy or a driver). Makes no allocation."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # ImportError, CUDARuntimeError (no driver), anything a broken install raises
        return 0


def bind_gpu(gpu_id: int) -> None:
    """Make CUDA device ``gpu_id`` this process's current one: call before ``select`` (whose
    first allocation creates the CUDA context on the current device)."""
    import cupy

    cupy.cuda.Device(gpu_id).use()


def select(device: str = "auto"):
    """Choose the array backend for this process and return its ``xp`` module.

    ``cpu``: NumPy. ``gpu``: CuPy, or ``UserError`` if no GPU is usable.
    ``auto``: CuPy when a GPU is usable, NumPy otherwise.
    """
    global _xp, _device, _reason
    if device not in DEVICES:
        raise UserError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    if device == "cpu":
        _xp, _device, _reason = np, "cpu", "NumPy (--device cpu)"
        return _xp
    cupy, why = probe_cupy()
    if cupy is None:
        if device == "gpu":
            raise UserError(f"--device gpu requested but {why}; use --device cpu or auto")
        _xp, _device, _reason = np, "cpu", f"NumPy: {why}"
    else:
        _xp, _device, _reason = cupy, "gpu", f"CuPy: {why}"
    return _xp


def get_xp():
    """The selected array module (``numpy`` until ``select`` picks CuPy)."""
    return _xp


def device() -> str:
    """``"cpu"`` or ``"gpu"``: where arrays made with ``get_xp()`` live."""
    return _device


def reason() -> str:
    """One line: which backend is active and why."""
    return _reason


def is_device_array(a) -> bool:
    """True for arrays in GPU memory (anything exposing ``__cuda_array_interface__``)."""
    return hasattr(a, "__cuda_array_interface__")


def array_module(a):
    """``cupy`` for CuPy arrays, ``numpy`` otherwise (like ``cupy.get_array_module``)."""
    if is_device_array(a) and type(a).__module__.startswith("cupy"):
        import cupy
        return cupy
    return np


def to_device(a):
    """Copy a host array to the selected backend (no copy when that is NumPy)."""
    return _xp.asarray(a)


def to_host(a) -> np.ndarray:
    """Return ``a`` as a NumPy array (copies device arrays to the host)."""
    if is_device_array(a) and hasattr(a, "get"):
        return a.get()
    return np.asarray(a)


def synchronize() -> None:
    """Wait for all work queued on the current CUDA stream (no-op on NumPy).

    Call before MPI reads a device buffer: MPI knows nothing of CUDA streams.
    """
    if _device == "gpu":
        _xp.cuda.get_current_stream().synchronize()


def pinned_empty(shape, dtype=np.float32) -> np.ndarray:
    """A host NumPy array in page-locked memory on GPU runs (plain memory on CPU runs).

    Pinned memory makes device<->host copies fast and lets them run asynchronously;
    the host-staged MPI transport uses it.
    """
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    if _device != "gpu" or count == 0:
        return np.empty(shape, dtype=dtype)
    mem = _xp.cuda.alloc_pinned_memory(count * dtype.itemsize)
    return np.frombuffer(mem, dtype=dtype, count=count).reshape(shape)


class HostEvent:
    """Stand-in for ``cupy.cuda.Event`` on NumPy runs: host work is done when it returns."""

    done = True

    def synchronize(self) -> None:
        """Nothing to wait for."""


class HostStream:
    """Stand-in for ``cupy.cuda.Stream`` on NumPy runs (the same method names, no work)."""

    done = True

    def record(self, event=None):
        """An event that is already complete."""
        return event if event is not None else HostEvent()

    def wait_event(self, event) -> None:
        """Nothing to wait for: host work is ordered by the host thread."""

    def synchronize(self) -> None:
        """Nothing to wait for."""


HOST_STREAM = HostStream()
_copy_streams: dict = {}   # CUDA device id -> the staging copy stream


def current_stream():
    """The stream kernels are queued on now (CuPy's current stream; ``HOST_STREAM`` on NumPy)."""
    return _xp.cuda.get_current_stream() if _device == "gpu" else HOST_STREAM


def copy_stream():
    """The dedicated stream of the host-staged transport's copies (one per CUDA device).

    Non-blocking (``cudaStreamNonBlocking``): CuPy queues kernels on the legacy default stream,
    which a plain stream would synchronise with, serialising the copies with the compute.
    ``HOST_STREAM`` on NumPy runs.
    """
    if _device != "gpu":
        return HOST_STREAM
    dev = _xp.cuda.Device().id
    if dev not in _copy_streams:
        _copy_streams[dev] = _xp.cuda.Stream(non_blocking=True)
    return _copy_streams[dev]


def new_event():
    """An event for ordering streams: no timing (cheaper to record), completed ones report ``done``."""
    return _xp.cuda.Event(disable_timing=True) if _device == "gpu" else HostEvent()


def host_floats(values) -> list:
    """``values`` (Python floats, NumPy scalars, 0-d device arrays, mixed) as Python floats, reading
    device values in ONE copy: the host sync the training loop pays at a log interval, not per step."""
    values = list(values)
    out = [None] * len(values)
    on_device = [i for i, v in enumerate(values) if is_device_array(v)]
    for i, v in enumerate(values):
        if not is_device_array(v):
            out[i] = float(v)
    if on_device:
        xp = array_module(values[on_device[0]])
        if xp is np:    # foreign device arrays (tests' fakes): one at a time
            read = [float(to_host(values[i])) for i in on_device]
        else:
            read = to_host(xp.stack([values[i] for i in on_device])).tolist()
        for i, v in zip(on_device, read):
            out[i] = float(v)
    return out


# nvcc/NVRTC contract a*b + c into one FMA by default (one rounding where NumPy rounds twice):
# fused kernels are compiled without it, and with IEEE division, so they give the NumPy bits.
ELEMENTWISE_OPTIONS = ("--fmad=false", "--prec-div=true")


def elementwise(name: str, in_params: str, out_params: str, body: str):
    """A CuPy ``ElementwiseKernel`` (compiled on first call, ``ELEMENTWISE_OPTIONS``) when a GPU is
    usable, else None (the caller runs its NumPy code). Outputs are passed in, nothing is returned."""
    cupy, _ = probe_cupy()
    if cupy is None:
        return None
    return cupy.ElementwiseKernel(in_params, out_params, body, name, no_return=True,
                                  options=ELEMENTWISE_OPTIONS)


def describe() -> dict:
    """What ``ssdmpi info`` reports about the backend: active backend and why, CuPy availability."""
    cupy, why = probe_cupy()
    return {"active": "cupy" if _device == "gpu" else "numpy", "device": _device,
            "reason": _reason, "gpu_usable": cupy is not None, "cupy_probe": why}
