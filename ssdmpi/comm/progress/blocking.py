"""``--progress blocking``: ``allreduce_start`` runs the whole allreduce in the caller's thread;
``wait()`` is free. No overlap, no surprises: the baseline."""

from __future__ import annotations

from ssdmpi.comm.gradients import GradientChannel


class BlockingChannel(GradientChannel):
    """Every allreduce is reduced when it is started (``GradientChannel._reduce_now``)."""

    name = "blocking"

    def _start(self, handle, divide_here: bool) -> None:
        self._reduce_now(handle, divide_here)
