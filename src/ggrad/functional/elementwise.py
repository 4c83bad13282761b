"""Elementwise operations: arithmetic with numpy broadcasting, and unary functions."""

from __future__ import annotations

import builtins
import math
import numbers

import numpy as np

from .. import autograd, dtypes
from ._core import (_BIG, F32, Tensor, _apply, _as_tensor, _broadcast, _float, _float_result, _is_scalar,
                    _out, cast, full_like, result_type, sum_to)


# ---- elementwise binary (numpy broadcasting, torch's type promotion) ------------------------
def _binary(op: str, a: Tensor, b: Tensor, rule, dtype) -> Tensor:
    return _apply(op, (a, b), _broadcast(a, b, op), rule, dtype=dtype)


def _bool_arith(op: str, a, b):
    """Arithmetic on two bool operands, as torch: + is or, * is and, - is refused."""
    from .compare import logical_and, logical_or
    if op == "sub":
        raise TypeError("subtraction of bool tensors is not supported (use ^ or logical_xor)")
    return (logical_or if op == "add" else logical_and)(a, b)


def add(a, b, alpha=1) -> Tensor:
    if alpha != 1:
        b = mul(b, alpha)
    dtype = result_type(a, b)
    if dtype is dtypes.bool_:
        return _bool_arith("add", a, b)
    if _is_scalar(b):
        return affine(a, 1.0, float(b), dtype)
    if _is_scalar(a):
        return affine(b, 1.0, float(a), dtype)
    a, b = _as_tensor(a), _as_tensor(b)
    return _binary("add", a, b, lambda ctx, g: (sum_to(g, ctx.parents[0].shape), sum_to(g, ctx.parents[1].shape)),
                   dtype)


def sub(a, b, alpha=1) -> Tensor:
    if alpha != 1:
        b = mul(b, alpha)
    dtype = result_type(a, b)
    if dtype is dtypes.bool_:
        return _bool_arith("sub", a, b)
    if _is_scalar(b):
        return affine(a, 1.0, -float(b), dtype)
    if _is_scalar(a):
        return affine(b, -1.0, float(a), dtype)  # a - b = -b + a
    a, b = _as_tensor(a), _as_tensor(b)
    return _binary("sub", a, b, lambda ctx, g: (sum_to(g, ctx.parents[0].shape), sum_to(-g, ctx.parents[1].shape)),
                   dtype)


def mul(a, b) -> Tensor:
    dtype = result_type(a, b)
    if dtype is dtypes.bool_:
        return _bool_arith("mul", a, b)
    if _is_scalar(b):
        return affine(a, float(b), 0.0, dtype)
    if _is_scalar(a):
        return affine(b, float(a), 0.0, dtype)
    a, b = _as_tensor(a), _as_tensor(b)
    return _binary("mul", a, b, _mul_rule, dtype)


def _mul_rule(ctx, g):
    a, b = ctx.parents
    return (sum_to(g * b.detach(), a.shape) if a.requires_grad else None,
            sum_to(g * a.detach(), b.shape) if b.requires_grad else None)


def div(a, b, rounding_mode: str | None = None) -> Tensor:
    """True division (integers give float32), or rounded with rounding_mode="floor" /
    "trunc" (integers stay integers), as torch.div."""
    if rounding_mode is not None:
        if rounding_mode not in ("floor", "trunc"):
            raise ValueError(f"rounding_mode must be None, 'floor' or 'trunc', got {rounding_mode!r}")
        dtype = result_type(a, b)
        if dtype is dtypes.bool_:
            raise TypeError("rounded division of bool tensors is not supported")
        if _is_scalar(a) or _is_scalar(b):  # true division: a reciprocal misrounds exact multiples
            like = b if _is_scalar(a) else a
            a, b = (full_like(like, v, F32) if _is_scalar(v) else v for v in (a, b))
        q = div(a, b)
        return cast(floor(q) if rounding_mode == "floor" else trunc(q), dtype)
    dtype = result_type(a, b)
    dtype = dtype if dtype.is_floating_point else F32
    if _is_scalar(b):
        with np.errstate(divide="ignore"):
            return affine(a, float(np.float32(1.0) / np.float32(b)), 0.0, dtype)
    if _is_scalar(a):
        b = _as_tensor(b)
        return affine(pow(b if b.dtype is dtype else cast(b, dtype), -1), float(a), 0.0, dtype)
    a, b = _as_tensor(a), _as_tensor(b)
    return _binary("div", a, b, _div_rule, dtype)


def _div_rule(ctx, g):
    a, b = ctx.parents
    b = b.detach()
    return (sum_to(g / b, a.shape) if a.requires_grad else None,
            sum_to(-(g * _out(ctx)) / b, b.shape) if ctx.parents[1].requires_grad else None)


