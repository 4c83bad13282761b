"""Launch limits: the sizes past which a ggml kernel cannot be started on a backend.

A GPU kernel runs as a grid of thread blocks, and a grid is limited per axis: CUDA allows
2**31 - 1 blocks along x but only 65,535 along y and z; Vulkan guarantees 65,535 along
each axis (lavapipe allows no more, NVIDIA's driver 2**31 - 1 along x). Several ggml
kernels size an axis of their grid by a tensor's size with no loop to cover the rest, and
ggml then aborts the whole process (ggml-cuda: "PAD failed / CUDA error: invalid
argument"; ggml-vulkan: GGML_ASSERT(wg0 <= maxComputeWorkGroupCount...)). ggml-vulkan
also refuses any tensor larger than the device's storage-buffer range.

`problem(kind, node)` says, before anything runs, why such a node could not be started:
the graph executor refuses it with that reason (a Python exception, never an abort), and
the op builders in ggrad shape or split their nodes so that they fit. The rules below are
read from ggml 0.15.3's launch code, one per kernel whose grid grows along a limited axis
(ggml-cuda/pad.cu, concat.cu, getrows.cu, binbcast.cu's repeat_back, softmax.cu,
cumsum.cu, argsort.cu, the batched products in mmvf.cu; ggml-vulkan's POOL_2D and products). Kernels that clamp
their grid and loop (get_rows, im2col, the copies, the broadcasting binary ops) or use a
one-dimensional grid (the unary ops, scale, pool_2d on CUDA, sum_rows) need none.
"""

from __future__ import annotations

import math

from ggml import ggml as G

GRID_YZ = 65535        # blocks along y and z: CUDA's limit, Vulkan's guaranteed minimum
VULKAN_GRID_X = 65535  # along x: Vulkan's guaranteed minimum (lavapipe's actual limit)
REPEAT_BACK_PLANES = 1 << 15  # ggml-cuda runs REPEAT_BACK over a source of at most this ne[2] * ne[3]
VULKAN_POOL_WORKGROUP = 512  # ggml-vulkan's pool2d pipeline: 512 outputs per workgroup
VULKAN_MATMUL_TILE = 32  # the narrowest tile of ggml-vulkan's products (its pipelines: 32 to 256)


def _ne(tensor) -> tuple[int, int, int, int]:
    return tuple(tensor.contents.ne)  # type: ignore[return-value]


def _src(node, i: int):
    return node.contents.src[i]


def _axes(what: str, **blocks: int) -> str | None:
    """The first axis whose block count passes the grid's limit, as a sentence."""
    for axis, count in blocks.items():
        limit = VULKAN_GRID_X if axis == "x" else GRID_YZ
        if count > limit:
            return f"{what} would need {count:,} blocks along the grid's {axis} axis (at most {limit:,})"
    return None


def _contiguous(node) -> bool:
    return bool(G.ggml_is_contiguous(node))


def _cuda(node) -> str | None:
    op = node.contents.op
    ne = _ne(node)
    if op == G.GGML_OP_PAD:
        return _axes("PAD", y=ne[1], z=ne[2] * ne[3])
    if op == G.GGML_OP_REPEAT_BACK:
        src = _ne(_src(node, 0))
        if src[2] * src[3] > REPEAT_BACK_PLANES:  # refused by its supports_op, not a launch
            return f"REPEAT_BACK of a source of {src[2] * src[3]:,} planes (at most {REPEAT_BACK_PLANES:,})"
        return _axes("REPEAT_BACK", y=ne[1], z=ne[2] * ne[3])
    if op == G.GGML_OP_GET_ROWS_BACK:
        return _axes("GET_ROWS_BACK", y=ne[1])
    if op == G.GGML_OP_CONCAT:
        a, b = _src(node, 0), _src(node, 1)
        if not (_contiguous(a) and _contiguous(b)):
            return _axes("CONCAT of strided operands", y=ne[2], z=ne[3])
        return None
    if op in (G.GGML_OP_SOFT_MAX, G.GGML_OP_CUMSUM):
        src = _ne(_src(node, 0))
        return _axes(G.ggml_op_name(op).decode(), y=src[2], z=src[3])
    if op == G.GGML_OP_ARGSORT:
        src = _ne(_src(node, 0))
        if src[0] > 1024:  # the CUB path starts a block row per sorted row
            return _axes("ARGSORT of rows longer than 1024", y=src[1] * src[2] * src[3])
        return None
    if op == G.GGML_OP_MUL_MAT:  # the vector and tiled kernels start a block row per matrix
        return _axes("MUL_MAT over a batch of matrices", y=ne[2], z=ne[3])
    return None


def _vulkan(node) -> str | None:
    op = node.contents.op
    if op == G.GGML_OP_POOL_2D:
        outputs = math.prod(_ne(node))
        return _axes("POOL_2D", x=-(-outputs // VULKAN_POOL_WORKGROUP))
    if op == G.GGML_OP_MUL_MAT:  # one workgroup per tile of 32 to 256 result columns along y
        return _axes("MUL_MAT", y=-(-_ne(node)[1] // VULKAN_MATMUL_TILE))
    return None


def product_rows(kind: str) -> int | None:
    """The most rows one matrix product's operand may have on a `kind` backend (the
    rows a convolution's window columns make), or None where there is no such limit."""
    return GRID_YZ * VULKAN_MATMUL_TILE if kind == "vulkan" else None


def problem(kind: str, node) -> str | None:
    """Why ggml's `kind` backend could not launch `node`'s kernel, or None if it can."""
    if kind == "cuda":
        return _cuda(node)
    if kind == "vulkan":
        return _vulkan(node)
    return None
