"""How ssdmpi starts MPI: the library settings it makes for its own processes, and the one place
that imports ``mpi4py.MPI`` (which initialises MPI), so that every path into MPI (the command
line, ``python -m``, the Python API, the GPU check, the benchmarks, the tests) applies them first.

Settings (``apply`` only fills in what is unset: a value the user set wins):

- ``MPIR_CVAR_CH4_NUM_VCIS=2`` (MPICH 4 and later, the ch4 device): two virtual communication
  interfaces, so that the Communicator's gradient and control communicators use separate network
  endpoints. With one, over TCP, a control message (the metrics' reduction at a sync point, the
  agreement on a signal) queues on the same connection behind a gradient allreduce in flight and
  waits for most of it: 570-590 ms of a 1.35 s allreduce of 80 MB at 1 Gbit/s, against 8-14 ms
  with two, and at every sync point that falls inside a period of ``ssd --comm period``
  (BENCHMARKS.md, "A sync point's control message behind the allreduce in flight"). Other MPI
  libraries ignore the variable.
- ``OMPI_MCA_btl_tcp_flags`` without ``put``, ``OMPI_MCA_btl_tcp_max_send_size=524288`` (Open
  MPI's TCP transport): the same stall there has another cause. With ``put`` (its default) the
  TCP transport emulates a remote write of a whole large message and queues all of it on the
  peer's connection, so a control message waits for the rest of that message: 590-600 ms of a
  1.3 s allreduce of 80 MB at 1 Gbit/s. Without it, large messages go in a pipeline of a few
  512 KiB fragments, and the control message waits for those only: 27-40 ms, with the
  allreduce itself as fast (1.30-1.31 s at 1 Gbit/s, 0.18 s at 10 Gbit/s, and 89 instead of
  100-112 ms over an unthrottled loopback; BENCHMARKS.md, "A sync point's control message behind
  the allreduce in flight"). The flags string is Open MPI 5's default less ``put``. Shared
  memory, UCX and MPICH do not read these variables.

``import ssdmpi`` edits no environment: the settings are made by ``load_mpi`` just before MPI
starts. A script that imports ``mpi4py.MPI`` itself before ssdmpi does starts MPI without them
(call ``apply()`` first to have them).
"""

from __future__ import annotations

import os
import subprocess
import sys

DEFAULTS = {"MPIR_CVAR_CH4_NUM_VCIS": "2",
            "OMPI_MCA_btl_tcp_flags": "send,inplace,need-ack,need-csum,hetero-rdma",
            "OMPI_MCA_btl_tcp_max_send_size": "524288"}

# Asks the MPI library for its version without initialising MPI (in a child process).
_VERSION_CODE = "import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; print(MPI.Get_library_version())"


def apply(environ=None) -> None:
    """Set each of ``DEFAULTS`` in ``environ`` (default ``os.environ``) that is not set already."""
    environ = os.environ if environ is None else environ
    for name, value in DEFAULTS.items():
        environ.setdefault(name, value)


def load_mpi():
    """mpi4py's ``MPI`` module. The first call in a process applies ``DEFAULTS`` and then imports
    it, which initialises MPI; if something else already imported it, MPI has started and the
    environment is left alone (the settings could only reach child processes)."""
    if loaded_mpi() is None:
        apply()
    from mpi4py import MPI

    return MPI


def loaded_mpi():
    """mpi4py's ``MPI`` module if this process has imported it (MPI started), else None; imports nothing."""
    return sys.modules.get("mpi4py.MPI")


def running_library() -> str | None:
    """The running MPI library's version line (its first, spaces collapsed: ``MPICH Version: 5.0.2``)
    when this process has started MPI, else None (starts nothing)."""
    MPI = loaded_mpi()
    return None if MPI is None else " ".join(MPI.Get_library_version().strip().splitlines()[0].split())


def library_version() -> str:
    """The MPI library's version text. Asked of the running MPI when this process has started it;
    otherwise in a child process, so that this one stays out of MPI (an MPI singleton parent can
    upset an ``mpiexec`` it starts later). ``MPI unavailable (why)`` when it cannot be asked."""
    if loaded_mpi() is not None:
        return loaded_mpi().Get_library_version()
    try:
        proc = subprocess.run([sys.executable, "-c", _VERSION_CODE], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"MPI unavailable ({type(exc).__name__}: {exc})"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return f"MPI unavailable ({last})"
    return proc.stdout.strip()
