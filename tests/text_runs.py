"""The small language-model run the text tests share: a gpt of 2 blocks (d_model 32, context 16) on
the built-in Devil's Dictionary, its settings as ``ssdmpi.train`` takes them or as command-line flags,
and the oracle for its validation loss (recomputed in NumPy from the model's logits)."""

import numpy as np

from ssdmpi.data import load_dataset

T = 16      # the context: tokens per window
SMALL_GPT = {"dataset": "devils-dictionary", "model": "gpt", "n_layer": 2, "n_head": 2, "d_model": 32, "context": T}


def cli_args(settings: dict) -> list:
    """``settings`` (``ssdmpi.train``'s names) as ``ssdmpi train`` flags: ``n_layer: 2`` is
    ``--n-layer 2``, ``progress_bar`` (false) is ``--no-progress-bar``."""
    out = []
    for name, value in settings.items():
        if name == "progress_bar":
            out.append("--no-progress-bar")
        else:
            out += [f"--{name.replace('_', '-')}", str(value)]
    return out


def numpy_val_loss(model) -> float:
    """The mean cross-entropy over every validation window of ``T`` tokens, from the model's logits
    (in float64 here)."""
    vx, vy = load_dataset("devils-dictionary").val_windows(T)
    total = 0.0
    for i in range(0, len(vx), 256):
        z = model.forward(vx[i:i + 256], train=False).astype(np.float64)
        z -= z.max(axis=-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
        total -= np.take_along_axis(logp, vy[i:i + 256, :, None], axis=-1).sum()
    return total / vy.size
