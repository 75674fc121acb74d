"""Text windows on real MPI ranks (run at 1, 2 and 4 ranks by tests/run.py).

Every rank builds its loader of windows with its own rank; the ranks compare what they got with
allgather. The stream is numbered (token ``i`` is ``i``), so a window names its positions.
"""

import numpy as np
import pytest

from ssdmpi.data import evaluation_shard, load_dataset
from ssdmpi.data.text import from_tokens

T = 11


def numbered(n_train, n_val=0):
    return from_tokens("numbered", np.arange(n_train), np.arange(n_val), vocab_size=65536)


@pytest.mark.parametrize("batch", [1, 6])
def test_windows_are_disjoint_across_ranks_and_steps(comm, batch):
    rank, world = comm.Get_rank(), comm.Get_size()
    ds = numbered(3001)
    loader = ds.loader(T, batch, rank, world, seed=17, prefetch=True)
    steps = loader.steps_per_epoch
    assert steps == ((3001 + 1) // (T + 1) - 1) // (world * batch)
    for _ in range(2):
        xs, ys = zip(*(loader.next_batch() for _ in range(steps)))
        x, y = np.concatenate(xs), np.concatenate(ys)
        np.testing.assert_array_equal(y, x + 1)                         # y is x shifted by one
        np.testing.assert_array_equal(x, x[:, :1] + np.arange(T))       # consecutive tokens
        covered = np.concatenate(comm.allgather(np.concatenate([x, y[:, -1:]], axis=1).ravel()))
        assert len(np.unique(covered)) == len(covered) == steps * world * batch * (T + 1)   # disjoint
    loader.close()


def test_union_of_the_ranks_batches_is_the_single_process_batch(comm):
    rank, world = comm.Get_rank(), comm.Get_size()
    ds = load_dataset("devils-dictionary")
    mine = ds.loader(64, 3, rank, world, seed=4)
    single = ds.loader(64, 3 * world, 0, 1, seed=4)
    for _ in range(single.steps_per_epoch + 2):   # across an epoch boundary
        xb, yb = mine.next_batch()
        x1, y1 = single.next_batch()
        np.testing.assert_array_equal(np.concatenate(comm.allgather(xb)), x1)
        np.testing.assert_array_equal(np.concatenate(comm.allgather(yb)), y1)


def test_resume_mid_epoch_is_bitwise(comm, tmp_path):
    import h5py

    rank, world = comm.Get_rank(), comm.Get_size()
    ds = numbered(4000)
    def make():
        return ds.loader(T, 5, rank, world, seed=23, prefetch=True)
    steps = make().steps_per_epoch
    stop = steps + steps // 2 + 1   # the middle of the second epoch
    uninterrupted = make()
    want = [uninterrupted.next_batch() for _ in range(stop + steps)]
    first = make()
    got = [first.next_batch() for _ in range(stop)]
    with h5py.File(tmp_path / f"loader{rank}.h5", "w") as f:   # as a checkpoint would store it
        f.attrs.update(first.state_dict())
    first.close()
    resumed = make()
    with h5py.File(tmp_path / f"loader{rank}.h5", "r") as f:
        resumed.load_state_dict(dict(f.attrs))
    assert resumed.epoch == 1 and 0 < resumed.step_in_epoch < steps
    got += [resumed.next_batch() for _ in range(steps)]
    for (xa, ya), (xb, yb) in zip(got, want):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    assert len(set(comm.allgather((resumed.epoch, resumed.step_in_epoch)))) == 1
    resumed.close()
    uninterrupted.close()


def test_resize_from_one_rank_and_back_keeps_the_global_batches(comm):
    rank, world = comm.Get_rank(), comm.Get_size()
    ds = numbered(5000)
    G = 4 * world
    single = ds.loader(T, G, 0, 1, seed=8)      # every rank computes the 1-rank sequence
    steps = single.steps_per_epoch
    want = [single.next_batch()[0] for _ in range(2 * steps)]
    before = ds.loader(T, G, 0, 1, seed=8)       # 1 rank -> world ranks, mid-epoch
    for _ in range(steps // 3):
        before.next_batch()
    mine = ds.loader(T, 4, rank, world, seed=8)
    mine.load_state_dict(before.state_dict())
    got = [np.concatenate(comm.allgather(mine.next_batch()[0])) for _ in range(steps - steps // 3 + 2)]
    for a, b in zip(got, want[steps // 3:]):
        np.testing.assert_array_equal(a, b)
    after = ds.loader(T, G, 0, 1, seed=8)        # world ranks -> 1 rank
    after.load_state_dict(mine.state_dict())
    for t in range(steps + 2, 2 * steps):
        np.testing.assert_array_equal(after.next_batch()[0], want[t])


def test_validation_windows_are_the_same_on_every_rank_and_shard_once(comm):
    rank, world = comm.Get_rank(), comm.Get_size()
    ds = numbered(100, 2000)
    x, y = ds.val_windows(T, max_windows=50)
    assert len(set(comm.allgather(x.tobytes() + y.tobytes()))) == 1
    part = evaluation_shard(len(x), rank, world)
    tokens = comm.allreduce(y[part].size)
    assert tokens == 50 * T                                  # the denominator: val windows x context
    assert comm.allreduce(int(y[part].sum())) == int(y.sum())
