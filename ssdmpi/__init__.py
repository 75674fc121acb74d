"""ssdmpi: data-parallel training with SSD-SGD (Several Steps Delay SGD) over MPI.

See ``docs/ALGORITHM.md`` for the method and ``docs/ARCHITECTURE.md`` for the layout.
``ssdmpi.train(config, model=None, dataset=None)`` trains from a script and
``ssdmpi.load_model(path, model=None)`` loads what a run trained (docs/API.md).
Importing it edits no environment and starts no MPI (``ssdmpi/comm/mpi_env.py``).
"""

from ssdmpi.restore import load_model
from ssdmpi.version import __version__

__all__ = ["__version__", "load_model", "train"]


def __getattr__(name: str):
    """``ssdmpi.train``, the function of ``ssdmpi/run/api.py``, imported when first asked for, so that
    ``import ssdmpi`` (and the ``ssdmpi`` command line) loads no trainer, NumPy or MPI."""
    if name == "train":
        from ssdmpi.run.api import train

        return train
    raise AttributeError(f"module 'ssdmpi' has no attribute {name!r}")
