"""Attention: torch.nn.functional.scaled_dot_product_attention, and the masks it takes."""

from __future__ import annotations

import math

import numpy as np

from .. import dtypes
from ._core import Tensor, _as_tensor, _constant, _float, cast
from .compare import where
from .layout import matmul, matmul_nt
from .losses import dropout
from .reduce import softmax


def causal_mask(rows: int, cols: int) -> Tensor:
    """An additive (rows, cols) mask: 0 on and below the diagonal, -inf above (torch's
    is_causal: top-left aligned), made once per size and kept on the device."""
    return _constant(("causal", rows, cols),
                     lambda: np.triu(np.full((rows, cols), -np.inf, np.float32), k=1))


def additive_mask(mask, dtype, keep_true: bool) -> Tensor:
    """A float mask to add to attention scores: a bool mask becomes 0 / -inf (`keep_true`:
    True marks the positions that take part, SDPA's convention; else those masked out,
    MultiheadAttention's), a float mask is added as it is."""
    mask = _as_tensor(mask)
    if mask.dtype is dtypes.bool_:
        return where(mask, 0.0, -math.inf) if keep_true else where(mask, -math.inf, 0.0)
    return cast(_float(mask, "attention mask"), dtype)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: float | None = None, training: bool = True) -> Tensor:
    """softmax(q k^T * scale + mask) v over (..., L, E) queries and (..., S, E) keys, as
    torch's: a bool attn_mask marks with True the pairs that take part, a float one is
    added; is_causal masks keys after each query. A row with every key masked gives NaN,
    as torch's. Dropout (dropout_p > 0) applies while `training` (ggrad's addition:
    torch's functional form always drops)."""
    q, k, v = (_float(_as_tensor(t), "scaled_dot_product_attention") for t in (query, key, value))
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(f"scaled_dot_product_attention needs query, key and value of one rank >= 2, "
                         f"got {q.shape}, {k.shape}, {v.shape}")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"shape mismatch in scaled_dot_product_attention: query {q.shape}, key {k.shape}, "
                         f"value {v.shape}")
    if is_causal and attn_mask is not None:
        raise ValueError("scaled_dot_product_attention takes attn_mask or is_causal, not both (as torch)")
    scores = matmul_nt(q, k) * (1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale))
    if is_causal:
        scores = scores + causal_mask(q.shape[-2], k.shape[-2])
    elif attn_mask is not None:
        scores = scores + additive_mask(attn_mask, scores.dtype, keep_true=True)
    weights = softmax(scores, -1)
    if dropout_p > 0.0 and training:
        weights = dropout(weights, dropout_p)
    return matmul(weights, v)
