"""MPI library settings ssdmpi makes for its own processes before MPI starts; a value the user
set wins (``apply`` only fills in what is unset).

- ``MPIR_CVAR_CH4_NUM_VCIS=2`` (MPICH 4 and later, the ch4 device): two virtual communication
  interfaces, so that the Communicator's gradient and control communicators use separate network
  endpoints. With one, over TCP, a control message (the metrics' reduction at a sync point, the
  agreement on a signal) queues on the same connection behind a gradient allreduce in flight and
  waits for most of it: 570-590 ms of a 1.35 s allreduce of 80 MB at 1 Gbit/s, against 8-14 ms
  with two, and at every sync point that falls inside a period of ``ssd --comm period``
  (BENCHMARKS.md section 13). Other MPI libraries ignore the variable.
- ``OMPI_MCA_btl_tcp_flags`` without ``put``, ``OMPI_MCA_btl_tcp_max_send_size=524288`` (Open
  MPI's TCP transport): the same stall there has another cause. With ``put`` (its default) the
  TCP transport emulates a remote write of a whole large message and queues all of it on the
  peer's connection, so a control message waits for the rest of that message: 590-600 ms of a
  1.3 s allreduce of 80 MB at 1 Gbit/s. Without it, large messages go in a pipeline of a few
  512 KiB fragments, and the control message waits for those only: 27-40 ms, with the
  allreduce itself as fast (1.30-1.31 s at 1 Gbit/s, 0.18 s at 10 Gbit/s, and 89 instead of
  100-112 ms over an unthrottled loopback; BENCHMARKS.md section 15). The flags string is Open
  MPI 5's default less ``put``. Shared memory, UCX and MPICH do not read these variables.
"""

from __future__ import annotations

import os

DEFAULTS = {"MPIR_CVAR_CH4_NUM_VCIS": "2",
            "OMPI_MCA_btl_tcp_flags": "send,inplace,need-ack,need-csum,hetero-rdma",
            "OMPI_MCA_btl_tcp_max_send_size": "524288"}


def apply(environ=None) -> None:
    """Set each of ``DEFAULTS`` in ``environ`` (default ``os.environ``) that is not set already.
    Call before ``mpi4py`` initialises MPI (``ssdmpi/__init__.py`` does, on import)."""
    environ = os.environ if environ is None else environ
    for name, value in DEFAULTS.items():
        environ.setdefault(name, value)
