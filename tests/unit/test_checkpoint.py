"""HDF5 checkpoints: round trips, atomic writes, checksums that catch damage, resume selection."""

import os

import h5py
import numpy as np
import pytest

from ssdmpi import checkpoint
from ssdmpi.comm import trees
from ssdmpi.errors import UserError


def state_of(rank: int) -> dict:
    rng = np.random.default_rng(rank)
    return {
        "algo": {"algo": "ssd", "t": 27, "s": 26, "stage": "delay",
                 "W": rng.standard_normal(1000).astype(np.float32),
                 "L": rng.standard_normal(1000).astype(np.float32),
                 "local": {"P": rng.standard_normal(1000).astype(np.float32)},
                 "lr": np.float32(0.1), "count": np.int64(3), "none": None},
        "model": {"params": rng.standard_normal(1000).astype(np.float32), "buffers": {}},
        "loader": {"epoch": 1, "step_in_epoch": 5, "seed": 0},
        "rng": {"bit_generator": "PCG64", "state": {"state": 2 ** 120 + 7, "inc": 2 ** 100 + 1}},
        "history": [np.arange(3, dtype=np.float64), {"a": 1}],
        "plain_list": [1, 2.5, "x"],
    }


def write(directory, step, world_size=2, meta=None):
    path = os.path.join(directory, checkpoint.checkpoint_name(step))
    base = {"world_size": world_size, "step": step, "epoch": step / 10, "stage": "delay", "model": "mlp",
            "num_params": 1000, "algo": "ssd", "config": {"model": "mlp", "lr": 0.1}}
    base.update(meta or {})
    shared = {"model": {"global_weights": state_of(0)["algo"]["W"], "buffers": {}}}
    return checkpoint.write_checkpoint(path, base, ((r, state_of(r)) for r in range(world_size)), shared)


def assert_same(a, b):
    if isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, (np.ndarray, np.generic)):
        assert type(a) is type(b) and a.dtype == b.dtype and np.array_equal(a, b)
    else:
        assert a == b and type(a) is type(b)


def test_round_trip_is_exact_including_scalar_dtypes_and_big_ints(tmp_path):
    path = write(tmp_path, 10)
    for rank in (0, 1):
        assert_same(state_of(rank), checkpoint.read_rank_state(path, rank))
    assert checkpoint.verify(path) == []
    meta = checkpoint.read_meta(path)
    assert meta["step"] == 10 and meta["world_size"] == 2 and meta["format_version"] == checkpoint.FORMAT_VERSION


def test_layout_is_readable_with_plain_h5py(tmp_path):
    path = write(tmp_path, 10)
    with h5py.File(path, "r") as f:
        assert f.attrs["format"] == "ssdmpi-checkpoint" and f.attrs["world_size"] == 2 and f.attrs["step"] == 10
        W = f["model/global_weights"]
        assert W.dtype == np.float32 and W.shape == (1000,) and len(W.attrs["sha256"]) == 64
        assert np.array_equal(f["rank_0001/algo/L"][()], state_of(1)["algo"]["L"])
        assert '"stage": "delay"' in f["rank_0000/algo/_values"].asstr()[()]


def test_write_is_atomic_and_leaves_no_temporary_files(tmp_path):
    path = write(tmp_path, 10)
    inode = os.stat(path).st_ino
    write(tmp_path, 10, meta={"reason": "again"})      # same name: replaced by a rename, never rewritten
    assert os.stat(path).st_ino != inode
    assert sorted(os.listdir(tmp_path)) == ["ckpt-00000010.h5"]


def test_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    path = write(tmp_path, 10)
    before = open(path, "rb").read()

    def broken_states():
        yield 0, state_of(0)
        raise RuntimeError("rank 1 vanished")

    with pytest.raises(RuntimeError):
        checkpoint.write_checkpoint(path, {"world_size": 2, "step": 10}, broken_states())
    assert open(path, "rb").read() == before
    assert sorted(os.listdir(tmp_path)) == ["ckpt-00000010.h5"]


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


def data_offset(path, name):
    with h5py.File(path, "r") as f:
        return f[name].id.get_offset()


@pytest.mark.parametrize("name", ["rank_0001/algo/L", "model/global_weights", "rank_0000/loader/_values"])
def test_flipped_byte_in_any_dataset_is_detected(tmp_path, name):
    path = write(tmp_path, 10)
    offset = data_offset(path, name)
    if name.endswith("_values"):   # a variable-length string: flip inside its heap instead
        with h5py.File(path, "r") as f:
            text = f[name].asstr()[()].encode()
        offset = open(path, "rb").read().index(text) + 3
    flip_byte(path, offset + 5)
    problems = checkpoint.verify(path)
    assert problems and ("checksum mismatch" in problems[0] or "unreadable" in problems[0]), problems


