"""``ssdmpi.comm.world``: COMM_WORLD before a Communicator exists, at any rank count."""

import pytest
from mpi4py import MPI

from ssdmpi.comm import world
from ssdmpi.errors import UserError


def test_rank_and_size_are_comm_worlds():
    assert world.rank_and_size() == (MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size())


def test_on_root_runs_once_on_rank_0_and_returns_its_result_everywhere():
    calls = []

    def read():
        calls.append(1)
        return {"from": MPI.COMM_WORLD.Get_rank()}

    assert world.on_root(read) == {"from": 0}
    assert len(calls) == (1 if MPI.COMM_WORLD.Get_rank() == 0 else 0)


def test_on_root_raises_rank_0s_error_everywhere():
    def read():
        raise UserError("no such config file: x.yaml")

    with pytest.raises(UserError, match="^no such config file: x.yaml$") as info:
        world.on_root(read)
    assert info.value.collective


def test_agree_names_the_lowest_failing_rank_other_than_0():
    rank, size = world.rank_and_size()
    assert world.agree(lambda: rank * 2) == rank * 2
    odd = size - 1

    def pick():
        if rank == odd:
            raise UserError("no GPU here")
        return "ok"

    with pytest.raises(UserError) as info:
        world.agree(pick)
    assert info.value.collective
    assert str(info.value) == ("no GPU here" if odd == 0 else f"rank {odd}: no GPU here")
