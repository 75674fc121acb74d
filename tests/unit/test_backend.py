"""Backend selection (NumPy or CuPy) and its helpers. Runs with or without a GPU."""

import re
from pathlib import Path

import numpy as np
import pytest

from ssdmpi import backend
from ssdmpi.errors import UserError
from tests.fakes import FakeDeviceArray

GPU, WHY_NOT = backend.probe_cupy()


@pytest.fixture(autouse=True)
def restore_backend():
    yield
    backend.select("cpu")


def test_cpu_is_numpy():
    assert backend.select("cpu") is np
    assert backend.get_xp() is np and backend.device() == "cpu"
    assert "NumPy" in backend.reason()


def test_auto_uses_cupy_only_when_a_gpu_allocation_works():
    xp = backend.select("auto")
    if GPU is None:
        assert xp is np and backend.device() == "cpu"
        assert WHY_NOT in backend.reason()              # says why: CuPy missing or no GPU
    else:
        assert xp is GPU and backend.device() == "gpu"


@pytest.mark.skipif(GPU is not None, reason="a GPU is usable here: --device gpu succeeds")
def test_gpu_without_a_gpu_is_a_user_error():
    with pytest.raises(UserError, match=r"--device gpu requested but .*; use --device cpu or auto"):
        backend.select("gpu")


def test_unknown_device_is_a_user_error():
    with pytest.raises(UserError, match="unknown device 'tpu'; choose one of auto, cpu, gpu"):
        backend.select("tpu")


def test_probe_is_cached_and_explains_itself():
    assert backend.probe_cupy() is backend.probe_cupy()
    if GPU is None:
        assert re.search(r"CuPy missing|no GPU", WHY_NOT)


def test_host_helpers_on_numpy_arrays():
    backend.select("cpu")
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert backend.array_module(a) is np and not backend.is_device_array(a)
    assert backend.to_device(a) is a                    # NumPy backend: no copy
    np.testing.assert_array_equal(backend.to_host(a), a)
    backend.synchronize()                               # a no-op on the CPU
    buf = backend.pinned_empty((3, 4), np.float64)
    assert isinstance(buf, np.ndarray) and buf.shape == (3, 4) and buf.dtype == np.float64


def test_a_foreign_cuda_array_is_a_device_array_but_not_cupy():
    fake = FakeDeviceArray(np.zeros(1, dtype=np.float32))   # anything exposing the CUDA array interface
    assert backend.is_device_array(fake)
    assert backend.array_module(fake) is np             # only real CuPy arrays select cupy


def test_describe_reports_backend_and_probe():
    backend.select("cpu")
    info = backend.describe()
    assert info["active"] == "numpy" and info["device"] == "cpu"
    assert info["gpu_usable"] is (GPU is not None) and info["cupy_probe"] == WHY_NOT


def test_only_backend_imports_cupy():
    root = Path(backend.__file__).resolve().parent
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py")
                 if p.name != "backend.py" and re.search(r"^\s*(import cupy|from cupy)", p.read_text(), re.M)]
    assert offenders == []


@pytest.mark.skipif(GPU is None, reason=f"no GPU: {WHY_NOT}")
def test_gpu_helpers_move_and_pin():
    xp = backend.select("gpu")
    a = np.arange(5, dtype=np.float32)
    d = backend.to_device(a)
    assert backend.is_device_array(d) and backend.array_module(d) is xp
    backend.synchronize()
    np.testing.assert_array_equal(backend.to_host(d), a)
    pinned = backend.pinned_empty((4,), np.float32)
    pinned[:] = 1
    assert pinned.sum() == 4


def test_cupy_installed_without_a_gpu_falls_back_to_numpy():
    # The case of CI and of login nodes: `import cupy` works, the first allocation raises.
    cupy = pytest.importorskip("cupy", reason="CuPy not installed (pip install cupy-cuda12x)")
    if GPU is not None:
        pytest.skip("a GPU is usable here")
    with pytest.raises(RuntimeError):
        cupy.zeros(1)
    assert backend.select("auto") is np
    assert "first allocation failed" in backend.reason()


def test_stream_stand_ins_on_numpy():
    # The transport's stream calls work unchanged on NumPy runs, and never wait.
    backend.select("cpu")
    stream, copy = backend.current_stream(), backend.copy_stream()
    assert stream is copy is backend.HOST_STREAM
    event = stream.record(backend.new_event())
    assert event.done
    copy.wait_event(event)
    event.synchronize()
    copy.synchronize()


def test_host_floats_reads_host_and_device_scalars_in_order():
    values = [1.5, np.float32(2.5), FakeDeviceArray(np.array(3.5, dtype=np.float32)), np.nan]
    out = backend.host_floats(values)
    assert out[:3] == [1.5, 2.5, 3.5] and np.isnan(out[3]) and all(type(v) is float for v in out)
    assert backend.host_floats([]) == []


@pytest.mark.skipif(GPU is None, reason=f"no GPU: {WHY_NOT}")
def test_gpu_streams_events_and_device_scalars():
    xp = backend.select("gpu")
    copy = backend.copy_stream()
    assert copy is backend.copy_stream() and copy.is_non_blocking     # one per device; runs beside the null stream
    event = backend.current_stream().record(backend.new_event())
    copy.wait_event(event)
    event.synchronize()
    assert event.done
    losses = [xp.asarray(1.25, dtype=xp.float32), 2.0, xp.asarray(float("inf"))]
    assert backend.host_floats(losses) == [1.25, 2.0, float("inf")]
