"""The MPI layer: the only package that calls MPI for gradients and weights.

See ``docs/ARCHITECTURE.md``. Import MPI lazily (``from mpi4py import MPI`` inside
functions) so that ``ssdmpi --help`` and serial tools never initialise MPI.
"""
