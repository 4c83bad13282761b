"""Frozen quantized weights (ggml's Q8_0) and the product that reads them in place: the
weight stays in its blocks on the device (34 bytes per 32 weights), and gradients flow
through it to the activations without a float copy of it being kept."""

from __future__ import annotations

import numpy as np

from .. import dtypes, lazy
from ..tensor import Tensor
from ._core import _apply

BLOCK = 32


def quantize(weight) -> Tensor:
    """A (rows, columns) float weight in Q8_0 blocks (columns a multiple of 32), as
    llama.cpp quantizes (the gguf package's reference quantizer)."""
    import gguf

    array = np.asarray(weight.numpy() if isinstance(weight, Tensor) else weight, dtype=np.float32)
    if array.ndim != 2 or array.shape[1] % BLOCK:
        raise ValueError(f"quantize needs a (rows, columns) weight with columns a multiple of {BLOCK}, got shape "
                         f"{array.shape}")
    raw = gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0)
    return from_blocks(np.ascontiguousarray(raw).view(dtypes.Q8_0_BLOCK), array.shape)


def from_blocks(blocks: np.ndarray, shape: tuple[int, int]) -> Tensor:
    """A frozen Q8_0 weight of `shape` from its blocks ((rows, columns / 32), e.g. a GGUF
    tensor's bytes viewed as `dtypes.Q8_0_BLOCK`); uploaded on first use, kept persistent."""
    rows, cols = (int(n) for n in shape)
    blocks = np.ascontiguousarray(blocks).view(dtypes.Q8_0_BLOCK)
    if cols % BLOCK or blocks.size != rows * (cols // BLOCK):
        raise ValueError(f"Q8_0 blocks of shape {blocks.shape} do not hold a ({rows}, {cols}) weight")
    blocks = blocks.reshape(rows, cols // BLOCK)
    return Tensor._wrap(lazy.Node((rows, cols), dtypes.q8_0, host=blocks, scope="persistent"))


def block_bytes(weight: Tensor) -> np.ndarray:
    """A Q8_0 weight's blocks as bytes, (rows, columns / 32 * 34): the host copy it was made
    from while it has one, else downloaded."""
    host = weight.node.host
    return np.ascontiguousarray(weight.numpy() if host is None else host).view(np.uint8)


def dequantize(weight: Tensor) -> np.ndarray:
    """The float32 values a Q8_0 weight stands for (on the host: for checks and export)."""
    import gguf

    raw = block_bytes(weight)
    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0).reshape(weight.shape)


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """x @ weight^T for a frozen Q8_0 `weight` of shape (out, in); the gradient reaches x."""
    if weight.dtype is not dtypes.q8_0:
        raise TypeError(f"quantized.linear takes a q8_0 weight (quantize, from_blocks), got {weight.dtype}")
    if not isinstance(x, Tensor) or not x.dtype.is_floating_point or x.ndim < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"quantized.linear: input of shape {getattr(x, 'shape', None)} for a weight of shape "
                         f"{weight.shape} (its last axis must be {weight.shape[1]}, floating point)")

    def rule(ctx, g):
        return _apply("matmul_q_back", (g, weight), x.shape, None, None, x.dtype), None
    return _apply("matmul_q", (x, weight), (*x.shape[:-1], weight.shape[0]), rule, None, x.dtype)


def embedding(index, weight: Tensor) -> Tensor:
    """Rows of a frozen Q8_0 table for each id in `index` (float32; no gradient to the table)."""
    from .indexing import _integer_index, checked_index

    if weight.dtype is not dtypes.q8_0:
        raise TypeError(f"quantized.embedding takes a q8_0 table, got {weight.dtype}")
    index = _integer_index(index, "embedding")
    if index.ndim + 1 > 4:
        raise ValueError("embedding index may have at most 3 dimensions")
    index = checked_index(index, weight.shape[0], "embedding index", "rows", False)
    return _apply("gather_rows_q", (weight, index), index.shape + weight.shape[1:], None, None, dtypes.float32)
