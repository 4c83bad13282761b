"""Attention: torch.nn.functional.scaled_dot_product_attention, and the masks it takes."""

from __future__ import annotations

import math

import numpy as np
from ggml import ggml as G

from .. import dtypes
from .. import ops
from ..ops import (compute, computed_by, contiguous, fuses_attention, reshape, soft_max, softmax_low, softmax_low_back,
                   softmax_low_source, writes_weights_low)
from ..runtime import precision
from . import _core
from ._core import Tensor, _apply, _as_tensor, _constant, _float, _out, cast
from .compare import gt, where
from .layout import matmul, matmul_nt
from .losses import dropout
from .reduce import any as any_of, softmax


def causal_mask(rows: int, cols: int, dtype=dtypes.float32) -> Tensor:
    """An additive (rows, cols) mask of the scores' `dtype` (a float32 one would promote
    half-precision scores): 0 on and below the diagonal, -inf above (torch's is_causal:
    top-left aligned), made once per size and kept on the device."""
    mask = _constant(("causal", rows, cols), lambda: np.triu(np.full((rows, cols), -np.inf, np.float32), k=1))
    return cast(mask, dtype)


def additive_mask(mask, dtype, keep_true: bool) -> Tensor:
    """A mask of `dtype` to add to attention scores: a bool mask becomes 0 / -inf
    (`keep_true`: True marks the positions that take part, SDPA's convention; else those
    masked out, MultiheadAttention's), a float mask is added as it is."""
    mask = _as_tensor(mask)
    if mask.dtype is dtypes.bool_:
        mask = where(mask, 0.0, -math.inf) if keep_true else where(mask, -math.inf, 0.0)
    return cast(_float(mask, "attention mask"), dtype)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: float | None = None, training: bool = True) -> Tensor:
    """softmax(q k^T * scale + mask) v over (..., L, E) queries and (..., S, E) keys, as
    torch's: a bool attn_mask marks with True the pairs that take part, a float one is
    added; is_causal masks keys after each query. A query whose every key attn_mask masks
    gets zeros and zero gradients, as torch's (2.5+, its _safe_softmax; a softmax gives NaN
    there, as MultiheadAttention still does in torch). Dropout (dropout_p > 0) applies while
    `training` (ggrad's addition: torch's functional form always drops)."""
    q, k, v = (_float(_as_tensor(t), "scaled_dot_product_attention") for t in (query, key, value))
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(f"scaled_dot_product_attention needs query, key and value of one rank >= 2, "
                         f"got {q.shape}, {k.shape}, {v.shape}")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"shape mismatch in scaled_dot_product_attention: query {q.shape}, key {k.shape}, "
                         f"value {v.shape}")
    if is_causal and attn_mask is not None:
        raise ValueError("scaled_dot_product_attention takes attn_mask or is_causal, not both (as torch)")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if attn_mask is None and not (dropout_p > 0.0 and training):
        fused = _fused_attention(q, k, v, scale, is_causal)
        if fused is not None:
            return fused
    scores = matmul_nt(q, k)
    if attn_mask is None:
        mask = causal_mask(q.shape[-2], k.shape[-2], scores.dtype) if is_causal else None
        weights = attention_weights(scores, scale, mask, for_product=not (dropout_p > 0.0 and training))
    else:  # rows with no key left: a zero mask (finite weights, finite gradients), then zeros
        mask = additive_mask(attn_mask, scores.dtype, keep_true=True)
        kept = any_of(gt(mask, -math.inf), -1, keepdim=True) if mask.ndim else gt(mask, -math.inf)
        weights = attention_weights(scores, scale, where(kept, mask, 0.0)) * cast(kept, scores.dtype)
    if dropout_p > 0.0 and training:
        weights = dropout(weights, dropout_p)
    return matmul(weights, v)


def _fused_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool) -> Tensor | None:
    """scaled_dot_product_attention without a mask (or is_causal's) or dropout as one kernel each
    way (set 59, CUDA) where autocast runs in a 16-bit type over float32 q (..., L, D), k, v
    (..., S, D) of one or two batch axes, heads of 32, 64 or 128; else None (composed)."""
    low = precision.autocast_dtype()
    if low is None or any(t.dtype is not dtypes.float32 for t in (q, k, v)) or q.ndim not in (3, 4) \
            or k.shape != v.shape or q.shape[:-2] != k.shape[:-2] or q.shape[-1] not in (32, 64, 128) \
            or max(q.shape[:-2]) > 65535 or max(q.shape[-2], k.shape[-2]) > 2 ** 30 or not fuses_attention():
        return None
    return _apply("attention", (q, k, v), q.shape, _attention_rule, (scale, bool(causal), low.storage), dtypes.float32)


