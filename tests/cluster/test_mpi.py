"""MPI across the namespaced nodes (MPICH's hydra, launched from node 0).

- 2 nodes x 2 ranks: each node's ranks see its own host name, MPI's shared-memory
  communicator holds exactly the 2 ranks of a node, and an allreduce's bytes really cross
  the nodes' NICs (``tc -s`` counters on both ends of node 1's veth);
- SSGD in float64 on 2 nodes x 1 rank equals 2 ranks on one node and one process with the
  doubled batch (``ssdmpi train``, final checkpoints);
- SSD with ``--comm period`` on 2 nodes x 2 ranks trains, with W identical on every rank.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from ssdmpi import checkpoint
from tests.cluster.conftest import ROOT, mpirun
from tests.conftest import run_cli

h5py = pytest.importorskip("h5py")

MB = 1 << 20
HELLO = f"""
import socket
import numpy as np
from mpi4py import MPI
c = MPI.COMM_WORLD
local = c.Split_type(MPI.COMM_TYPE_SHARED)
x = np.full({8 * MB // 8}, c.rank + 1.0)
y = np.empty_like(x)
c.Allreduce(x, y)
ok = bool((y == c.size * (c.size + 1) / 2).all())
rows = c.gather((c.rank, socket.gethostname(), MPI.Get_processor_name(), local.size, ok))
if c.rank == 0:   # one writer: ranks' lines through one launcher can interleave
    print("".join(f"rank {{r}} host {{h}} proc {{p}} local {{n}} ok {{o}}\\n" for r, h, p, n, o in rows), flush=True)
"""


def test_ranks_know_their_node_share_memory_per_node_and_cross_the_nics(ns_cluster, tmp_path):
    node1 = ns_cluster.nodes[1]
    sent0, received0 = ns_cluster.nic_bytes(node1)
    r = mpirun(ns_cluster, 2, [sys.executable, "-c", HELLO], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {int(m[0]): m[1:] for m in re.findall(r"rank (\d) host (\S+) proc (\S+) local (\d) ok (\w+)", r.stdout)}
    n0, n1 = ns_cluster.nodes[0].host, node1.host
    assert rows == {0: (n0, n0, "2", "True"), 1: (n0, n0, "2", "True"),
                    2: (n1, n1, "2", "True"), 3: (n1, n1, "2", "True")}, r.stdout + r.stderr
    sent, received = (b - a for a, b in zip((sent0, received0), ns_cluster.nic_bytes(node1)))
    # Node 1 holds half the ranks: it must send and receive at least half the 8 MB vector
    # (no shared memory between nodes); the loopback would leave these counters alone.
    assert sent >= 4 * MB and received >= 4 * MB, f"node 1's NIC: sent {sent} B, received {received} B"


SSGD = ["--dataset", "digits", "--model", "mlp", "--widths", "32", "--algo", "ssgd", "--dtype", "float64",
        "--steps", "30", "--lr", "0.05", "--seed", "4", "--eval-every", "0", "--log-every", "10",
        "--keep-checkpoints", "0", "--no-progress-bar"]


def final_checkpoint(run_dir: Path) -> Path:
    return sorted(p.parent for p in (run_dir / "checkpoints").glob("ckpt-*/manifest.json"))[-1]


def global_weights(run_dir: Path) -> np.ndarray:
    meta, weights, _ = checkpoint.read_model(str(final_checkpoint(run_dir)))
    assert meta["step"] == 30
    return weights


def train(cluster, nodes, ranks_per_node, batch, run_dir):
    cmd = [sys.executable, "-m", "ssdmpi", "train", *SSGD, "--batch-size", str(batch), "--run-dir", str(run_dir)]
    r = mpirun(cluster, ranks_per_node, cmd, run_dir.parent, nodes=nodes)
    assert r.returncode == 0, r.stdout + r.stderr


def test_ssgd_float64_two_nodes_equals_one_node_and_one_process(ns_cluster, tmp_path):
    train(ns_cluster, 2, 1, 8, tmp_path / "two-nodes")
    train(ns_cluster, 1, 2, 8, tmp_path / "one-node")
    r = run_cli(["train", *SSGD, "--batch-size", "16", "--run-dir", str(tmp_path / "one-process")], cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    across, within, single = (global_weights(tmp_path / d) for d in ("two-nodes", "one-node", "one-process"))
    assert across.dtype == np.float64
    scale = max(1.0, float(np.abs(single).max()))
    # mean of two per-rank means vs one mean over the doubled batch: rounding only (~1e-16)
    assert np.abs(across - within).max() <= 1e-10 * scale
    assert np.abs(across - single).max() <= 1e-10 * scale


# Train through the Python API, then compare every rank's W (the checkpoint stores W once).
PERIOD_SCRIPT = """
import hashlib, sys
from mpi4py import MPI
import ssdmpi
result = ssdmpi.train(dict(dataset="digits", model="mlp", algo="ssd", comm="period", delay=3, warmup_steps=10,
                           steps=60, batch_size=8, seed=5, eval_every=0, log_every=10, progress_bar=False,
                           run_dir=sys.argv[1]))
hashes = MPI.COMM_WORLD.allgather(hashlib.sha256(result.model.params.tobytes()).hexdigest())
assert result.exit_code == 0 and len(set(hashes)) == 1, f"W differs between ranks: {hashes}"
print(f"ranks agree on W: {len(hashes)} ranks")
"""


def test_ssd_period_on_two_nodes_trains_with_the_same_w_on_every_rank(ns_cluster, tmp_path):
    run_dir = tmp_path / "period"
    r = mpirun(ns_cluster, 2, [sys.executable, "-c", PERIOD_SCRIPT, str(run_dir)], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "on 4 ranks" in r.stdout and "ranks agree on W: 4 ranks" in r.stdout, r.stdout
    meta, w, _ = checkpoint.read_model(str(final_checkpoint(run_dir)))
    assert (meta["step"], meta["world_size"]) == (60, 4)
    assert np.isfinite(w).all()
    r = run_cli(["ckpt", "inspect", str(final_checkpoint(run_dir))], cwd=ROOT)
    assert r.returncode == 0 and ", 4 ranks," in r.stdout and "checksums: ok" in r.stdout, r.stdout + r.stderr
