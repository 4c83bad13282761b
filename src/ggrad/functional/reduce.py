"""Reductions along axes, max and argmax, softmax and log-softmax."""

from __future__ import annotations

import numbers

import numpy as np

from ._core import Tensor, _apply, _as_tensor, _axis, _float, _out, _sum_to_rule, reshape
from .elementwise import affine, exp, log
from .layout import permute, transpose


# ---- reductions ----------------------------------------------------------------------------
def _reduce_axes(x: Tensor, axis) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(x.ndim))
    axes = (axis,) if isinstance(axis, numbers.Integral) else tuple(axis)
    axes = tuple(sorted({_axis(a, x.ndim) for a in axes}))
    return axes


def sum(x, axis=None, keepdims: bool = False) -> Tensor:
    x = _float(_as_tensor(x), "sum")
    axes = _reduce_axes(x, axis)
    keep = tuple(1 if i in axes else n for i, n in enumerate(x.shape))
    if keep == x.shape:
        return x
    shape = keep if keepdims else tuple(n for i, n in enumerate(x.shape) if i not in axes)
    return _apply("sum_to", (x,), shape, _sum_to_rule, keep)


def mean(x, axis=None, keepdims: bool = False) -> Tensor:
    x = _as_tensor(x)
    count = int(np.prod([x.shape[a] for a in _reduce_axes(x, axis)], dtype=np.int64))
    return affine(sum(x, axis, keepdims), 1.0 / count)


def _to_last(x: Tensor, axis: int) -> Tensor:
    if axis == x.ndim - 1:
        return x
    axes = [a for a in range(x.ndim) if a != axis] + [axis]
    return permute(x, axes)


def one_hot_argmax(x: Tensor) -> Tensor:
    """1.0 at the first maximum of each row (last axis), 0.0 elsewhere; no gradient."""
    return _apply("onehot_argmax", (x,), x.shape)


def max(x, axis=None, keepdims: bool = False) -> Tensor:
    """Largest value along an axis (or of all); the gradient goes to the first maximum."""
    x = _float(_as_tensor(x), "max")
    if axis is None:
        flat = reshape(x, (x.size,))
        out = sum(flat * one_hot_argmax(flat.detach()))
        return reshape(out, (1,) * x.ndim) if keepdims else out
    a = _axis(axis, x.ndim)
    last = _to_last(x, a)
    out = sum(last * one_hot_argmax(last.detach()), axis=-1)
    return _keep(out, x.shape, a) if keepdims else out


def _keep(out: Tensor, shape: tuple, axis: int) -> Tensor:
    return reshape(out, tuple(1 if i == axis else n for i, n in enumerate(shape)))


def argmax(x, axis: int = -1) -> Tensor:
    """Index (int32) of the first maximum along `axis`."""
    x = _float(_as_tensor(x), "argmax")
    last = _to_last(x, _axis(axis, x.ndim)) if x.ndim else reshape(x, (1,))
    return _apply("argmax", (last,), last.shape[:-1], None, dtype=np.int32)


def logsumexp(x, axis: int = -1, keepdims: bool = False) -> Tensor:
    x = _as_tensor(x)
    m = max(x, axis, keepdims=True).detach()
    out = log(sum(exp(x - m), axis, keepdims=True)) + m
    return out if keepdims else reshape(out, tuple(n for i, n in enumerate(x.shape) if i != _axis(axis, x.ndim)))


def softmax(x, axis: int = -1) -> Tensor:
    x = _float(_as_tensor(x), "softmax")
    a = _axis(axis, x.ndim)
    if a != x.ndim - 1:
        return transpose(softmax(transpose(x, a, -1)), a, -1)
    return _apply("softmax", (x,), x.shape, _softmax_rule)


def _softmax_rule(ctx, g):
    return (_apply("softmax_back", (g, _out(ctx)), g.shape),)


def log_softmax(x, axis: int = -1) -> Tensor:
    x = _float(_as_tensor(x), "log_softmax")
    a = _axis(axis, x.ndim)
    if a != x.ndim - 1:
        return transpose(log_softmax(transpose(x, a, -1)), a, -1)
    return _apply("log_softmax", (x,), x.shape,
                  lambda ctx, g: (_apply("log_softmax_back", (g, _out(ctx)), g.shape),))

