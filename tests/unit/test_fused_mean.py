"""The fused mean's plan (ssdmpi/comm/fused_mean.py) for rank counts 1-9, simulated in one
process, and the real thing at rank counts that are not powers of two (the ring), launched.

tests/mpi/test_fused_mean.py checks it under MPI at 1, 2 and 4 ranks (recursive halving)."""

import subprocess
import sys

import numpy as np
import pytest

from ssdmpi.comm import fused_mean
from tests.conftest import ROOT, mpiexec

SIZES = range(1, 10)


@pytest.mark.parametrize("size", SIZES)
def test_partners_agree_on_every_exchange(size):
    """At every step, what a rank sends is what its destination adds, of the same length."""
    length = 12 * size
    plans = [fused_mean.reduce_scatter_steps(r, size, length) for r in range(size)]
    assert len({len(p) for p in plans}) == 1
    for step in range(len(plans[0])):
        for r in range(size):
            dest, send, source, into = plans[r][step]
            assert send[1] - send[0] == into[1] - into[0]
            assert plans[dest][step][2] == r and plans[dest][step][3] == send
            assert plans[source][step][0] == r and plans[source][step][1] == into


@pytest.mark.parametrize("size", SIZES)
def test_simulated_reduce_scatter_leaves_each_rank_its_block_summed(size):
    """Run every rank's exchanges in lockstep on copies: rank r's owned block is the full sum,
    and the owned blocks of all ranks tile the vector (a permutation of the blocks)."""
    length = 5 * size
    rng = np.random.default_rng(size)
    xs = [rng.integers(-50, 50, length).astype(np.float64) for _ in range(size)]
    bufs = [x.copy() for x in xs]
    plans = [fused_mean.reduce_scatter_steps(r, size, length) for r in range(size)]
    for step in range(len(plans[0])):
        sent = {(r, plans[r][step][0]): bufs[r][slice(*plans[r][step][1])].copy() for r in range(size)}
        for r in range(size):
            _, _, source, into = plans[r][step]
            bufs[r][slice(*into)] += sent[(source, r)]
    total = np.sum(xs, axis=0)
    q = length // size
    owned = [fused_mean.owned_block(r, size) for r in range(size)]
    assert sorted(owned) == list(range(size))
    for r, b in enumerate(owned):
        np.testing.assert_array_equal(bufs[r][b * q:(b + 1) * q], total[b * q:(b + 1) * q])


def test_power_of_two_owners_are_bit_reversed_ranks():
    assert [fused_mean.owned_block(r, 8) for r in range(8)] == [0, 4, 2, 6, 1, 5, 3, 7]
    assert [fused_mean.owned_block(r, 3) for r in range(3)] == [1, 2, 0]


@pytest.mark.parametrize("ranks", [3, 6])
def test_ring_under_mpiexec(ranks):
    """The MPI tests of the fused mean at rank counts that use the ring."""
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           "tests/mpi/test_fused_mean.py"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout
