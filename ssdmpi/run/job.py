"""What the loop, the reporter and the trainer share: the ``Job`` (what one run trains, built by
``ssdmpi/run/setup.py``) and ``Stop`` (the signal flags the loop reads at synchronisation points).
The lowest floor of the trainer: it imports nothing of ssdmpi."""

from __future__ import annotations

import dataclasses
import signal


@dataclasses.dataclass
class Job:
    """What one run trains, built by ``setup`` (the same on every rank but for its shard)."""

    cfg: object              # the resolved TrainConfig
    algo_cfg: object         # its AlgoConfig (steps, not epochs)
    dataset: object
    model: object
    loader: object
    algo: object
    state: object            # a TrainingState over model, algo and loader
    evaluator: object
    E: int                   # steps per epoch
    total_steps: int
    workers: int             # ranks that train on data (all but asgd's servers, which have no loader)
    context: int | None = None           # a language model's tokens per window (a text dataset), else None
    checkpoints: object = None           # this rank's CheckpointWriter (ssdmpi/checkpoint/writer.py)
    last_checkpoint: str | None = None   # the newest checkpoint of this run, or the one it resumed from
    placement: object = None             # this rank's threads and GPU, and why (comm/node.py)
    command: bool = False                # run by the ssdmpi train command (else a script, the Python API)
    resize: dict | None = None           # the ``resize`` record when resumed on another number of ranks


class Stop:
    """The signal flags: handlers set them, the loop reads them at synchronisation points.

    A context manager: entering installs the handlers, leaving restores the previous ones,
    except that ``exiting=True`` (the command line, whose process ends with the run) leaves
    SIGUSR1 ignored: a lead-time signal that arrives after the last step, while the process
    shuts down (MPI_Finalize, the interpreter's exit), has nothing left to checkpoint and must
    not kill the rank of a finished run (its job would fail with 138 instead of completing).
    """

    def __init__(self, exiting: bool = False):
        self.preempt = 0      # SIGUSR1 / SIGTERM seen: checkpoint, exit 85
        self.interrupt = 0    # SIGINT seen: checkpoint, exit 130
        self.exiting = exiting
        self.previous = {}

    def __enter__(self) -> Stop:
        for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
            try:
                self.previous[sig] = signal.signal(sig, self._handler)
            except (ValueError, OSError):   # not the main thread, or no such signal here
                pass
        return self

    def _handler(self, signum, frame):
        if signum == signal.SIGINT:
            if self.interrupt:     # the second Ctrl-C: stop now, no checkpoint
                raise KeyboardInterrupt
            self.interrupt = 1
        else:
            self.preempt = 1

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, signal.SIG_IGN if self.exiting and sig == signal.SIGUSR1 else handler)
        self.previous = {}
