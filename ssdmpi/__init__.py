"""ssdmpi: data-parallel training with SSD-SGD (Several Steps Delay SGD) over MPI.

See ``docs/ALGORITHM.md`` for the method and ``docs/ARCHITECTURE.md`` for the layout.
"""

__version__ = "0.1.0"
