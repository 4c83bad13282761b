"""Comparisons, masks and selection: bool results (stored as float 0/1), `where`,
`masked_fill`, the logical operators and the NaN/inf tests. Comparisons compute in
float32 (integers exactly up to 2**24), with IEEE semantics: NaN is unequal to
everything, inf equals inf."""

from __future__ import annotations

import math
import numbers

import numpy as np

from .. import dtypes
from ._core import (F32, Tensor, _apply, _as_tensor, _broadcast, _constant, _is_scalar, broadcast_shape, cast, full_like,
                    result_type, sum_to)

BOOL = dtypes.bool_


def _compare(kind: str, a, b) -> Tensor:
    if _is_scalar(a):  # 2 < x is x > 2
        a, b, kind = b, a, {"lt": "gt", "gt": "lt", "le": "ge", "ge": "le"}.get(kind, kind)
    a = _as_tensor(a)
    if _is_scalar(b):
        value = float(b)
        if math.isnan(value):  # nothing equals NaN
            return _fill_bool(a, kind == "ne")
        value = _f32(value)
        return _apply("compare", (a,), a.shape, None, (kind, value), BOOL)
    b = _as_tensor(b)
    return _apply("compare", (a, b), _broadcast(a, b, kind), None, (kind, 0.0), BOOL)


def _f32(value: float) -> float:
    """The scalar as the comparison sees it: rounded to float32, as torch casts a Python
    scalar to a float32 tensor's dtype (an integer tensor compares in float32 too)."""
    with np.errstate(over="ignore"):
        return float(np.float32(value))


def _fill_bool(like: Tensor, value: bool) -> Tensor:
    return full_like(like, 1.0 if value else 0.0, BOOL)


def eq(a, b) -> Tensor:
    return _compare("eq", a, b)


def ne(a, b) -> Tensor:
    return _compare("ne", a, b)


def lt(a, b) -> Tensor:
    return _compare("lt", a, b)


def le(a, b) -> Tensor:
    return _compare("le", a, b)


def gt(a, b) -> Tensor:
    return _compare("gt", a, b)


def ge(a, b) -> Tensor:
    return _compare("ge", a, b)


def _as_bool(x) -> Tensor:
    x = _as_tensor(x)
    return x if x.dtype is BOOL else ne(x, 0)


def _logical(op: str, a, b) -> Tensor:
    a, b = _as_bool(a), _as_bool(b)
    shape = _broadcast(a, b, op)
    if op == "and":
        return _apply("mul", (a, b), shape, None, dtype=BOOL)
    if op == "xor":
        return _apply("compare", (a, b), shape, None, ("ne", 0.0), BOOL)
    return _apply("compare", (_apply("add", (a, b), shape, None, dtype=F32),), shape, None, ("gt", 0.0), BOOL)


def logical_and(a, b) -> Tensor:
    return _logical("and", a, b)


def logical_or(a, b) -> Tensor:
    return _logical("or", a, b)


def logical_xor(a, b) -> Tensor:
    return _logical("xor", a, b)


def logical_not(x) -> Tensor:
    x = _as_bool(x)
    return _apply("affine", (x,), x.shape, None, (-1.0, 1.0), BOOL)


def _bitwise(op: str, a, b) -> Tensor:
    """&, |, ^ as torch defines them on bool tensors (integers: not supported here)."""
    for x in (a, b):
        dt = x.dtype if isinstance(x, Tensor) else dtypes.scalar_dtype(x)
        if dt is not BOOL:
            raise TypeError(f"{op} is supported on bool tensors only, got {dt} (ggml has no integer "
                            "bit operations)")
    return _logical({"&": "and", "|": "or", "^": "xor"}[op], a, b)


def _classify(kind: str, x) -> Tensor:
    x = _as_tensor(x)
    if not x.dtype.is_floating_point:  # integers and bools are always finite numbers
        return _fill_bool(x, kind == "finite")
    return _apply("classify", (x,), x.shape, None, kind, BOOL)


