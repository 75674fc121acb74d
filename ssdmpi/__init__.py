"""ssdmpi: data-parallel training with SSD-SGD (Several Steps Delay SGD) over MPI.

See ``docs/ALGORITHM.md`` for the method and ``docs/ARCHITECTURE.md`` for the layout.
``ssdmpi.train(config, model=None, dataset=None)`` trains from a script and
``ssdmpi.load_model(path, model=None)`` loads what a run trained (docs/API.md).
Importing it edits no environment and starts no MPI (``ssdmpi/comm/mpi_env.py``).
"""

__version__ = "0.1.0"

from ssdmpi.api import train  # noqa: E402  (the command's module is ssdmpi.trainer)
from ssdmpi.restore import load_model  # noqa: E402

__all__ = ["__version__", "load_model", "train"]
