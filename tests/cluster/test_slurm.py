"""Slurm across the namespaced nodes: jobs/train.sbatch on 2 nodes x 2 tasks.

- a 2-node allocation places 2 ranks on each node: host names differ by node, and MPI's
  shared-memory communicator has 2 ranks on each;
- ``sbatch -N 2 --ntasks-per-node 2 jobs/train.sbatch`` trains 4 ranks to the end;
- preempted with ``scancel --signal=USR1 --batch``, the same job checkpoints, requeues and
  resumes, and ends bit for bit where the uninterrupted job ended;
- killing one node's ranks mid-job ends the job within 60 s, failed, with srun naming the
  lost tasks, and a resubmission into the same run directory (the template always passes
  ``--resume auto``) on the one node left (2 ranks instead of 4, the same command line)
  continues from the last complete checkpoint to the end, saying it was resized.
"""

from __future__ import annotations

import json
import os
import re
import signal
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from tests.cluster.conftest import wait_until
from tests.slurm.conftest import JOBS
from tests.slurm.test_jobs import checkpoints, final_state, records

pytest.importorskip("h5py")

STEPS = 600
TRAIN_ARGS = (f"--dataset digits --model mlp --steps {STEPS} --batch-size 4 --algo ssd --delay 3 --comm period "
              "--warmup-steps 20 --checkpoint-every 100 --keep-checkpoints 0 --eval-every 0 --log-every 5 "
              "--seed 3 --no-progress-bar")
TWO_NODES = ("-N", "2", "--ntasks-per-node", "2")
JOB_TIMEOUT = 300
SSDMPI = "python -m ssdmpi"     # PYTHONPATH (set by the fixture) points at this tree

# rank 0 prints every rank's row (ranks' lines through one launcher can interleave)
HELLO = ("from mpi4py import MPI; import socket; c = MPI.COMM_WORLD; "
         "local = c.Split_type(MPI.COMM_TYPE_SHARED); s = c.allreduce(c.rank + 1); "
         "rows = c.gather((c.rank, socket.gethostname(), MPI.Get_processor_name(), local.size, s)); "
         "c.rank == 0 and print(*(f'rank {r} host {h} proc {p} local {n} sum {t}' for r, h, p, n, t in rows), "
         "sep=chr(10), flush=True)")


def submit_train(slurm, cwd: Path, *extra: str, nodes: tuple = TWO_NODES, **env) -> tuple[int, Path, Path]:
    job = slurm.sbatch(JOBS / "train.sbatch", *nodes, *extra, cwd=cwd,
                       env={"SSDMPI_ARGS": TRAIN_ARGS, "SSDMPI": SSDMPI, **env})
    return job, cwd / "runs" / f"ssdmpi-train-{job}", cwd / f"ssdmpi-train-{job}.out"


