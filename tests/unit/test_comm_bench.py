"""``ssdmpi bench comm`` runs end to end at 2 ranks and reports what its docstring promises."""

import json
import math

from tests.conftest import run_cli


def test_bench_comm_json_at_two_ranks(tmp_path):
    out = tmp_path / "comm.json"
    proc = run_cli(["bench", "comm", "--sizes", "4K,256K", "--repeats", "3", "--overlap-size", "256K",
                    "--json", str(out)], ranks=2, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert "(a) allreduce" in proc.stdout and "(b) overlap" in proc.stdout   # the tables, and the file
    result = json.loads(out.read_text())
    assert result["ranks"] == 2
    # A result file (ssdmpi/bench/result.py): the command as typed, the machine with the MPI library loaded.
    assert result["format"] == "ssdmpi-bench-result/1" and result["benchmark"] == "comm"
    assert result["command"].startswith("ssdmpi bench comm --sizes 4K,256K --repeats 3")
    assert result["machine"]["mpi"].split() == result["mpi"].split()
    assert [row["bytes"] for row in result["bandwidth"]] == [4096, 256 << 10]
    for row in result["bandwidth"]:
        for name in ("raw", "sum", "mean", "sum+div"):
            assert row[f"{name}_s"] > 0 and row[f"{name}_GBps"] > 0
        assert row["sum_vs_raw"] > 0 and row["mean_vs_raw"] > 0 and row["sum+div_vs_raw"] > 0
    pairs = {(row["compute"], row["strategy"]) for row in result["overlap"]}
    strategies = ("blocking", "test", "poll", "thread")
    assert pairs == {(c, s) for c in ("cpu-bound (matmul)", "idle (sleep)") for s in strategies}
    for row in result["overlap"]:
        # Tiny buffers on a shared machine make the overlap itself noise; check its shape only.
        assert row["comm_s"] > 0 and row["total_s"] > 0 and math.isfinite(row["overlap"])
        assert 0.0 <= row["stats_overlap"] <= 1.0 and row["pieces"] == 10
    assert "(c) a control allreduce" in proc.stdout
    control = result["control"]
    assert control["bytes"] == 256 << 10
    assert control["control_alone_s"] > 0 and control["allreduce_s"] > 0 and control["control_in_flight_s"] > 0


def test_bench_comm_rejects_a_bad_size():
    proc = run_cli(["bench", "comm", "--sizes", "lots"])
    assert proc.returncode == 2
    assert "--sizes must be comma-separated sizes" in proc.stderr and "'lots'" in proc.stderr
    assert "Traceback" not in proc.stderr
