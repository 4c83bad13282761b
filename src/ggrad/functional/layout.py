"""Matrix products, layout (permute, transpose), indexing, joining, casts, one-hot."""

from __future__ import annotations

import numbers

import numpy as np

from .. import capture
from ._core import (F32, Tensor, _apply, _as_tensor, _axis, _float, broadcast_to, reshape, sum_to,
                    tensor)
from .elementwise import abs, affine, sign


# ---- matrices and layout -----------------------------------------------------------------
def matmul_nt(a: Tensor, b: Tensor) -> Tensor:
    """a @ b^T over the last two axes (ggml's native product: no transpose is built)."""
    _float(a, "matmul"), _float(b, "matmul")
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-1]:
        raise ValueError(f"shape mismatch in matmul: {a.shape} @ {b.shape[:-2] + b.shape[:-3:-1]}")
    batch_a, batch_b = a.shape[:-2], b.shape[:-2]
    try:
        batch = np.broadcast_shapes(batch_a, batch_b)
    except ValueError:
        raise ValueError(f"shape mismatch in matmul: batch dims {batch_a} and {batch_b} do not broadcast") from None
    if len(batch) + 2 > 4:
        raise ValueError("matmul supports at most 2 batch dimensions")
    if batch_a != batch:  # ggml broadcasts only the second operand's batch
        a = broadcast_to(a, batch + a.shape[-2:])
    if not all(n % m == 0 for n, m in zip(reversed(batch), reversed(batch_b))):
        b = broadcast_to(b, batch + b.shape[-2:])
    return _apply("matmul_nt", (a, b), batch + (a.shape[-2], b.shape[-2]), _matmul_nt_rule)


def _matmul_nt_rule(ctx, g):
    a, b = ctx.parents
    ga = sum_to(matmul_nt(g, transpose(b.detach())), a.shape) if a.requires_grad else None
    gb = sum_to(_matmul_tn(g, a.detach()), b.shape) if b.requires_grad else None
    return ga, gb


def _matmul_tn(x: Tensor, y: Tensor) -> Tensor:
    """x^T @ y over the last two axes, for equal batch dims (a product's weight gradient)."""
    return _apply("matmul_tn", (x, y), x.shape[:-2] + (x.shape[-1], y.shape[-1]))


def matmul(a, b) -> Tensor:
    """numpy's a @ b (1-D operands as vectors, batch dims broadcast)."""
    a, b = _as_tensor(a), _as_tensor(b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul needs operands of at least 1 dimension, got {a.shape} @ {b.shape}")
    if a.ndim == 1:
        return reshape(matmul(reshape(a, (1, a.shape[0])), b), b.shape[:-2] + b.shape[-1:])
    if b.ndim == 1:
        return reshape(matmul(a, reshape(b, (b.shape[0], 1))), a.shape[:-1])
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"shape mismatch in matmul: {a.shape} @ {b.shape}")
    return matmul_nt(a, transpose(b))


def permute(x, *axes) -> Tensor:
    x = _as_tensor(x)
    if len(axes) == 1 and not isinstance(axes[0], numbers.Integral):
        axes = tuple(axes[0])
    axes = tuple(_axis(a, x.ndim) for a in axes)
    if sorted(axes) != list(range(x.ndim)):
        raise ValueError(f"permute of a {x.ndim}-d tensor needs a permutation of its axes, got {axes}")
    if axes == tuple(range(x.ndim)):
        return x
    inverse = tuple(axes.index(i) for i in range(len(axes)))
    return _apply("permute", (x,), tuple(x.shape[a] for a in axes),
                  lambda ctx, g: (permute(g, inverse),), axes, x.dtype)


def transpose(x, dim0: int = -2, dim1: int = -1) -> Tensor:
    x = _as_tensor(x)
    if x.ndim < 2:
        return x
    if x.ndim == 2 and {dim0, dim1} in ({-2, -1}, {0, 1}):
        axes = (1, 0)
    else:
        axes = list(range(x.ndim))
        d0, d1 = _axis(dim0, x.ndim), _axis(dim1, x.ndim)
        axes[d0], axes[d1] = axes[d1], axes[d0]
        axes = tuple(axes)
    if x.node.pending and x.node.op == "permute" and x.node.arg == axes:  # a swap undoes itself
        if x._ctx is not None:
            return x._ctx.parents[0]
        if not x.requires_grad:
            return Tensor._wrap(x.node.srcs[0])
    return permute(x, axes)


# ---- indexing, joining ---------------------------------------------------------------------
def _slice(x: Tensor, axis: int, start: int, stop: int) -> Tensor:
    if start == 0 and stop == x.shape[axis]:
        return x
    shape = x.shape[:axis] + (stop - start,) + x.shape[axis + 1:]

    def rule(ctx, g):
        n = ctx.parents[0].shape[axis]
        return (_apply("pad", (g,), ctx.parents[0].shape, None, (axis, start, n - stop)),)
    return _apply("slice", (x,), shape, rule, (axis, start), x.dtype)