def test_flipped_byte_in_meta_is_detected(tmp_path):
    path = write(tmp_path, 10)
    text = open(path, "rb").read()
    flip_byte(path, text.index(b'"world_size"') + 2)
    assert checkpoint.verify(path)


def test_truncated_file_is_detected(tmp_path):
    path = write(tmp_path, 10)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    problems = checkpoint.verify(path)
    assert problems and "unreadable" in problems[0]


def test_resume_selection_skips_corrupt_checkpoints_with_a_warning(tmp_path):
    good = write(tmp_path, 10)
    truncated = write(tmp_path, 20)
    flipped = write(tmp_path, 30)
    with open(truncated, "r+b") as f:
        f.truncate(os.path.getsize(truncated) - 100)
    flip_byte(flipped, data_offset(flipped, "rank_0000/algo/W") + 17)
    warnings = []
    assert checkpoint.select_resume(tmp_path, warn=warnings.append) == good
    assert len(warnings) == 2
    assert "ckpt-00000030.h5" in warnings[0] and "checksum mismatch" in warnings[0]
    assert "ckpt-00000020.h5" in warnings[1]


def test_resume_selection_with_no_checkpoints_and_with_only_corrupt_ones(tmp_path):
    assert checkpoint.select_resume(tmp_path / "none") is None
    bad = write(tmp_path, 10)
    with open(bad, "r+b") as f:
        f.truncate(100)
    with pytest.raises(checkpoint.CheckpointError, match="none of the 1 checkpoints .* verifies"):
        checkpoint.select_resume(tmp_path)


def test_retain_keeps_the_newest(tmp_path):
    for step in (5, 10, 15, 20):
        write(tmp_path, step)
    deleted = checkpoint.retain(tmp_path, 2)
    assert [os.path.basename(p) for p in deleted] == ["ckpt-00000005.h5", "ckpt-00000010.h5"]
    assert [s for s, _ in checkpoint.list_checkpoints(tmp_path)] == [15, 20]
    assert checkpoint.retain(tmp_path, 0) == []


def test_compatibility_checks_are_one_line_errors(tmp_path):
    meta = checkpoint.read_meta(write(tmp_path, 10))
    checkpoint.check_compatible(meta, 2, "mlp", 1000)
    with pytest.raises(UserError, match="written by 2 ranks but this job has 4; resume with mpiexec -n 2"):
        checkpoint.check_compatible(meta, 4, "mlp")
    with pytest.raises(UserError, match="holds model 'mlp', not 'lenet5'"):
        checkpoint.check_compatible(meta, 2, "lenet5")
    with pytest.raises(UserError, match="has 1000 parameters but this one has 50"):
        checkpoint.check_compatible(meta, 2, "mlp", 50)


def test_not_a_checkpoint(tmp_path):
    path = tmp_path / "ckpt-00000001.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.zeros(3)
    with pytest.raises(UserError, match="not an ssdmpi checkpoint"):
        checkpoint.read_meta(str(path))
    with pytest.raises(UserError, match="does not exist"):
        checkpoint.resolve_path(str(tmp_path / "missing.h5"))


def test_describe_lists_what_is_inside(tmp_path):
    text = checkpoint.describe(write(tmp_path, 10))
    assert "step 10" in text and "world size 2" in text and "model mlp" in text
    assert "/rank_0001/algo/L  float32 (1000,)" in text


def test_split_and_join_keep_arrays_in_order():
    arrays = []
    tree = state_of(3)
    skeleton = trees.split(tree, arrays)
    assert [p["__array__"] for p in trees.placeholders(skeleton)] == list(range(len(arrays)))
    assert_same(tree | {"history": list(tree["history"])}, trees.join(skeleton, arrays))


def test_arrays_equal_across_ranks_are_stored_once_as_links(tmp_path):
    W = np.linspace(0, 1, 5000, dtype=np.float32)

    def states():
        for rank in range(4):
            yield rank, {"algo": {"W": W.copy(), "L": W + rank}, "model": {"params": W + rank}}

    path = checkpoint.write_checkpoint(str(tmp_path / "ckpt-00000001.h5"), {"world_size": 4, "step": 1}, states(),
                                       {"model": {"global_weights": W}})
    with h5py.File(path, "r") as f:
        assert isinstance(f.get("rank_0003/algo/W", getlink=True), h5py.SoftLink)
        assert isinstance(f.get("rank_0002/model/params", getlink=True), h5py.SoftLink)   # = its L
        assert isinstance(f.get("rank_0001/algo/L", getlink=True), h5py.HardLink)
        assert np.array_equal(f["model/global_weights"][()], W)
    for rank in range(4):
        state = checkpoint.read_rank_state(path, rank)
        assert np.array_equal(state["algo"]["W"], W) and np.array_equal(state["model"]["params"], W + rank)
    assert checkpoint.verify(path) == []
    assert os.path.getsize(path) < 6 * W.nbytes      # W once, four L: not 12 copies
    assert "-> /rank_0000/algo/W" in checkpoint.describe(path)
