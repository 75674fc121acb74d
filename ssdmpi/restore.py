"""A trained model back from its checkpoint: ``ssdmpi.load_model(path, model=None,
normalisation=None)``, and the pieces ``ssdmpi eval`` and ``ssdmpi export`` rebuild a model and
its test data with.

A checkpoint names its model as the run did (``config.model``: a built-in or registered name,
or ``package.module:factory``), with the options the run passed (``widths``, gpt's sizes:
``config.settings.model_options``), its dtype, the
data's per-sample shape and number of classes (``input_shape``, ``num_classes`` in its metadata)
and the data's normalisation (``normalisation``: ``ssdmpi/data/normalisation.py``; checkpoints
written before it was recorded lack it; a language model's data has none: its inputs are token
ids); ``checkpoint.read_model`` reads only the global weights ``W`` and the BatchNorm statistics
that go with them. Serial: no MPI.
"""

from __future__ import annotations

import os
import types

from ssdmpi.errors import UserError

PREDICT_BATCH = 1024   # samples per forward pass of predict (memory only: the results do not depend on it)


def load_model(path, model=None, normalisation=None):
    """The model a run trained, with its global weights ``W`` and their BatchNorm statistics
    loaded, on the host (NumPy), ready for raw inputs: an ``ssdmpi.nn.Model`` (``forward``,
    ``evaluate`` take normalised inputs) with, added here,

    - ``predict(raw)``: the classes, ``(N,)`` int64;
    - ``predict_proba(raw)``: the softmax of the logits, ``(N, classes)`` float64;
    - ``predict_logits(raw)``: the logits, ``(N, classes)`` in the model's dtype;
    - ``normalisation``: the ``Normalisation`` they apply first (None: unknown), and
      ``checkpoint``: the checkpoint read.

    ``raw``: samples as the dataset holds them (``ssdmpi/data/normalisation.py``: digits 0..16,
    IDX and CIFAR-10 uint8 0..255, HDF5 and arrays as stored), ``(N, C, H, W)``, ``(N, H, W)`` for
    one channel, ``(N, features)`` or each sample flattened.

    A language model (``model.input_kind == "tokens"``: ``gpt`` trained on a text dataset) takes
    token ids instead, ``(N, T)`` integers with ``T`` up to its context (``(T,)``: one sequence):
    ``predict_logits`` gives ``(N, T, vocab)``, ``predict_proba`` their softmax, ``predict`` the most
    likely next token at each position, ``(N, T)``; and ``generate(prompt, tokens, temperature=1.0,
    top_k=None, seed=0)`` continues a text (``generate`` below; ``ssdmpi generate``).

    ``path``: a run directory (its newest checkpoint that verifies), a checkpoint, or a file of
    one. ``model``: None builds the checkpoint's own model from its config (a built-in model, or a
    factory it names as ``package.module:factory`` that can be imported here); a name or a
    factory builds that one instead (the factory of a script's ``__main__``, which cannot be
    imported); a built ``ssdmpi.nn.Model`` receives the weights (and is returned).
    ``normalisation``: for a checkpoint that does not record it, the data's: an
    ``ssdmpi.data.Dataset`` (e.g. ``ssdmpi.data.load_dataset("digits")``), a ``Normalisation`` or
    its record. ``UserError`` (one line) when the checkpoint is unusable, its model cannot be
    rebuilt, or the model does not fit it.
    """
    from ssdmpi import checkpoint

    return from_checkpoint(checkpoint.resolve_path(os.fspath(path)), model, normalisation)[0]


def from_checkpoint(ckpt: str, model=None, normalisation=None):
    """``(model, meta)``: ``load_model`` of the checkpoint ``ckpt`` (resolved: ``checkpoint.resolve_path``),
    and its metadata."""
    import numpy as np

    from ssdmpi import checkpoint

    meta, weights, buffers = checkpoint.read_model(ckpt)
    if model is None or not _is_model(model):
        shape, classes = data_shape(ckpt, meta)
        model = build(ckpt, meta.get("config", {}), shape, classes, model, xp=np,
                      instead="pass model= (the factory it was trained with, or a built ssdmpi.nn.Model)")
    model = load_weights(model, {"global_weights": weights, "buffers": buffers}, ckpt)
    model.checkpoint = ckpt
    model.normalisation = _normalisation(normalisation, meta)
    methods = [predict, predict_proba, predict_logits] + ([generate] if model.input_kind == "tokens" else [])
    for fn in methods:
        setattr(model, fn.__name__, types.MethodType(fn, model))
    return model, meta


