"""A private single-node Slurm cluster for the job-template tests (session scope).

``slurm_cluster`` starts, as root, Debian's ``munged``, ``slurmctld`` and ``slurmd``
from a ``slurm.conf`` generated in a fresh temporary directory: its own ports, its
own munge socket and key, state and spool directories under the temporary
directory, one node with this machine's real CPU count and memory, one partition,
no accounting and no cgroups (``proctrack/linuxproc``, ``task/none``). The daemons
run in the foreground (``-D`` / ``-F``) as our own child processes, so teardown
stops exactly what this fixture started. Nothing under ``/etc`` is written and the
site's own Slurm configuration, SPANK plugins and munge key are not used; the clients
find the cluster through ``SLURM_CONF`` in :attr:`SlurmCluster.env`.

Without root, or without the packages (``apt-get install slurm-wlm munge``), every
test here is skipped with the reason. If the packages are there but the cluster
does not come up, the tests fail and print the daemons' logs.

Stale MPI shared memory cannot break it: MPICH names a node's segment after the PMI job
name (for ``srun --mpi=pmi2``: "JOBID.STEPID"), and an aborted or killed job leaves it in
``/dev/shm``. So each start numbers its jobs from a random ``FirstJobId`` (a new cluster does
not reuse the last one's names), and a ``Prolog`` and ``Epilog`` on the node remove stale
segments (unmapped, older than a moment: ``python -m ssdmpi.comm.shm --clean``) before and
after every job, as a site's prolog/epilog would. Teardown removes what is left.

Set ``SSDMPI_KEEP_SLURM=1`` to keep the temporary directory (configuration, logs,
job outputs) after the session, for debugging.
"""

from __future__ import annotations

import ctypes
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ssdmpi.comm.shm import remove_stale_segments

ROOT = Path(__file__).resolve().parent.parent.parent
JOBS = ROOT / "jobs"

# Job states after which a job will not run again (COMPLETING and REQUEUED are on the way
# back to PENDING when a job requeues itself, so they are not here).
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                "DEADLINE", "PREEMPTED", "SPECIAL_EXIT", "REVOKED"}
START_TIMEOUT = 90      # seconds for munged + slurmctld + slurmd to report an idle node
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol", "scancel")


def _free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports that were free on 127.0.0.1 a moment ago."""
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when pytest dies, even by SIGKILL (an outer
    timeout), so no daemon outlives the session (Linux ``PR_SET_PDEATHSIG``)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _mem_mb() -> int:
    """Memory to declare for the node: 90% of MemTotal (more than the node has drains it)."""
    text = Path("/proc/meminfo").read_text()
    kb = int(re.search(r"MemTotal:\s+(\d+)", text).group(1))
    return max(256, int(kb / 1024 * 0.9))


def _tail(path: Path, chars: int = 6000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError as exc:
        return f"({exc})"


class SlurmCluster:
    """A running private cluster, and the client helpers the tests use.

    ``env`` is the environment for every client call and job: this process's
    environment minus any ``SLURM_*`` (in case pytest itself runs inside a Slurm
    job), plus ``SLURM_CONF``, this Python's bin directory first on ``PATH`` (so jobs
    find the venv's ``python``, ``mpiexec`` and ``ssdmpi``) and ``SRUN_MPI=pmi2``.
    """

    def __init__(self, base: Path):
        self.base = base
        self.conf = base / "slurm.conf"
        self.logs = base / "log"
        self.node = socket.gethostname().split(".")[0]
        self.procs: dict[str, subprocess.Popen] = {}
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(self.conf)
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", ""), "/usr/sbin", "/sbin"])
        # This cluster's MpiDefault=none, and the templates' srun follows the site's default
        # unless SRUN_MPI is set: their MPICH ranks need pmi2 to find each other.
        env["SRUN_MPI"] = "pmi2"
        self.env = env

    # ---- lifecycle ---------------------------------------------------------------

    def write_config(self) -> None:
        b = self.base
        for d in ("state", "spool", "log", "munge"):
            (b / d).mkdir(mode=0o755)
        key = b / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        (b / "plugstack.conf").write_text("")     # do not load the site's SPANK plugins
        self.write_shm_cleaner(b / "shm-clean.sh")
        ctld_port, slurmd_port = _free_ports(2)
        cpus = os.cpu_count() or 1
        self.conf.write_text(f"""\
