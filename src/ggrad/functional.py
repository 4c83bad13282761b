"""Operations on tensors: each primitive with its gradient rule right below it, then the
operations composed from them (micrograd's habit: derived ops through basic ones).

A primitive validates its inputs (ggml aborts on a failed assert, so nothing invalid
may reach a builder), adds a lazy node, and -- inside a grad tape -- records its rule.
Rules are written with these same operations, so backward is more lazy nodes.
"""

from __future__ import annotations

import builtins
import math
import numbers

import numpy as np

from . import autograd, lazy, ops  # noqa: F401  (ops registers the ggml builders)
from .tensor import Tensor, tensor

F32 = np.dtype(np.float32)
_BIG = 3.0e38  # stands in for an open clamp bound (ggml takes floats)


# ---- plumbing ---------------------------------------------------------------------------
def _apply(op: str, inputs: tuple, shape, rule=None, arg=None, dtype=F32) -> Tensor:
    node = lazy.apply(op, tuple(t.node for t in inputs), tuple(shape), dtype, arg)
    out = Tensor._wrap(node)
    if rule is not None and autograd.is_recording() and any(t.requires_grad for t in inputs):
        out.requires_grad = True
        out._ctx = autograd.Context(rule, inputs, {"out": node, "arg": arg})
    return out


def _out(ctx) -> Tensor:
    """The recorded op's own result, as a tensor (rules of exp, tanh... reuse it)."""
    return Tensor._wrap(ctx.out)


def _float(x: Tensor, what: str) -> Tensor:
    if x.dtype != F32:
        raise TypeError(f"{what} needs a float tensor, got {x.dtype} (convert with .float())")
    return x


def _as_tensor(x, what: str = "operand") -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (numbers.Number, np.ndarray, list, tuple)):
        return tensor(x)
    raise TypeError(f"{what} must be a Tensor, array or number, got {type(x).__name__}")


def _is_scalar(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, Tensor)


def _axis(axis: int, ndim: int) -> int:
    if not isinstance(axis, numbers.Integral) or not -ndim <= axis < builtins.max(ndim, 1):
        raise ValueError(f"axis {axis} is out of range for a tensor of {ndim} dimensions")
    return int(axis) % builtins.max(ndim, 1)


def _broadcast(a: Tensor, b: Tensor, op: str) -> tuple[int, ...]:
    if a.shape == b.shape:
        return a.shape
    try:
        shape = np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise ValueError(f"shape mismatch in {op}: {a.shape} and {b.shape} do not broadcast") from None
    if len(shape) > 4:
        raise ValueError(f"{op} of {a.shape} and {b.shape} has more than 4 dimensions")
    return shape