def context_of(meta: dict):
    """The context a checkpoint's model was trained with (its text windows' tokens), or None: from its
    config (``context``), else its recorded input shape when that is one length."""
    context = (meta.get("config") or {}).get("context")
    if context is None and len(meta.get("input_shape") or ()) == 1 and (meta.get("config") or {}).get("dataset"):
        from ssdmpi.data.datasets import dataset_kind
        try:
            if dataset_kind(meta["config"]["dataset"]) == "text":
                context = meta["input_shape"][0]
        except UserError:
            pass
    return None if context is None else int(context)


def _normalisation(given, meta: dict):
    """``load_model``'s ``normalisation``: the one given (a Dataset, a Normalisation, a record), else
    the checkpoint's record, else None."""
    from ssdmpi.data.normalisation import Normalisation

    if given is None:
        recorded = meta.get("normalisation")
        return None if recorded is None else Normalisation.from_record(recorded)
    if isinstance(given, Normalisation):
        return given
    if isinstance(given, dict):
        return Normalisation.from_record(given)
    norm = Normalisation.of(given)
    if norm is None:
        raise UserError(f"normalisation= takes an ssdmpi.data.Dataset, a Normalisation or its record, "
                        f"not {type(given).__name__}")
    return norm


def token_ids(model, ids):
    """A language model's inputs: ``ids`` as an ``(N, T)`` int64 array (``(T,)`` is one sequence);
    ``UserError`` (one line) unless they are integers in ``[0, vocab)`` with ``1 <= T <= context``."""
    import numpy as np

    x = np.asarray(ids)
    if x.ndim == 1:
        x = x[None, :]
    vocab, context = int(model.output_shape[-1]), int(model.input_shape[0])
    if x.ndim != 2 or not 1 <= x.shape[1] <= context or (x.size and x.dtype.kind not in "iu"):
        raise UserError(f"a language model takes token ids (N, T) or (T,) as integers, 1 <= T <= {context} (its "
                        f"context); got {x.dtype} of shape {tuple(np.shape(ids))}")
    if x.size and (int(x.min()) < 0 or int(x.max()) >= vocab):
        raise UserError(f"token ids must be in [0, {vocab}), got values from {int(x.min())} to {int(x.max())}")
    return x.astype(np.int64)


def predict_logits(model, raw, batch_size: int = PREDICT_BATCH):
    """The logits ``(N, classes)`` of raw inputs (``load_model``): normalised as the run's data
    was, then ``model.forward(x, train=False)`` in batches; a NumPy array in the model's dtype.
    A language model's: ``(N, T, vocab)`` of token ids ``(N, T)``, in batches of ``batch_size`` tokens."""
    import numpy as np

    from ssdmpi.backend import to_host

    if model.input_kind == "tokens":
        x = token_ids(model, raw)
        out = np.empty(x.shape + (int(model.output_shape[-1]),), dtype=model.dtype)
        rows = max(1, batch_size // x.shape[1])
        for start in range(0, len(x), rows):
            out[start:start + rows] = to_host(model.forward(model.xp.asarray(x[start:start + rows]), train=False))
        return out
    if model.normalisation is None:
        raise UserError(f"{model.checkpoint} does not record its data's normalisation (it was written by an older "
                        "ssdmpi): pass it, ssdmpi.load_model(path, normalisation=ssdmpi.data.load_dataset(NAME)), or "
                        "give model.forward(x, train=False) inputs normalised as in training")
    x = model.normalisation.apply(raw, model.input_shape, model.dtype)
    out = np.empty((len(x),) + tuple(model.output_shape), dtype=model.dtype)
    for start in range(0, len(x), batch_size):
        out[start:start + batch_size] = to_host(model.forward(model.xp.asarray(x[start:start + batch_size]),
                                                              train=False))
    return out


def predict_proba(model, raw, batch_size: int = PREDICT_BATCH):
    """The class probabilities ``(N, classes)`` of raw inputs: the softmax of ``predict_logits``, in float64
    (a language model's: ``(N, T, vocab)``, over the vocabulary)."""
    import numpy as np

    z = predict_logits(model, raw, batch_size).astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=-1, keepdims=True)
    return z