def floor_divide(a, b) -> Tensor:
    return div(a, b, rounding_mode="floor")


def remainder(a, b) -> Tensor:
    """a - floor(a / b) * b: the sign of the divisor, as Python's % and torch.remainder."""
    return sub(a, mul(floor_divide(a, b), b))


# ---- elementwise unary -------------------------------------------------------------------
def _unary(op: str, x, rule, arg=None, dtype=None) -> Tensor:
    """A float function of `x`: integers and bools give float32 (torch.exp(int) is float)."""
    x = _as_tensor(x)
    return _apply(op, (x,), x.shape, rule, arg, dtype or _float_result(x))


def _same_type(op: str, x, rule, arg=None) -> Tensor:
    """An op whose result keeps `x`'s dtype (neg, abs, relu... of integers stay integers)."""
    x = _as_tensor(x)
    if x.dtype is dtypes.bool_:
        raise TypeError(f"{op} is not defined for bool tensors")
    return _apply(op, (x,), x.shape, rule, arg, x.dtype)


def affine(x, scale: float, bias: float = 0.0, dtype=None) -> Tensor:
    """scale * x + bias, one node (in float32, rounded once to the result dtype)."""
    x = _as_tensor(x)
    dtype = dtype or result_type(x, float(scale))
    return _apply("affine", (x,), x.shape, lambda ctx, g: (affine(g, ctx.arg[0]),), (float(scale), float(bias)),
                  dtype)


def scale(x, k: float) -> Tensor:
    return affine(x, k)


def neg(x) -> Tensor:
    return _same_type("neg", x, lambda ctx, g: (-g,))


def exp(x) -> Tensor:
    return _unary("exp", x, lambda ctx, g: (g * _out(ctx),))


def log(x) -> Tensor:
    return _unary("log", x, lambda ctx, g: (g / ctx.parents[0].detach(),))


def sqrt(x) -> Tensor:
    return _unary("sqrt", x, lambda ctx, g: (affine(g / _out(ctx), 0.5),))


def square(x) -> Tensor:
    return _same_type("sqr", x, lambda ctx, g: (affine(g * ctx.parents[0].detach(), 2.0),))


def abs(x) -> Tensor:
    return _same_type("abs", x, lambda ctx, g: (g * sign(ctx.parents[0].detach()),))


def sign(x) -> Tensor:
    return _same_type("sgn", x, None)


def _rounding(op: str):
    def fn(x) -> Tensor:
        x = _as_tensor(x)
        if not x.dtype.is_floating_point:
            return x
        return _same_type(op, x, lambda ctx, g: (affine(g, 0.0),))
    fn.__name__ = op
    fn.__doc__ = f"{op} of each element; integers are returned as they are; zero gradient."
    return fn


floor, ceil, round, trunc = (_rounding(op) for op in ("floor", "ceil", "round", "trunc"))


def step(x) -> Tensor:
    """1 where x > 0, else 0 (no gradient)."""
    return _unary("step", x, None)


def relu(x) -> Tensor:
    return _same_type("relu", x, lambda ctx, g: (_apply("relu_back", (g, _out(ctx)), g.shape, dtype=g.dtype),))


def leaky_relu(x, negative_slope: float = 0.01) -> Tensor:
    def rule(ctx, g):
        slope = ctx.arg
        return (g * affine(step(ctx.parents[0].detach()), 1.0 - slope, slope),)
    return _unary("leaky_relu", x, rule, float(negative_slope))


def sigmoid(x) -> Tensor:
    def rule(ctx, g):
        y = _out(ctx)
        return (g * y * affine(y, -1.0, 1.0),)
    return _unary("sigmoid", x, rule)


def tanh(x) -> Tensor:
    return _unary("tanh", x, lambda ctx, g: (g * affine(square(_out(ctx)), -1.0, 1.0),))


_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def gelu(x, approximate: str = "none") -> Tensor:
    """x * Phi(x) (exact, erf form) or its tanh approximation, as PyTorch's."""
    if approximate == "tanh":
        return _gelu_tanh(x)
    if approximate != "none":
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return _unary("gelu", x, _gelu_rule)


def _gelu_rule(ctx, g):
    # d/dx x*Phi(x) = Phi(x) + x*phi(x). ggml has no erf: Phi(x) = gelu(x)/x away from 0,
    # and 0.5 + x*phi(0) within 1e-3 of it (the next term is O(x^3)).
    x = ctx.parents[0].detach()
    small = step(affine(abs(x), -1.0, 1e-3))
    big = affine(small, -1.0, 1.0)
    phi_cdf = big * _out(ctx) / (x + small) + small * affine(x, _INV_SQRT_2PI, 0.5)
    pdf = affine(exp(affine(square(x), -0.5)), _INV_SQRT_2PI)
    return (g * (phi_cdf + x * pdf),)


