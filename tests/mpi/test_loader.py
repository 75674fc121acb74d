"""The sharded loader on real MPI ranks (run at 1, 2 and 4 ranks by tests/run.py).

Every rank builds its loader with its own rank; the ranks then compare what they got
with allgather. ``x[i]`` holds the value ``i``, so a batch names its samples.
"""

import numpy as np
import pytest

from ssdmpi.data import ShardedLoader, evaluation_shard, load_dataset

N = 203   # not a multiple of any global batch below: there is always a remainder


def numbered(n, shape=(3, 4, 4)):
    x = np.broadcast_to(np.arange(n, dtype=np.float32).reshape(n, 1, 1, 1), (n,) + shape).copy()
    return x, np.arange(n, dtype=np.int64) % 10


def ids(xb):
    return xb.reshape(len(xb), -1)[:, 0].astype(np.int64)


@pytest.mark.parametrize("batch", [1, 8])
def test_shards_are_disjoint_and_cover_the_epoch(comm, batch):
    rank, world = comm.Get_rank(), comm.Get_size()
    x, y = numbered(N)
    loader = ShardedLoader(x, y, batch, rank, world, seed=17, prefetch=True)
    steps = N // (world * batch)
    assert loader.steps_per_epoch == steps
    for epoch in range(2):
        mine = np.concatenate([ids(loader.next_batch()[0]) for _ in range(steps)])
        everyone = np.concatenate(comm.allgather(mine))
        assert len(np.unique(everyone)) == len(everyone) == steps * world * batch   # disjoint
        perm = loader.permutation(epoch)
        np.testing.assert_array_equal(np.sort(everyone), np.sort(perm[:steps * world * batch]))   # covers
        assert len(perm) - len(everyone) == loader.dropped_per_epoch < world * batch   # the remainder
    loader.close()


def test_union_of_the_ranks_batches_is_the_single_process_batch(comm):
    rank, world = comm.Get_rank(), comm.Get_size()
    x, y = numbered(N)
    x += np.random.default_rng(0).random(x.shape, dtype=np.float32)   # distinct pixels: augmentation shows
    mine = ShardedLoader(x, y, 6, rank, world, seed=4, augment="crop2,flip")
    single = ShardedLoader(x, y, 6 * world, 0, 1, seed=4, augment="crop2,flip")
    for _ in range(single.steps_per_epoch + 2):   # across an epoch boundary
        xb, yb = mine.next_batch()
        gathered_x, gathered_y = comm.allgather(xb), comm.allgather(yb)
        x1, y1 = single.next_batch()
        np.testing.assert_array_equal(np.concatenate(gathered_x), x1)
        np.testing.assert_array_equal(np.concatenate(gathered_y), y1)


def test_sequence_is_identical_across_save_and_restore_mid_epoch(comm, tmp_path):
    import h5py

    rank, world = comm.Get_rank(), comm.Get_size()
    x, y = numbered(N)
    def make():
        return ShardedLoader(x, y, 5, rank, world, seed=23, augment="crop4,flip", prefetch=True)
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
    # and every rank resumed at the same position
    assert len(set(comm.allgather((resumed.epoch, resumed.step_in_epoch)))) == 1
    resumed.close()
    uninterrupted.close()


def test_evaluation_shards_count_the_test_set_once(comm):
    rank, world = comm.Get_rank(), comm.Get_size()
    ds = load_dataset("digits")
    part = evaluation_shard(ds.num_test, rank, world)
    assert comm.allreduce(len(ds.test_y[part])) == ds.num_test
    assert comm.allreduce(int(ds.test_y[part].sum())) == int(ds.test_y.sum())


def test_every_rank_loads_the_same_dataset(comm):
    ds = load_dataset("synthetic", num_train=256, num_test=64, input_shape=(1, 6, 6), seed=2)
    import hashlib
    digest = hashlib.sha256(ds.train_x.tobytes() + ds.test_y.tobytes()).hexdigest()   # hash() differs per process
    assert len(set(comm.allgather(digest))) == 1
