"""The sharded loader, in one process: simulated ranks, remainder, resume, prefetch, augmentation.

Samples are numbered: ``x[i]`` holds the value ``i`` everywhere, so a batch tells which
samples it contains. (Multi-rank runs of the same properties: tests/mpi/test_loader.py.)
"""

import h5py
import numpy as np
import pytest

from ssdmpi.data import Augment, ShardedLoader, evaluation_shard, parse_augment
from ssdmpi.errors import UserError


def numbered(n, shape=(1, 2, 2)):
    x = np.broadcast_to(np.arange(n, dtype=np.float32).reshape((n,) + (1,) * len(shape)), (n,) + shape).copy()
    return x, np.arange(n, dtype=np.int64) % 10


def ids(xb):
    return xb.reshape(len(xb), -1)[:, 0].astype(np.int64)


def sequence(loader, steps):
    return [loader.next_batch() for _ in range(steps)]


def assert_same_sequence(a, b):
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_simulated_ranks_are_disjoint_and_cover_the_epoch_minus_the_remainder(world):
    n, batch = 103, 4
    x, y = numbered(n)
    loaders = [ShardedLoader(x, y, batch, r, world, seed=11) for r in range(world)]
    steps = n // (world * batch)
    assert all(ld.steps_per_epoch == steps for ld in loaders)
    assert loaders[0].dropped_per_epoch == n - steps * world * batch
    dropped = []
    for epoch in range(3):
        seen = np.concatenate([ids(ld.next_batch()[0]) for _ in range(steps) for ld in loaders])
        assert len(np.unique(seen)) == len(seen) == steps * world * batch        # disjoint
        perm = loaders[0].permutation(epoch)
        np.testing.assert_array_equal(np.sort(seen), np.sort(perm[:steps * world * batch]))   # covers
        dropped.append(set(perm[steps * world * batch:].tolist()))
        assert all(ld.epoch == epoch + 1 and ld.step_in_epoch == 0 for ld in loaders)   # rolled over
    if world * batch > 1 and n % (world * batch):
        assert len({frozenset(d) for d in dropped}) > 1   # a different remainder each epoch


@pytest.mark.parametrize("augment", [None, "crop1,flip"])
def test_union_over_ranks_is_the_single_process_batch_of_size_world_times_batch(augment):
    x, y = numbered(150, (2, 3, 3))
    x += np.random.default_rng(0).random(x.shape, dtype=np.float32)   # distinct pixels: augmentation shows
    world, batch = 4, 5
    ranks = [ShardedLoader(x, y, batch, r, world, seed=3, augment=augment) for r in range(world)]
    single = ShardedLoader(x, y, world * batch, 0, 1, seed=3, augment=augment)
    for _ in range(2 * single.steps_per_epoch + 1):   # into the third epoch
        xs, ys = zip(*(ld.next_batch() for ld in ranks))
        x1, y1 = single.next_batch()
        np.testing.assert_array_equal(np.concatenate(xs), x1)
        np.testing.assert_array_equal(np.concatenate(ys), y1)


def test_batches_are_float32_int64_copies_with_the_right_labels():
    x, y = numbered(40)
    xb, yb = ShardedLoader(x, y, 8, 0, 1, seed=0).next_batch()
    assert xb.dtype == np.float32 and yb.dtype == np.int64 and xb.shape == (8, 1, 2, 2)
    np.testing.assert_array_equal(yb, ids(xb) % 10)
    xb[:] = -1
    assert x.min() == 0   # the caller owns the batch


def test_seed_fixes_the_order_and_different_seeds_differ():
    x, y = numbered(64)
    a = sequence(ShardedLoader(x, y, 8, 0, 1, seed=5), 10)
    b = sequence(ShardedLoader(x, y, 8, 0, 1, seed=5), 10)
    c = sequence(ShardedLoader(x, y, 8, 0, 1, seed=6), 10)
    assert_same_sequence(a, b)
    assert not all(np.array_equal(p[0], q[0]) for p, q in zip(a, c))


@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("stop", [3, 7, 9])   # mid-epoch, at an epoch boundary (7 steps/epoch), next epoch
def test_restored_loader_yields_exactly_what_an_uninterrupted_one_would(tmp_path, prefetch, stop):
    x, y = numbered(60, (1, 4, 4))
    def make():
        return ShardedLoader(x, y, 4, 1, 2, seed=9, augment=Augment(pad=2, flip=True, seed=4), prefetch=prefetch)
    uninterrupted = sequence(make(), stop + 12)
    first = make()
    head = sequence(first, stop)
    # The state goes through HDF5 attributes, as a checkpoint stores it.
    with h5py.File(tmp_path / "state.h5", "w") as f:
        f.create_group("loader").attrs.update(first.state_dict())
    first.close()
    with h5py.File(tmp_path / "state.h5", "r") as f:
        state = dict(f["loader"].attrs)
    resumed = make()
    resumed.next_batch()   # it had moved on (and prefetched) before the restore
    resumed.load_state_dict(state)
    assert (resumed.epoch, resumed.step_in_epoch) == divmod(stop, 7)
    assert_same_sequence(head + sequence(resumed, 12), uninterrupted)
    resumed.close()


