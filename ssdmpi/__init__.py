"""ssdmpi: data-parallel training with SSD-SGD (Several Steps Delay SGD) over MPI.

See ``docs/ALGORITHM.md`` for the method and ``docs/ARCHITECTURE.md`` for the layout.
``ssdmpi.train(config, model=None, dataset=None)`` trains from a script (docs/API.md).
Importing it edits no environment and starts no MPI (``ssdmpi/comm/mpi_env.py``).
"""

__version__ = "0.1.0"

from ssdmpi import train  # noqa: E402  (callable: the Python API; see ssdmpi/api.py)

__all__ = ["__version__", "train"]