def getitem(x: Tensor, index) -> Tensor:
    """Integers and unit-step slices per axis (``x[2]``, ``x[a:b]``, ``x[:, a:b]``); an
    integer tensor gathers rows (``table[ids]``, an embedding lookup)."""
    if isinstance(index, Tensor) or (isinstance(index, (list, np.ndarray)) and not isinstance(index, tuple)):
        return gather(x, index)
    index = index if isinstance(index, tuple) else (index,)
    if len(index) > x.ndim:
        raise IndexError(f"too many indices ({len(index)}) for a tensor of shape {x.shape}")
    out, drop = x, []
    for axis, ix in enumerate(index):
        n = x.shape[axis]
        if isinstance(ix, numbers.Integral) and not isinstance(ix, bool):
            if not -n <= ix < n:
                raise IndexError(f"index {ix} is out of range for axis {axis} of size {n}")
            start = int(ix) % n
            out = _slice(out, axis, start, start + 1)
            drop.append(axis)
        elif isinstance(ix, slice):
            start, stop, stride = ix.indices(n)
            if stride != 1:
                raise ValueError("only slices with step 1 are supported")
            if stop <= start:
                raise IndexError(f"slice {ix} of axis {axis} (size {n}) is empty")
            out = _slice(out, axis, start, stop)
        else:
            raise TypeError(f"unsupported index {ix!r}: use ints, unit-step slices or an int tensor")
    if drop:
        out = reshape(out, tuple(n for i, n in enumerate(out.shape) if i not in drop))
    return out


def _check_range(index: Tensor, size: int, what: str, of: str) -> None:
    """Indices known on the host must lie in [0, size): ggml would read out of bounds.
    A captured step (ggrad.compile) runs the same check on every new batch."""
    def check(host: np.ndarray) -> None:
        if host.size and (host.min() < 0 or host.max() >= size):
            raise IndexError(f"{what} out of range for {size} {of} (min {host.min()}, max {host.max()})")
    if index.node.host is not None:
        check(index.node.host)
        capture.on_input(index.node, check)


def gather(table, index) -> Tensor:
    """Rows of `table` picked by integer `index` (any shape): the result has shape
    ``index.shape + table.shape[1:]``. The gradient sums into the picked rows."""
    table = _float(_as_tensor(table), "gather")
    index = _as_tensor(index)
    if index.dtype != np.int32:
        raise TypeError(f"gather needs an integer index, got {index.dtype}")
    if table.ndim != 2:
        raise ValueError(f"gather picks rows of a 2-d table, got shape {table.shape}")
    _check_range(index, table.shape[0], "gather index", "rows")
    if index.ndim + 1 > 4:
        raise ValueError("gather index may have at most 3 dimensions")

    def rule(ctx, g):
        t, ix = ctx.parents
        return _apply("scatter_rows", (g, ix), t.shape), None
    return _apply("gather_rows", (table, index), index.shape + table.shape[1:], rule)


def embedding(index, weight) -> Tensor:
    """PyTorch's F.embedding: rows of `weight` for each id in `index`."""
    return gather(weight, index)


def concat(tensors, axis: int = 0) -> Tensor:
    tensors = [_float(_as_tensor(t), "concat") for t in tensors]
    if not tensors:
        raise ValueError("concat needs at least one tensor")
    first = tensors[0]
    a = _axis(axis, first.ndim)
    for t in tensors[1:]:
        if t.ndim != first.ndim or any(p != q for i, (p, q) in enumerate(zip(t.shape, first.shape)) if i != a):
            raise ValueError(f"shape mismatch in concat along axis {a}: {first.shape} and {t.shape}")
    out = first
    for t in tensors[1:]:
        out = _concat2(out, t, a)
    return out


def _concat2(x: Tensor, y: Tensor, axis: int) -> Tensor:
    n = x.shape[axis]
    shape = x.shape[:axis] + (n + y.shape[axis],) + x.shape[axis + 1:]

    def rule(ctx, g):
        return _slice(g, axis, 0, n), _slice(g, axis, n, shape[axis])
    return _apply("concat", (x, y), shape, rule, axis)


def where(condition, a, b) -> Tensor:
    """a where condition is nonzero, else b (condition is not differentiated). Written as
    c*a + (1-c)*b, so an infinite value in the branch not taken still yields NaN."""
    c = _as_tensor(condition)
    c = cast(c, np.float32) if c.dtype != F32 else c
    c = sign(abs(c.detach()))
    return c * a + affine(c, -1.0, 1.0) * b


def cast(x, dtype) -> Tensor:
    x = _as_tensor(x)
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.float32), np.dtype(np.int32)):
        raise TypeError(f"cast supports float32 and int32, got {dtype}")
    if x.dtype == dtype:
        return x
    return _apply("cast", (x,), x.shape, None, dtype=dtype)


def fill(x: Tensor, value: float) -> Tensor:
    """A float tensor shaped like `x`, every element `value` (made on the device)."""
    return _apply("fill", (_float(x, "fill"),), x.shape, None, float(value))


# Up to this many classes, one_hot picks rows of a kept identity matrix (one ggml node);
# past it, it compares indices with a range (seven nodes, no num_classes^2 memory).
IDENTITY_MAX = 1024
_identities: dict[int, Tensor] = {}


def one_hot(index, num_classes: int) -> Tensor:
    index = _as_tensor(index)
    if index.dtype != np.int32:
        raise TypeError(f"one_hot needs integer classes, got {index.dtype}")
    if index.ndim + 1 > 4:
        raise ValueError("one_hot index may have at most 3 dimensions")
    _check_range(index, num_classes, "class index", "classes")
    num_classes = int(num_classes)
    if num_classes <= IDENTITY_MAX:
        identity = _identities.get(num_classes)
        if identity is None:  # uploaded once per device, then read where it is
            identity = _identities[num_classes] = tensor(np.eye(num_classes, dtype=np.float32))
        return _apply("gather_rows", (identity, index), index.shape + (num_classes,))
    return _apply("onehot", (index,), index.shape + (num_classes,), None, num_classes)

