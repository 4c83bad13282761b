"""Reductions along axes, max and argmax, softmax and log-softmax."""

from __future__ import annotations

import math
import numbers

import numpy as np

from .. import dtypes
from ._core import Tensor, _apply, _as_tensor, _axis, _float, _out, _sum_to_rule, cast, reshape
from .elementwise import affine, exp, log
from .layout import matmul, permute, transpose


# ---- reductions (torch's dim=/keepdim=, numpy's axis=/keepdims= alike) ---------------------
def _dims(dim, axis):
    if axis is not None:
        if dim is not None:
            raise TypeError("pass dim or axis, not both")
        return axis
    return dim


def _keep(keepdim: bool, keepdims) -> bool:
    return bool(keepdim if keepdims is None else keepdims)


def _reduce_axes(x: Tensor, axis) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(x.ndim))
    axes = (axis,) if isinstance(axis, numbers.Integral) else tuple(axis)
    axes = tuple(sorted({_axis(a, x.ndim) for a in axes}))
    return axes


def sum(x, dim=None, keepdim: bool = False, *, axis=None, keepdims=None, dtype=None) -> Tensor:
    """Sum over `dim` (all by default). Integer and bool tensors sum to int64, as torch."""
    x = _as_tensor(x)
    if dtype is not None:
        x = cast(x, dtype)
    out_dtype = x.dtype if x.dtype.is_floating_point else dtypes.int64
    axes = _reduce_axes(x, _dims(dim, axis))
    keep = tuple(1 if i in axes else n for i, n in enumerate(x.shape))
    shape = keep if _keep(keepdim, keepdims) else tuple(n for i, n in enumerate(x.shape) if i not in axes)
    if keep == x.shape:  # only axes of size 1: nothing to add, but they still go
        out = x if x.dtype is out_dtype else cast(x, out_dtype)
        return out if shape == x.shape else reshape(out, shape)
    return _apply("sum_to", (x,), shape, _sum_to_rule, keep, out_dtype)


def mean(x, dim=None, keepdim: bool = False, *, axis=None, keepdims=None, dtype=None) -> Tensor:
    x = _as_tensor(x)
    if dtype is not None:
        x = cast(x, dtype)
    _float(x, "mean")
    dim = _dims(dim, axis)
    count = int(np.prod([x.shape[a] for a in _reduce_axes(x, dim)], dtype=np.int64))
    return affine(sum(x, dim, _keep(keepdim, keepdims)), 1.0 / count)


def var(x, dim=None, keepdim: bool = False, *, correction=1, unbiased=None, axis=None, keepdims=None) -> Tensor:
    """Variance with Bessel's correction by default (torch's), `correction=0` biased."""
    x = _float(_as_tensor(x), "var")
    if unbiased is not None:
        correction = 1 if unbiased else 0
    dim = _dims(dim, axis)
    count = int(np.prod([x.shape[a] for a in _reduce_axes(x, dim)], dtype=np.int64))
    centered = x - mean(x, dim, keepdim=True)
    total = sum(centered * centered, dim, _keep(keepdim, keepdims))
    return affine(total, 1.0 / (count - correction) if count > correction else math.nan)


def std(x, dim=None, keepdim: bool = False, *, correction=1, unbiased=None, axis=None, keepdims=None) -> Tensor:
    from .elementwise import sqrt
    return sqrt(var(x, dim, keepdim, correction=correction, unbiased=unbiased, axis=axis, keepdims=keepdims))


def norm(x, p=2, dim=None, keepdim: bool = False) -> Tensor:
    """The vector p-norm over `dim` (all elements by default): p = 2, 1, inf, -inf, or any
    other positive number."""
    from .elementwise import abs, pow, sqrt
    x = _float(_as_tensor(x), "norm")
    if p == "fro":
        p = 2
    p = float(p)
    if p == 2:
        return sqrt(sum(x * x, dim, keepdim))
    if p == 1:
        return sum(abs(x), dim, keepdim)
    if p == math.inf:
        return max(abs(x), dim, keepdim)
    if p == -math.inf:
        return min(abs(x), dim, keepdim)
    if not p > 0:
        raise ValueError(f"norm: p must be positive, 'fro' or +-inf, got {p}")
    return pow(sum(pow(abs(x), p), dim, keepdim), 1.0 / p)


