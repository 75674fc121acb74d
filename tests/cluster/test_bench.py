"""``ssdmpi bench train --nodes 2`` end to end on a real namespaced cluster (root + iproute2, else skip).

Two tiny variants (ssgd on 2 nodes; asgd with 1 server: 3 nodes) of a few steps on the
digits data: both runs finish, the table has their rows (asgd with its staleness), the logs
show the ranks ran on different hosts, and the benchmarks' cluster is gone afterwards.
"""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest

from ssdmpi.bench.launch import CLUSTER_NAME
from ssdmpi.cluster import Cluster
from tests.cluster.conftest import ROOT, host_links, leftovers, skip_reason


def test_bench_train_on_two_nodes_runs_ssgd_and_asgd_and_leaves_nothing(tmp_path):
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    links = host_links()
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "ssdmpi", "bench", "train", "--nodes", "2", "--net", "1gbit",
           "--variants", "ssgd,asgd:1", "--dataset", "digits", "--model", "mlp", "--steps", "12",
           "--warmup-steps", "4", "--batch-size", "16", "--lr", "0.05", "--timeout", "150",
           "--train-args", "--log-every 2", "--out", str(out)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=360, cwd=ROOT, check=False)
    finally:
        left = leftovers(Cluster(CLUSTER_NAME, 3), links)
    logs = {p.name: p.read_text() for p in (out / "logs").glob("*.log")} if (out / "logs").exists() else {}
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:] + str(logs)[-3000:]
    assert not left, f"the benchmark's cluster was left behind: {left}"
    rows = {row["name"]: row for row in csv.DictReader((out / "results.csv").open())}
    assert set(rows) == {"ssgd", "asgd-s1"}
    assert all(rows[n]["status"] == "ok" and float(rows[n]["samples_per_s"]) > 0 for n in rows)
    assert rows["ssgd"]["staleness"] == "" and float(rows["asgd-s1"]["staleness"]) >= 0
    assert "2 node(s) x 1 rank(s), NIC 1gbit" in logs["ssgd.log"]
    assert "3 node(s) x 1 rank(s), NIC 1gbit" in logs["asgd-s1.log"]
