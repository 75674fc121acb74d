"""The codecs of ``--comm-dtype`` (ssdmpi/comm/compressed.py) against their definitions: PyTorch's
bfloat16 and float16 casts, NumPy's float16, the reference simulator's own rounding
(ssdmpi/verify/quantize.py, written from the numbers, not the bits), and int8 worked by hand; their
round-trip error bounds; the shard layout. The sums across ranks are tests/mpi/test_compressed.py's."""

import numpy as np
import pytest

from ssdmpi.comm.compressed import CODECS, DTYPES, INT8_BLOCK, Compressor, shard_length
from ssdmpi.verify import quantize


def round_trip(dtype: str, x) -> np.ndarray:
    codec = CODECS[dtype]
    return codec.decode(np, codec.encode(np, np.asarray(x, np.float32)))


def awkward_values(n: int = 1 << 16) -> np.ndarray:
    """Normal values over many magnitudes, every kind of tie, subnormals, the extremes, signed zeros."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-40, 40, n))).astype(np.float32)
    u = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    ties = ((u & np.uint32(0xFFFF0000)) | np.uint32(0x8000)).view(np.float32)      # exactly half a bfloat16 step
    special = np.array([0.0, -0.0, 1.0, -1.0, 1.0 / 3.0, 65504.0, 65519.0, 65520.0, 1e5, -1e5, 3.4e38, -3.4e38,
                        np.finfo(np.float32).max, np.finfo(np.float32).tiny, 1e-40, -1e-42, 1.5e-45,
                        np.inf, -np.inf], np.float32)
    out = np.concatenate([x, ties, special])
    return out[np.isfinite(out) | np.isinf(out)]


def test_the_choices_are_float32_and_the_codecs():
    assert DTYPES == ("float32", *sorted(CODECS, key=DTYPES.index))


def test_bfloat16_is_float32_rounded_to_nearest_even_as_pytorch_does():
    torch = pytest.importorskip("torch")
    x = awkward_values()
    expected = torch.from_numpy(x).to(torch.bfloat16).to(torch.float32).numpy()
    np.testing.assert_array_equal(round_trip("bfloat16", x), expected)


def test_bfloat16_agrees_with_the_reference_rounding_written_from_the_numbers():
    x = awkward_values()
    mine, theirs = round_trip("bfloat16", x), quantize.round_bfloat16(x)
    assert np.array_equal(mine.view(np.uint32), theirs.view(np.uint32))     # signed zeros too


def test_bfloat16_keeps_nan_a_nan_and_ties_go_to_even():
    x = np.array([np.nan, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, -(1.0 + 2.0 ** -8)], np.float32)
    out = round_trip("bfloat16", x)
    assert np.isnan(out[0])
    assert out[1:].tolist() == [1.0, 1.0 + 4 * 2.0 ** -8, -1.0]            # 1 + 2**-7 is bfloat16's next after 1


def test_float16_is_ieee_half_saturating_at_its_largest():
    torch = pytest.importorskip("torch")
    x = awkward_values()
    expected = torch.from_numpy(np.clip(x, -65504, 65504)).to(torch.float16).to(torch.float32).numpy()
    np.testing.assert_array_equal(round_trip("float16", x), expected)
    assert round_trip("float16", np.array([1e9, -np.inf, 65520.0], np.float32)).tolist() == [65504.0, -65504.0,
                                                                                               65504.0]
    np.testing.assert_array_equal(round_trip("float16", x), quantize.round_float16(x))


def test_int8_by_hand():
    block = np.zeros(INT8_BLOCK, np.float32)
    block[:5] = [2.54, -1.27, 0.01, 0.015, -0.005]           # scale 2.54/127 = 0.02
    codes, scale = CODECS["int8"].encode(np, np.concatenate([block, np.zeros(INT8_BLOCK, np.float32)]))
    assert scale.dtype == np.float32 and scale.tolist() == [np.float32(2.54) / np.float32(127), 0.0]
    # 0.01 / 0.02 = 0.5 rounds to even (0), 0.015 / 0.02 = 0.75 to 1, -0.005 / 0.02 = -0.25 to -0
    assert codes[:5].tolist() == [127, -64, 0, 1, 0] and not codes[5:].any()
    assert codes.dtype == np.int8


def test_int8_agrees_with_the_reference_and_its_error_is_half_a_step_per_block():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(64 * INT8_BLOCK) * np.repeat(np.exp2(rng.integers(-20, 20, 64)), INT8_BLOCK)
         ).astype(np.float32)
    x[5 * INT8_BLOCK:6 * INT8_BLOCK] = 0                    # a block of zeros: scale 0
    codes, scale = CODECS["int8"].encode(np, x)
    ref_codes, ref_scale = quantize.int8_blocks(x)
    np.testing.assert_array_equal(codes.reshape(ref_codes.shape), ref_codes)
    np.testing.assert_array_equal(scale, ref_scale)
    err = np.abs(round_trip("int8", x) - x).reshape(-1, INT8_BLOCK).max(axis=1)
    assert np.all(err <= scale * 0.5 * (1 + 1e-6))
    assert err[5] == 0 and np.all(np.abs(codes) <= 127)


@pytest.mark.parametrize("dtype, relative", [("bfloat16", 2.0 ** -8), ("float16", 2.0 ** -11)])
def test_casts_round_trip_within_half_a_unit_in_the_last_place(dtype, relative):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(10_000) * np.exp2(rng.integers(-10, 10, 10_000))).astype(np.float32)
    x = x[np.abs(x) >= 2.0 ** -14]                           # float16's normal range (below: fixed spacing)
    err = np.abs(round_trip(dtype, x).astype(np.float64) - x)
    assert np.all(err <= relative * np.abs(x))
    assert err.max() > relative * np.abs(x).max() / 64       # it does round


def test_shards_are_whole_blocks_covering_the_buffer():
    for n in (1, 255, 256, 257, 1000, 100_003):
        for size in (1, 2, 3, 4, 7):
            for block in (1, INT8_BLOCK):
                S = shard_length(n, size, block)
                assert S % block == 0 and size * S >= n and (size * (S - block) < n or S == block)


def test_wire_bytes_per_sum():
    c = Compressor("int8", 100_003, 4, 0, np)
    assert (c.S, c.piece) == (25_088, 25_088 + 4 * 98)
    assert c.wire_bytes == 2 * 3 * c.piece
    assert Compressor("bfloat16", 1000, 2, 1, np).wire_bytes == 2 * 1 * 2 * 500
    assert Compressor("float16", 1000, 1, 0, np).wire_bytes == 0


def test_the_state_round_trips_and_resets():
    c = Compressor("int8", 1000, 2, 0, np)
    c.residual[:] = np.arange(1000, dtype=np.float32)
    c.shard_residual[:] = 3.0
    d = {k: v.copy() for k, v in c.state_dict().items()}
    fresh = Compressor("int8", 1000, 2, 0, np)
    fresh.load_state_dict(d)
    assert np.array_equal(fresh.residual, c.residual) and np.array_equal(fresh.shard_residual, c.shard_residual)
    fresh.reset()
    assert not fresh.residual.any() and not fresh.shard_residual.any()


# -- the flag ------------------------------------------------------------------------------------

TRAIN = ["train", "--dataset", "digits", "--model", "mlp", "--widths", "32", "--batch-size", "8", "--lr", "0.05",
         "--eval-every", "0", "--no-progress-bar", "--steps", "40", "--log-every", "10"]


@pytest.mark.parametrize("args, needle", [
    (["--algo", "localsgd", "--comm-dtype", "int8"], "--comm-dtype"),
    (["--algo", "ssd", "--comm", "step", "--comm-dtype", "bfloat16"], "--comm-dtype applies only to --algo ssd "
                                                                      "--comm period"),
    (["--comm-dtype", "int4"], "int4"),
    (["--comm-dtype", "int8", "--dtype", "float64"], "--comm-dtype int8 sends float32 sums compressed"),
])
def test_bad_comm_dtype_is_one_line(args, needle, tmp_path):
    from tests.conftest import assert_one_line_error, run_cli

    assert_one_line_error(run_cli(TRAIN + ["--run-dir", str(tmp_path / "run")] + args), needle)


@pytest.mark.timeout(300)
def test_a_run_in_int8_sends_a_quarter_of_the_bytes_per_step(tmp_path):
    """``bytes_sent`` in the step records of the delay stage (one period sum every 5 steps, and nothing
    else): int8 sends at most 0.27 of float32's, at 2 ranks, and the summary says MB sent."""
    import json

    from tests.conftest import run_cli

    per_step = {}
    for dtype in ("float32", "int8"):
        run = tmp_path / dtype
        result = run_cli(TRAIN + ["--run-dir", str(run), "--algo", "ssd", "--comm", "period", "--delay", "5",
                                  "--warmup-steps", "10", "--comm-dtype", dtype], ranks=2, timeout=240)
        assert result.returncode == 0, result.stderr
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        delay = [r["bytes_sent"] for r in records if r["kind"] == "step" and r["step"] > 10]
        assert len(delay) == 3
        per_step[dtype] = sum(delay) / len(delay)
        assert "MB sent" in (run / "summary.txt").read_text()
    assert 0 < per_step["int8"] <= 0.27 * per_step["float32"]