def _to_last(x: Tensor, axis: int) -> Tensor:
    if axis == x.ndim - 1:
        return x
    axes = [a for a in range(x.ndim) if a != axis] + [axis]
    return permute(x, axes)


def _from_last(x: Tensor, axis: int) -> Tensor:
    """Undo `_to_last` on a tensor of the same rank."""
    if axis == x.ndim - 1:
        return x
    axes = list(range(x.ndim - 1))
    axes.insert(axis, x.ndim - 1)
    return permute(x, axes)


def one_hot_argmax(x: Tensor) -> Tensor:
    """1.0 at the first maximum of each row (last axis), 0.0 elsewhere; no gradient."""
    return _apply("onehot_argmax", (x,), x.shape, dtype=x.dtype)


def max(x, dim=None, keepdim: bool = False, *, axis=None, keepdims=None) -> Tensor:
    """Largest value along `dim` (or of all); the gradient goes to the first maximum.
    (Tensor.max(dim) returns values and indices, as torch's.)"""
    x = _as_tensor(x)
    if x.dtype is dtypes.bool_:
        from .compare import any
        return any(x, _dims(dim, axis), _keep(keepdim, keepdims))
    dim, keepdim = _dims(dim, axis), _keep(keepdim, keepdims)
    if dim is None:
        flat = reshape(x, (x.numel(),))
        out = cast(sum(flat * one_hot_argmax(flat.detach())), x.dtype)  # an int sum is int64
        return reshape(out, (1,) * x.ndim) if keepdim else out
    a = _axis(dim, x.ndim)
    last = _to_last(x, a)
    out = cast(sum(last * one_hot_argmax(last.detach()), -1), x.dtype)
    return _keepdim(out, x.shape, a) if keepdim else out


def min(x, dim=None, keepdim: bool = False, *, axis=None, keepdims=None) -> Tensor:
    x = _as_tensor(x)
    if x.dtype is dtypes.bool_:
        from .compare import all
        return all(x, _dims(dim, axis), _keep(keepdim, keepdims))
    return -max(-x, dim, keepdim, axis=axis, keepdims=keepdims)


amax, amin = max, min


def _keepdim(out: Tensor, shape: tuple, axis: int) -> Tensor:
    return reshape(out, tuple(1 if i == axis else n for i, n in enumerate(shape)))


def argmax(x, dim=None, keepdim: bool = False, *, axis=None) -> Tensor:
    """Index (int64) of the first maximum along `dim`; of the flattened tensor by default."""
    x = _as_tensor(x)
    dim = _dims(dim, axis)
    if dim is None:
        out = argmax(reshape(x, (x.numel(),)), 0)
        return reshape(out, (1,) * x.ndim) if keepdim and x.ndim else out
    a = _axis(dim, x.ndim) if x.ndim else 0
    last = _to_last(x, a) if x.ndim else reshape(x, (1,))
    out = _apply("argmax", (last,), last.shape[:-1], None, dtype=dtypes.int64)
    return _keepdim(out, x.shape, a) if keepdim and x.ndim else out


def argmin(x, dim=None, keepdim: bool = False, *, axis=None) -> Tensor:
    x = _as_tensor(x)
    return argmax(-x if x.dtype is not dtypes.bool_ else ~x, dim, keepdim, axis=axis)


def cumsum(x, dim: int, *, dtype=None) -> Tensor:
    """Running sums along `dim` (ggml's CUMSUM); integers and bools give int64."""
    x = _as_tensor(x)
    if dtype is not None:
        x = cast(x, dtype)
    out_dtype = x.dtype if x.dtype.is_floating_point else dtypes.int64
    a = _axis(dim, x.ndim) if x.ndim else 0
    if x.ndim == 0:
        return cast(x, out_dtype)
    last = _to_last(x, a)

    def rule(ctx, g):  # d/dx_i of sum_{j>=i}: the reversed running sum of g
        total = sum(g, -1, keepdim=True)
        return (total - cumsum(g, -1) + g,)
    out = _apply("cumsum", (last,), last.shape, rule, dtype=out_dtype)
    return _from_last(out, a)


