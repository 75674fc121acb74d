"""The private test cluster itself works: a 2-task batch job runs srun steps and MPI.

If these fail, the template tests cannot mean anything; they also show the two ways
the templates start ranks (``srun --mpi=pmi2`` and MPICH's ``mpiexec`` inside the
allocation) working with this venv's MPICH.
"""

import textwrap

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