def predict(model, raw, batch_size: int = PREDICT_BATCH):
    """The predicted classes ``(N,)`` int64 of raw inputs: the largest logit's index (a language
    model's: the most likely next token at each position, ``(N, T)``)."""
    return predict_logits(model, raw, batch_size).argmax(axis=-1).astype("int64")


def _is_model(obj) -> bool:
    from ssdmpi.nn import Model

    return isinstance(obj, Model)


def data_shape(path: str, meta: dict) -> tuple[tuple, int]:
    """``(per-sample input shape, number of classes)`` the checkpoint's model was built for: from
    its metadata, or (a checkpoint that does not record them) from its dataset, loaded by name."""
    if meta.get("input_shape") is not None and meta.get("num_classes") is not None:
        return tuple(int(s) for s in meta["input_shape"]), int(meta["num_classes"])
    from ssdmpi.data import load_dataset

    cfg = meta.get("config", {})
    try:
        dataset = load_dataset(cfg.get("dataset"), cfg.get("data_path"))
    except UserError as exc:
        raise UserError(f"{path} does not record the shape of its data, and its dataset cannot be loaded here "
                        f"({exc}); pass model= a built ssdmpi.nn.Model") from None
    return tuple(dataset.input_shape), int(dataset.num_classes)


def build(path: str, cfg: dict, input_shape, num_classes: int, model=None, xp=None, instead: str = ""):
    """The checkpoint's model (``model`` None: the one its config names, with the run's options),
    built for ``input_shape`` and ``num_classes`` with array module ``xp``. A model that cannot be
    rebuilt here (its factory lived in a script's ``__main__``, or is not importable) is a
    ``UserError`` that ends with ``instead``: what to pass."""
    import numpy as np

    from ssdmpi.config.settings import model_options
    from ssdmpi.nn import build_model

    spec = cfg.get("model") if model is None else model
    options = model_options(cfg)
    try:
        return build_model(spec, input_shape, num_classes, xp=np if xp is None else xp,
                           dtype=np.dtype(cfg.get("dtype", "float32")), seed=0, **options)
    except UserError as exc:
        if model is not None:
            raise
        why = ("it was defined in the script that trained it" if str(spec).startswith("__main__:")
               else str(exc).removeprefix(f"--model {spec}: "))
        raise UserError(f"{path}: its model {spec} cannot be rebuilt here ({why}); {instead}") from None


def load_weights(model, shared: dict, path: str, instead: str = "pass the model it was trained with"):
    """``model`` with the checkpoint's global weights and BatchNorm statistics (``shared``: its
    ``/model`` group) copied in; ``UserError`` ending with ``instead`` if the parameter counts differ."""
    import numpy as np

    weights = np.asarray(shared["global_weights"])
    if weights.shape != model.params.shape:
        raise UserError(f"{path} holds {weights.size} parameters but the model {model.name} has "
                        f"{model.params.size}; {instead}")
    model.params[...] = model.xp.asarray(weights)
    if shared.get("buffers"):
        model.load_buffers({k: model.xp.asarray(v) for k, v in shared["buffers"].items()})
    return model


