"""Optimizers on flat buffers (ALGORITHM.md sections 3 and 4) and learning-rate schedules.

- ``part``: the inner optimizer as a part (``Optimizer``: ``init`` a state on flat buffers, a fused
  ``update``); one file per ``--optimizer`` in ``optimizers/`` (``sgd.py``: ``MomentumSGD``), found by the registry.
- ``GlobalMomentumLocal``, ``GLUPaper``, ``PlainLocalSGD``: the local updates
  ``global-momentum``, ``glu-paper``, ``sgd``; ``make_local_update(name, ...)``.
- ``outer``: the outer optimizer of the merged averages (``OuterOptimizer``: SGD or Nesterov momentum on
  the pseudo-gradient, DiLoCo's; ``--outer-optimizer``, ``--outer-lr``, ``--outer-momentum``).
- ``fused``: each update as one pass over the buffers (NumPy in cache-sized blocks, or one
  CuPy kernel), bitwise equal to the operation-by-operation form.
- ``LRSchedule``: constant, step, multistep, cosine, poly, each with linear warm-up.
"""

from ssdmpi.optim.local import LOCAL_UPDATES, GlobalMomentumLocal, GLUPaper, PlainLocalSGD, make_local_update
from ssdmpi.optim.optimizers.sgd import MomentumSGD
from ssdmpi.optim.part import Optimizer, OptState
from ssdmpi.optim.schedules import KINDS as SCHEDULES
from ssdmpi.optim.schedules import LRSchedule

__all__ = ["Optimizer", "OptState", "MomentumSGD", "GlobalMomentumLocal", "GLUPaper", "PlainLocalSGD",
           "make_local_update", "LOCAL_UPDATES", "LRSchedule", "SCHEDULES"]
