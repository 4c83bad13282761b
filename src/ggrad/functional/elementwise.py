"""Elementwise operations: arithmetic with numpy broadcasting, and unary functions."""

from __future__ import annotations

import builtins
import math
import numbers

import numpy as np
from ggml import ggml as G

from .. import autograd, dtypes, ops, runtime
from ..ops import compute
from ..runtime import kernels
from .layout import PLACEMENTS, placed_sum
from ._core import (F32, Tensor, _apply, _as_tensor, _broadcast, _float_result, _is_scalar,
                    _out, cast, full_like, record, result_type, sum_to)


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
    if a._node.op in PLACEMENTS and b._node.op in PLACEMENTS:  # slices' gradients meeting in backward
        placed = placed_sum(a, b)
        if placed is not None:
            return placed
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


def addcmul(input, tensor1, tensor2, *, value=1) -> Tensor:
    """torch.addcmul: input + value * tensor1 * tensor2."""
    return add(input, mul(tensor1, tensor2), alpha=value)


def addcdiv(input, tensor1, tensor2, *, value=1) -> Tensor:
    """torch.addcdiv: input + value * tensor1 / tensor2."""
    return add(input, div(tensor1, tensor2), alpha=value)


def _mul_rule(ctx, g):
    a, b = ctx.parents
    if a is b:  # x * x: one product, its two equal terms summed once (exactly: v + v is 2v, -0 kept)
        v = sum_to(g * a.detach(), a.shape) if a.requires_grad else None
        return (None if v is None else v + v, None)
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
        out = cast(_rounded_quotient(a, b, rounding_mode), dtype)
        parents = tuple(_as_tensor(v) for v in (a, b))
        if dtype.is_floating_point and any(p.requires_grad for p in parents) and autograd.is_recording():
            out = _with_rule(out, parents, _zero_rule, f"div (rounding_mode={rounding_mode!r})")
        return out
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


def _rounded_quotient(a, b, rounding_mode: str) -> Tensor:
    """floor(a / b) or trunc(a / b), as torch's. A division need not round correctly (CUDA
    builds with fast math: -217 / 7 gave -31.000002, floored to -32); one step with the
    exact remainder (Dekker's product) rounds the quotient q, and trunc (torch's is of the
    rounded quotient) is done. The floor is of the exact quotient, which matters where q
    lies within a few ulps of an integer n: there the sign of the exact remainder a - n * b
    says on which side of n the true quotient lies (1.0 // 0.1 is 9: 0.1 in float32 is a
    little more than a tenth). Its edges as torch's: a quotient that is 0 though a is not
    (b infinite, or the quotient below float32's range) floors to -1 where the signs
    differ (-3 // inf is -1), and an infinite a over a nonzero b gives NaN."""
    from .compare import eq, isnan, where
    a, b = _float32(a), _float32(b)  # and broadcast as floats (CUDA cannot repeat int32)
    with autograd.no_grad():
        q = div(a, b)
        product, error = _two_product(q, b)
        rounded = q + ((a - product) - error) / b
        q = where(isnan(rounded), q, rounded)  # the split overflows past 2^115: q as it was
        if rounding_mode == "trunc":
            return trunc(q)
        n = round(q)
        near = step(QUOTIENT_ULPS * abs(q) - abs(q - n))
        product, error = _two_product(n, b)
        side = ((a - product) - error) * sign(b)  # the sign of (true quotient - n)
        floored = where(near, n - step(-side), floor(q)) - cast(eq(q, 0.0), F32) * step(-a * sign(b))
        return where(eq(b, 0.0), floored, floored + (a - a))


def _float32(x) -> Tensor:
    x = _as_tensor(x)
    return x if x.dtype is F32 else cast(x, F32)


QUOTIENT_ULPS = 8 * 2.0 ** -23  # how far a computed quotient may sit from the true one


