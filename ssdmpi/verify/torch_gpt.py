"""The PyTorch twin of the ``gpt`` model: a plain nanoGPT ``GPT`` module (Karpathy's ``model.py``).

Its ``state_dict`` names are nanoGPT's (``transformer.wte.weight``, ``transformer.wpe.weight``,
``transformer.h.0.ln_1.weight``, ``transformer.h.0.attn.c_attn.weight``, ...,
``transformer.ln_f.bias``, ``lm_head.weight`` tied to ``transformer.wte.weight``), reached from
the ssdmpi names by :func:`ssdmpi.nn.transformer.nanogpt_name`. Attention is either PyTorch's
fused ``scaled_dot_product_attention`` with ``is_causal=True`` (``attention="sdpa"``: nanoGPT's
default path, the benchmark peer) or the explicit masked softmax (``"math"``: nanoGPT's
fallback, the one ssdmpi's layer computes). GELU is ``nn.GELU(approximate="tanh")``.

PyTorch is imported inside the functions (a test oracle and benchmark peer only).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from ssdmpi.backend import to_host


def modules():
    """The nanoGPT module classes (``CausalSelfAttention``, ``MLP``, ``Block``, ``GPT``) as a namespace.
    Each takes a ``config`` namespace: ``n_layer``, ``n_head``, ``n_embd``, ``block_size``,
    ``vocab_size``, ``dropout``, ``attention`` ("sdpa" or "math")."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class CausalSelfAttention(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
            self.c_proj = nn.Linear(config.n_embd, config.n_embd)
            self.attn_dropout = nn.Dropout(config.dropout)
            self.resid_dropout = nn.Dropout(config.dropout)
            self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout
            self.sdpa = config.attention == "sdpa"
            if not self.sdpa:
                mask = torch.tril(torch.ones(config.block_size, config.block_size))
                self.register_buffer("bias", mask.view(1, 1, config.block_size, config.block_size), persistent=False)

        def forward(self, x):
            b, t, c = x.size()
            q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
            q, k, v = (a.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for a in (q, k, v))
            if self.sdpa:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=True,
                                                   dropout_p=self.dropout if self.training else 0.0)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
                att = self.attn_dropout(F.softmax(att, dim=-1))
                y = att @ v
            y = y.transpose(1, 2).contiguous().view(b, t, c)
            return self.resid_dropout(self.c_proj(y))

    class MLP(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
            self.gelu = nn.GELU(approximate="tanh")
            self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)
            self.dropout = nn.Dropout(config.dropout)

        def forward(self, x):
            return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))

    class Block(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.ln_1 = nn.LayerNorm(config.n_embd)
            self.attn = CausalSelfAttention(config)
            self.ln_2 = nn.LayerNorm(config.n_embd)
            self.mlp = MLP(config)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd)))
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
            self.transformer.wte.weight = self.lm_head.weight      # weight tying, as nanoGPT

        def forward(self, idx):
            t = idx.size(1)
            pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
            x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
            for block in self.transformer.h:
                x = block(x)
            return self.lm_head(self.transformer.ln_f(x))

    return SimpleNamespace(CausalSelfAttention=CausalSelfAttention, MLP=MLP, Block=Block, GPT=GPT)


def config_of(model, attention: str = "sdpa"):
    """The nanoGPT config of an ssdmpi ``gpt`` model (sizes read from its layers)."""
    from ssdmpi.nn.transformer import Block

    blocks = [layer for layer in model.layers if isinstance(layer, Block)]
    attn = blocks[0].attn
    dropout = attn.attn_dropout.rate if attn.attn_dropout is not None else 0.0
    wte = model.layers[0]
    return SimpleNamespace(n_layer=len(blocks), n_head=attn.n_head, n_embd=attn.dim, block_size=attn.context,
                           vocab_size=wte.vocab, dropout=dropout, attention=attention)


def build_torch_gpt(model, attention: str = "sdpa"):
    """A nanoGPT ``GPT`` computing the same function as the ssdmpi ``gpt`` ``model``, with its
    parameters copied in (float32 or float64, like ``model``)."""
    import torch

    twin = modules().GPT(config_of(model, attention))
    twin = twin.to(torch.float64 if model.dtype == np.float64 else torch.float32)
    copy_to_torch(model, twin)
    return twin


def copy_to_torch(model, twin, name=None) -> None:
    """Copy ``model``'s tensors into ``twin`` by name: ``name(ssdmpi name) -> twin name``
    (default :func:`~ssdmpi.nn.transformer.nanogpt_name`, for a whole ``gpt``)."""
    import torch

    from ssdmpi.nn.transformer import nanogpt_name

    name = name or nanogpt_name
    state = twin.state_dict()
    with torch.no_grad():
        for spec in model.flat.specs:
            state[name(spec.name)].copy_(torch.from_numpy(to_host(model.flat.view(spec.name)).copy()))


def torch_grads(model, twin, name=None) -> np.ndarray:
    """``twin``'s parameter gradients packed in ``model``'s flat order (a host array); ``name`` as in
    :func:`copy_to_torch`."""
    from ssdmpi.nn.transformer import nanogpt_name

    name = name or nanogpt_name
    params = dict(twin.named_parameters(remove_duplicate=False))
    out = np.empty(model.num_params, dtype=model.dtype)
    for spec in model.flat.specs:
        out[spec.offset:spec.offset + spec.size] = params[name(spec.name)].grad.detach().numpy().reshape(-1)
    return out
