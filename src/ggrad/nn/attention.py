"""Multi-head self-attention and a pre-norm transformer block."""

from __future__ import annotations

import math

import numpy as np

from .. import functional as F
from ..tensor import Tensor, tensor
from .layers import GELU, Dropout, Linear
from .normalization import LayerNorm
from .module import Module, Sequential


class MultiheadAttention(Module):
    """Self-attention over (batch, time, embed) inputs; `causal=True` lets position t
    attend to positions <= t only."""

    def __init__(self, embed_dim: int, num_heads: int, causal: bool = False, dropout: float = 0.0) -> None:
        super().__init__()
        if not all(isinstance(n, int) and n > 0 for n in (embed_dim, num_heads)):
            raise ValueError(f"MultiheadAttention needs positive integer sizes, got embed_dim={embed_dim!r}, "
                             f"num_heads={num_heads!r}")
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        self.embed_dim, self.num_heads, self.causal = embed_dim, num_heads, causal
        self.head_dim = embed_dim // num_heads
        self.qkv = Linear(embed_dim, 3 * embed_dim)
        self.out = Linear(embed_dim, embed_dim)
        self.dropout = Dropout(dropout)
        self._masks: dict[int, Tensor] = {}

    def _mask(self, t: int) -> Tensor:
        """An additive (t, t) mask, made once per length and kept on the device."""
        if t not in self._masks:
            self._masks[t] = tensor(np.triu(np.full((t, t), -1e9, np.float32), k=1))
        return self._masks[t]

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim != 3 or x.shape[2] != self.embed_dim:
            raise ValueError(f"MultiheadAttention({self.embed_dim}) needs (batch, time, {self.embed_dim}), got {x.shape}")
        b, t, e = x.shape
        h, d = self.num_heads, self.head_dim
        qkv = self.qkv(x)  # (b, t, 3e)
        q, k, v = (qkv[:, :, i * e:(i + 1) * e].reshape(b, t, h, d).permute(0, 2, 1, 3) for i in range(3))
        scores = F.matmul_nt(q, k) * (1.0 / math.sqrt(d))  # (b, h, t, t)
        if self.causal:
            scores = scores + self._mask(t)
        attn = self.dropout(F.softmax(scores, axis=-1))
        y = (attn @ v).permute(0, 2, 1, 3).reshape(b, t, e)
        return self.out(y)

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, causal={self.causal}"


class TransformerBlock(Module):
    """x + attn(norm(x)), then x + mlp(norm(x)) (pre-norm, GELU MLP of 4x width)."""

    def __init__(self, embed_dim: int, num_heads: int, causal: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm1 = LayerNorm(embed_dim)
        self.attn = MultiheadAttention(embed_dim, num_heads, causal, dropout)
        self.norm2 = LayerNorm(embed_dim)
        self.mlp = Sequential(Linear(embed_dim, 4 * embed_dim), GELU(), Linear(4 * embed_dim, embed_dim),
                              Dropout(dropout))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))
