"""``ssdmpi export``: a run's global model as one ``.safetensors`` file that other tools read.

The file holds the global model ``W`` of a checkpoint (assembled from its rank files) with the
BatchNorm statistics that go with it (``checkpoint.read_model``: the training ranks' averaged,
what ``ssdmpi eval`` and ``ssdmpi.load_model`` use), as named tensors:

- the built-in models (``mlp``, ``wide-mlp``, ``lenet5``, ``resnet20``) under PyTorch
  ``state_dict`` names, those of their PyTorch twins (``ssdmpi/verify/torch_ref.py``):
  ``fc1.weight`` ``(out, in)``, ``conv1.weight`` ``(out, in, k, k)``, ``layer1.0.bn1.running_mean``,
  and ``*.num_batches_tracked`` (int64, the checkpoint's step), so ``load_state_dict(...,
  strict=True)`` takes them;
- ``gpt`` under nanoGPT's ``state_dict`` names (``transformer.wte.weight``, ``transformer.h.0.attn.c_attn.weight``,
  ..., ``ssdmpi/nn/transformer.py``'s ``nanogpt_name``), the output head tied to the token embedding
  stored once, as ``transformer.wte.weight`` (``lm_head.weight`` is the same tensor: metadata ``tied``;
  ``safetensors.torch.load_model`` fills both);
- a model with a mapping of its own (``STATE_DICT``: model name -> ``"module:function"``, or
  ``register_state_dict``) under the names that function gives;
- any other model under ssdmpi's own tensor names (its ``model.flat.specs``) and BatchNorm
  statistics.

Its metadata (safetensors' string -> string map), each value a string (JSON where noted)::

    format          "ssdmpi-export"           format_version  "1"
    model           the run's model name      model_options   JSON, e.g. {"widths": [256]}, {"n_layer": 4, ...}
    input_shape     JSON, e.g. [1, 28, 28]    num_classes     e.g. "10"
    normalisation   JSON (ssdmpi/data/normalisation.py) or "null" (a checkpoint too old to record it)
    names           "pytorch" or "ssdmpi"     dtype           "float32" or "float64"
    step            the checkpoint's step     checkpoint      its directory's name (ckpt-<step>)
    ssdmpi_version  the exporting ssdmpi      trained_with    the ssdmpi that wrote the checkpoint
    tied            (gpt) JSON: {name: the stored tensor it is} of the tensors stored once

Loading it needs only ``safetensors`` (and PyTorch for a PyTorch model): docs/API.md shows how.
``safetensors`` is optional for ssdmpi (``pip install 'ssdmpi[export]'``). Serial; no MPI.
"""

from __future__ import annotations

import importlib
import json
import os
import tempfile

from ssdmpi.errors import UserError
from ssdmpi.version import __version__

FORMAT, FORMAT_VERSION = "ssdmpi-export", 1
# A model's own mapping to PyTorch names: model name -> "module:function", the function taking
# (model, step) and returning {name: NumPy array}. Imported only when that model is exported.
STATE_DICT = {name: "ssdmpi.export:twin_state_dict" for name in ("mlp", "wide-mlp", "lenet5", "resnet20")}
STATE_DICT["gpt"] = "ssdmpi.export:nanogpt_state_dict"


def register_state_dict(model_name: str, function) -> None:
    """Export models named ``model_name`` with ``function(model, step) -> {name: array}`` (or a
    ``"module:function"`` string naming it)."""
    STATE_DICT[model_name] = function


def _mapping(model_name: str):
    """The state-dict function of ``model_name`` and whether it gives PyTorch names."""
    fn = STATE_DICT.get(model_name)
    if fn is None:
        return own_state_dict, False
    if isinstance(fn, str):
        module, _, attr = fn.partition(":")
        fn = getattr(importlib.import_module(module), attr)
    return fn, True


def own_state_dict(model, step: int) -> dict:
    """ssdmpi's names: every parameter tensor in its shape, each BatchNorm's running statistics."""
    import numpy as np

    from ssdmpi.backend import to_host

    out = {spec.name: np.ascontiguousarray(to_host(model.flat.view(spec.name))) for spec in model.flat.specs}
    for key, value in model.buffers().items():
        if key.endswith((".running_mean", ".running_var")):
            out[key] = np.ascontiguousarray(to_host(value))
    return out


