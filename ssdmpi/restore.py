"""A trained model back from its checkpoint: ``ssdmpi.load_model(path, model=None)``, and the
pieces ``ssdmpi eval`` rebuilds a model and its test data with.

A checkpoint names its model as the run did (``config.model``: a built-in or registered name,
or ``package.module:factory``), with the options the run passed (``widths``), its dtype and
the data's per-sample shape and number of classes (``input_shape``, ``num_classes`` in its
metadata); ``checkpoint.read_model`` reads only the global weights ``W`` and rank 0's BatchNorm
statistics. Serial: no MPI.
"""

from __future__ import annotations

import os

from ssdmpi.errors import UserError


def load_model(path, model=None):
    """The model a run trained, with its global weights ``W`` (and rank 0's BatchNorm statistics)
    loaded, on the host (NumPy); in inference use (``model.evaluate``, ``model.forward``).

    ``path``: a run directory (its newest checkpoint that verifies) or a checkpoint file.
    ``model``: None builds the checkpoint's own model from its config (a built-in model, or a
    factory it names as ``package.module:factory`` that can be imported here); a name or a
    factory builds that one instead (the factory of a script's ``__main__``, which cannot be
    imported); a built ``ssdmpi.nn.Model`` receives the weights. ``UserError`` (one line) when
    the checkpoint is unusable, its model cannot be rebuilt, or the model does not fit it.
    """
    import numpy as np

    from ssdmpi import checkpoint

    ckpt = checkpoint.resolve_path(os.fspath(path))
    meta, weights, buffers = checkpoint.read_model(ckpt)
    if model is None or not _is_model(model):
        shape, classes = data_shape(ckpt, meta)
        model = build(ckpt, meta.get("config", {}), shape, classes, model, xp=np,
                      instead="pass model= (the factory it was trained with, or a built ssdmpi.nn.Model)")
    return load_weights(model, {"global_weights": weights, "buffers": buffers}, ckpt)


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

    from ssdmpi.nn import build_model

    spec = cfg.get("model") if model is None else model
    options = {"widths": tuple(cfg["widths"])} if cfg.get("widths") else {}
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