def eval_dataset(path: str, cfg: dict, dataset: str | None, data_path: str | None):
    """The test data ``ssdmpi eval`` evaluates the checkpoint on: ``--dataset``/``--data-path``, or
    the checkpoint's own. A run trained on arrays a script gave ``ssdmpi.train`` does not keep
    them: without ``--dataset`` that is a ``UserError`` saying what to pass."""
    from ssdmpi.data import DATASETS, load_dataset
    from ssdmpi.data.datasets import canonical_name

    name = dataset or cfg.get("dataset")
    if dataset is None:
        try:
            canonical_name(name)
        except UserError:
            raise UserError(f"{path} was trained on arrays given to ssdmpi.train ({name!r}), which its run does "
                            f"not keep: pass their test split as --dataset hdf5 --data-path FILE.h5 (docs/API.md), "
                            f"or --dataset NAME ({', '.join(DATASETS)})") from None
    return load_dataset(name, data_path if dataset or data_path else cfg.get("data_path"))


# --- a language model's text ------------------------------------------------------------------

def check_sampling(tokens: int, temperature: float, top_k, seed: int = 0) -> None:
    """``UserError`` (one line) for a bad number of tokens, temperature, top-k or seed (``generate``'s)."""
    from ssdmpi.validate import nonnegative_int, number, positive_int

    nonnegative_int("tokens", tokens)
    number("temperature", temperature, low=0.0)
    if top_k is not None:
        positive_int("top-k", top_k)
    nonnegative_int("seed", seed)


def sample(model, ids, tokens: int, temperature: float = 1.0, top_k: int | None = None, seed: int = 0):
    """``tokens`` new token ids (a 1-D int64 NumPy array) continuing ``ids`` (1-D, at least one token), drawn
    from a language model ``model`` as nanoGPT's ``generate`` does (``ssdmpi/generate.py``'s docstring);
    ``model`` is only read."""
    import numpy as np

    from ssdmpi.backend import to_host

    check_sampling(tokens, temperature, top_k, seed)
    context, vocab = int(model.input_shape[0]), int(model.output_shape[-1])
    sequence = [int(i) for i in np.asarray(ids).reshape(-1)]
    if not sequence:
        raise ValueError("sample needs at least one token to start from")
    rng = np.random.default_rng(seed)
    out = np.empty(int(tokens), dtype=np.int64)
    for i in range(int(tokens)):
        window = model.xp.asarray(np.asarray(sequence[-context:], dtype=np.int64)[None, :])
        logits = to_host(model.forward(window, train=False))[0, -1].astype(np.float64)
        if temperature == 0:
            token = int(np.argmax(logits))
        else:
            logits /= temperature
            if top_k is not None and top_k < vocab:
                logits[logits < np.partition(logits, -top_k)[-top_k]] = -np.inf
            logits -= logits.max()
            probs = np.exp(logits)
            cdf = np.cumsum(probs)
            token = min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), vocab - 1)
        out[i] = token
        sequence.append(token)
    return out


def byte_model(model) -> None:
    """``UserError`` unless ``model`` is a byte-level language model (token ids in, a vocabulary of 256)."""
    from ssdmpi.data.text import BYTE_VOCAB

    if getattr(model, "input_kind", "features") != "tokens":
        raise UserError(f"{getattr(model, 'checkpoint', 'the checkpoint')} holds {model.name}, which is not a language "
                        "model: generate samples from a run of --model gpt on a text dataset")
    if int(model.output_shape[-1]) != BYTE_VOCAB:
        raise UserError(f"generate writes text byte by byte, but this model's vocabulary has "
                        f"{int(model.output_shape[-1])} tokens, not the {BYTE_VOCAB} bytes")


def generate(model, prompt: str = "\n", tokens: int = 200, temperature: float = 1.0, top_k: int | None = None,
             seed: int = 0) -> str:
    """``prompt`` and ``tokens`` bytes sampled after it (``sample``), decoded together: the text
    ``ssdmpi generate`` prints. ``model``: a byte-level language model (``ssdmpi.load_model`` of a
    gpt run on a text dataset, where this is ``model.generate(prompt, ...)``)."""
    import numpy as np

    from ssdmpi.data.text import decode, encode

    byte_model(model)
    ids = encode(prompt)
    if ids.size == 0:
        raise UserError("the prompt is empty; give at least one character (the default is a newline)")
    return decode(np.concatenate([ids, sample(model, ids, tokens, temperature, top_k, seed)]))