def twin_state_dict(model, step: int) -> dict:
    """A built-in model under its PyTorch twin's ``state_dict`` names (``ssdmpi/verify/torch_ref.py``):
    the twins name their tensors as ssdmpi does, and each ``BatchNorm{1,2}d`` adds
    ``num_batches_tracked`` (here the checkpoint's step; PyTorch reads it only with ``momentum=None``)."""
    import numpy as np

    from ssdmpi.nn.norm import BatchNorm

    out = own_state_dict(model, step)
    for full, layer in model.named_layers:
        if isinstance(layer, BatchNorm):
            out[f"{full}.num_batches_tracked"] = np.array(int(step), dtype=np.int64)
    return out


def nanogpt_state_dict(model, step: int) -> dict:
    """``gpt`` under nanoGPT's ``state_dict`` names (``ssdmpi/verify/torch_gpt.py``'s twin): each tensor
    as ``nanogpt_name`` names it; the tied output head is the token embedding, stored once (``tied``)."""
    from ssdmpi.nn.transformer import nanogpt_name

    return {nanogpt_name(name): value for name, value in own_state_dict(model, step).items()}


def tied(model_name: str) -> dict:
    """``{name: stored name}`` of the tensors a ``nanogpt_state_dict`` export stores once for two names."""
    from ssdmpi.nn.transformer import NANOGPT_TIED

    return dict(NANOGPT_TIED)


def check_out(out: str, force: bool) -> str:
    """``out`` as an absolute path that may be written: ``UserError`` (one line) when it exists and
    ``force`` is not given, is a directory, or its directory does not exist."""
    path = os.path.abspath(out)
    if os.path.isdir(path):
        raise UserError(f"--out {out} is a directory; give a file name, e.g. {os.path.join(out, 'model.safetensors')}")
    if os.path.lexists(path) and not force:
        raise UserError(f"{out} exists; choose another --out or pass --force to replace it")
    if not os.path.isdir(os.path.dirname(path)):
        raise UserError(f"no such directory: {os.path.dirname(path)} (for --out {out})")
    return path


def _safetensors():
    try:
        from safetensors.numpy import save_file
    except ImportError:
        raise UserError("ssdmpi export needs the safetensors package: pip install 'ssdmpi[export]' "
                        "(or pip install safetensors)") from None
    return save_file


def export(path, out: str, force: bool = False, model=None) -> dict:
    """Write checkpoint ``path``'s global model (``path``: a run directory, a checkpoint or a file
    of one) to the safetensors file ``out``, atomically (a temporary file renamed into place);
    refuses an existing ``out`` unless ``force``. ``model``: as ``ssdmpi.load_model``'s (a model
    the checkpoint's config cannot rebuild here). Returns a summary: ``out``, ``checkpoint``,
    ``model``, ``names``, ``tensors``, ``parameters``, ``metadata``."""
    import numpy as np

    from ssdmpi import checkpoint, restore
    from ssdmpi.config.settings import model_options

    target = check_out(out, force)
    save_file = _safetensors()
    ckpt = checkpoint.resolve_path(os.fspath(path))
    loaded, meta = restore.from_checkpoint(ckpt, model=model)
    cfg = meta.get("config", {})
    name = model if isinstance(model, str) else cfg.get("model", loaded.name)
    step = int(meta.get("step") or 0)
    fn, pytorch = _mapping(loaded.name)
    tensors = {k: np.asarray(v, order="C") for k, v in fn(loaded, step).items()}   # 0-d stays 0-d
    metadata = {
        "format": FORMAT, "format_version": str(FORMAT_VERSION), "model": str(name),
        "model_options": json.dumps(model_options(cfg)),
        "input_shape": json.dumps([int(s) for s in loaded.input_shape]),
        "num_classes": str(int(loaded.output_shape[-1])),
        "normalisation": json.dumps(None if loaded.normalisation is None else loaded.normalisation.to_record()),
        "names": "pytorch" if pytorch else "ssdmpi", "dtype": str(loaded.dtype), "step": str(step),
        "checkpoint": os.path.basename(os.path.normpath(ckpt)), "ssdmpi_version": __version__,
        "trained_with": str(meta.get("ssdmpi_version", "unknown")),
    }
    if fn is nanogpt_state_dict:
        metadata["tied"] = json.dumps(tied(loaded.name))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(target) + ".", suffix=".tmp", dir=os.path.dirname(target))
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)   # mkstemp's 0600 would survive the rename
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return {"out": target, "checkpoint": ckpt, "model": name, "names": metadata["names"], "tensors": len(tensors),
            "parameters": int(loaded.num_params), "metadata": metadata}
