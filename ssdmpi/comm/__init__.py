"""The MPI layer: the only package that calls MPI (besides ``ssdmpi info`` and the raw
mpi4py baseline of ``ssdmpi bench comm``).

- ``communicator.py``: ``Communicator`` (allreduce of flat buffers, nonblocking handles,
  broadcast, the control calls: barrier, object broadcast, agreement, scalar reductions,
  state-tree gather/scatter) — the contract the layers above code against.
- ``world.py``: COMM_WORLD before a Communicator exists (rank 0 reads the configuration,
  every rank agrees on set-up errors).
- ``node.py``: where a rank runs: local rank and size, host, usable CPUs; its BLAS threads
  and its GPU, chosen and applied before the backend's first allocation.
- ``trees.py``: how a state tree travels (a pickled skeleton, raw array buffers).
- ``progress.py``: progress strategies (``test``, ``thread``, ``blocking``) and the measured
  default per backend.
- ``transport.py``: how GPU buffers reach MPI (``host`` staging, ``cuda-aware``).
- ``stats.py``: per-interval timings (``snapshot_and_reset()`` keys).
- ``watchdog.py``: the stall watchdog (names the operation and the missing ranks, aborts).
- ``agreement.py``: comparing setup signatures and errors across ranks (pure functions).
- ``abort.py``: a failing rank aborts the whole job instead of hanging it.
- ``shm.py``: MPI shared-memory segments left in ``/dev/shm`` by killed jobs (find, remove).

See ``docs/ARCHITECTURE.md``. Import MPI lazily (``from mpi4py import MPI`` inside
functions) so that ``ssdmpi --help`` and serial tools never initialise MPI.
"""
