"""``ssdmpi bench checkpoint`` on tiny sizes: it runs both paths at each layout, writes its
table and files, removes its scratch checkpoints, and says whether each goal is met.
(Timings here mean nothing: the point is that the harness measures what it says.)"""

import csv
import json
import subprocess
import sys

import pytest

from ssdmpi.bench.checkpoint import parse_layouts, report
from ssdmpi.errors import UserError
from tests.conftest import ROOT


@pytest.mark.timeout(400)
def test_both_paths_at_one_and_two_ranks(tmp_path):
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "ssdmpi", "bench", "checkpoint", "--layouts", "1,2", "--model", "mlp",
           "--batch-size", "4", "--repeats", "2", "--plain-steps", "2", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=380, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [(row["layout"], row["path"]) for row in rows] == [("1", "gather"), ("1", "sharded"), ("2", "gather"),
                                                              ("2", "sharded")]
    by = {(row["layout"], row["path"]): row for row in rows}
    # rank 0 writes every rank's state on the gather path; each rank only its own on the sharded one
    assert int(by[("2", "sharded")]["bytes_rank"]) < int(by[("2", "gather")]["bytes_rank"])
    assert int(by[("2", "gather")]["bytes_rank"]) > int(by[("1", "gather")]["bytes_rank"])
    for row in rows:
        assert float(row["copy_s"]) > 0 and float(row["wall_s"]) >= float(row["stall_s"]) - 1e-9
    sharded = by[("2", "sharded")]
    assert float(sharded["stall_s"]) >= float(sharded["call_s"]) > 0
    document = json.loads((out / "result.json").read_text())
    assert document["format"] == "ssdmpi-bench-result/1" and document["benchmark"] == "checkpoint"
    assert document["command"].startswith("ssdmpi bench checkpoint --layouts 1,2")
    assert [layout["ranks"] for layout in document["layouts"]] == [1, 2] and len(document["rows"]) == 4
    assert "| 2 | 2 | sharded |" in r.stdout and "x the copy" in r.stdout
    assert sorted(p.name for p in out.iterdir()) == ["layout-1.json", "layout-2.json", "result.json", "results.csv"]


def test_layouts_are_ranks_here_or_nodes_by_ranks():
    assert parse_layouts("2,4,4x2") == [("2", 2, None, 2), ("4", 4, None, 4), ("4x2", 8, 4, 2)]
    for bad in ("0", "2x", "x2", "two", "2x0"):
        with pytest.raises(UserError, match="is not N or NODESxR"):
            parse_layouts(bad)


def layout(label, ranks, per_node, stall, copy, write):
    row = {"bytes_rank": 1e6, "drain_s": 0.0, "wall_s": 1.0, "write_s": write, "call_s": stall, "slowdown_s": 0.0,
           "stall_s": stall, "steps_while_writing": 3, "stall_over_copy": stall / copy}
    return {"layout": label, "ranks": ranks, "nodes": ranks // per_node, "ranks_per_node": per_node,
            "num_params": 10, "copy_s": copy, "gather": dict(row, stall_s=1.0, stall_over_copy=1.0 / copy),
            "sharded": row}


def test_the_report_says_which_goal_is_met():
    text = report([layout("2", 2, 2, 0.014, 0.01, 0.5), layout("4x2", 8, 2, 0.02, 0.01, 0.6)])
    assert "2: sharded stall 0.0140 s = 1.40 x the copy (0.0100 s): met (goal <= 1.5x)" in text
    assert "4x2: sharded stall 0.0200 s = 2.00 x the copy (0.0100 s): not met (goal <= 1.5x)" in text
    assert "2 rank(s) per node, sharded write time: 2: 0.500 s, 4x2: 0.600 s (largest / first 1.20x)" in text
