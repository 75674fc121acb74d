"""Errors the user can fix: printed as one line, exit code 2, no traceback."""

USAGE_EXIT = 2          # bad flags, bad data, bad checkpoint: the user's to fix
REQUEUE_EXIT = 85       # checkpointed on a signal or preemption: "requeue me"
DIVERGED_EXIT = 3       # a non-finite loss or weights: stopped, the last good checkpoint kept
INTERRUPT_EXIT = 130    # checkpointed after Ctrl-C (SIGINT)
BROKEN_PIPE_EXIT = 141  # a single process whose output reader left (`ssdmpi data list | head`), as SIGPIPE


class UserError(Exception):
    """Bad input (flags, data, checkpoints). The message says what is wrong and what to do.

    ``collective=True`` means every rank raised this same error (e.g. after the ranks
    agreed on it), so rank 0 alone reports it and no MPI abort is needed.
    """

    def __init__(self, message: str, collective: bool = False):
        super().__init__(message)
        self.collective = collective
