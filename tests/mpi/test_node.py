"""comm/node.py under mpiexec: every rank learns its node (one node here)."""

import os
import socket

from ssdmpi.comm import node


def test_discover_finds_the_local_ranks(comm):
    me = node.discover()
    everyone = comm.allgather(me)
    assert sorted(n.local_rank for n in everyone) == list(range(comm.Get_size()))   # one node: local = world
    assert {n.local_size for n in everyone} == {comm.Get_size()}
    assert me.host == socket.gethostname() and me.cpus == len(os.sched_getaffinity(0))
    assert me.node_cpus >= me.cpus
    n, why = node.choose_threads(me, None, {})
    assert n == max(1, min(me.cpus, me.node_cpus // comm.Get_size()))
    ranks = "1 local rank" if comm.Get_size() == 1 else f"{comm.Get_size()} local ranks"
    assert why == f"{me.node_cpus} usable CPUs on {me.host} / {ranks}"
