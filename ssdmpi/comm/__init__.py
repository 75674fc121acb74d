"""The MPI layer: the only package that calls MPI (besides ``ssdmpi info`` and the raw
mpi4py baseline of ``ssdmpi bench comm``).

- ``communicator.py``: ``Communicator``, what a run holds: three private duplicates and the
  calls of its three channels under one name, one lifetime:
  ``gradients.py`` (allreduce of flat buffers, nonblocking handles, broadcast; the base of the
  progress strategies), ``control.py`` (barrier, object broadcast, agreement, scalar
  reductions, state-tree gather/scatter) and ``p2p.py`` (sends and receives for ``asgd``).
- ``progress/``: the progress strategies, one ``GradientChannel`` subclass per file
  (``blocking``, ``caller`` = ``test``, ``poller`` = ``poll``, ``thread``), the factory and the
  measured default per backend.
- ``operations.py``: operation numbers (``#seq``) and names, and watched waits.
- ``world.py``: COMM_WORLD before a Communicator exists (rank 0 reads the configuration,
  every rank agrees on set-up errors).
- ``node.py``: where a rank runs: local rank and size, host, usable CPUs; its BLAS threads
  and its GPU, chosen and applied before the backend's first allocation.
- ``mpi_env.py``: how ssdmpi starts MPI: ``load_mpi()``, the one import of ``mpi4py.MPI``,
  applies ssdmpi's MPI settings first; the library's version.
- ``trees.py``: how a state tree travels (a pickled skeleton, raw array buffers).
- ``fused_mean.py``: the blocking mean with the division done in cache.
- ``compressed.py``: sums sent as bfloat16, float16 or int8 (``--comm-dtype``), with error feedback.
- ``transport.py``: how GPU buffers reach MPI (``host`` staging, ``cuda-aware``).
- ``stats.py``: per-interval timings (``snapshot_and_reset()`` keys).
- ``watchdog.py``: the stall watchdog (names the operation and the missing ranks, aborts).
- ``agreement.py``: comparing setup signatures and errors across ranks (pure functions).
- ``abort.py``: a failing rank aborts the whole job instead of hanging it.
- ``shm.py``: MPI shared-memory segments left in ``/dev/shm`` by killed jobs (find, remove).

See ``docs/ARCHITECTURE.md``. MPI starts only when something calls ``mpi_env.load_mpi()``
(inside functions), so that ``ssdmpi --help`` and serial tools never initialise it.
"""
