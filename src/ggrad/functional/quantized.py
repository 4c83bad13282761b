"""Frozen quantized weights (ggml's block types: Q4_0 ... Q8_0, the K-quants Q4_K, Q5_K,
Q6_K; runtime/quants.py) and the products that read them in place: a weight stays
in its blocks on the device (Q4_K: 144 bytes per 256 weights), and gradients flow through
it to the activations without a float copy of it being kept."""

from __future__ import annotations

import numpy as np

from .. import dtypes, lazy
from ..runtime import quants
from ..tensor import Tensor
from ._core import _apply


def _block_type(dtype) -> quants.BlockType:
    if not isinstance(dtype, dtypes.dtype) or not dtype.is_quantized:
        raise TypeError(f"a quantized dtype ({', '.join(dtypes.QUANTIZED)}) is needed, got {dtype!r}")
    return quants.BLOCK_TYPES[dtype.name]


def frozen_weight(weight, taker: str, what: str = "weight") -> Tensor:
    """`weight` where it is a quantized tensor, else a TypeError naming `taker`."""
    if not isinstance(weight, Tensor) or not weight.dtype.is_quantized:
        raise TypeError(f"{taker} takes a quantized {what} (quantize, from_blocks), got "
                        f"{getattr(weight, 'dtype', type(weight).__name__)}")
    return weight


def quantize(weight, dtype=dtypes.q8_0) -> Tensor:
    """A (rows, columns) float weight in `dtype`'s blocks (columns a multiple of its block:
    32, or 256 for the K-quants), as llama.cpp's quantize tool makes them."""
    kind = _block_type(dtype)
    array = np.asarray(weight.numpy() if isinstance(weight, Tensor) else weight, dtype=np.float32)
    if array.ndim != 2:
        raise ValueError(f"quantize to {kind.name} needs a (rows, columns) weight, got shape {array.shape}")
    return from_blocks(quants.quantize(array, kind), array.shape, dtype)


def from_blocks(blocks: np.ndarray, shape: tuple[int, int], dtype=dtypes.q8_0) -> Tensor:
    """A frozen weight of `shape` from its `dtype` blocks ((rows, columns / block) of them,
    or their bytes: a GGUF tensor's data); uploaded on first use, kept persistent."""
    kind = _block_type(dtype)
    rows, cols = (int(n) for n in shape)
    blocks = np.ascontiguousarray(blocks)
    if blocks.dtype.names and blocks.dtype != kind.storage:
        raise TypeError(f"from_blocks: blocks of {blocks.dtype.names[0]} given for a {kind.name} weight")
    if blocks.dtype != kind.storage:
        if blocks.nbytes % kind.block_bytes:
            raise ValueError(f"{blocks.nbytes} bytes are no whole number of {kind.name} blocks "
                             f"({kind.block_bytes} bytes each)")
        blocks = blocks.reshape(-1).view(np.uint8).view(kind.storage)
    if cols <= 0 or cols % kind.block or blocks.size != rows * (cols // kind.block):
        raise ValueError(f"{blocks.size} {kind.name} blocks do not hold a ({rows}, {cols}) weight "
                         f"({kind.block} weights a block)")
    blocks = blocks.reshape(rows, cols // kind.block)
    return Tensor._wrap(lazy.Node((rows, cols), dtype, host=blocks, scope="persistent"))


def block_bytes(weight: Tensor) -> np.ndarray:
    """A quantized weight's blocks as bytes, (rows, row bytes): the host copy it was made
    from while it has one, else downloaded."""
    _block_type(weight.dtype)
    host = weight.node.host
    blocks = np.ascontiguousarray(weight.numpy() if host is None else host)
    return blocks.view(np.uint8).reshape(blocks.shape[0], -1)


def dequantize(weight: Tensor) -> np.ndarray:
    """The float32 values a quantized weight stands for, as ggml's kernels read them (on
    the host: for checks and export)."""
    kind = _block_type(weight.dtype)
    return quants.dequantize(block_bytes(weight).view(kind.storage), kind).reshape(weight.shape)


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """x @ weight^T for a frozen quantized `weight` of shape (out, in); the gradient reaches x."""
    frozen_weight(weight, "quantized.linear")
    if not isinstance(x, Tensor) or not x.dtype.is_floating_point or x.ndim < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"quantized.linear: input of shape {getattr(x, 'shape', None)} for a weight of shape "
                         f"{weight.shape} (its last axis must be {weight.shape[1]}, floating point)")

    def rule(ctx, g):
        return _apply("matmul_q_back", (g, weight), x.shape, None, None, x.dtype), None
    return _apply("matmul_q", (x, weight), (*x.shape[:-1], weight.shape[0]), rule, None, x.dtype)


def embedding(index, weight: Tensor) -> Tensor:
    """Rows of a frozen quantized table for each id in `index` (float32; no gradient to the table)."""
    from .indexing import _integer_index, checked_index

    frozen_weight(weight, "quantized.embedding", "table")
    index = _integer_index(index, "embedding")
    if index.ndim + 1 > 4:
        raise ValueError("embedding index may have at most 3 dimensions")
    index = checked_index(index, weight.shape[0], "embedding index", "rows", False)
    return _apply("gather_rows_q", (weight, index), index.shape + weight.shape[1:], None, None, dtypes.float32)
