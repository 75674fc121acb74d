"""Text data: the windows the loader draws, validation windows, the corpora, 'ssdmpi data convert text'.

Most tests use a *numbered* stream: token ``i`` holds the value ``i`` (uint16, vocab 65536), so
a window tells exactly which positions of the stream it covers. (Multi-rank runs of the loader's
properties: tests/mpi/test_text_loader.py.)
"""

import gzip
import hashlib
import json
import os

import h5py
import numpy as np
import pytest

from ssdmpi.data import ShardedLoader, corpora, datasets, load_dataset
from ssdmpi.data.text import TextDataset, decode, encode, from_tokens, windows_per_epoch
from ssdmpi.errors import UserError
from tests.conftest import run_cli

DEVIL_FILE = os.path.join(os.path.dirname(datasets.__file__), "devil.dict.dz")
# zcat devil.dict.dz | sha256sum
DEVIL_TEXT_SHA256 = "703d1225d2fb927653bfd8b00e4e96938e0b630c6023edd26702ac6ed50383f8"
# bible -f gen1:1-rev22:21 | sed -E 's/^[^ ]+ //' | sha256sum  (Debian's bible-kjv 4.38)
KJV_TEXT_SHA256 = "b5c4940bcfeee072c0935b5200d0f9d88a00a0199cb0961d16133458fcdfae5d"


def numbered(n_train, n_val=0):
    """A TextDataset whose token at position i of each split is i."""
    return from_tokens("numbered", np.arange(n_train), np.arange(n_val), vocab_size=65536)


def epoch_windows(ds, context, batch, world, seed, epochs=1):
    """Per epoch, the x windows every simulated rank got, in step order then rank order."""
    loaders = [ds.loader(context, batch, r, world, seed) for r in range(world)]
    steps = loaders[0].steps_per_epoch
    return [np.concatenate([ld.next_batch()[0] for _ in range(steps) for ld in loaders]) for _ in range(epochs)]


def sequence(loader, steps):
    return [loader.next_batch() for _ in range(steps)]


def assert_same_sequence(a, b):
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)


# ---------------------------------------------------------------------------- training windows

def test_a_window_is_context_plus_one_consecutive_tokens_and_y_is_x_shifted_by_one():
    ds = numbered(1000)
    xb, yb = ds.loader(16, 8, 0, 1, seed=3).next_batch()
    assert xb.shape == yb.shape == (8, 16) and xb.dtype == yb.dtype == np.int64
    starts = xb[:, :1]
    np.testing.assert_array_equal(xb, starts + np.arange(16))        # consecutive stream positions
    np.testing.assert_array_equal(yb, starts + 1 + np.arange(16))    # the next token of each
    xb[:] = -1
    assert ds.train_tokens.min() == 0   # the caller owns the batch


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_windows_are_disjoint_across_ranks_and_steps_and_start_at_the_epochs_offset(world):
    N, T, B = 2000, 12, 5
    ds = numbered(N)
    L = T + 1
    n = (N + 1) // L - 1                    # the documented count, stated independently
    assert windows_per_epoch(N, T) == n == len(ds.train_windows(T)[0])
    phases = []
    for x in epoch_windows(ds, T, B, world, seed=7, epochs=4):
        steps = n // (world * B)
        assert len(x) == steps * world * B
        covered = np.concatenate([x, x[:, -1:] + 1], axis=1).ravel()   # each window's T+1 positions
        assert len(np.unique(covered)) == len(covered)                 # disjoint
        phase = int(x[:, 0].min() % L)
        assert np.all(x[:, 0] % L == phase)                             # one grid of windows per epoch
        assert 0 <= x[:, 0].min() and x[:, 0].max() + L <= N
        phases.append(phase)
    assert len(set(phases)) > 1   # windows do not start at the same multiples of L every epoch


def test_an_epoch_uses_every_window_but_the_remainder():
    N, T, B, world = 3001, 10, 7, 3
    ds = numbered(N)
    n = windows_per_epoch(N, T)
    x_all = ds.loader(T, n, 0, 1, seed=1).next_batch()[0]   # one step of all n windows
    starts = np.sort(x_all[:, 0])
    np.testing.assert_array_equal(np.diff(starts), np.full(n - 1, T + 1))   # back to back, no gap
    x = epoch_windows(ds, T, B, world, seed=1)[0]
    assert set(x[:, 0].tolist()) <= set(starts.tolist())
    assert n - len(x) == n % (world * B) == ds.loader(T, B, 0, world, seed=1).dropped_per_epoch


