"""ssdmpi's inner optimizer and a language model's loss on a PyTorch twin, from PyTorch's own parts:
what the recipe check (``ssdmpi/verify/lm_recipe.py``) and the benchmark peers
(``ssdmpi/bench/torch_peer.py``) train a twin with.

- ``decay_groups``: the twin's parameters in two groups, weight decay on the tensors the engine's model
  decays (``ParamSpec.decay``, the model's own choice: a gpt's Linear weights, not its norms, biases or
  embeddings), none on the rest;
- ``adamw``: ``torch.optim.AdamW`` over those groups with ``--beta1``, ``--beta2``, ``--eps`` and
  ``--weight-decay`` (its single-tensor loop, PyTorch's default on the CPU, whose operation order
  ``ssdmpi/optim/optimizers/adamw.py`` follows);
- ``clip``: ``--grad-clip C`` as ``torch.nn.utils.clip_grad_norm_`` over all parameters (a tied tensor
  once), nothing for ``C`` 0;
- ``token_loss``: the mean cross-entropy over every target of a batch of windows.

The learning rate is the caller's to set on the groups before each step. PyTorch is imported inside
the functions (a test oracle and benchmark peer only).
"""

from __future__ import annotations


def same_name(name: str) -> str:
    """The twin's name of the engine's tensor ``name`` when they are the same (the image models' twins)."""
    return name


def decay_groups(module, engine, weight_decay: float, name=same_name) -> list:
    """``module``'s parameters (the twin of ``engine``) as optimizer groups: those whose engine tensor is
    decayed at ``weight_decay``, the others at 0 (an empty group left out). ``name(engine name) -> twin
    name``; a twin parameter with no engine tensor is a ``KeyError``."""
    decays = {name(spec.name): spec.decay for spec in engine.flat.specs}
    named = list(module.named_parameters())
    groups = [{"params": [p for n, p in named if decays[n]], "weight_decay": float(weight_decay)},
              {"params": [p for n, p in named if not decays[n]], "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def adamw(module, engine, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
          name=same_name):
    """``torch.optim.AdamW`` over ``decay_groups(module, engine, weight_decay, name)``."""
    import torch

    return torch.optim.AdamW(decay_groups(module, engine, weight_decay, name), lr=float(lr),
                             betas=(float(beta1), float(beta2)), eps=float(eps), foreach=False)


def clip(module, max_norm: float | None) -> None:
    """Scale ``module``'s gradients to a global norm of at most ``max_norm`` (``clip_grad_norm_``);
    nothing when it is 0 or None."""
    if max_norm:
        import torch

        torch.nn.utils.clip_grad_norm_(module.parameters(), float(max_norm))


def token_loss(logits, targets):
    """The mean cross-entropy of ``logits`` (B, T, V) against the next tokens ``targets`` (B, T)."""
    import torch.nn.functional as F

    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
