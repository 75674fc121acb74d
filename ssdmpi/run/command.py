"""``ssdmpi train``: data-parallel training with SSD-SGD, SSGD, OD-SGD, local SGD or ASGD: its
flags and help (this module: imported when the CLI parser is built, so it imports no NumPy);
``ssdmpi/run/trainer.py`` runs it (``run``), as ``ssdmpi.train(...)`` (``ssdmpi/run/api.py``) does.

Run directory (``--run-dir``, default ``runs/<timestamp>-<algo>``, then ``-2``, ``-3``, ... for runs
started in the same second)::

    config.yaml      the resolved configuration (--config reads it back for a new run; its run_dir is a comment)
    metrics.jsonl    one JSON object per logged step and per evaluation (ssdmpi/metrics.py)
    checkpoints/     ckpt-<step>/ (one file per rank and a manifest), the newest --keep-checkpoints
                     of them, and the links last and best (ssdmpi/checkpoint/)
    summary.txt      the human summary, also printed at the end; summary.json for scripts
    steps.csv        with --csv: the step records of metrics.jsonl as a table; evals.csv the eval records
    tensorboard/     with --tensorboard: TensorBoard event files (tensorboard --logdir RUN; ssdmpi/loggers.py)

When things happen (``t`` = iterations done, ``E`` = steps per epoch):

* every ``--log-every`` steps, at each epoch's end and at ``--checkpoint-every`` steps,
  the ranks synchronise once over the control communicator: metrics are summed, and the
  ranks agree on signals and on divergence. This is the only extra synchronisation the
  trainer adds; with ``--log-every 10`` a signal is acted on within 10 steps;
* at each epoch's end (``t % E == 0``) and every ``--checkpoint-every`` steps: checkpoint
  (after ``algo.drain()``, which completes the request in flight without changing the
  trajectory), written in the background and committed at a later sync point; a signal's
  and the final checkpoint are written before the run goes on or ends;
* every ``--eval-every`` epochs and at the end: evaluation of the global model ``W`` (and,
  in the delay stage, of rank 0's local model ``L``) on the test split, sharded across the
  ranks, with rank 0's BatchNorm statistics;
* at the end: ``algo.finalize()`` (``W`` gets every gradient communicated and the partial
  period), evaluation, the final checkpoint (the training state before finalize, so that
  training longer continues bit for bit, and the finalized ``W`` as its model), ``summary.txt``.

Exit codes: 0 done; 2 bad input (one line); 3 diverged (a non-finite loss or weights: the
run stops at once, keeping the last good checkpoint); 85 checkpointed on SIGUSR1/SIGTERM
or ``--stop-at-step``, "requeue me" (the line printed is the command that resumes it, with
``--resume auto``; on a finished run that only says it is complete); 130 checkpointed
after Ctrl-C (SIGINT; a second Ctrl-C aborts at once); 1 anything else (the whole job is
aborted, naming the failing rank). Signal handlers only set a flag; the ranks act on it
together at the next synchronisation point.
"""

from __future__ import annotations

import argparse

from ssdmpi.config import add_arguments as _add_config_arguments

EPILOG = """\
settings: dataclass defaults < --preset (default: default) < --config FILE < flags.
output: the opening lines, one line per evaluation, notes, the summary; --log-every N adds a line every
  N steps (--no-progress-bar too, instead of a bar); a progress bar only where stdout is a terminal.
run directory: config.yaml, metrics.jsonl, checkpoints/ckpt-<step>/ (last, best), summary.txt/.json,
  steps.csv/evals.csv (--csv), tensorboard/ (--tensorboard).
exit codes: 0 done; 2 bad input; 3 diverged (last good checkpoint kept);
  85 checkpointed on SIGUSR1/SIGTERM or --stop-at-step, requeue me (--resume auto);
  130 checkpointed after Ctrl-C; 1 anything else (the whole job is aborted)."""


def add_arguments(parser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    _add_config_arguments(parser)
