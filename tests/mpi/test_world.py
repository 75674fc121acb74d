"""The MPI runtime the tests run on works at every rank count."""

import numpy as np
from mpi4py import MPI


def test_iallreduce_sums_every_rank(comm):
    send = np.full(1000, comm.Get_rank() + 1, dtype=np.float32)
    recv = np.empty_like(send)
    comm.Iallreduce(send, recv, op=MPI.SUM).Wait()
    n = comm.Get_size()
    assert np.all(recv == n * (n + 1) / 2)