def test_two_node_allocation_places_two_ranks_per_node(ns_slurm, tmp_path):
    script = tmp_path / "hello.sbatch"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        #SBATCH --output=hello-%j.out
        echo "nodes=$SLURM_JOB_NUM_NODES tasks=$SLURM_NTASKS"
        timeout 120 srun --mpi=pmi2 python -c "{HELLO}"
        """))
    job = ns_slurm.sbatch(script, *TWO_NODES, cwd=tmp_path)
    out = tmp_path / f"hello-{job}.out"
    (record,) = ns_slurm.wait_done(job, 180, [out])
    text = out.read_text()
    assert record["JobState"] == "COMPLETED", ns_slurm.explain(job, [out])
    assert "nodes=2 tasks=4" in text
    rows = {int(m[0]): m[1:] for m in re.findall(r"rank (\d) host (\S+) proc (\S+) local (\d) sum (\d+)", text)}
    n0, n1 = (n.host for n in ns_slurm.cluster.nodes)
    assert rows == {0: (n0, n0, "2", "10"), 1: (n0, n0, "2", "10"), 2: (n1, n1, "2", "10"),
                    3: (n1, n1, "2", "10")}, text


@pytest.fixture(scope="module")
def uninterrupted(ns_slurm, tmp_path_factory):
    cwd = tmp_path_factory.mktemp("train")
    job, run_dir, out = submit_train(ns_slurm, cwd)
    (record,) = ns_slurm.wait_done(job, JOB_TIMEOUT, [out])
    assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0", ns_slurm.explain(job, [out])
    return record, run_dir, out


def test_four_rank_job_across_two_nodes_completes(uninterrupted):
    record, run_dir, _ = uninterrupted
    assert (record["NumNodes"], record["NumTasks"]) == ("2", "4")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 4 and summary["step"] == STEPS
    assert final_state(run_dir)["step"] == STEPS


def test_preempted_two_node_job_requeues_and_resumes_bit_for_bit(ns_slurm, uninterrupted, tmp_path):
    job, run_dir, out = submit_train(ns_slurm, tmp_path)
    wait_until(lambda: [r for r in records(run_dir, "step") if r["step"] >= 20] or ns_slurm.finished(job),
               JOB_TIMEOUT, f"job {job} to log step 20")
    ns_slurm.run(["scancel", "--signal=USR1", "--batch", str(job)])
    (record,) = ns_slurm.wait_done(job, JOB_TIMEOUT, [out])
    text, why = out.read_text(), ns_slurm.explain(job, [out])
    assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0", why
    assert record["Restarts"] == "1", f"the signal did not lead to exactly one requeue\n{why}"
    for line in ("got SIGUSR1", "ssdmpi train exited with 85", f"requeueing job {job}", f"job {job} (restart 1)"):
        assert line in text, f"{line!r} missing from the job output\n{why}"
    starts = records(run_dir, "start")
    assert len(starts) == 2 and 0 < starts[1]["step"] < STEPS, why
    got, want = final_state(run_dir), final_state(uninterrupted[1])
    assert got["step"] == want["step"] == STEPS and got["world_size"] == 4
    for key in ("W", "rank0", "rank1", "rank2", "rank3"):
        assert got[key].dtype == want[key].dtype and np.array_equal(got[key], want[key]), \
            f"{key} differs after preemption + resume (max |diff| {np.abs(got[key] - want[key]).max()})"


def trainer_pids(cluster, node) -> list[int]:
    """The ``ssdmpi train`` ranks running on ``node``."""
    pids = []
    for pid in cluster.pids(node):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"ssdmpi" in cmd and b"train" in cmd and b"python" in os.path.basename(cmd[0]):
            pids.append(pid)
    return pids


def test_losing_a_node_fails_the_job_fast_and_a_resubmission_on_the_node_left_resumes(ns_slurm, uninterrupted,
                                                                                       tmp_path):
    cluster = ns_slurm.cluster
    lost = cluster.nodes[1]
    job, run_dir, out = submit_train(ns_slurm, tmp_path)
    wait_until(lambda: checkpoints(run_dir) or ns_slurm.finished(job), JOB_TIMEOUT, f"job {job}'s first checkpoint")
    pids = trainer_pids(cluster, lost)
    assert len(pids) == 2, f"expected 2 ranks on {lost.host}, found {pids}\n{ns_slurm.explain(job, [out])}"
    for pid in pids:                              # the node's ranks die at once, as in a crash
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    wait_until(lambda: ns_slurm.finished(job), 60, f"job {job} to end after {lost.host}'s ranks were killed", 0.5)
    assert time.monotonic() - killed < 60
    record, text = ns_slurm.job(job), out.read_text()
    why = ns_slurm.explain(job, [out])
    assert record["JobState"] == "FAILED" and record["ExitCode"] != "0:0", why
    assert re.search(rf"srun: error: {lost.host}: tasks? 2(-3)?", text), f"srun did not name the lost ranks\n{why}"
    assert "ssdmpi train exited with 0" not in text, why
    last = int(final_state(run_dir)["step"])
    assert 0 < last < STEPS, why

    # the same command line, on the one node left: 2 ranks, each with twice the batch
    again, _, out2 = submit_train(ns_slurm, tmp_path, nodes=("-N", "1", "--ntasks-per-node", "2"),
                                  RUN_DIR=str(run_dir))
    (record,) = ns_slurm.wait_done(again, JOB_TIMEOUT, [out2])
    why = ns_slurm.explain(again, [out2])
    assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0", why
    assert record["NumNodes"] == "1", why
    starts = records(run_dir, "start")
    assert [(s["step"], s["world_size"]) for s in starts] == [(0, 4), (last, 2)], why
    (resize,) = records(run_dir, "resize")
    assert (resize["step"], resize["from_ranks"], resize["to_ranks"], resize["batch_size"]) == (last, 4, 2, [4, 8])
    assert "resumed on another number of ranks (4 -> 2)" in out2.read_text(), why
    final = final_state(run_dir)
    assert final["step"] == STEPS and final["world_size"] == 2
