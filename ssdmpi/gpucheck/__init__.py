"""The GPU check: one command that verifies ssdmpi's GPU path on a machine with a GPU.

``bin/ssdmpi-gpucheck --out DIR`` (or ``python -m ssdmpi.gpucheck --out DIR``), <= 8 minutes
on one H200; what it checks, how to run it and how to read its report: docs/GPU.md.

- ``run.py``: the runner; each part in its own subprocess under its own time budget;
- ``parts.py``: the one-process parts (models, optimizers, engine, training);
- ``ranks.py``: the two-rank parts under ``mpiexec -n 2`` (algorithms per transport, overlap);
- ``report.py``: the records, written as they grow (a killed part or run leaves its results).
"""