# -- the device path, on host memory ---------------------------------------------------------------

class DeviceLike(np.ndarray):
    """NumPy memory posing as a CuPy array: ``__cuda_array_interface__``, ``get`` and ``set`` (the names the
    transport drives); NumPy's functions on it return it, as CuPy's return device arrays. No streams:
    this checks the device path's data flow (``tests/unit/test_gpu_staging.py`` the stream order)."""

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ctypes.data, False), "strides": None,
                "version": 3}

    def get(self, out=None, stream=None, blocking=True):
        out = np.empty(self.shape, self.dtype) if out is None else out
        out[...] = np.asarray(self)
        return out

    def set(self, host, stream=None):
        np.asarray(self)[...] = host


class FakeCupy:
    """``xp`` of ``DeviceLike`` arrays: NumPy's functions under another module name."""

    __name__ = "fakecupy"

    def __getattr__(self, name):
        return getattr(np, name)

    def zeros(self, *args, **kwargs):
        return np.zeros(*args, **kwargs).view(DeviceLike)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "int8"])
def test_a_device_buffer_takes_the_device_path_and_gets_the_host_paths_bits(monkeypatch, dtype):
    """Steps 1 and 5 in ``xp`` on the buffer's device, the codes staged through pinned host memory, the copy
    back: three sums (with their error feedback) bitwise those of the same sums of host buffers."""
    from mpi4py import MPI

    from ssdmpi import backend
    from ssdmpi.comm.communicator import Communicator

    fake = FakeCupy()
    real = backend.array_module
    monkeypatch.setattr(backend, "array_module", lambda a: fake if isinstance(a, DeviceLike) else real(a))
    n = 70_001
    data = [np.random.default_rng(p).standard_normal(n).astype(np.float32) for p in range(3)]
    results = {}
    for device in (False, True):
        c = Communicator(MPI.COMM_SELF, progress="test", transport="host", stall_timeout=None)
        try:
            like = np.zeros(n, np.float32).view(DeviceLike) if device else np.zeros(n, np.float32)
            stream = c.compressor(dtype, like)
            assert (stream.xp is fake) == device
            out = []
            for p, x in enumerate(data):
                buf = x.copy().view(DeviceLike) if device else x.copy()
                c.allreduce_start(buf, average=p == 2, compressor=stream).wait()
                out.append(np.array(buf))
            staged = list(c.grads._host_staging._staging.values()) if device else []
            results[device] = (out, np.array(stream.residual), stream.shard_residual.copy(), staged)
        finally:
            c.free()
    host, dev = results[False], results[True]
    for a, b in zip(host[0], dev[0]):
        assert np.array_equal(a, b)
    assert np.array_equal(host[1], dev[1]) and np.array_equal(host[2], dev[2])
    assert len(dev[3]) == 1 and dev[3][0].dtype == np.uint8     # the codes were staged, not float32
    assert not np.array_equal(dev[0][0], data[0])                 # it did compress