def sum_to(g: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Sum `g` down to `shape` (the inverse of broadcasting `shape` up to g.shape)."""
    if g.shape == shape:
        return g
    keep = (1,) * (g.ndim - len(shape)) + tuple(shape)
    if keep == g.shape:
        return reshape(g, shape)
    return _apply("sum_to", (g,), shape, _sum_to_rule, keep)


def _sum_to_rule(ctx, g):
    return (broadcast_to(reshape(g, ctx.arg), ctx.parents[0].shape),)


def broadcast_to(x: Tensor, shape) -> Tensor:
    shape = tuple(shape)
    if x.shape == shape:
        return x
    np.broadcast_shapes(x.shape, shape)  # raises for shapes that do not broadcast
    keep = (1,) * (len(shape) - x.ndim) + x.shape
    x = reshape(x, keep) if keep != x.shape else x
    return _apply("broadcast_to", (x,), shape, lambda ctx, g: (sum_to(g, ctx.parents[0].shape),))


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
    gb = sum_to(matmul_nt(transpose(g), transpose(a.detach())), b.shape) if b.requires_grad else None
    return ga, gb


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


def reshape(x, *shape) -> Tensor:
    x = _as_tensor(x)
    if len(shape) == 1 and not isinstance(shape[0], numbers.Integral):
        shape = tuple(shape[0])
    shape = tuple(int(s) for s in shape)
    if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
        raise ValueError(f"cannot reshape {x.shape} into {shape}")
    if -1 in shape:
        known = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
        if known == 0 or x.size % known:
            raise ValueError(f"cannot reshape {x.shape} into {shape}")
        shape = tuple(x.size // known if s == -1 else s for s in shape)
    if int(np.prod(shape, dtype=np.int64)) != x.size or len(shape) > 4:
        raise ValueError(f"cannot reshape {x.shape} ({x.size} elements) into {shape}")
    if shape == x.shape:
        return x
    return _apply("reshape", (x,), shape, lambda ctx, g: (reshape(g, ctx.parents[0].shape),),
                  dtype=x.dtype)


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


def _onehot_argmax(x: Tensor) -> Tensor:
    return _apply("onehot_argmax", (x,), x.shape)


def max(x, axis=None, keepdims: bool = False) -> Tensor:
    """Largest value along an axis (or of all); the gradient goes to the first maximum."""
    x = _float(_as_tensor(x), "max")
    if axis is None:
        flat = reshape(x, (x.size,))
        out = sum(flat * _onehot_argmax(flat.detach()))
        return reshape(out, (1,) * x.ndim) if keepdims else out
    a = _axis(axis, x.ndim)
    last = _to_last(x, a)
    out = sum(last * _onehot_argmax(last.detach()), axis=-1)
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


def gather(table, index) -> Tensor:
    """Rows of `table` picked by integer `index` (any shape): the result has shape
    ``index.shape + table.shape[1:]``. The gradient sums into the picked rows."""
    table = _float(_as_tensor(table), "gather")
    index = _as_tensor(index)
    if index.dtype != np.int32:
        raise TypeError(f"gather needs an integer index, got {index.dtype}")
    if table.ndim != 2:
        raise ValueError(f"gather picks rows of a 2-d table, got shape {table.shape}")
    host = index.node.host
    if host is not None and host.size and (host.min() < 0 or host.max() >= table.shape[0]):
        raise IndexError(f"gather index out of range for {table.shape[0]} rows "
                         f"(min {host.min()}, max {host.max()})")
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


def one_hot(index, num_classes: int) -> Tensor:
    index = _as_tensor(index)
    if index.dtype != np.int32:
        raise TypeError(f"one_hot needs integer classes, got {index.dtype}")
    if index.ndim + 1 > 4:
        raise ValueError("one_hot index may have at most 3 dimensions")
    host = index.node.host
    if host is not None and host.size and (host.min() < 0 or host.max() >= num_classes):
        raise IndexError(f"class index out of range for {num_classes} classes "
                         f"(min {host.min()}, max {host.max()})")
    return _apply("onehot", (index,), index.shape + (int(num_classes),), None, int(num_classes))


# ---- training helpers and losses ---------------------------------------------------------------
def rand_like(x) -> Tensor:
    """Uniform [0, 1) numbers shaped like `x`, drawn on the device: no crossing. The
    device generator's state advances in place (`ggrad.manual_seed` resets it)."""
    from .random import device_state
    x = _as_tensor(x)
    state = device_state()
    u = _apply("rand", (state,), x.shape)
    with autograd.no_grad():
        state._assign(_apply("rand_next", (state,), (1,)))
    return u


def dropout(x, p: float = 0.5, training: bool = True, rng: np.random.Generator | None = None) -> Tensor:
    """Zero each element with probability p and scale the rest by 1/(1-p). The mask is
    drawn on the device (no crossing); with `rng` it is drawn on the host from that
    generator and uploaded instead (a reproducible reference)."""
    x = _as_tensor(x)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if not training or p == 0.0:
        return x
    if rng is not None:
        mask = tensor((rng.random(x.shape) >= p).astype(np.float32) / np.float32(1.0 - p))
    else:
        mask = affine(step(affine(rand_like(x), 1.0, -p)), 1.0 / (1.0 - p))
    return x * mask


def _reduce(loss: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return mean(loss)
    if reduction == "sum":
        return sum(loss)
    if reduction == "none":
        return loss
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _same_shape(a: Tensor, b: Tensor, what: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch in {what}: input {a.shape}, target {b.shape}")


def mse_loss(input, target, reduction: str = "mean") -> Tensor:
    input, target = _as_tensor(input), _as_tensor(target)
    _same_shape(input, target, "mse_loss")
    return _reduce(square(input - target), reduction)


def l1_loss(input, target, reduction: str = "mean") -> Tensor:
    input, target = _as_tensor(input), _as_tensor(target)
    _same_shape(input, target, "l1_loss")
    return _reduce(abs(input - target), reduction)


def cross_entropy(logits, target, reduction: str = "mean") -> Tensor:
    """Softmax cross-entropy over the last axis of `logits` (N, C). `target` holds class
    indices (N,) or probabilities (N, C); the mean is over the batch."""
    logits, target = _float(_as_tensor(logits), "cross_entropy"), _as_tensor(target)
    if logits.ndim != 2:
        raise ValueError(f"cross_entropy needs logits of shape (N, C), got {logits.shape}")
    n, classes = logits.shape
    if target.dtype == np.int32:
        if target.shape != (n,):
            raise ValueError(f"shape mismatch in cross_entropy: logits {logits.shape}, class targets {target.shape} (want ({n},))")
        target = one_hot(target, classes)
    elif target.shape != logits.shape:
        raise ValueError(f"shape mismatch in cross_entropy: logits {logits.shape}, probability targets {target.shape}")
    per_sample = _apply("softmax_cross_entropy", (logits, target.detach()), (n,), _cross_entropy_rule)
    return _reduce(per_sample, reduction)


def _cross_entropy_rule(ctx, g):
    logits, target = ctx.parents
    return _apply("softmax_cross_entropy_back", (logits.detach(), target, g), logits.shape), None


def binary_cross_entropy_with_logits(logits, target, reduction: str = "mean") -> Tensor:
    """max(x, 0) - x*y + log(1 + exp(-|x|)): stable for large |x|."""
    x, y = _as_tensor(logits), _as_tensor(target)
    _same_shape(x, y, "binary_cross_entropy_with_logits")
    return _reduce(relu(x) - x * y.detach() + log(affine(exp(-abs(x)), 1.0, 1.0)), reduction)
