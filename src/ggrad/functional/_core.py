"""Plumbing shared by every operation: applying a primitive (a lazy node plus, inside a
grad tape, its recorded rule), input checks, broadcasting and its inverse, reshape."""

from __future__ import annotations

import builtins
import math
import numbers

import numpy as np

from .. import anomaly, autograd, dtypes, lazy, ops  # noqa: F401  (ops registers the ggml builders)
from ..dtypes import result_type
from ..tensor import Tensor, axis_index as _axis, full_like, tensor  # noqa: F401  (_axis, full_like: for the modules here)

F32 = dtypes.float32


# the only ops that read a quantized weight's blocks (functional/quantized.py); any other op
# would read blocks as elements (a transpose's view of them aborts in ggml)
_QUANTIZED_OPS = frozenset({"matmul_q", "matmul_q_back", "gather_rows_q"})


def _apply(op: str, inputs: tuple, shape, rule=None, arg=None, dtype=F32) -> Tensor:
    # (lists, not generators, here: a generator is resumed once per item, and every op runs this)
    if op not in _QUANTIZED_OPS:
        for t in inputs:
            if t._node.dtype.is_quantized:
                raise TypeError(f"{op} of a {t._node.dtype.name} tensor: a quantized weight is read only by "
                                "ggrad.functional.quantized's linear and embedding (dequantize gives its values)")
    node = lazy.apply(op, tuple([t._node for t in inputs]), tuple(shape), dtype, arg)
    out = Tensor._wrap(node)
    if rule is not None and autograd.is_recording() and any([t.requires_grad for t in inputs]):
        record(out, op, rule, inputs, arg)
    if anomaly.active():  # ggrad.detect_anomaly: run and check every op as it is made
        anomaly.check(op, inputs, out)
    return out


def record(out: Tensor, op: str, rule, inputs: tuple, arg=None) -> None:
    """Record `rule` as the gradient of `out`, made by `op` from `inputs`."""
    if anomaly.active():
        rule = anomaly.checked_rule(op, rule)
    out.requires_grad = True
    out._ctx = autograd.Context(rule, inputs, {"out": out.node, "arg": arg})


_constants: dict[tuple, Tensor] = {}


def _constant(key: tuple, make) -> Tensor:
    """A float32 constant made on the host once and then kept on the device (an eager
    step that uploaded it every time would cross for it every step)."""
    value = _constants.get(key)
    if value is None:
        value = _constants[key] = tensor(make())
    return value


def _out(ctx) -> Tensor:
    """The recorded op's own result, as a tensor (rules of exp, tanh... reuse it)."""
    return Tensor._wrap(ctx.out)


def _float(x: Tensor, what: str) -> Tensor:
    if not x.dtype.is_floating_point:
        raise TypeError(f"{what} needs a floating-point tensor, got {x.dtype} (convert with .float())")
    return x


def _float_result(x: Tensor) -> dtypes.dtype:
    """The dtype of a float function of `x` (exp, log...): integers and bools give float32."""
    return x.dtype if x.dtype.is_floating_point else F32


def _as_tensor(x, what: str = "operand") -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (numbers.Number, np.ndarray, list, tuple)):
        return tensor(x)
    raise TypeError(f"{what} must be a Tensor, array or number, got {type(x).__name__}")


def _is_scalar(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, Tensor)


def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    """numpy's broadcast of `shapes` (no axis is empty here), or None where they do not
    broadcast: np.broadcast_shapes costs a few microseconds, and every binary op asks."""
    out = shapes[0]
    for shape in shapes[1:]:
        if shape == out:
            continue
        n = builtins.max(len(out), len(shape))
        merged = []
        for x, y in zip((1,) * (n - len(out)) + tuple(out), (1,) * (n - len(shape)) + tuple(shape)):
            if x == y or y == 1:
                merged.append(x)
            elif x == 1:
                merged.append(y)
            else:
                return None
        out = tuple(merged)
    return tuple(out)


def _broadcast(a: Tensor, b: Tensor, op: str) -> tuple[int, ...]:
    if a.shape == b.shape:
        return a.shape
    shape = broadcast_shape(a.shape, b.shape)
    if shape is None:
        raise ValueError(f"shape mismatch in {op}: {a.shape} and {b.shape} do not broadcast")
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
    return _apply("sum_to", (g,), shape, _sum_to_rule, keep, g.dtype)


def _sum_to_rule(ctx, g):
    return (broadcast_to(reshape(g, ctx.arg), ctx.parents[0].shape),)


def broadcast_to(x: Tensor, shape) -> Tensor:
    shape = tuple(int(n) if isinstance(n, numbers.Integral) else n for n in shape)
    if x.shape == shape:
        return x
    fits = broadcast_shape(x.shape, shape) == shape
    if not fits or len(shape) > 4 or any(not isinstance(n, numbers.Integral) or n < 1 for n in shape):
        raise ValueError(f"cannot broadcast a tensor of shape {x.shape} to {shape}")
    keep = (1,) * (len(shape) - x.ndim) + x.shape
    x = reshape(x, keep) if keep != x.shape else x
    return _apply("broadcast_to", (x,), shape, lambda ctx, g: (sum_to(g, ctx.parents[0].shape),),
                  dtype=x.dtype)


def reshape(x, *shape) -> Tensor:
    x = _as_tensor(x)
    if len(shape) == 1 and not isinstance(shape[0], numbers.Integral):
        shape = tuple(shape[0])
    shape = tuple(int(s) for s in shape)
    if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
        raise ValueError(f"cannot reshape {x.shape} into {shape}")
    if -1 in shape:
        known = math.prod([s for s in shape if s != -1])
        if known == 0 or x.numel() % known:
            raise ValueError(f"cannot reshape {x.shape} into {shape}")
        shape = tuple(x.numel() // known if s == -1 else s for s in shape)
    if math.prod(shape) != x.numel() or len(shape) > 4:
        raise ValueError(f"cannot reshape {x.shape} ({x.numel()} elements) into {shape}")
    if shape == x.shape:
        return x
    return _apply("reshape", (x,), shape, lambda ctx, g: (reshape(g, ctx.parents[0].shape),),
                  dtype=x.dtype)


def cast(x, dtype) -> Tensor:
    """`x` as `dtype` (float -> int truncates toward zero; anything -> bool is `x != 0`).
    The gradient flows back cast to the source's dtype, as PyTorch's `.to(dtype)`."""
    x = _as_tensor(x)
    dtype = dtypes.as_dtype(dtype)
    if x.dtype is dtype:
        return x
    if dtype is dtypes.bool_:
        return x != 0  # compare's ne, through Tensor's operator (compare sits on this module)
    rule = (lambda ctx, g: (cast(g, ctx.parents[0].dtype),)) if dtype.is_floating_point else None
    return _apply("cast", (x,), x.shape, rule, dtype=dtype)

