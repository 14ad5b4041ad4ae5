"""A GPT-2-style decoder in plain torch, the GPU part's training load.

GPT-2 small's shape (12 layers, width 768, 12 heads, pre-LayerNorm blocks, GELU MLP of 4x
width, learned positions, output head tied to the token embedding) with the dataset's
vocabulary; causal attention through ``scaled_dot_product_attention``. Built on the meta
device and initialised from a seeded ``torch.Generator`` (GPT-2's normal(0, 0.02)), so no
global random state is read or changed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Shape:
    """The model's size; ``GPT2_SMALL`` and ``TINY`` (the CPU smoke test's) below."""

    layers: int
    width: int
    heads: int


GPT2_SMALL = Shape(layers=12, width=768, heads=12)
TINY = Shape(layers=2, width=32, heads=2)


class Block(nn.Module):
    """Pre-LayerNorm attention + MLP, each added to the residual stream."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2) for y in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.down(F.gelu(self.up(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    """Token ids ``[B, T]`` -> mean cross-entropy against ``labels`` (-100 ignored)."""

    def __init__(self, shape: Shape, vocab: int, seq_len: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, shape.width)
        self.wpe = nn.Embedding(seq_len, shape.width)
        self.blocks = nn.ModuleList(Block(shape.width, shape.heads) for _ in range(shape.layers))
        self.ln_f = nn.LayerNorm(shape.width)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.wte(ids) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.T  # the head tied to the embedding
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)


def build(shape: Shape, vocab: int, seq_len: int, device: torch.device, seed: int = 0) -> GPT:
    """The model on ``device``, initialised as GPT-2 is, from ``seed`` alone."""
    with torch.device("meta"):
        model = GPT(shape, vocab, seq_len)
    model = model.to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif ".ln" in name or name.startswith("ln_"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=g)
    return model