def _attention_rule(ctx, g):
    q, k, v = ctx.parents
    n_q, n_kv = math.prod(q.shape), math.prod(k.shape)
    grads = _apply("attention_back", (g, _out(ctx), q.detach(), k.detach(), v.detach()), (n_q + 2 * n_kv,), None,
                   ctx.arg, g.dtype)  # dq, then dk and dv, each contiguous
    return (_core.reshape(grads[:n_q], q.shape), _core.reshape(grads[n_q:n_q + n_kv], k.shape),
            _core.reshape(grads[n_q + n_kv:], v.shape))


@compute("attention")
def _attention(ctx, s, node):
    q = s[0]
    d, length, heads, batch = (q.contents.ne[i] for i in range(4))
    made = ops.attention(ctx, *s, *node.arg)
    if made is None:
        raise RuntimeError(f"the backend refuses ggrad's attention kernel for {node.shape}")
    # the output (B, L, H, D) seen as (B, H, L, D): merging its heads afterwards copies nothing
    return G.ggml_view_4d(ctx, made, d, length, heads, batch, heads * d * 4, d * 4, length * heads * d * 4, 0)


@compute("attention_back")
def _attention_back(ctx, s, node):
    g, out, q, k, v = s
    scale, causal, storage = node.arg
    made = ops.attention_node(out, lambda: ops.attention(ctx, q, k, v, scale, causal, storage))
    return G.ggml_reshape_1d(ctx, ops.attention_back(ctx, made, g, scale, causal, False), node.shape[0])


