"""The private test cluster itself works: a 2-task batch job runs srun steps and MPI.

If these fail, the template tests cannot mean anything; they also show the two ways
the templates start ranks (``srun --mpi=pmi2`` and MPICH's ``mpiexec`` inside the
allocation) working with this venv's MPICH.
"""

import os
import textwrap
import time
from pathlib import Path

# One line from rank 0 only (two ranks' output through one launcher can interleave).
HELLO = ("from mpi4py import MPI; c = MPI.COMM_WORLD; r = c.gather(c.rank); s = c.allreduce(c.rank + 1); "
         "c.rank == 0 and print(f'hello size={c.size} ranks={r} sum={s}', flush=True)")


def test_node_is_idle_with_all_cpus(slurm_cluster):
    r = slurm_cluster.run(["sinfo", "-h", "-N", "-o", "%N %T %c"])
    name, state, cpus = r.stdout.split()
    assert (name, state) == (slurm_cluster.node, "idle")
    assert int(cpus) >= 2, "the templates' tests need 2 tasks on one node"


def test_two_task_job_runs_srun_and_both_mpi_launchers(slurm_cluster, tmp_path):
    script = tmp_path / "hello.sbatch"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        #SBATCH --ntasks=2
        #SBATCH --output=hello-%j.out
        echo "tasks=$SLURM_NTASKS"
        srun hostname
        timeout 120 srun --mpi=pmi2 python -c "{HELLO}" | sed 's/^/srun /'
        timeout 120 mpiexec -n "$SLURM_NTASKS" python -c "{HELLO}" | sed 's/^/mpiexec /'
        """))
    job = slurm_cluster.sbatch(script, cwd=tmp_path)
    out = tmp_path / f"hello-{job}.out"
    (record,) = slurm_cluster.wait_done(job, timeout=180, outputs=[out])
    text = out.read_text()
    assert record["JobState"] == "COMPLETED", slurm_cluster.explain(job, [out])
    assert "tasks=2" in text
    assert text.count(slurm_cluster.node) >= 2          # srun hostname: one line per task
    for launcher in ("srun", "mpiexec"):
        lines = [line for line in text.splitlines() if line.startswith(f"{launcher} hello")]
        # one 2-rank world (not two 1-rank ones), and the allreduce went through: 1 + 2 = 3
        assert lines == [f"{launcher} hello size=2 ranks=[0, 1] sum=3"], text


def fnv1a_32(text: str) -> int:
    """The 32-bit FNV-1a hash MPICH applies to the PMI job name to name a node's segment."""
    h = 2166136261
    for byte in text.encode():
        h = ((h ^ byte) * 16777619) & 0xFFFFFFFF
    return h


def test_stale_segment_where_the_next_job_looks_does_not_break_it(slurm_cluster, tmp_path):
    """A killed job's leftover ``/dev/shm/mpich_shm_<hash("JOB.STEP")>_0`` is planted under the
    exact name the next job's first srun step uses; the job still runs (the node's prolog
    removes it), and the job itself shows that the plant was where it looked."""
    seg = ("from mpi4py import MPI; from ssdmpi.comm.shm import mapped_segments; c = MPI.COMM_WORLD; "
           "s = c.allreduce(c.rank + 1); c.rank == 0 and print('segments', *sorted(mapped_segments()), "
           "f'sum={s}', flush=True)")
    script = tmp_path / "stale.sbatch"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        #SBATCH --ntasks=2
        #SBATCH --output=stale-%j.out
        timeout 60 srun --mpi=pmi2 python -c "{seg}"
        """))
    job = slurm_cluster.sbatch(script, "--hold", cwd=tmp_path)
    stale = Path("/dev/shm") / f"mpich_shm_{fnv1a_32(f'{job}.0'):x}_0"
    try:
        stale.write_bytes(b"\xa5" * (4 << 20))      # another job's state, not a fresh segment
        then = time.time() - 3600
        os.utime(stale, (then, then))
        slurm_cluster.run(["scontrol", "release", str(job)])
        out = tmp_path / f"stale-{job}.out"
        (record,) = slurm_cluster.wait_done(job, timeout=180, outputs=[out])
        text = out.read_text()
        assert record["JobState"] == "COMPLETED", slurm_cluster.explain(job, [out])
        # the job mapped the planted name (and, with two VCIs, MPICH's mpich_vci_* segment beside it)
        (line,) = [w.split() for w in text.splitlines() if w.startswith("segments ")]
        assert stale.name in line[1:-1] and line[-1] == "sum=3", text
    finally:
        stale.unlink(missing_ok=True)