# Generated by tests/slurm/conftest.py: a private single-node test cluster.
ClusterName=ssdmpitest
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire also delays the restart of a requeued job (default 120 s)
AuthInfo=socket={b}/munge/munge.sock,cred_expire=5
StateSaveLocation={b}/state
SlurmdSpoolDir={b}/spool
SlurmctldPidFile={b}/slurmctld.pid
SlurmdPidFile={b}/slurmd.pid
PlugStackConfig={b}/plugstack.conf
FirstJobId={random.randrange(1000, 60_000_000)}
Prolog={b}/shm-clean.sh
Epilog={b}/shm-clean.sh
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobRequeue=1
SlurmdTimeout=30
SlurmctldTimeout=30
MessageTimeout=20
MinJobAge=600
KillWait=10
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={_mem_mb()} State=UNKNOWN
PartitionName=test Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""")

    @staticmethod
    def write_shm_cleaner(path: Path) -> None:
        """The node's prolog/epilog: remove stale MPI segments. It must exit 0 (a failing
        prolog drains the node), and it runs as root with Slurm's bare environment."""
        path.write_text(f"""#!/bin/sh
PYTHONPATH={ROOT} {sys.executable} -m ssdmpi.comm.shm --clean --min-age 1 >/dev/null 2>&1
exit 0
""")
        path.chmod(0o755)

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.logs / f"{name}.out", "wb")
        # own session: a stray terminal signal to pytest does not reach the daemons
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=self.env, cwd=self.base, start_new_session=True,
                                            preexec_fn=_die_with_parent)
        log.close()

    def start(self) -> None:
        b = self.base
        self._spawn("munged", ["munged", "--foreground", "--force", f"--socket={b}/munge/munge.sock",
                               f"--key-file={b}/munge/munge.key", f"--pid-file={b}/munge/munged.pid",
                               f"--seed-file={b}/munge/munged.seed", f"--log-file={b}/log/munged.log"])
        self._wait_for(lambda: (b / "munge" / "munge.sock").exists(), 20, "munged's socket")
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._spawn("slurmd", ["slurmd", "-D", "-N", self.node, "-f", str(self.conf)])
        self._wait_for(self._node_idle, START_TIMEOUT, f"node {self.node} idle in sinfo")

    def _node_idle(self) -> bool:
        try:
            r = self.run(["sinfo", "-h", "-N", "-o", "%T"], check=False, timeout=15)
        except subprocess.TimeoutExpired:   # slurmctld not answering yet
            return False
        return r.returncode == 0 and r.stdout.strip() == "idle"

    def _wait_for(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode} while waiting for {what}\n{self.dump()}")
            if ready():
                return
            time.sleep(0.5)
        raise RuntimeError(f"timed out after {timeout}s waiting for {what}\n{self.dump()}")

    def stop(self) -> None:
        """Cancel every job, wait (bounded) for them to end, then stop the daemons and strays."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            try:
                self.run(["scancel", "--user=root", "--full"], check=False, timeout=15)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    r = self.run(["squeue", "-h", "-o", "%i"], check=False, timeout=15)
                    if r.returncode != 0 or not r.stdout.strip():
                        break
                    time.sleep(0.5)
            except subprocess.TimeoutExpired:
                pass   # a hung controller: the daemons are stopped below all the same
        for name in ("slurmd", "slurmctld", "munged"):
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        self._kill_strays()

    def _kill_strays(self) -> None:
        """Kill processes left by our jobs or daemons (slurmstepd, ranks): those whose
        environment names our ``SLURM_CONF`` or whose command line names our directory."""
        marker = str(self.base).encode()
        me = os.getpid()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == me:
                continue
            try:
                if marker in (proc / "environ").read_bytes() or marker in (proc / "cmdline").read_bytes():
                    os.kill(int(proc.name), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass

    def dump(self) -> str:
        """The daemons' logs (tails), for failure messages."""
        parts = []
        for log in sorted(self.logs.glob("*")):
            parts.append(f"----- {log.name} -----\n{_tail(log)}")
        return "\n".join(parts)

    # ---- client helpers ----------------------------------------------------------

    def run(self, cmd: list[str], check: bool = True, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this cluster; raise with its output if it fails."""
        r = subprocess.run(cmd, env=kw.pop("env", self.env), capture_output=True, text=True, timeout=timeout, **kw)
        if check and r.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}")
        return r

    def sbatch(self, script: Path, *args: str, cwd: Path, env: dict | None = None,
               script_args: tuple | list = ()) -> int:
        """Submit ``script`` from directory ``cwd`` with extra sbatch ``args``; return the job id.

        ``env`` adds variables to the job's environment (sbatch exports its own);
        ``script_args`` follow the script (``sbatch jobs/train.sbatch --epochs 3``)."""
        full = dict(self.env, **(env or {}))
        r = self.run(["sbatch", "--parsable", *args, str(script), *script_args], cwd=cwd, env=full)
        return int(r.stdout.strip().split(";")[0])

    def job(self, job_id) -> dict:
        """``scontrol show job`` as a dict (JobState, Restarts, ExitCode, ...); {} if unknown.

        For an array job, the fields of its first task."""
        r = self.run(["scontrol", "show", "job", "-o", str(job_id)], check=False)
        if r.returncode != 0 or not r.stdout.strip():
            return {}
        line = r.stdout.strip().splitlines()[0]
        return dict(m.groups() for m in re.finditer(r"(\w+(?::\w+)?)=(\S*)", line))

    def finished(self, job_id) -> bool:
        """The job is in a final state (or unknown to the controller)."""
        return self.job(job_id).get("JobState", "COMPLETED") in FINAL_STATES

    def array_tasks(self, array_job_id: int) -> list[dict]:
        """``scontrol show job`` of each task of an array job."""
        r = self.run(["scontrol", "show", "job", "-o", str(array_job_id)])
        return [dict(m.groups() for m in re.finditer(r"(\w+(?::\w+)?)=(\S*)", line))
                for line in r.stdout.strip().splitlines()]

    def wait_done(self, job_id, timeout: float, outputs: list[Path] = ()) -> list[dict]:
        """Wait until the job (every task, for an array) has left the queue; return its records.

        On timeout: cancel it and fail, printing the job's outputs and the daemons' logs."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = self.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"], check=False)
            if r.returncode == 0 and not r.stdout.strip():
                return self.array_tasks(job_id)
            time.sleep(1)
        self.run(["scancel", str(job_id)], check=False)
        pytest.fail(f"job {job_id} still queued/running after {timeout}s\n{self.explain(job_id, outputs)}")

    def explain(self, job_id, outputs: list[Path] = ()) -> str:
        """Everything useful for a failure message: the job record, its outputs, the logs."""
        parts = [self.run(["scontrol", "show", "job", str(job_id)], check=False).stdout]
        for out in outputs:
            parts.append(f"----- {out} -----\n{_tail(Path(out), 12000)}")
        parts.append(self.dump())
        return "\n".join(parts)


def _missing() -> str | None:
    """Why a private cluster cannot be started here, or None."""
    if os.geteuid() != 0:
        return "the private Slurm cluster needs root (it runs munged/slurmctld/slurmd as root)"
    absent = [d for d in DAEMONS if shutil.which(d, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None]
    if absent:
        return f"Slurm/munge not installed (missing {', '.join(absent)}): apt-get install slurm-wlm munge"
    return None


@pytest.fixture(scope="session")
def slurm_cluster():
    """A running private single-node Slurm (see the module docstring); stopped at session end."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    # short path: the munge socket's full path must fit in a sockaddr_un (108 bytes)
    base = Path(tempfile.mkdtemp(prefix="ssdmpi-slurm-"))
    base.chmod(0o755)
    cluster = SlurmCluster(base)
    try:
        cluster.write_config()
        cluster.start()
    except BaseException as exc:
        cluster.stop()
        pytest.fail(f"could not start the private Slurm cluster in {base}: {exc}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()
        remove_stale_segments(min_age_s=1)
        if os.environ.get("SSDMPI_KEEP_SLURM"):
            print(f"\nkept the Slurm test directory {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