def self_attention(qkv: Tensor, heads: int, scale: float, causal: bool) -> Tensor | None:
    """MultiheadAttention's self-attention over its fused projection's output `qkv` (N, L, 3E),
    q, k, v side by side: the (N, L, E) output, heads merged, as one kernel each way (set 59,
    CUDA: the scores and weights never written) where autocast runs in a 16-bit type, the
    heads are 32, 64 or 128 wide and the backend has the kernels; else None (the caller
    composes, as every other backend does). softmax(q k^T * scale) v, keys after each query
    masked where `causal`; the weights meet v rounded to the low type, as the composed
    product's cast rounds them."""
    low = precision.autocast_dtype()
    if low is None or qkv.dtype is not dtypes.float32 or qkv.ndim != 3 or qkv.shape[-1] % (3 * heads):
        return None
    n, length, e3 = qkv.shape
    if e3 // (3 * heads) not in (32, 64, 128) or n > 65535 or heads > 65535 or length > 2 ** 30 \
            or not fuses_attention():
        return None
    return _apply("self_attention", (qkv,), (n, length, e3 // 3), _self_attention_rule,
                  (heads, float(scale), bool(causal), low.storage), dtypes.float32)


def _self_attention_rule(ctx, g):
    (qkv,) = ctx.parents
    return (_apply("self_attention_back", (g, _out(ctx), qkv.detach()), qkv.shape, None, ctx.arg, g.dtype),)


@compute("self_attention")
def _self_attention(ctx, s, node):
    out = ops.self_attention(ctx, s[0], *node.arg)
    if out is None:
        raise RuntimeError(f"the backend refuses ggrad's attention kernel for {node.shape} ({node.arg[0]} heads)")
    return out


@compute("self_attention_back")
def _self_attention_back(ctx, s, node):
    return ops.self_attention_back(ctx, s[0], s[1], s[2], *node.arg)


def attention_weights(scores: Tensor, scale: float, mask: Tensor | None = None, for_product: bool = False) -> Tensor:
    """softmax(scores * scale + mask) over the last axis. Where the mask is none or a
    constant (L, S) one (is_causal's), one node each way: ggml's SOFT_MAX scales and masks
    inside it, and its gradient scales (a transformer block's two SCALE nodes over every
    score, 90 us of an H200's bf16 step, leave); else the composed ops.
    `for_product`: the weights feed only their product with the values (no dropout, not
    returned). Under autocast that product reads them in the low dtype, and where the
    backend has ggrad's kernels (set 57) the softmax writes them so, each float32 weight
    rounded once as the product's cast would round it; float32 weights are neither written
    nor cast. Their gradient computes the float32 weights again from each row's max and 1/sum."""
    folds = mask is None or (mask.shape == tuple(scores.shape[-2:]) and not mask.requires_grad)
    if not folds:
        return softmax(scores * scale + mask, -1)
    # float32 scores only (a float16 score's weights would be rounded twice), and only where
    # the backend has the kernels: elsewhere the backward needs no scores of its own
    low = precision.autocast_dtype() if for_product and scores.dtype is dtypes.float32 and writes_weights_low() else None
    inputs = (scores,) if mask is None else (scores, mask)
    arg = (float(scale), low.storage if low is not None else None)
    return _apply("scaled_softmax", inputs, scores.shape, _scaled_softmax_rule, arg, scores.dtype)


def _scaled_softmax_rule(ctx, g):
    # with the weights written low, the scores (and mask) too: a gradient built where the
    # forward's nodes are gone (its values kept) computes the float32 weights again from them
    sources = ctx.parents if ctx.arg[1] is not None else ()
    grad = _apply("scaled_softmax_back", (g, _out(ctx)) + tuple(t.detach() for t in sources), g.shape, None, ctx.arg,
                  g.dtype)
    return (grad,) + (None,) * (len(ctx.parents) - 1)


@compute("scaled_softmax")
def _scaled_softmax(ctx, s, node):
    scale, low = node.arg
    mask = contiguous(ctx, s[1]) if len(s) > 1 else None
    scores = contiguous(ctx, s[0])
    written = softmax_low(ctx, scores, mask, scale, low) if low is not None else None
    return written if written is not None else soft_max(ctx, scores, mask, scale)


@compute("scaled_softmax_back")
def _scaled_softmax_back(ctx, s, node):
    """As ops' softmax_back (y flagged an output: see its note), the gradient scaled; from
    the kernel's row statistics where the forward wrote the weights low in this graph, or
    from the weights computed again in float32 where it wrote them low in another."""
    grad, y = s[:2]
    scale, low = node.arg
    probs = softmax_low_source(y)
    if probs is not None:
        return softmax_low_back(ctx, probs, grad)
    if low is not None and not computed_by(y, G.GGML_OP_SOFT_MAX):  # kept values, maybe the rounded ones
        y = soft_max(ctx, contiguous(ctx, s[2]), contiguous(ctx, s[3]) if len(s) > 3 else None, scale)
    y.contents.flags |= G.GGML_TENSOR_FLAG_OUTPUT
    return G.ggml_soft_max_ext_back(ctx, grad, y, scale, 0.0)


def rotary_embedding(x, positions=None, base: float = 10000.0, interleaved: bool = False) -> Tensor:
    """Rotary position embedding of (batch, time, heads, head_dim) or (time, heads,
    head_dim) queries or keys: pair j of position p turns by p * base^(-2j / head_dim).
    Pairs are (j, j + head_dim / 2) (GPT-NeoX's rotate-half), or adjacent entries (2j,
    2j + 1) with `interleaved` (llama.cpp's llama models). One ggml ROPE node each way.
    `positions`: integer (time,), 0..time-1 by default."""
    x = _float(_as_tensor(x), "rotary_embedding")
    if x.ndim not in (3, 4) or x.shape[-1] % 2:
        raise ValueError(f"rotary_embedding needs (batch, time, heads, head_dim) or (time, heads, head_dim) with an "
                         f"even head_dim, got {x.shape}")
    time = x.shape[-3]
    if positions is None:
        positions = _constant(("positions", time), lambda: np.arange(time, dtype=np.int32))
    positions = _as_tensor(positions)
    if positions.shape != (time,) or positions.dtype.is_floating_point or positions.dtype is dtypes.bool_:
        raise ValueError(f"positions must be {time} integers, got {positions.dtype} of shape {positions.shape}")
    arg = (2 if not interleaved else 0, float(base))
    return _apply("rope", (x, positions), x.shape, _rope_rule, arg, x.dtype)


def _rope_rule(ctx, g):
    return _apply("rope_back", (g, ctx.parents[1]), g.shape, None, ctx.arg, g.dtype), None


def _rope(ctx, s, node, fn):
    x, positions = s
    mode, base = node.arg
    x = reshape(ctx, x, (1,) * (4 - len(node.shape)) + node.shape) if len(node.shape) == 3 else x
    rotated = fn(ctx, x, positions, None, node.shape[-1], mode, 0, base, 1.0, 0.0, 1.0, 0.0, 0.0)
    return reshape(ctx, rotated, node.shape)


compute("rope", keep_int=True)(lambda ctx, s, node: _rope(ctx, s, node, G.ggml_rope_ext))
compute("rope_back", keep_int=True)(lambda ctx, s, node: _rope(ctx, s, node, G.ggml_rope_ext_back))
