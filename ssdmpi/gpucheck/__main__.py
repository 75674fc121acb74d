"""``python -m ssdmpi.gpucheck --out DIR``: the GPU check (``ssdmpi/gpucheck/run.py``)."""

import sys

from ssdmpi.gpucheck.run import main

sys.exit(main())
