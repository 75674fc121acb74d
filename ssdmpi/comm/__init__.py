"""The MPI layer: the only package that calls MPI for gradients and weights.

- ``communicator.py``: ``Communicator`` (allreduce of flat buffers, nonblocking handles,
  broadcast, control-traffic helpers) — the contract the layers above code against.
- ``progress.py``: progress strategies (``test``, ``thread``, ``blocking``) and the measured
  default per backend.
- ``transport.py``: how GPU buffers reach MPI (``host`` staging, ``cuda-aware``).
- ``stats.py``: per-interval timings (``snapshot_and_reset()`` keys).
- ``watchdog.py``: the stall watchdog (names the operation and the missing ranks, aborts).
- ``agreement.py``: comparing setup signatures and errors across ranks (pure functions).
- ``options.py``: the ``--progress/--transport/--bucket-size/--stall-timeout`` flags.
- ``abort.py``: a failing rank aborts the whole job instead of hanging it.

See ``docs/ARCHITECTURE.md``. Import MPI lazily (``from mpi4py import MPI`` inside
functions) so that ``ssdmpi --help`` and serial tools never initialise MPI.
"""
