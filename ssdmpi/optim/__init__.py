"""Optimizers on flat buffers (ALGORITHM.md sections 3 and 4) and learning-rate schedules.

- ``MomentumSGD``: the global update ``M <- mu*M - eta*(lam*mask*W + G); W <- W + M``.
- ``GlobalMomentumLocal``, ``GLUPaper``, ``PlainLocalSGD``: the local updates
  ``global-momentum``, ``glu-paper``, ``sgd``; ``make_local_update(name, ...)``.
- ``fused``: each update as one pass over the buffers (NumPy in cache-sized blocks, or one
  CuPy kernel), bitwise equal to the operation-by-operation form.
- ``LRSchedule``: constant, step, multistep, cosine, poly, each with linear warm-up.
"""

from ssdmpi.optim.local import LOCAL_UPDATES, GlobalMomentumLocal, GLUPaper, PlainLocalSGD, make_local_update
from ssdmpi.optim.schedules import KINDS as SCHEDULES
from ssdmpi.optim.schedules import LRSchedule
from ssdmpi.optim.sgd import MomentumSGD

__all__ = ["MomentumSGD", "GlobalMomentumLocal", "GLUPaper", "PlainLocalSGD", "make_local_update",
           "LOCAL_UPDATES", "LRSchedule", "SCHEDULES"]