def _two_product(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """p = fl(x * y) and its rounding error e, with x * y = p + e exactly (Dekker's
    product: each factor split into two 12-bit halves whose products are exact)."""
    def halves(v):
        c = v * 4097.0
        high = c - (c - v)
        return high, v - high
    p = x * y
    (xh, xl), (yh, yl) = halves(x), halves(y)
    return p, ((xh * yh - p) + xh * yl + xl * yh) + xl * yl


def _div_rule(ctx, g):
    a, b = ctx.parents
    b = b.detach()
    return (sum_to(g / b, a.shape) if a.requires_grad else None,
            sum_to(-(g * _out(ctx)) / b, b.shape) if ctx.parents[1].requires_grad else None)


def floor_divide(a, b) -> Tensor:
    return div(a, b, rounding_mode="floor")


def remainder(a, b) -> Tensor:
    """a - floor(a / b) * b with the sign of the divisor, as Python's % and torch.remainder:
    exact where the product is within a rounding of a (-3 % 0.1 is 4.5e-8, not 0), and
    torch's at an infinite divisor (-3 % inf is inf, 3 % inf is 3)."""
    from .compare import eq, isinf, where
    dtype = result_type(a, b)
    if dtype is dtypes.bool_:
        raise TypeError("remainder of bool tensors is not supported")
    if _is_scalar(a) or _is_scalar(b):
        like = b if _is_scalar(a) else a
        a, b = (full_like(like, v, F32) if _is_scalar(v) else v for v in (a, b))
    a, b = _float32(a), _float32(b)
    with autograd.no_grad():
        q = div(a, b, rounding_mode="floor")
        product, error = _two_product(q, b)
        infinite = where(eq(q, 0.0), a, b) + (a - a)  # a, or b where the signs differ; NaN for infinite a
        out = cast(where(isinf(b), infinite, (a - product) - error), dtype)
    parents = tuple(_as_tensor(v) for v in (a, b))
    if any(p.requires_grad for p in parents) and autograd.is_recording():
        out = _with_rule(out, parents, _remainder_rule, "remainder")
    return out


def _zero_rule(ctx, g):
    """Exact zeros (0 * g would be NaN where g is inf or NaN; torch's are zeros)."""
    return tuple(full_like(p, 0.0, g.dtype) if p.requires_grad else None for p in ctx.parents)


def _remainder_rule(ctx, g):
    """torch's: 1 for a, -floor(a / b) for b."""
    a, b = ctx.parents
    return (sum_to(g, a.shape) if a.requires_grad else None,
            sum_to(-(g * div(a.detach(), b.detach(), rounding_mode="floor")), b.shape) if b.requires_grad else None)


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


def sin(x) -> Tensor:
    return _unary("sin", x, lambda ctx, g: (g * cos(ctx.parents[0].detach()),))


def cos(x) -> Tensor:
    return _unary("cos", x, lambda ctx, g: (-(g * sin(ctx.parents[0].detach())),))


def log(x) -> Tensor:
    return _unary("log", x, lambda ctx, g: (g / ctx.parents[0].detach(),))


def sqrt(x) -> Tensor:
    return _unary("sqrt", x, lambda ctx, g: (affine(g / _out(ctx), 0.5),))


def square(x) -> Tensor:
    return _same_type("sqr", x, lambda ctx, g: (affine(g * ctx.parents[0].detach(), 2.0),))


def abs(x) -> Tensor:
    return _same_type("abs", x, lambda ctx, g: (g * sign(ctx.parents[0].detach()),))


def sign(x) -> Tensor:
    return _same_type("sgn", x, _zero_rule)  # torch's: a zero gradient, not none


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
    """max(x, 0); NaN stays NaN and passes its gradient, as torch's. The gradient kernel's
    test (y <= 0 ? 0 : g) gives the same mask read from the input as from the output, so
    float32 relu reads its input: nothing then needs the output kept, which a cast for a
    product may take without it (autocast: ops.as_type's relu-cast)."""
    def rule(ctx, g):
        x = ctx.parents[0].detach()
        # the compute's test is of the gradient's dtype (a backward seeded in another dtype
        # takes the composed mask, which holds for relu's output only)
        read = x if _kernel_set(x) and g.dtype is x.dtype else _out(ctx)
        return (_apply("relu_nan_back", (g, read), g.shape, dtype=g.dtype),)
    return _same_type("relu_nan", x, rule)


def leaky_relu(x, negative_slope: float = 0.01) -> Tensor:
    def back(g, x, slope):  # linear in g: its own gradient (create_graph)
        return _apply("leaky_relu_back", (g, x), g.shape, lambda ctx, gg: (back(gg, x, slope), None), slope, g.dtype)
    return _unary("leaky_relu_nan", x, lambda ctx, g: (back(g, ctx.parents[0].detach(), ctx.arg),), float(negative_slope))


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
    # d/dx x*Phi(x) = Phi(x) + x*phi(x): ggrad's kernel (one pass), or composed. ggml has no
    # erf op: Phi(x) = gelu(x)/x away from 0, and 0.5 + x*phi(0) within 1e-3 of it (the
    # next term is O(x^3)).
    x = ctx.parents[0].detach()
    if kernels.supported(runtime.current().backend, kernels.GELU_BACK):
        return (_apply("gelu_back_kernel", (x, g, _out(ctx)), x.shape, dtype=g.dtype),)
    small = step(affine(abs(x), -1.0, 1e-3))
    big = affine(small, -1.0, 1.0)
    phi_cdf = big * _out(ctx) / (x + small) + small * affine(x, _INV_SQRT_2PI, 0.5)
    pdf = affine(exp(affine(square(x), -0.5)), _INV_SQRT_2PI)
    return (g * (phi_cdf + x * pdf),)


@compute("gelu_back_kernel")
def _gelu_back_kernel(ctx, s, node):
    x, g, y = [ops.contiguous(ctx, t) for t in s]
    n = math.prod(node.shape)
    return ops.reshape(ctx, kernels.op(ctx, kernels.GELU_BACK, (n, 1), [x, g, y], []), node.shape)


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
    where min > max the result is max; NaN in x (or in a tensor bound) gives NaN; a NaN
    number bound is refused. The gradient reaches x where min <= x <= max (tensor bounds
    get torch's share)."""
    if min is None and max is None:
        raise ValueError("clamp needs min, max or both")
    if isinstance(min, Tensor) or isinstance(max, Tensor):
        return _clamp_tensor(_as_tensor(x), min, max)
    x = _as_tensor(x)
    if x.dtype is dtypes.bool_:
        raise TypeError("clamp is not defined for bool tensors")
    dtype = result_type(x, *(b for b in (min, max) if b is not None))
    lo = -math.inf if min is None else float(min)
    hi = math.inf if max is None else float(max)
    if math.isnan(lo) or math.isnan(hi):  # NOTE: torch returns all NaN; refused (tests/test_bad_input.py)
        raise ValueError(f"clamp bounds must not be NaN, got {min}, {max}")
    lo = builtins.min(lo, hi)  # torch: max wins where min > max

    def rule(ctx, g):  # a select, as torch's: an inf g outside [lo, hi] gives 0, not NaN
        from .compare import ge, le, where
        x = ctx.parents[0].detach()
        lo, hi = ctx.arg
        return (where(ge(x, lo) & le(x, hi), g, full_like(g, 0.0)),)
    return _apply("clamp_nan", (x,), x.shape, rule, (lo, hi), dtype)


def _clamp_tensor(x: Tensor, lo, hi) -> Tensor:
    """clamp with a tensor bound: NaN wins (in x or a bound), and torch's gradients:
    x where lo <= x <= hi, lo where x < lo < hi, hi where x > hi or hi < lo."""
    from . import compare
    lo, hi = (None if b is None else _as_tensor(b) for b in (lo, hi))
    bounds = [b for b in (lo, hi) if b is not None]
    for b in bounds:
        _broadcast(x, b, "clamp")
    with autograd.no_grad():
        out = cast(x, result_type(x, *bounds))
        if lo is not None:
            out = compare.where(compare.lt(out, lo) | compare.isnan(lo), lo, out)
        if hi is not None:
            out = compare.where(compare.gt(out, hi) | compare.isnan(hi), hi, out)
    parents = (x, *bounds)
    if not autograd.is_recording() or not any(t.requires_grad for t in parents):
        return out

    def rule(ctx, g):
        v = x.detach()
        low = None if lo is None else lo.detach()
        high = None if hi is None else hi.detach()
        zero = full_like(g, 0.0)
        keep = [compare.ge(v, low)] if low is not None else []
        keep += [compare.le(v, high)] if high is not None else []
        grads = [sum_to(compare.where(keep[0] & keep[-1], g, zero), x.shape) if x.requires_grad else None]
        if low is not None:
            below = compare.lt(v, low) if high is None else compare.lt(v, low) & compare.lt(low, high)
            grads.append(sum_to(compare.where(below, g, zero), low.shape) if lo.requires_grad else None)
        if high is not None:
            above = compare.gt(v, high) if low is None else compare.gt(v, high) | compare.lt(high, low)
            grads.append(sum_to(compare.where(above, g, zero), high.shape) if hi.requires_grad else None)
        return tuple(grads)
    return _with_rule(out, parents, rule, "clamp")


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
    return _with_rule(out, (a, b), rule, "maximum" if kind == "gt" else "minimum")


def _with_rule(value: Tensor, parents: tuple, rule, op: str) -> Tensor:
    """`value` (computed without recording) with `rule` recorded as the gradient of `op`."""
    out = _apply("cont", (value,), value.shape, None, dtype=value.dtype)
    record(out, op, rule, parents)
    return out


def choose(flag, a: Tensor, b: Tensor) -> Tensor:
    """`a` if the one-element bool tensor `flag` holds, else `b`: whole tensors (of one
    shape and dtype), exactly (a NaN or inf in the one not chosen stays out), without a
    host read. No gradient. (fit's on_nonfinite="skip" keeps or drops a step's update.)"""
    flag = _as_tensor(flag)
    if flag.numel() != 1 or flag.dtype is not dtypes.bool_:
        raise ValueError(f"choose needs a one-element bool flag, got {flag.dtype} of shape {flag.shape}")
    if a.shape != b.shape or a.dtype is not b.dtype:
        raise ValueError(f"choose needs tensors of one shape and dtype, got {a.shape} {a.dtype}, {b.shape} {b.dtype}")
    return _apply("choose", (flag, a, b), a.shape, None, dtype=a.dtype)


# Integer exponents up to this size are multiplied out (exact signs, a few roundings);
# larger ones take exp(p * log|x|) with the sign of an odd power put back.
_SQUARING_MAX = 64


def pow(x, p) -> Tensor:
    """x ** p for a number p, as torch: integer p gives exact signs ((-2) ** 17 is
    -131072) and 1 for p = 0 (also for NaN); a negative x to a non-integer p is NaN;
    p = +-inf follows C's pow (|x| == 1 gives 1). Integer tensors to negative integer
    powers are refused, as torch does."""
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
    if not dtype.is_floating_point and p < 0:
        raise RuntimeError("Integers to negative integer powers are not allowed.")

    def rule(ctx, g):  # torch's: zero for p = 0 (also where x ** -1 is inf)
        if p == 0:
            return (full_like(g, 0.0),)
        return (g * affine(pow(ctx.parents[0].detach(), p - 1), p),)
    if math.isinf(p):
        out = _pow_inf(x, p, dtype)
        return _with_rule(out, (x,), rule, "pow") if x.requires_grad and autograd.is_recording() else out
    if p.is_integer() and builtins.abs(p) <= _SQUARING_MAX:
        return _unary("pow_int", x, rule, int(p), dtype)
    return _unary("pow_big_int" if p.is_integer() else "pow", x, rule, p, dtype)


def _pow_inf(x: Tensor, p: float, dtype) -> Tensor:
    """C's pow(x, +-inf): inf where |x| > 1 (0 for -inf), 0 where |x| < 1 (inf), 1 where |x| == 1."""
    from .compare import gt, isnan, lt, where
    with autograd.no_grad():
        a = abs(cast(x, dtype))
        big, small = (math.inf, 0.0) if p > 0 else (0.0, math.inf)
        return where(gt(a, 1.0), big, where(lt(a, 1.0), small, where(isnan(a), a, full_like(a, 1.0))))


# ---- ggml builders: NaN kept where ggml's kernels drop it, exact integer powers ---------
def _number(ctx, x):
    """1 where x is a number (|x| + 1 > 0 holds for every number, infinities included), 0
    for NaN: a comparison, and every comparison with NaN is false on every backend."""
    return G.ggml_step(ctx, G.ggml_scale_bias(ctx, G.ggml_abs(ctx, x), 1.0, 1.0))


def _keep_nan(ctx, x, y):
    """`y`, NaN where `x` is NaN. ggml's relu, leaky_relu and clamp compare, so they turn
    NaN into a number (relu: 0; clamp: its upper bound on the CPU, its lower on Vulkan):
    0 / number(x) is 0, or NaN (0 / 0) where x is NaN."""
    number = _number(ctx, x)
    return G.ggml_add(ctx, y, G.ggml_div(ctx, G.ggml_scale(ctx, number, 0.0), number))


# ggrad's kernel set (scripts/patch_ggml_kernels.py): relu and leaky_relu keep NaN as
# torch's, and SILU_BACK in these modes is their gradient, each one node
SILU_BACK_RELU, SILU_BACK_LEAKY_RELU = 1, 2


def _silu_back_mode(ctx, g, x, mode: int, slope: float = 0.0):
    """One SILU_BACK node of ggrad's kernel set: `mode` in op_params[0], `slope` in
    op_params[1] (float bits). Its kernels read both operands as flat arrays."""
    out = G.ggml_silu_back(ctx, ops.contiguous(ctx, g), ops.contiguous(ctx, x))
    out.contents.op_params[0] = mode
    out.contents.op_params[1] = kernels.param(float(slope))
    return ops._asking(out, "silu_back_x4")  # CUDA: four values a thread where they fit (op_params[2])


def _kernel_set(node) -> bool:
    """Whether ggrad's relu kernels serve `node` (a lazy node or a tensor: float32; others
    compose)."""
    return kernels.version() >= 1 and node.dtype is F32


@compute("relu_nan")
def _relu_nan(ctx, s, node):
    """relu(x) / number(x): relu(NaN) is 0 on every backend (or NaN), and 0 / 0 is NaN."""
    y = ops._asking(G.ggml_relu(ctx, s[0]), "unary_x4")  # CUDA: four values a thread (set 50)
    if _kernel_set(node) or not node.dtype.is_floating_point:
        return y
    return G.ggml_div(ctx, y, _number(ctx, s[0]))


@compute("relu_nan_back")
def _relu_nan_back(ctx, s, node):
    """g where relu's output (>= 0, or NaN) is not 0, as torch's (a NaN output passes g); the
    kernel set reads relu's float32 input instead (the same mask).
    NOTE: composed, a product with the 0/1 mask, not a select (ggml's select, get_rows over
    one-element rows, cost ~20% of a small MLP's step): an inf or NaN g where the output is
    0 gives NaN, where torch (and the kernel) give 0. ggml's step is x > 0 on the CPU and
    CUDA, x >= 0 on Vulkan, 0 for NaN everywhere."""
    g, out = s
    if _kernel_set(node):
        return _silu_back_mode(ctx, g, out, SILU_BACK_RELU)
    if runtime.current().backend.info.kind == "vulkan":  # 1 - (-out >= 0)
        mask = G.ggml_scale_bias(ctx, G.ggml_step(ctx, G.ggml_neg(ctx, out)), -1.0, 1.0)
    else:  # 1 + (out > 0) - (out + 1 > 0): out + 1 > 0 holds for every number here
        above = G.ggml_sub(ctx, G.ggml_step(ctx, out), G.ggml_step(ctx, G.ggml_scale_bias(ctx, out, 1.0, 1.0)))
        mask = G.ggml_scale_bias(ctx, above, 1.0, 1.0)
    return G.ggml_mul(ctx, g, mask)


@compute("leaky_relu_nan")
def _leaky_relu_nan(ctx, s, node):
    """leaky_relu(x) / number(x), as relu_nan: leaky_relu(NaN) is 0 (or NaN) everywhere."""
    y = G.ggml_leaky_relu(ctx, s[0], node.arg, False)
    return y if _kernel_set(node) else G.ggml_div(ctx, y, _number(ctx, s[0]))


@compute("leaky_relu_back")
def _leaky_relu_back(ctx, s, node):
    """g where x > 0, g * slope elsewhere (NaN too), as torch's."""
    g, x = s
    if _kernel_set(node):
        return _silu_back_mode(ctx, g, x, SILU_BACK_LEAKY_RELU, node.arg)
    slope = node.arg
    above = G.ggml_step(ctx, x)
    if runtime.current().backend.info.kind == "vulkan":  # its step is x >= 0: take out x == 0
        above = G.ggml_sub(ctx, above, G.ggml_mul(ctx, above, G.ggml_step(ctx, G.ggml_neg(ctx, x))))
    return G.ggml_mul(ctx, g, G.ggml_scale_bias(ctx, above, 1.0 - slope, slope))


@compute("clamp_nan")
def _clamp_nan(ctx, s, node):
    """NOTE: ggml_clamp is always in place (its result is a view of its source, ggml
    0.15.3), so it runs on a copy: over a leaf it overwrote the tensor being clamped."""
    lo, hi = node.arg
    y = G.ggml_clamp(ctx, G.ggml_cont(ctx, s[0]), lo, hi)
    return _keep_nan(ctx, s[0], y) if node.dtype.is_floating_point else y


@compute("pow_int")
def _pow_int(ctx, s, node):
    """x ** n for an integer n, multiplied out by squaring; 1 / x ** |n| for n < 0."""
    x, n = s[0], node.arg
    if n == 0:
        return G.ggml_fill(ctx, x, 1.0)
    result, base, k = None, x, builtins.abs(n)
    while k:
        if k & 1:
            result = base if result is None else G.ggml_mul(ctx, result, base)
        k >>= 1
        if k:
            base = G.ggml_sqr(ctx, base)
    if n < 0:
        return G.ggml_div(ctx, G.ggml_fill(ctx, x, 1.0), result)
    return G.ggml_cont(ctx, result) if result is x else result


@compute("pow_big_int")
def _pow_big_int(ctx, s, node):
    """x ** p for a large integer p: exp(p * log|x|), negated where x < 0 if p is odd
    (relu(sgn(-x)) is exactly [x < 0] on every backend)."""
    x, p = s[0], node.arg
    magnitude = G.ggml_exp(ctx, G.ggml_scale(ctx, G.ggml_log(ctx, G.ggml_abs(ctx, x)), p))
    if p % 2 == 0:
        return magnitude
    negative = G.ggml_relu(ctx, G.ggml_sgn(ctx, G.ggml_neg(ctx, x)))
    return G.ggml_mul(ctx, magnitude, G.ggml_scale_bias(ctx, negative, -2.0, 1.0))


@compute("choose", keep_int=True)
def _choose(ctx, s, node):
    """The two tensors as the two rows of a table; get_rows picks row 1 - flag."""
    flag, a, b = s
    n = math.prod(node.shape)
    table = G.ggml_concat(ctx, ops.reshape(ctx, a, (1, n)), ops.reshape(ctx, b, (1, n)), 1)
    pick = G.ggml_cast(ctx, ops.reshape(ctx, G.ggml_scale_bias(ctx, flag, -1.0, 1.0), (1,)), ops.I32)
    return ops.reshape(ctx, G.ggml_get_rows(ctx, table, pick), node.shape)