def test_prefetch_does_not_change_the_sequence():
    x, y = numbered(90, (3, 4, 4))
    with ShardedLoader(x, y, 6, 2, 3, seed=1, augment="crop2,flip", prefetch=True) as fast:
        a = sequence(fast, 17)
    b = sequence(ShardedLoader(x, y, 6, 2, 3, seed=1, augment="crop2,flip"), 17)
    assert_same_sequence(a, b)


def test_resume_with_the_same_global_batch_split_differently_is_accepted():
    x, y = numbered(64)
    saved = ShardedLoader(x, y, 8, 0, 4, seed=2)
    sequence(saved, 1)
    other = ShardedLoader(x, y, 16, 0, 2, seed=2)
    other.load_state_dict(saved.state_dict())
    assert (other.epoch, other.step_in_epoch) == (0, 1)


@pytest.mark.parametrize("change", ["seed", "batch", "data", "augment"])
def test_resume_into_a_different_sequence_is_refused(change):
    x, y = numbered(64)
    state = ShardedLoader(x, y, 8, 0, 2, seed=2).state_dict()
    kwargs = {"seed": 3} if change == "seed" else {}
    batch = 4 if change == "batch" else 8
    xx, yy = numbered(80) if change == "data" else (x, y)
    aug = "flip" if change == "augment" else None
    loader = ShardedLoader(xx, yy, batch, 0, 2, seed=kwargs.get("seed", 2), augment=aug)
    with pytest.raises(UserError, match="saved data-loader state"):
        loader.load_state_dict(state)


def test_too_few_samples_for_one_global_batch():
    x, y = numbered(15)
    with pytest.raises(UserError, match=r"15 training samples are fewer than one global batch \(4 ranks x batch 4"):
        ShardedLoader(x, y, 4, 0, 4, seed=0)
    with pytest.raises(UserError, match="rank 4 is not in 0..3"):
        ShardedLoader(x, y, 1, 4, 4, seed=0)


# ---------------------------------------------------------------------------- augmentation

def reference_augment(images, pad, flip, offsets, flips):
    """Straightforward per-sample pad (np.pad), crop and mirror: the oracle."""
    out = []
    h, w = images.shape[2:]
    for img, (u, v), f in zip(images, offsets, flips):
        dy, dx = min(int(u * (2 * pad + 1)), 2 * pad), min(int(v * (2 * pad + 1)), 2 * pad)
        padded = np.pad(img, ((0, 0), (pad, pad), (pad, pad)))
        crop = padded[:, dy:dy + h, dx:dx + w]
        out.append(crop[:, :, ::-1] if flip and f else crop)
    return np.stack(out)


@pytest.mark.parametrize("pad,flip", [(4, True), (2, False), (0, True)])
def test_augmentation_matches_the_per_sample_reference(pad, flip):
    images = np.random.default_rng(0).random((64, 3, 8, 8), dtype=np.float32)
    offsets, flips = Augment.draws(7, 1, 2, 64)
    got = Augment(pad=pad, flip=flip).apply(images, offsets, flips)
    np.testing.assert_array_equal(got, reference_augment(images, pad, flip, offsets, flips))
    if pad:   # every crop offset occurs, including the un-shifted one
        shifts = np.minimum((offsets * (2 * pad + 1)).astype(int), 2 * pad)
        assert set(shifts.ravel()) == set(range(2 * pad + 1))


def test_augmented_loader_batch_is_the_reference_augmentation_of_its_samples():
    x, y = numbered(48, (3, 5, 5))
    x += np.random.default_rng(1).random(x.shape, dtype=np.float32)
    loader = ShardedLoader(x, y, 4, 1, 3, seed=8, augment=Augment(pad=3, flip=True, seed=21))
    sequence(loader, 2)
    xb, _ = loader.next_batch()   # epoch 0, global step 2, rank 1
    offsets, flips = Augment.draws(21, 0, 2, 12)
    want = reference_augment(x[loader.indices(0, 2)], 3, True, offsets[4:8], flips[4:8])
    np.testing.assert_array_equal(xb, want)


@pytest.mark.parametrize("spec,want", [
    ("crop4,flip", Augment(4, True)), ("flip", Augment(0, True)), ("crop", Augment(4, False)),
    ("crop=2, flip", Augment(2, True)), ("none", None), ("", None), (None, None),
])
def test_augmentation_specs(spec, want):
    assert parse_augment(spec) == want
    if want is not None:
        assert parse_augment(want.spec()) == want


@pytest.mark.parametrize("spec", ["rotate", "cropx", "crop-2"])
def test_bad_augmentation_spec_is_a_user_error(spec):
    with pytest.raises(UserError, match="augmentation"):
        parse_augment(spec)


def test_augmentation_needs_images():
    with pytest.raises(UserError, match=r"needs images \(N, C, H, W\)"):
        ShardedLoader(np.zeros((10, 4), np.float32), np.zeros(10, np.int64), 2, 0, 1, seed=0, augment="flip")


# ---------------------------------------------------------------------------- evaluation sharding

@pytest.mark.parametrize("n", [0, 1, 3, 10, 101])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
def test_evaluation_shards_count_every_sample_once(n, world):
    parts = [np.arange(n)[evaluation_shard(n, r, world)] for r in range(world)]
    np.testing.assert_array_equal(np.concatenate(parts), np.arange(n))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