_GELU_C = math.sqrt(2.0 / math.pi)


def _gelu_tanh(x) -> Tensor:
    # Composed rather than ggml's GELU, which reads an fp16 table on the CPU (~1e-3 off).
    x = _as_tensor(x)
    inner = affine(x + affine(x * square(x), 0.044715), _GELU_C)
    return x * affine(tanh(inner), 0.5, 0.5)


def silu(x) -> Tensor:
    def rule(ctx, g):
        x = ctx.parents[0].detach()
        s = sigmoid(x)
        return (g * s * affine(x * affine(s, -1.0, 1.0), 1.0, 1.0),)
    return _unary("silu", x, rule)


def clamp(x, min=None, max=None) -> Tensor:
    """min(max(x, min), max), as torch.clamp: bounds are numbers or tensors (broadcast);
    where min > max the result is max. The gradient reaches x where min <= x <= max."""
    if min is None and max is None:
        raise ValueError("clamp needs min, max or both")
    if isinstance(min, Tensor) or isinstance(max, Tensor):
        return _clamp_tensor(_as_tensor(x), min, max)
    lo = -_BIG if min is None else float(min)
    hi = _BIG if max is None else float(max)
    if math.isnan(lo) or math.isnan(hi):
        raise ValueError(f"clamp bounds must not be NaN, got {min}, {max}")
    lo = builtins.min(lo, hi)  # torch: max wins where min > max

    def rule(ctx, g):
        from .compare import ge, le
        x = ctx.parents[0].detach()
        lo, hi = ctx.arg
        return (g * (ge(x, lo) & le(x, hi)),)
    x = _as_tensor(x)
    if x.dtype is dtypes.bool_:
        raise TypeError("clamp is not defined for bool tensors")
    return _apply("clamp", (x,), x.shape, rule, (lo, hi), result_type(x, *(b for b in (min, max) if b is not None)))


def _clamp_tensor(x: Tensor, lo, hi) -> Tensor:
    from .compare import gt, lt, where
    if lo is not None:
        x = where(lt(x, lo), lo, x)
    if hi is not None:
        x = where(gt(x, hi), hi, x)
    return x


def maximum(a, b) -> Tensor:
    """Elementwise max (NaN if either is NaN); at ties each side gets half the gradient."""
    return _extremum(a, b, "gt")


def minimum(a, b) -> Tensor:
    return _extremum(a, b, "lt")


def _extremum(a, b, kind: str) -> Tensor:
    from . import compare
    a, b = _as_tensor(a), _as_tensor(b)
    dtype = result_type(a, b)
    _broadcast(a, b, kind)
    with autograd.no_grad():
        a_wins = getattr(compare, kind)(a, b)
        out = compare.where(a_wins, a, b)
        if dtype.is_floating_point:  # NaN wins, as torch: a + b is NaN where either is
            out = compare.where(compare.isnan(a) | compare.isnan(b), add(a, b), out)
    if not (a.requires_grad or b.requires_grad) or not autograd.is_recording():
        return out

    def rule(ctx, g):  # torch's: the loser gets nothing, a tie half each (NaN: both)
        x, y = a.detach(), b.detach()
        half = affine(compare.eq(x, y), -0.5, 1.0)
        a_loses, b_loses = (compare.lt(x, y), compare.gt(x, y)) if kind == "gt" else \
            (compare.gt(x, y), compare.lt(x, y))
        return (sum_to(g * (half * compare.logical_not(a_loses)), a.shape) if a.requires_grad else None,
                sum_to(g * (half * compare.logical_not(b_loses)), b.shape) if b.requires_grad else None)
    return _with_rule(out, (a, b), rule)


def _with_rule(value: Tensor, parents: tuple, rule) -> Tensor:
    """`value` (computed without recording) with `rule` recorded as its gradient."""
    out = _apply("cont", (value,), value.shape, None, dtype=value.dtype)
    out.requires_grad = True
    out._ctx = autograd.Context(rule, parents, {"out": out.node, "arg": None})
    return out


def pow(x, p) -> Tensor:
    if isinstance(p, Tensor) or not isinstance(p, numbers.Real):
        raise TypeError("pow takes a scalar exponent (float or int)")
    exponent = p
    p = float(p)
    if math.isnan(p):
        raise ValueError("pow exponent is NaN")
    x = _as_tensor(x)
    dtype = result_type(x, exponent)
    if p == 1.0 and dtype is x.dtype:
        return x
    return _unary("pow", x, lambda ctx, g: (g * affine(pow(ctx.parents[0].detach(), ctx.arg - 1), ctx.arg),), p,
                  dtype)