def test_the_same_seed_gives_the_same_windows_and_another_seed_others():
    ds = load_dataset("devils-dictionary")
    a = sequence(ds.loader(64, 4, 1, 2, seed=5), 30)
    b = sequence(ds.loader(64, 4, 1, 2, seed=5), 30)
    c = sequence(ds.loader(64, 4, 1, 2, seed=6), 30)
    assert_same_sequence(a, b)
    assert not any(np.array_equal(p[0], q[0]) for p, q in zip(a, c))


def test_the_union_over_ranks_is_the_single_process_batch():
    ds = numbered(1500)
    world, B, T = 4, 3, 9
    ranks = [ds.loader(T, B, r, world, seed=2) for r in range(world)]
    single = ds.loader(T, world * B, 0, 1, seed=2)
    for _ in range(2 * single.steps_per_epoch + 3):   # across two epoch boundaries
        xs, ys = zip(*(ld.next_batch() for ld in ranks))
        x1, y1 = single.next_batch()
        np.testing.assert_array_equal(np.concatenate(xs), x1)
        np.testing.assert_array_equal(np.concatenate(ys), y1)


@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("stop", [4, 11, 15])   # mid-epoch, at the boundary (11 steps/epoch), in the next
def test_a_restored_loader_continues_bitwise(tmp_path, prefetch, stop):
    ds = numbered(1200)
    def make():
        return ds.loader(12, 4, 1, 2, seed=9, prefetch=prefetch)
    assert make().steps_per_epoch == 11
    uninterrupted = sequence(make(), stop + 14)
    first = make()
    head = sequence(first, stop)
    with h5py.File(tmp_path / "state.h5", "w") as f:   # as a checkpoint stores it
        f.create_group("loader").attrs.update(first.state_dict())
    first.close()
    with h5py.File(tmp_path / "state.h5", "r") as f:
        state = dict(f["loader"].attrs)
    resumed = make()
    resumed.next_batch()   # it had moved on (and prefetched) before the restore
    resumed.load_state_dict(state)
    assert (resumed.epoch, resumed.step_in_epoch) == divmod(stop, 11)
    assert_same_sequence(head + sequence(resumed, 14), uninterrupted)
    resumed.close()