def sort(x, dim: int = -1, descending: bool = False):
    """(values, indices) along `dim`, ascending unless `descending` (ggml's ARGSORT;
    the order of equal elements is not specified, as torch's default)."""
    x = _as_tensor(x)
    a = _axis(dim, x.ndim)
    last = _to_last(x, a)
    index = _apply("argsort", (last,), last.shape, None, bool(descending), dtypes.int64)
    values = take_along_last(last, index)
    return _from_last(values, a), _from_last(index, a)


def argsort(x, dim: int = -1, descending: bool = False) -> Tensor:
    return sort(x, dim, descending)[1]


def topk(x, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
    """(values, indices) of the k largest (or smallest) along `dim`, in sorted order."""
    x = _as_tensor(x)
    a = _axis(dim, x.ndim)
    if not isinstance(k, numbers.Integral) or not 1 <= k <= x.shape[a]:
        raise ValueError(f"topk: k must be in [1, {x.shape[a]}] for dim {dim} of shape {x.shape}, got {k}")
    values, index = sort(x, a, descending=largest)
    if k == x.shape[a]:
        return values, index
    from .layout import narrow
    return narrow(values, a, 0, k), narrow(index, a, 0, k)


def take_along_last(x: Tensor, index: Tensor) -> Tensor:
    """x[..., index[..., j]] per row (last axis): values picked by integer indices of
    another tensor; the gradient sums into the picked places."""
    rows = int(np.prod(x.shape[:-1], dtype=np.int64))
    if index.shape[:-1] != x.shape[:-1]:
        raise ValueError(f"take_along_last: index {index.shape} and x {x.shape} differ before the last axis")
    if len(x.shape) + 1 > 4 and rows > 1:
        raise ValueError("take_along_last supports tensors of at most 3 dimensions")

    def rule(ctx, g):
        from .indexing import one_hot
        src, ix = ctx.parents
        hot = one_hot(ix, src.shape[-1])  # (..., k, n)
        g_rows = reshape(g, (rows, 1, g.shape[-1]))
        spread = reshape(matmul(g_rows, reshape(cast(hot, g.dtype), (rows,) + hot.shape[-2:])), src.shape)
        return spread, None
    return _apply("take_rows", (x, index), index.shape, rule, dtype=x.dtype)


def logsumexp(x, dim: int = -1, keepdim: bool = False, *, axis=None, keepdims=None) -> Tensor:
    x = _as_tensor(x)
    axis, keepdims = (dim if axis is None else axis), _keep(keepdim, keepdims)
    m = max(x, axis, keepdims=True).detach()
    out = log(sum(exp(x - m), axis, keepdims=True)) + m
    return out if keepdims else reshape(out, tuple(n for i, n in enumerate(x.shape) if i != _axis(axis, x.ndim)))


def softmax(x, dim: int = -1, *, axis=None) -> Tensor:
    x = _float(_as_tensor(x), "softmax")
    a = _axis(dim if axis is None else axis, x.ndim)
    if a != x.ndim - 1:
        return transpose(softmax(transpose(x, a, -1)), a, -1)
    return _apply("softmax", (x,), x.shape, _softmax_rule, dtype=x.dtype)


def _softmax_rule(ctx, g):
    return (_apply("softmax_back", (g, _out(ctx)), g.shape, dtype=g.dtype),)


def log_softmax(x, dim: int = -1, *, axis=None) -> Tensor:
    x = _float(_as_tensor(x), "log_softmax")
    a = _axis(dim if axis is None else axis, x.ndim)
    if a != x.ndim - 1:
        return transpose(log_softmax(transpose(x, a, -1)), a, -1)
    return _apply("log_softmax", (x,), x.shape,
                  lambda ctx, g: (_apply("log_softmax_back", (g, _out(ctx)), g.shape, dtype=g.dtype),),
                  dtype=x.dtype)
