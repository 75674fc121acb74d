"""``--progress test``: ``allreduce_start`` posts ``Iallreduce``; the caller's own ``handle.test()``
and ``progress()`` calls (between layers, every few MiB of an update, between steps) move it
along, and ``wait()`` finishes it. Overlap depends on how often the caller calls ``progress()``.

A device buffer's request is posted only once its staging copy is ready (``Staged.ready``): by
``allreduce_start`` if it already is, else by a later ``progress``/``test``/``wait``. Requests are
posted in the order they were started, so every rank posts the same sequence.

A compressed sum (``ssdmpi/comm/compressed.py``) is a chain of two collectives: its ``Ialltoall`` is
posted as above; once a ``test``/``progress``/``wait`` finds it complete, that call reduces the shard
and posts the ``Iallgather`` (on the channel's second communicator). The gathers are posted in the
order the sums were started, so a sum's gather waits for the earlier sums' to be posted first.
"""

from __future__ import annotations

from ssdmpi.comm.gradients import GradientChannel, clock


class CallerChannel(GradientChannel):
    """Nonblocking requests driven by the caller's calls (see the module docstring)."""

    name = "test"
    moved_by_caller = True

    def _start(self, handle, divide_here: bool) -> None:
        handle._unposted = True
        self._track(handle)
        self._post_staged(handle, wait=False)   # now if the staging is ready, else from test()

    def progress(self) -> None:
        """Move outstanding requests along: one ``MPI_Test`` drives the whole progress engine."""
        if self.pending:
            start = clock()
            for handle in self.pending:
                if not handle.test():
                    break
            # Data moves inside these calls, on the caller's time: count it as exposed.
            self.stats.add_exposed(clock() - start)

    def _test_posted(self, handle) -> bool:
        if handle._unposted and not self._post_staged(handle, wait=False):
            return False
        if handle._chain is not None and not handle._chain.gathering and not self._post_gathers(handle, wait=False):
            return False
        with self._lock:
            done = self._MPI.Request.Testall(handle._requests)
        if done:
            handle._t_complete = clock()
        return done

    def _complete(self, handle) -> None:
        if handle._unposted:
            self._post_staged(handle, wait=True)
        if handle._chain is not None and not handle._chain.gathering:
            self._post_gathers(handle, wait=True)
        if handle._requests is not None and handle._t_complete is None:
            with self._lock:
                self.ops.watched(handle, handle.seq, self._MPI.Request.Waitall, handle._requests)
            handle._t_complete = clock()

    def _post_staged(self, upto, wait: bool) -> bool:
        """Post the requests whose staging is ready, in posting order, up to ``upto``; ``wait``:
        wait for each staging first. True when ``upto`` is posted."""
        MPI = self._MPI
        op, in_place = MPI.SUM, MPI.IN_PLACE
        for h in self.pending:
            if h._unposted:
                if not h._staged.ready():
                    if not wait:
                        return False
                    h._staged.wait_ready()
                with self._lock:
                    h._requests = ([h._chain.post_scatter(self._comm)] if h._chain is not None
                                   else [self._comm.Iallreduce(in_place, b, op=op) for b in h._buckets])
                h._unposted = False
                self._posted()
            if h is upto:
                break
        return True

    def _post_gathers(self, upto, wait: bool) -> bool:
        """Compressed sums up to ``upto``, in posting order: once a sum's ``Ialltoall`` is complete,
        reduce its shard and post its ``Iallgather``; ``wait``: wait for each alltoall first. True when
        ``upto``'s gather is posted."""
        MPI = self._MPI
        for h in self.pending:
            chain = h._chain
            if chain is not None and not chain.gathering:
                if h._unposted and not self._post_staged(h, wait):
                    return False
                with self._lock:
                    done = MPI.Request.Testall(h._requests)
                    if not done and wait:
                        self.ops.watched(h, h.seq, MPI.Request.Waitall, h._requests)
                if not done and not wait:
                    return False
                chain.reduce_shard()
                with self._lock:
                    h._requests = [chain.post_gather(self._gather_comm)]
                self._posted()
            if h is upto:
                break
        return True

    def _posted(self) -> None:
        """A request was just posted (a hook for ``poll``)."""