@pytest.mark.parametrize("old, new", [(4, 2), (2, 4), (4, 1), (1, 3)])
def test_a_resize_continues_the_epoch_with_the_same_global_batches(old, new):
    ds = numbered(2500)
    G, T = 12, 7                         # the global batch stays; its split over the ranks changes
    def global_batches(loaders, steps):
        return [tuple(np.concatenate(part) for part in zip(*(ld.next_batch() for ld in loaders)))
                for _ in range(steps)]
    single = ds.loader(T, G, 0, 1, seed=4)
    steps = single.steps_per_epoch
    want = global_batches([single], 2 * steps)
    before = [ds.loader(T, G // old, r, old, seed=4) for r in range(old)]
    got = global_batches(before, steps // 2)
    state = before[0].state_dict()
    after = [ds.loader(T, G // new, r, new, seed=4) for r in range(new)]
    for ld in after:
        ld.load_state_dict(state)
    got += global_batches(after, 2 * steps - steps // 2)
    assert_same_sequence(got, want)
    seen = np.concatenate([x for x, _ in got[:steps]])[:, 0]
    assert len(np.unique(seen)) == len(seen)   # the resized epoch: no window dropped or repeated


def test_a_resume_with_another_context_is_refused_when_the_window_count_differs():
    ds = numbered(1000)
    state = ds.loader(10, 4, 0, 1, seed=0).state_dict()
    with pytest.raises(UserError, match="saved data-loader state has num_samples"):
        ds.loader(20, 4, 0, 1, seed=0).load_state_dict(state)


def test_the_reference_simulators_loader_list_is_built_the_same_way():
    ds = numbered(900)
    x, y = ds.train_windows(8)
    by_hand = [ShardedLoader(x, y, 4, r, 3, seed=1) for r in range(3)]
    by_method = [ds.loader(8, 4, r, 3, seed=1) for r in range(3)]
    for a, b in zip(by_hand, by_method):
        assert_same_sequence(sequence(a, 12), sequence(b, 12))


def test_too_short_a_stream_or_a_bad_context_is_a_user_error():
    with pytest.raises(UserError, match="fewer than one window of 11"):
        numbered(10).loader(10, 1, 0, 1, seed=0)
    assert numbered(11).loader(10, 1, 0, 1, seed=0).steps_per_epoch == 1   # exactly one window
    with pytest.raises(UserError, match="fewer than one global batch"):
        numbered(100).loader(10, 16, 0, 1, seed=0)
    for bad in (0, -3, 2.5, "64"):
        with pytest.raises(UserError, match="context length must be a positive integer"):
            numbered(100).loader(bad, 1, 0, 1, seed=0)


# ---------------------------------------------------------------------------- validation windows

def test_validation_windows_are_fixed_consecutive_and_predict_each_token_once():
    ds = numbered(50, 1000)
    T = 16
    x, y = ds.val_windows(T)
    K = (1000 - 1) // T
    assert x.shape == y.shape == (K, T) and x.dtype == y.dtype == np.int64
    np.testing.assert_array_equal(x, np.arange(K * T).reshape(K, T))
    np.testing.assert_array_equal(y, x + 1)
    assert len(np.unique(y)) == y.size   # every target once
    again = ds.val_windows(T)
    np.testing.assert_array_equal(again[0], x)


def test_at_most_max_windows_evenly_spread():
    ds = numbered(50, 1000)
    x, y = ds.val_windows(10, max_windows=7)
    K = 99
    np.testing.assert_array_equal(x[:, 0], [(i * K // 7) * 10 for i in range(7)])
    np.testing.assert_array_equal(y, x + 1)
    assert ds.val_windows(10, max_windows=500)[0].shape == (K, 10)   # more than there are: all of them
    with pytest.raises(UserError, match="validation windows must be >= 1"):
        ds.val_windows(10, max_windows=0)


def test_a_val_split_shorter_than_a_window_gives_none():
    ds = numbered(50, 10)
    assert ds.num_val_windows(10) == 0
    x, y = ds.val_windows(10)
    assert x.shape == y.shape == (0, 10)
    assert ds.val_windows(9)[0].shape == (1, 9)


# ---------------------------------------------------------------------------- datasets and corpora

def test_the_built_in_corpus_is_the_shipped_file_split_ninety_ten():
    with gzip.open(DEVIL_FILE) as f:    # read here with the standard library alone
        text = f.read()
    assert len(text) == 383_656 and hashlib.sha256(text).hexdigest() == DEVIL_TEXT_SHA256
    ds = load_dataset("devils-dictionary")
    assert isinstance(ds, TextDataset) and ds.kind == "text" and ds.vocab_size == 256
    assert ds.num_val_tokens == round(0.1 * len(text)) and ds.num_train_tokens + ds.num_val_tokens == len(text)
    assert bytes(ds.train_tokens) + bytes(ds.val_tokens) == text
    assert "public domain" in ds.licence and "Bierce" in ds.description
    assert ds.summary().startswith("devils-dictionary: 345,290 train / 38,366 val tokens")
    assert load_dataset("devil") is ds   # an alias, and cached
    assert not ds.train_tokens.flags.writeable


def test_the_built_in_corpus_ships_with_its_licence():
    here = os.path.dirname(DEVIL_FILE)
    with open(os.path.join(here, "devil.LICENSE.txt"), encoding="utf-8") as f:
        notice = f.read()
    with open(DEVIL_FILE, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() in notice
    assert "public domain" in notice.lower() and DEVIL_TEXT_SHA256 in notice


def kjv_source():
    """The KJV's file, or why there is none to read."""
    try:
        path = datasets.locate("kjv")
    except UserError as exc:
        return str(exc)
    if corpora.is_bible_data(path) and corpora.bible_program() is None:
        return f"{path} is there but not Debian's bible program that reads it (apt-get install bible-kjv)"
    return path


@pytest.mark.skipif(not os.path.isfile(kjv_source()), reason=f"the KJV is not installed: {kjv_source()}")
def test_the_king_james_bible():
    datasets.clear_cache()
    ds = load_dataset("kjv")
    text = bytes(ds.train_tokens) + bytes(ds.val_tokens)
    if ds.source == "/usr/lib/bible.data":   # Debian's: the text its bible program prints, references dropped
        assert hashlib.sha256(text).hexdigest() == KJV_TEXT_SHA256
        assert text.count(b"\n") == 31_102 and text.startswith(b"In the beginning God created the heaven")
    assert len(text) > 1_000_000 and ds.num_val_tokens == round(0.1 * len(text))
    assert "public domain" in ds.licence


def test_kjv_when_missing_says_where_it_looked_and_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SSDMPI_DATA", str(tmp_path))
    monkeypatch.setattr(datasets, "BIBLE_DATA", str(tmp_path / "no-bible.data"))
    with pytest.raises(UserError) as info:
        load_dataset("kjv")
    message = str(info.value)
    assert str(tmp_path / "kjv" / "kjv.txt") in message and "apt-get install bible-kjv" in message
    (tmp_path / "kjv").mkdir()
    verses = "In the beginning God created the heaven and the earth.\n" * 40
    (tmp_path / "kjv" / "kjv.txt").write_text(verses)
    ds = load_dataset("kjv")
    assert ds.source == str(tmp_path / "kjv" / "kjv.txt")
    assert bytes(ds.train_tokens) + bytes(ds.val_tokens) == verses.encode()


def test_debians_bible_data_without_its_program_says_what_to_install(tmp_path, monkeypatch):
    fake = tmp_path / "bible.data"
    fake.write_bytes(b"EC02Compressed Data File" + bytes(100))
    monkeypatch.setattr(corpora, "bible_program", lambda: None)
    with pytest.raises(UserError, match="apt-get install bible-kjv"):
        load_dataset("kjv", str(tmp_path))


@pytest.mark.skipif(corpora.bible_program() is None, reason="Debian's bible program (bible-kjv) is not installed")
def test_a_broken_bible_data_file_is_a_one_line_error(tmp_path):
    fake = tmp_path / "bible.data"
    fake.write_bytes(b"EC02Compressed Data File" + bytes(100))
    with pytest.raises(UserError, match="not the 31,102 of the whole Bible"):
        load_dataset("kjv", str(fake))


def test_dataset_kinds_and_that_image_consumers_get_a_one_line_error():
    assert datasets.dataset_kind("kjv") == datasets.dataset_kind("text") == "text"
    assert datasets.dataset_kind("digits") == "classification" and load_dataset("digits").kind == "classification"
    ds = load_dataset("devils-dictionary")
    with pytest.raises(UserError, match="is text"):
        _ = ds.input_shape
    with pytest.raises(UserError, match="is text"):
        datasets.load_raw("devils-dictionary")
    with pytest.raises(UserError, match="takes no path"):
        load_dataset("devils-dictionary", "/tmp")
    with pytest.raises(UserError, match="needs a path"):
        load_dataset("text")


def test_encode_and_decode_are_utf8_bytes():
    tokens = encode("naïve café")
    assert tokens.dtype == np.uint8 and bytes(tokens) == b"na\xc3\xafve caf\xc3\xa9"
    assert decode(tokens) == "naïve café"
    assert decode(tokens[:3]) == "na\ufffd"   # half a character


def test_tokens_outside_the_vocabulary_are_refused():
    with pytest.raises(UserError, match=r"outside \[0, 256\)"):
        from_tokens("t", np.array([1, 300]), np.array([], np.int64))
    with pytest.raises(UserError, match="train split is empty"):
        from_tokens("t", np.array([], np.uint8), np.array([1], np.uint8))


# ---------------------------------------------------------------------------- convert, list

def write(path, text):
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return str(path)


def test_convert_text_round_trip(tmp_path):
    a = write(tmp_path / "a.txt", "Ἐν ἀρχῇ ἦν ὁ λόγος.\n" * 30)
    b = write(tmp_path / "b.txt", "It was the best of times, it was the worst of times.\n" * 20)
    out = tmp_path / "corpus.h5"
    result = run_cli(["data", "convert", "text", a, b, "--out", str(out), "--val-fraction", "0.25",
                      "--separator", r"\n\x1e\n", "--context", "32", "--licence", "public domain",
                      "--description", "two openings"])
    assert result.returncode == 0, result.stderr
    joined = open(a, "rb").read() + b"\n\x1e\n" + open(b, "rb").read()
    cut = len(joined) - round(0.25 * len(joined))
    while joined[cut] & 0xC0 == 0x80:      # the cut moves past a character's continuation bytes
        cut += 1
    with h5py.File(out, "r") as f:
        assert bytes(f["train_tokens"][...]) == joined[:cut] and bytes(f["val_tokens"][...]) == joined[cut:]
        assert f["train_tokens"].dtype == np.uint8
        attrs = dict(f.attrs)
    assert attrs["format"] == "ssdmpi-text" and attrs["vocab_size"] == 256 and attrs["tokenizer"] == "bytes"
    assert attrs["name"] == "corpus" and attrs["licence"] == "public domain" and attrs["description"] == "two openings"
    datasets.clear_cache()
    ds = load_dataset("text", str(out))
    assert bytes(ds.train_tokens) + bytes(ds.val_tokens) == joined and ds.licence == "public domain"
    assert ds.name == "text" and str(out) in ds.source and "corpus" in ds.source
    assert ds.loader(32, 2, 0, 1, seed=0).next_batch()[0].shape == (2, 32)


def test_convert_a_named_corpus_then_load_it_from_the_file(tmp_path):
    out = tmp_path / "devil.h5"
    result = run_cli(["data", "convert", "devils-dictionary", "--out", str(out), "--compress"])
    assert result.returncode == 0, result.stderr
    datasets.clear_cache()
    mine, built_in = load_dataset("text", str(out)), load_dataset("devils-dictionary")
    np.testing.assert_array_equal(mine.train_tokens, built_in.train_tokens)
    np.testing.assert_array_equal(mine.val_tokens, built_in.val_tokens)
    assert mine.licence == built_in.licence


@pytest.mark.parametrize("case, needle", [
    ("empty", "is empty"),
    ("binary", "is not UTF-8 text"),
    ("nul", "holds NUL bytes"),
    ("small", "fewer than one window of 257"),
    ("small-val", "val split of"),
    ("no-files", "no text files given"),
    ("missing", "cannot read"),
    ("fraction", "--val-fraction must be in [0, 1)"),
    ("files-for-images", "takes no FILE arguments"),
    ("text-flag-for-images", "--val-fraction is for 'ssdmpi data convert text"),
    ("escape", r"unknown escape \q"),
    ("exists", "exists; choose another --out"),
])
def test_bad_convert_input_is_one_line_and_exit_2(tmp_path, case, needle):
    text = write(tmp_path / "t.txt", "word " * 200)   # 1,000 bytes
    files = {"empty": [write(tmp_path / "e.txt", "")], "binary": [write(tmp_path / "b.bin", b"\xff\xfe\x00")],
             "nul": [write(tmp_path / "n.txt", b"ab\x00cd")], "small": [write(tmp_path / "s.txt", "tiny")],
             "small-val": [text], "no-files": [], "missing": [str(tmp_path / "nope.txt")]}.get(case, [text])
    name = "digits" if case in ("files-for-images", "text-flag-for-images") else "text"
    args = ["data", "convert", name] + (files if case != "text-flag-for-images" else [])
    out = tmp_path / "out.h5"
    if case == "exists":
        out.write_bytes(b"")
    args += ["--out", str(out)]
    args += {"small-val": ["--context", "200"], "fraction": ["--val-fraction", "1"],
             "text-flag-for-images": ["--val-fraction", "0.2"], "escape": ["--separator", r"\q"]}.get(case, [])
    if case == "small":
        args += ["--val-fraction", "0"]
    result = run_cli(args)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("ssdmpi: error: "), result.stderr
    assert needle in lines[0], lines[0]
    assert not out.exists() or case == "exists"


def test_loading_an_image_file_as_text_says_which_it_is(tmp_path):
    path = tmp_path / "images.h5"
    with h5py.File(path, "w") as f:
        f["train/images"], f["train/labels"] = np.zeros((4, 2, 2), np.uint8), np.zeros(4, np.int64)
        f["test/images"], f["test/labels"] = np.zeros((1, 2, 2), np.uint8), np.zeros(1, np.int64)
    with pytest.raises(UserError, match="holds an image dataset: use --dataset hdf5"):
        load_dataset("text", str(path))


def test_data_list_shows_the_text_datasets_with_their_licences():
    result = run_cli(["data", "list", "--json"])
    assert result.returncode == 0, result.stderr
    rows = {r["name"]: r for r in json.loads(result.stdout)}
    assert {name for name, row in rows.items() if row["kind"] == "text"} == {"devils-dictionary", "kjv", "text"}
    assert rows["devils-dictionary"]["found"] == DEVIL_FILE and "public domain" in rows["devils-dictionary"]["note"]
    assert "/usr/lib/bible.data" in rows["kjv"]["looked_in"] and "public domain" in rows["kjv"]["note"]
    text = run_cli(["data", "list"]).stdout
    assert "devils-dictionary" in text and "kjv" in text
