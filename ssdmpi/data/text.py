"""Text data for language models: byte-level token streams and the context windows drawn from them.

A ``TextDataset`` (``load_dataset("kjv")``, ``load_dataset("devils-dictionary")``,
``load_dataset("text", "corpus.h5")``; ``dataset.kind == "text"``, an image or tabular
``Dataset`` has ``kind == "classification"``) holds two 1-D token streams, ``train_tokens`` and
``val_tokens``. Tokens are bytes: a text's UTF-8 encoding, one token per byte, ``vocab_size`` 256,
no tokenizer (streams stored in ``ssdmpi/data/text_hdf5.py``'s layout may be uint16 with a
larger ``vocab_size``). A byte-level model's loss in nats per token is its loss per byte.

Training windows, for a context of ``T`` tokens (window length ``L = T + 1``) over a train stream
of ``N >= L`` tokens (``TokenWindows``: the loader's sample source):

* an epoch has ``n = max(1, (N + 1) // L - 1)`` windows; window ``i`` of epoch ``e`` starts at
  ``s = o_e + i * L``; the sample is ``x = tokens[s : s+T]``, ``y = tokens[s+1 : s+T+1]`` (int64),
  so ``y`` is ``x`` shifted by one, and the windows of an epoch are disjoint;
* ``o_e``, the epoch's offset, is uniform in ``0 .. N - n*L`` (``numpy.random.default_rng([seed,
  e, OFFSET_STREAM])``, the loader's seed): windows do not always start at the same multiples
  of ``L``; the range is at least ``0 .. T`` whenever ``N >= 2L - 1``;
* ``ShardedLoader`` orders and shards the window indices ``0 .. n-1`` exactly as it does image
  samples (``ssdmpi/data/loader.py``'s docstring): per epoch a seeded permutation, global step
  ``t`` takes positions ``t*W*B .. (t+1)*W*B`` of it, rank ``r`` the ``r``-th ``B`` of those, the
  remainder (< ``W*B`` windows) dropped that epoch. So the windows are disjoint across ranks and
  steps, the union of the ranks' batches is a 1-rank loader's batch of ``W*B``, and the sequence
  is a pure function of (seed, epoch, position): ``state_dict()`` / ``load_state_dict()`` resume
  it mid-epoch bit for bit, on the same or another number of ranks with the same global batch.

Validation windows (``val_windows``): fixed, the same for every seed, epoch and rank count.
With ``T``, the val stream of ``M`` tokens has ``K = (M - 1) // T`` consecutive windows, window
``j`` being ``x = val[j*T : j*T+T]``, ``y = val[j*T+1 : j*T+T+1]``: each val token after the
first is a target exactly once. ``max_windows`` (< ``K``) keeps ``max_windows`` of them, evenly
spread: windows ``j = i * K // max_windows``, ``i = 0 .. max_windows-1``.

The contract for a trainer of a language model (input ``x`` (B, T) int64 token ids, labels
``y`` (B, T) int64 next tokens)::

    ds = load_dataset(cfg.dataset, cfg.data_path)            # every rank; ds.kind == "text"
    loader = ds.loader(T, batch_size=B, rank=r, world_size=W, seed=cfg.seed, prefetch=...)
    xb, yb = loader.next_batch()                             # (B, T) int64 each, caller-owned
    vx, vy = ds.val_windows(T, max_windows)                  # the same arrays on every rank
    part = evaluation_shard(len(vx), r, W)                   # this rank's val windows

``ds.loader(...)`` is ``ShardedLoader(*ds.train_windows(T), B, r, W, seed, prefetch=...)``
(the reference simulator builds one per simulated rank the same way); its ``steps_per_epoch``,
``epoch``, ``iteration``, ``state_dict()`` count windows, not tokens. Its state checks the seed,
the window count and the global batch, not ``T``: the trainer keeps the context a structural
setting. Denominators are tokens: a step's loss is the mean over its ``B * T`` targets (the
global batch is ``W * B`` windows, ``W * B * T`` tokens); the validation loss and next-token
accuracy are sums over the val windows' targets (allreduced) divided by ``len(vx) * T``; tokens/s
is windows/s times ``T``; bits per byte is the loss in nats / ln 2. No MPI in here.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from ssdmpi.errors import UserError

BYTE_VOCAB = 256              # byte-level tokens: token = byte value
OFFSET_STREAM = 0x6F666673    # the per-epoch offset's draw, apart from the loader's permutation


def windows_per_epoch(num_tokens: int, context: int) -> int:
    """Training windows per epoch (module docstring): ``max(1, (N + 1) // (T + 1) - 1)``, 0 if ``N < T + 1``."""
    window = int(context) + 1
    if num_tokens < window:
        return 0
    return max(1, (int(num_tokens) + 1) // window - 1)


def check_context(context) -> int:
    """``context`` as a positive int; UserError otherwise."""
    try:
        value = int(context)
    except (TypeError, ValueError):
        value = 0
    if value < 1 or value != context:
        raise UserError(f"the context length must be a positive integer, got {context!r}")
    return value


class TokenWindows:
    """One side (``x`` or ``y``) of the training windows of a token stream, for ``ShardedLoader``.

    ``len()`` is the windows per epoch; ``gather(indices, seed, epoch)`` returns the windows
    ``indices`` of that epoch as a new (len(indices), T) int64 array: ``shift`` 0 gives the
    inputs ``x``, ``shift`` 1 the targets ``y``. A pure function of its arguments (thread-safe).
    """

    ndim = 2

    def __init__(self, tokens: np.ndarray, context: int, shift: int, name: str = "text"):
        self.context = check_context(context)
        self.window = self.context + 1
        self.tokens, self.shift = tokens, int(shift)
        self.num_windows = windows_per_epoch(len(tokens), self.context)
        if self.num_windows == 0:
            raise UserError(f"{name}: the train split has {len(tokens)} tokens, fewer than one window of "
                            f"{self.window} (context {self.context} + 1); use a shorter context or a larger corpus")
        self.slack = len(tokens) - self.num_windows * self.window
        self._columns = np.arange(self.shift, self.shift + self.context)

    def __len__(self) -> int:
        return self.num_windows

    @property
    def shape(self) -> tuple:
        return (self.num_windows, self.context)

    def offset(self, seed: int, epoch: int) -> int:
        """Where epoch ``epoch``'s first window starts (uniform in ``0 .. slack``)."""
        rng = np.random.default_rng([int(seed), int(epoch), OFFSET_STREAM])
        return int(rng.integers(0, self.slack + 1))

    def starts(self, indices, seed: int, epoch: int) -> np.ndarray:
        """The first token of each window ``indices`` of ``epoch`` (int64)."""
        return self.offset(seed, epoch) + np.asarray(indices, dtype=np.int64) * self.window

    def gather(self, indices, seed: int, epoch: int) -> np.ndarray:
        """Windows ``indices`` of ``epoch``: (len(indices), T) int64, shifted by ``shift``."""
        positions = self.starts(indices, seed, epoch)[:, None] + self._columns[None, :]
        return self.tokens[positions].astype(np.int64)


@dataclasses.dataclass
class TextDataset:
    """Byte-level token streams in memory (module docstring): the train and val splits.

    ``train_tokens``/``val_tokens``: 1-D read-only uint8 (or uint16) arrays of token ids in
    ``[0, vocab_size)``. ``source``: where the text came from; ``licence``: its terms, one line;
    ``description``: what the text is. A model of it is built for ``model_inputs(context)``: windows
    of ``context`` tokens, ``vocab_size`` classes (``num_classes``: the next token is one of them). It
    has no fixed ``input_shape`` (a window's length is the run's context): a consumer of images or
    feature vectors that asks for one gets a one-line ``UserError`` saying the data is text.
    """

    kind: ClassVar[str] = "text"
    name: str
    train_tokens: np.ndarray
    val_tokens: np.ndarray
    vocab_size: int = BYTE_VOCAB
    source: str = ""
    licence: str = ""
    description: str = ""

    @property
    def num_train_tokens(self) -> int:
        return len(self.train_tokens)

    @property
    def num_val_tokens(self) -> int:
        return len(self.val_tokens)

    def summary(self) -> str:
        """One line: name, sizes, vocabulary, source."""
        vocab = "bytes" if self.vocab_size == BYTE_VOCAB else "tokens"
        return (f"{self.name}: {self.num_train_tokens:,} train / {self.num_val_tokens:,} val tokens, "
                f"{vocab} (vocab {self.vocab_size}) ({self.source})")

    def train_windows(self, context: int) -> tuple[TokenWindows, TokenWindows]:
        """``(x, y)`` sample sources of the train split's windows, for ``ShardedLoader(x, y, ...)``."""
        return (TokenWindows(self.train_tokens, context, 0, self.name),
                TokenWindows(self.train_tokens, context, 1, self.name))

    def loader(self, context: int, batch_size: int, rank: int, world_size: int, seed: int,
               prefetch: bool = False):
        """This rank's ``ShardedLoader`` of training windows: ``next_batch()`` -> ``(x, y)``, (B, T) int64."""
        from ssdmpi.data.loader import ShardedLoader
        return ShardedLoader(*self.train_windows(context), batch_size, rank, world_size, seed, prefetch=prefetch)

    def num_val_windows(self, context: int) -> int:
        """All val windows for ``context`` (``K`` of the module docstring; 0 for a val split of <= T tokens)."""
        return max(0, (self.num_val_tokens - 1) // check_context(context))

    def val_windows(self, context: int, max_windows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The fixed validation windows ``(x, y)``: (K', T) int64 each (module docstring); K' may be 0."""
        T = check_context(context)
        K = self.num_val_windows(T)
        if max_windows is not None and int(max_windows) < 1:
            raise UserError(f"the number of validation windows must be >= 1, got {max_windows}")
        chosen = np.arange(K, dtype=np.int64)
        if max_windows is not None and int(max_windows) < K:
            chosen = np.arange(int(max_windows), dtype=np.int64) * K // int(max_windows)
        positions = chosen[:, None] * T + np.arange(T + 1)[None, :]
        windows = self.val_tokens[positions].astype(np.int64).reshape(len(chosen), T + 1)
        return windows[:, :-1].copy(), windows[:, 1:].copy()

    @property
    def num_classes(self) -> int:
        """The classes a language model of this text predicts among: the vocabulary."""
        return self.vocab_size

    def model_inputs(self, context: int) -> tuple[tuple, int]:
        """``(input_shape, num_classes)`` of a language model of ``context`` tokens: ``((context,), vocab_size)``."""
        return (check_context(context),), self.vocab_size

    @property
    def input_shape(self):
        """Not defined (module docstring): a ``UserError`` for consumers of images or feature vectors."""
        raise UserError(f"dataset '{self.name}' is text (windows of --context tokens for a language model, e.g. "
                        "--model gpt), not images or feature vectors; choose an image or tabular dataset here")


def from_tokens(name: str, train_tokens, val_tokens, vocab_size: int = BYTE_VOCAB, source: str = "",
                licence: str = "", description: str = "") -> TextDataset:
    """A validated ``TextDataset`` (read-only 1-D integer streams in ``[0, vocab_size)``); UserError otherwise."""
    vocab_size = int(vocab_size)
    if not 2 <= vocab_size <= 65536:
        raise UserError(f"{source or name}: vocab_size must be in 2..65536, got {vocab_size}")
    streams = []
    for split, tokens in (("train", train_tokens), ("val", val_tokens)):
        tokens = np.asarray(tokens)
        if tokens.ndim != 1 or not (np.issubdtype(tokens.dtype, np.integer) or tokens.size == 0):
            raise UserError(f"{source or name}: {split} tokens must be a 1-D integer array, got "
                            f"{tokens.dtype} {tokens.shape}")
        if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
            raise UserError(f"{source or name}: {split} tokens outside [0, {vocab_size}), e.g. "
                            f"{int(tokens[(tokens < 0) | (tokens >= vocab_size)][0])}")
        tokens = tokens.astype(np.uint8 if vocab_size <= 256 else np.uint16)
        tokens.flags.writeable = False
        streams.append(tokens)
    if streams[0].size == 0:
        raise UserError(f"{source or name}: the train split is empty")
    return TextDataset(name, streams[0], streams[1], vocab_size, source, licence, description)


def encode(text: str | bytes) -> np.ndarray:
    """Byte-level tokens of ``text`` (a str: its UTF-8 bytes; bytes as they are), as a new uint8 array."""
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return np.frombuffer(data, dtype=np.uint8).copy()


def decode(tokens) -> str:
    """The text of byte-level ``tokens`` (UTF-8; an incomplete or invalid sequence becomes U+FFFD)."""
    return bytes(np.asarray(tokens, dtype=np.uint8)).decode("utf-8", errors="replace")
