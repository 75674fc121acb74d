"""``ssdmpi bench model``: an alpha-beta model of step time, checked against measurements.

- ``alphabeta.py``: the model and its analysis (fit, predictions, planning table): pure functions;
- ``measure.py``: the MPI measurement loops (collective);
- ``report.py``: the Markdown report;
- ``command.py``: flags, checks, relaunching under ``mpiexec`` (``ssdmpi.bench.launch``), output.
"""

from ssdmpi.bench.model.command import add_arguments, run

__all__ = ["add_arguments", "run"]
