"""``TrainingAlgorithm``: what the trainer may ask of any algorithm (``ssdmpi/algos/__init__.py`` says
what each call means). Every ``--algo`` implements it: ``Algorithm`` (``base.py``: the SSGD warm-up and
a delay stage) and ``ASGD`` (``asgd.py``: parameter servers). The trainer (``ssdmpi/run/``) uses
nothing else, and never asks whether an algorithm has an attribute: the defaults below are what an
algorithm without the feature answers.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

from ssdmpi.phases import Phases


@dataclass(frozen=True)
class Parts:
    """What the registry hands an algorithm besides its config (``registry.build_algorithm``): the inner
    optimizer (``ssdmpi/optim/part.py``), for ``--comm period`` the period rule's spec and the values
    of its own settings, and the outer optimizer of its merged averages (``ssdmpi/optim/outer.py``; None:
    the plain average)."""

    optimizer: object
    rule: object = None
    rule_settings: dict = field(default_factory=dict)
    outer: object = None


class TrainingAlgorithm(abc.ABC):
    """The algorithm contract. ``name``: its ``--algo``. ``lockstep``: every rank takes each step
    together (False: the workers meet only through parameter servers, and the trainer reduces its
    sync points' metrics without aligning the ranks there). ``is_server``: this rank trains on no data
    (it evaluates nothing). ``phases``: this rank's step breakdown (``ssdmpi/phases.py``).
    ``delay_choice``: what ``--delay auto`` chose (None: nothing chosen, or no ``--delay auto``);
    ``on_delay_chosen``: set by the trainer, told of the choice when it is made."""

    name = "algorithm"
    lockstep = True
    is_server = False
    delay_choice = None
    on_delay_chosen = None

    def __init__(self) -> None:
        self.phases = Phases()

    # counters and rates (read by the loop and the metrics)
    t: int
    s: int

    @property
    @abc.abstractmethod
    def stage(self) -> str:
        """The stage the next iteration runs in (``"warmup"``, ``"delay"``, ``"async"``)."""

    @property
    def has_delay_stage(self) -> bool:
        """It leaves the SSGD warm-up for a stage of its own (plain ssgd never does)."""
        return True

    @property
    def m(self) -> int | None:
        """The local-update counter of the next iteration, or None."""
        return None

    @property
    @abc.abstractmethod
    def lr_global(self) -> float:
        """The global learning rate the next iteration steps with."""

    @property
    def lr_local(self) -> float | None:
        """The learning rate of the next local step (None where there is none)."""
        return None

    # the step and what is in flight
    @abc.abstractmethod
    def step(self, x, y):
        """Collective: iteration ``t`` on this rank's batch; its mean loss (None on a server)."""

    @abc.abstractmethod
    def drain(self) -> None:
        """Collective: complete what is in flight (continuing after it is the same trajectory)."""

    def finalize(self) -> None:
        """Collective, at the end of training: every communicated result applied to ``W``."""
        self.drain()

    def allreduce_window(self) -> tuple | None:
        """``(k, window, flag)`` of a schedule fixed by its settings with one allreduce per period of ``k``
        steps that must complete within ``window`` steps of its post (``flag``: the setting that sets the
        window); None for any other schedule, or one that ``--delay auto`` chooses."""
        return None

    def interval_staleness(self) -> dict:
        """This rank's staleness sums since the last call (then reset); {} where nothing is stale."""
        return {}

    # the models
    @abc.abstractmethod
    def global_weights(self):
        """``W`` (a view; do not modify)."""

    def local_weights(self):
        """This rank's ``L`` (a view), or None where there is none."""
        return None

    # state
    @abc.abstractmethod
    def state_dict(self, copy: bool = True) -> dict:
        """Collective (drains first): everything needed to continue bit for bit."""

    @abc.abstractmethod
    def load_state_dict(self, d: dict) -> None:
        """Restore ``state_dict()`` output into an algorithm built with the same config."""

    @abc.abstractmethod
    def replicated(self) -> tuple:
        """Keys of ``state_dict()`` whose arrays are the same on every rank."""

    @abc.abstractmethod
    def resized_state(self, ctx) -> tuple[dict, str]:
        """Collective: this rank's state from a checkpoint of another number of ranks, and what was merged."""

    @abc.abstractmethod
    def signature(self) -> dict:
        """The settings every rank must agree on (plain scalars keyed ``algo.*``)."""
