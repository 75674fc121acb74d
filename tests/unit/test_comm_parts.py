"""Serial parts of the comm layer: signature comparison, error agreement, stats, transports."""


import numpy as np
import pytest

from ssdmpi.comm.agreement import first_error, signature_mismatch
from ssdmpi.comm.operations import format_bytes
from ssdmpi.comm.stats import KEYS, CommStats
from ssdmpi.comm.transport import Transport, resolve_transport
from ssdmpi.errors import UserError
from tests.fakes import FakeGPU


def test_equal_signatures_agree():
    sig = {"flat_length": 1000, "dtype": "float32", "algo": "ssd"}
    assert signature_mismatch([sig, dict(sig), dict(sig)]) is None


def test_mismatch_names_ranks_keys_and_both_values():
    base = {"flat_length": 1000, "dtype": "float32", "delay": 4}
    odd = dict(base, flat_length=1001)
    other = dict(base, delay=8, dtype="float64")
    message = signature_mismatch([base, odd, dict(base), other, odd])
    assert "ranks 1, 4 differ from rank 0 in flat_length: rank 0 has 1000, ranks 1, 4 1001" in message
    assert "rank 3 differs from rank 0 in delay: rank 0 has 4, rank 3 8; dtype: rank 0 has 'float32'" in message
    assert "rank 2" not in message


def test_a_missing_key_is_a_mismatch():
    message = signature_mismatch([{"a": 1, "b": 2}, {"a": 1}])
    assert "b: rank 0 has 2, rank 1 (missing)" in message


def test_first_error_names_the_lowest_failing_rank():
    assert first_error([None, None]) is None
    assert first_error(["bad flag"]) == "bad flag"
    assert first_error([None, "no such file", "other"]) == "rank 1: no such file (and 1 other rank(s) failed too)"


def test_stats_overlap_and_reset():
    stats = CommStats()
    assert stats.snapshot()["overlap"] == 0.0
    stats.record(1000, inflight_s=2.0, wait_s=0.5, compute_s=1.5)
    stats.record(1000, inflight_s=2.0, wait_s=0.5, compute_s=1.5)
    snap = stats.snapshot_and_reset()
    assert tuple(snap) == KEYS
    assert snap["allreduce_count"] == 2 and snap["bytes_sent"] == 2000
    assert snap["overlap"] == pytest.approx(0.75)
    stats.record(10, inflight_s=1.0, wait_s=3.0, compute_s=0.0)   # waited longer than in flight: clipped
    assert stats.snapshot()["overlap"] == 0.0


def test_stats_keep_running_totals_not_a_history():
    # Recorded on every allreduce: it must stay O(1) in time and memory (its cost per call is
    # measured by ``bench comm``, not asserted here): the totals are exact and nothing grows.
    stats = CommStats()
    assert not hasattr(stats, "__dict__")          # __slots__: no per-call attributes can pile up
    for _ in range(10_000):
        stats.record(4, 0.5, 0.25, 1.0)
    snap = stats.snapshot()
    assert snap["allreduce_count"] == 10_000 and snap["bytes_sent"] == 40_000
    assert (snap["inflight_s"], snap["wait_s"], snap["compute_s"]) == (5000.0, 2500.0, 10000.0)
    assert snap["overlap"] == 0.5


def test_transport_resolution(monkeypatch):
    monkeypatch.delenv("SSDMPI_TRANSPORT", raising=False)
    assert resolve_transport("auto") == "host"
    assert resolve_transport("cuda-aware") == "cuda-aware"
    monkeypatch.setenv("SSDMPI_TRANSPORT", "cuda-aware")
    assert resolve_transport("auto") == "cuda-aware"
    assert resolve_transport("host") == "host"
    monkeypatch.setenv("SSDMPI_TRANSPORT", "pcie")
    with pytest.raises(UserError, match="SSDMPI_TRANSPORT"):
        resolve_transport("auto")
    with pytest.raises(UserError, match="unknown transport"):
        resolve_transport("nvlink")


def test_host_buffers_go_to_mpi_unchanged_without_synchronising():
    gpu = FakeGPU()
    transport = Transport("host", streams=gpu)
    a = np.ones(3, dtype=np.float32)
    assert transport.to_mpi(a) is a
    assert gpu.compute.done and gpu.copy.done and not gpu.log   # no event recorded, no copy queued


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(4000) == "4.0 KB"
    assert format_bytes(3_400_000) == "3.4 MB"


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6, 8])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_means_division_gives_the_bits_of_an_ieee_division(n, dtype):
    """Powers of two multiply by 1/n (exact), others divide: every value rounds like x / n,
    subnormal results, infinities, NaN and signed zeros included."""
    from ssdmpi.comm.fused_mean import divide

    info = np.finfo(dtype)
    x = np.concatenate([np.random.default_rng(n).standard_normal(1000).astype(dtype) * 1e3,
                        np.array([info.tiny, info.tiny * 3, info.smallest_subnormal * 7, info.max, -info.max,
                                  np.inf, -np.inf, np.nan, 0.0, -0.0], dtype)])
    got = x.copy()
    divide(got, n)
    u = np.dtype(f"u{x.itemsize}")
    assert np.array_equal((x / dtype(n)).view(u), got.view(u))


def test_the_progress_factory_table_tells_what_each_strategy_is():
    """``progress.create``'s table: every strategy once, in the file that defines its class, with
    the thread level it needs and the backend it is the default on, as the code has them."""
    import importlib

    from ssdmpi.comm import progress

    rows = {}
    for line in progress.create.__doc__.splitlines():
        cells = line.split()
        if cells and cells[0] in progress.CHANNELS:
            rows[cells[0]] = (cells[1], cells[-2], cells[-1])
    assert sorted(rows) == sorted(progress.CHANNELS)
    for name, (file, needs, default_on) in rows.items():
        cls = progress.CHANNELS[name]
        assert importlib.import_module(f"ssdmpi.comm.progress.{file.removesuffix('.py')}") \
            .__dict__.get(cls.__name__) is cls, (name, file)
        assert (needs == "MPI_THREAD_MULTIPLE") == cls.needs_thread_multiple, name
        assert default_on == {v: k.upper() for k, v in progress.DEFAULTS.items()}.get(name, "-"), name
