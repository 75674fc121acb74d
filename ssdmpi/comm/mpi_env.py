"""MPI library settings ssdmpi makes for its own processes before MPI starts; a value the user
set wins (``apply`` only fills in what is unset).

- ``MPIR_CVAR_CH4_NUM_VCIS=2`` (MPICH 4 and later, the ch4 device): two virtual communication
  interfaces, so that the Communicator's gradient and control communicators use separate network
  endpoints. With one, over TCP, a control message (the metrics' reduction at a sync point, the
  agreement on a signal) queues on the same connection behind a gradient allreduce in flight and
  waits for most of it: 570-590 ms of a 1.35 s allreduce of 80 MB at 1 Gbit/s, against 8-14 ms
  with two, and at every sync point that falls inside a period of ``ssd --comm period``
  (BENCHMARKS.md section 13). Other MPI libraries ignore the variable.
"""

from __future__ import annotations

import os

DEFAULTS = {"MPIR_CVAR_CH4_NUM_VCIS": "2"}


def apply(environ=None) -> None:
    """Set each of ``DEFAULTS`` in ``environ`` (default ``os.environ``) that is not set already.
    Call before ``mpi4py`` initialises MPI (``ssdmpi/__init__.py`` does, on import)."""
    environ = os.environ if environ is None else environ
    for name, value in DEFAULTS.items():
        environ.setdefault(name, value)
