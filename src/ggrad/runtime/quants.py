"""ggml's block-quantized types, as llama.cpp's files hold weights: each row of a matrix is
stored as blocks of 32 or 256 weights, a block a few bytes of scales and packed integers.

A quantized tensor's host form is one numpy item per block (a void type of the block's
bytes, named after the type, so that two types of one size stay apart). ggml's
own functions quantize and dequantize here (llama.cpp's reference code: what its quantize
tool writes and what its kernels read), so a check on the host sees the values a product
on the device multiplies by.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
from ggml import ggml as G


@dataclass(frozen=True)
class BlockType:
    """One quantized type: its name (ggrad's dtype name, llama.cpp's in lower case), ggml's
    type id, the weights per block and the numpy type of one block."""

    name: str
    ggml_type: int
    block: int
    storage: np.dtype

    @property
    def block_bytes(self) -> int:
        return self.storage.itemsize


def _block_type(name: str) -> BlockType:
    ggml_type = getattr(G, f"GGML_TYPE_{name.upper()}")
    storage = np.dtype([(name, f"V{G.ggml_type_size(ggml_type)}")])
    return BlockType(name, ggml_type, G.ggml_blck_size(ggml_type), storage)


# The types a frozen base weight may have: llama.cpp's legacy and K-quants, which need no
# importance matrix to make. Not IQ4_NL: ggml-vulkan's product of an IQ4_NL matrix by 6
# columns never finished on lavapipe (Mesa 25; 3 columns did), so CI cannot hold it.
BLOCK_TYPES = {t.name: t for t in map(_block_type, ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k",
                                                        "q6_k"))}
BY_GGML_TYPE = {t.ggml_type: t for t in BLOCK_TYPES.values()}


def quantize(array: np.ndarray, kind: BlockType) -> np.ndarray:
    """A (rows, columns) float array in `kind`'s blocks, (rows, columns / block), as
    llama.cpp's quantize tool makes them (ggml_quantize_chunk, no importance matrix)."""
    values = np.ascontiguousarray(array, dtype=np.float32)
    rows, cols = values.shape
    if cols <= 0 or cols % kind.block:
        raise ValueError(f"{kind.name} stores rows in blocks of {kind.block}: columns must be a positive multiple "
                         f"of {kind.block}, got {cols}")
    if not np.isfinite(values).all():
        raise ValueError(f"{kind.name}: the weights hold NaN or inf, which no block can hold")
    blocks = np.empty((rows, cols // kind.block), dtype=kind.storage)
    G.ggml_quantize_init(kind.ggml_type)
    written = G.ggml_quantize_chunk(kind.ggml_type, values.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                                    blocks.ctypes.data_as(ctypes.c_void_p), 0, rows, cols, None)
    if written != blocks.nbytes:
        raise RuntimeError(f"ggml wrote {written} bytes of {kind.name} for {blocks.nbytes} expected")
    if not np.isfinite(dequantize(blocks, kind)).all():  # a block's float16 scale overflows past ~65504 * step
        raise ValueError(f"{kind.name}: weights of magnitude up to {np.abs(values).max():.3g} overflow the "
                         "blocks' float16 scales")
    return blocks


def dequantize(blocks: np.ndarray, kind: BlockType) -> np.ndarray:
    """The float32 values of `kind`'s blocks, (rows, blocks per row * block), as ggml's
    kernels read them (its to_float)."""
    blocks = np.ascontiguousarray(blocks).view(kind.storage)
    out = np.empty(blocks.shape[:-1] + (blocks.shape[-1] * kind.block,), dtype=np.float32)
    to_float = G.ggml_get_type_traits(kind.ggml_type).contents.to_float
    to_float(blocks.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out.size)
    return out