def isnan(x) -> Tensor:
    return _classify("nan", x)


def isinf(x) -> Tensor:
    return _classify("inf", x)


def isfinite(x) -> Tensor:
    return _classify("finite", x)


def where(condition, a, b) -> Tensor:
    """a where condition holds, else b (broadcast; numbers allowed), exactly: a NaN or
    inf in the branch not taken stays out. Gradients reach a and b, not the condition."""
    c = _as_bool(condition)
    dtype = result_type(a, b)
    a, b = (_scalar_like(t, c, dtype) if _is_scalar(t) else cast(_as_tensor(t), dtype) for t in (a, b))
    shape = broadcast_shape(c.shape, a.shape, b.shape)
    if shape is None:
        raise ValueError(f"shape mismatch in where: condition {c.shape}, {a.shape} and {b.shape} "
                         "do not broadcast")
    if len(shape) > 4:
        raise ValueError(f"where of {c.shape}, {a.shape} and {b.shape} has more than 4 dimensions")

    def rule(ctx, g):
        cond, x, y = ctx.parents
        zero = full_like(g, 0.0)
        return (None,
                sum_to(where(cond, g, zero), x.shape) if x.requires_grad else None,
                sum_to(where(cond, zero, g), y.shape) if y.requires_grad else None)
    return _apply("select", (c, a, b), shape, rule, dtype=dtype)


_INT32 = np.iinfo(np.int32)


def _scalar_like(value, like: Tensor, dtype) -> Tensor:
    """A number filled into `like`'s shape on the device (ggml_fill: no upload)."""
    if dtype.category == dtypes.int32.category:
        if not math.isfinite(float(value)):
            raise ValueError(f"cannot convert {value} to {dtype}")
        if not _INT32.min <= float(value) <= _INT32.max:
            raise ValueError(f"cannot convert {value} to {dtype}: ggml stores integers in 32 bits")
    return full_like(like, value, dtype)


def masked_fill(x, mask, value) -> Tensor:
    """`value` where `mask` (broadcast to x's shape) holds, else x; the gradient reaches x
    where the mask does not hold (and a tensor value where it does)."""
    x = _as_tensor(x)
    mask = _as_bool(mask)
    if _broadcast(x, mask, "masked_fill") != x.shape:
        raise ValueError(f"masked_fill: mask of shape {mask.shape} does not broadcast to {x.shape}")
    if isinstance(value, Tensor):
        if value.ndim:
            raise ValueError(f"masked_fill takes a number or a 0-d tensor, got shape {value.shape}")
        value = cast(value, x.dtype)
    elif _is_scalar(value):
        value = _scalar_like(value, x, x.dtype)
    else:
        raise TypeError(f"masked_fill value must be a number or a 0-d tensor, got {type(value).__name__}")
    return where(mask, value, x)


def _triangle(x, diagonal: int, lower: bool, what: str) -> Tensor:
    x = _as_tensor(x)
    if x.ndim < 2:
        raise ValueError(f"{what} needs a tensor of at least 2 dimensions, got shape {x.shape}")
    if not isinstance(diagonal, numbers.Integral) or isinstance(diagonal, bool):
        raise TypeError(f"{what}: diagonal must be an int, got {diagonal!r}")
    rows, cols = x.shape[-2:]
    diagonal = int(diagonal)
    keep = _constant((what, rows, cols, diagonal), lambda: np.tri(rows, cols, diagonal, dtype=bool) if lower else
                     ~np.tri(rows, cols, diagonal - 1, dtype=bool))
    return where(keep, x, 0)


def tril(x, diagonal: int = 0) -> Tensor:
    """torch.tril: the elements on and below the `diagonal`-th diagonal of the last two
    axes, exact zeros above (a NaN there is dropped, not multiplied by 0)."""
    return _triangle(x, diagonal, True, "tril")


def triu(x, diagonal: int = 0) -> Tensor:
    """torch.triu: on and above the `diagonal`-th diagonal, exact zeros below."""
    return _triangle(x, diagonal, False, "triu")
