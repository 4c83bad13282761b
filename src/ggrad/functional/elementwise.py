"""Elementwise operations: arithmetic with numpy broadcasting, and unary functions."""

from __future__ import annotations

import math
import numbers

import numpy as np

from ._core import _BIG, Tensor, _apply, _as_tensor, _broadcast, _float, _is_scalar, _out, sum_to


# ---- elementwise binary (numpy broadcasting) ---------------------------------------------
def _binary(op: str, a: Tensor, b: Tensor, rule) -> Tensor:
    _float(a, op), _float(b, op)
    return _apply(op, (a, b), _broadcast(a, b, op), rule)


def add(a, b) -> Tensor:
    if _is_scalar(b):
        return affine(a, 1.0, float(b))
    if _is_scalar(a):
        return affine(b, 1.0, float(a))
    a, b = _as_tensor(a), _as_tensor(b)
    return _binary("add", a, b, lambda ctx, g: (sum_to(g, ctx.parents[0].shape), sum_to(g, ctx.parents[1].shape)))


def sub(a, b) -> Tensor:
    if _is_scalar(b):
        return affine(a, 1.0, -float(b))
    if _is_scalar(a):
        return affine(b, -1.0, float(a))  # a - b = -b + a
    a, b = _as_tensor(a), _as_tensor(b)
    return _binary("sub", a, b, lambda ctx, g: (sum_to(g, ctx.parents[0].shape), sum_to(-g, ctx.parents[1].shape)))


def mul(a, b) -> Tensor:
    if _is_scalar(b):
        return affine(a, float(b), 0.0)
    if _is_scalar(a):
        return affine(b, float(a), 0.0)
    a, b = _as_tensor(a), _as_tensor(b)
    return _binary("mul", a, b, _mul_rule)


def _mul_rule(ctx, g):
    a, b = ctx.parents
    return (sum_to(g * b.detach(), a.shape) if a.requires_grad else None,
            sum_to(g * a.detach(), b.shape) if b.requires_grad else None)


def div(a, b) -> Tensor:
    if _is_scalar(b):
        with np.errstate(divide="ignore"):
            return affine(a, float(np.float32(1.0) / np.float32(b)), 0.0)
    if _is_scalar(a):
        return affine(pow(b, -1), float(a), 0.0)  # a / b = a * b^-1
    a, b = _as_tensor(a), _as_tensor(b)
    return _binary("div", a, b, _div_rule)


def _div_rule(ctx, g):
    a, b = ctx.parents
    b = b.detach()
    return (sum_to(g / b, a.shape) if a.requires_grad else None,
            sum_to(-(g * _out(ctx)) / b, b.shape) if ctx.parents[1].requires_grad else None)


# ---- elementwise unary -------------------------------------------------------------------
def _unary(op: str, x, rule, arg=None) -> Tensor:
    x = _float(_as_tensor(x), op)
    return _apply(op, (x,), x.shape, rule, arg)


def affine(x, scale: float, bias: float = 0.0) -> Tensor:
    """scale * x + bias, one node."""
    return _unary("affine", x, lambda ctx, g: (affine(g, ctx.arg[0]),), (float(scale), float(bias)))


def scale(x, k: float) -> Tensor:
    return affine(x, k)


def neg(x) -> Tensor:
    return _unary("neg", x, lambda ctx, g: (-g,))


def exp(x) -> Tensor:
    return _unary("exp", x, lambda ctx, g: (g * _out(ctx),))


def log(x) -> Tensor:
    return _unary("log", x, lambda ctx, g: (g / ctx.parents[0].detach(),))


def sqrt(x) -> Tensor:
    return _unary("sqrt", x, lambda ctx, g: (affine(g / _out(ctx), 0.5),))


def square(x) -> Tensor:
    return _unary("sqr", x, lambda ctx, g: (affine(g * ctx.parents[0].detach(), 2.0),))


def abs(x) -> Tensor:
    return _unary("abs", x, lambda ctx, g: (g * sign(ctx.parents[0].detach()),))


def sign(x) -> Tensor:
    return _unary("sgn", x, None)


def step(x) -> Tensor:
    """1 where x > 0, else 0 (no gradient)."""
    return _unary("step", x, None)


def relu(x) -> Tensor:
    return _unary("relu", x, lambda ctx, g: (_apply("relu_back", (g, _out(ctx)), g.shape),))


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


def clamp(x, min: float | None = None, max: float | None = None) -> Tensor:
    if min is None and max is None:
        raise ValueError("clamp needs min, max or both")
    lo = -_BIG if min is None else float(min)
    hi = _BIG if max is None else float(max)
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        raise ValueError(f"clamp bounds must be numbers with min <= max, got {min}, {max}")

    def rule(ctx, g):
        x = ctx.parents[0].detach()
        lo, hi = ctx.arg
        return (g * step(affine(x, 1.0, -lo)) * step(affine(x, -1.0, hi)),)
    return _unary("clamp", x, rule, (lo, hi))


def pow(x, p) -> Tensor:
    if isinstance(p, Tensor) or not isinstance(p, numbers.Real):
        raise TypeError("pow takes a scalar exponent (float or int)")
    p = float(p)
    if math.isnan(p):
        raise ValueError("pow exponent is NaN")
    if p == 1.0:
        return _as_tensor(x)
    return _unary("pow", x, lambda ctx, g: (g * affine(pow(ctx.parents[0].detach(), ctx.arg - 1), ctx.arg),), p)

