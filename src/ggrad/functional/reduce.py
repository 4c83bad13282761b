"""Reductions along axes, max and argmax, softmax and log-softmax."""

from __future__ import annotations

import math
import numbers

import numpy as np
from ggml import ggml as G

from .. import autograd, dtypes, ops, runtime
from ..ops import compute
from ._core import Tensor, _apply, _as_tensor, _axis, _float, _out, _sum_to_rule, broadcast_to, cast, full_like, reshape
from .compare import _as_bool as as_bool, eq, gt, isinf, isnan, logical_not, ne, where
from .elementwise import _with_rule, abs, affine, exp, log, pow, sign
from .indexing import checked_index
from .layout import narrow, permute, transpose


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


def _reduced_shapes(x: Tensor, dim, keepdim: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The kept shape (1 on the reduced axes, same rank as `x`) and the result's shape."""
    axes = _reduce_axes(x, dim)
    keep = tuple(1 if i in axes else n for i, n in enumerate(x.shape))
    return keep, keep if keepdim else tuple(n for i, n in enumerate(x.shape) if i not in axes)


def sum(x, dim=None, keepdim: bool = False, *, axis=None, keepdims=None, dtype=None) -> Tensor:
    """Sum over `dim` (all by default), accumulated in float32 (half precision too, as
    torch). Integer and bool tensors sum to int64, as torch."""
    x = _as_tensor(x)
    if dtype is not None:
        x = cast(x, dtype)
    out_dtype = x.dtype if x.dtype.is_floating_point else dtypes.int64
    keep, shape = _reduced_shapes(x, _dims(dim, axis), _keep(keepdim, keepdims))
    if keep == x.shape:  # only axes of size 1: nothing to add, but they still go
        out = x if x.dtype is out_dtype else cast(x, out_dtype)
        return out if shape == x.shape else reshape(out, shape)
    return _apply("sum_to", (x,), shape, _sum_to_rule, keep, out_dtype)


def mean(x, dim=None, keepdim: bool = False, *, axis=None, keepdims=None, dtype=None) -> Tensor:
    """Mean over `dim` (all by default): the sum and the division in float32, one rounding
    to `x`'s dtype, as torch (a float16 sum of 100,000 ones is inf before it is divided)."""
    x = _as_tensor(x)
    if dtype is not None:
        x = cast(x, dtype)
    _float(x, "mean")
    keep, shape = _reduced_shapes(x, _dims(dim, axis), _keep(keepdim, keepdims))
    if keep == x.shape:
        return x if shape == x.shape else reshape(x, shape)
    count = x.numel() // int(np.prod(keep, dtype=np.int64))
    # the gradient divided before it is broadcast (the same values): a binary op then reads
    # the small tensor broadcast, not a repeated copy scaled (ops._binary)
    return _apply("mean_to", (x,), shape,
                  lambda ctx, g: (broadcast_to(affine(reshape(g, ctx.arg), 1.0 / count), ctx.parents[0].shape),), keep,
                  x.dtype)


def _var_float32(x, dim, keepdim: bool, correction, unbiased, axis, keepdims) -> Tensor:
    """The variance in float32 whatever `x`'s float dtype, as torch computes half precision:
    the squares of a float16 tensor overflow long before its variance does."""
    x = cast(_float(_as_tensor(x), "var"), dtypes.float32)
    if unbiased is not None:
        correction = 1 if unbiased else 0
    dim = _dims(dim, axis)
    count = int(np.prod([x.shape[a] for a in _reduce_axes(x, dim)], dtype=np.int64))
    centered = x - mean(x, dim, keepdim=True)
    total = sum(centered * centered, dim, _keep(keepdim, keepdims))
    return affine(total, 1.0 / (count - correction) if count > correction else math.nan)


def var(x, dim=None, keepdim: bool = False, *, correction=1, unbiased=None, axis=None, keepdims=None) -> Tensor:
    """Variance with Bessel's correction by default (torch's), `correction=0` biased;
    computed in float32, rounded once to `x`'s dtype."""
    x = _as_tensor(x)
    return cast(_var_float32(x, dim, keepdim, correction, unbiased, axis, keepdims), x.dtype)


def std(x, dim=None, keepdim: bool = False, *, correction=1, unbiased=None, axis=None, keepdims=None) -> Tensor:
    """sqrt(var), in float32 and rounded once to `x`'s dtype; the gradient is 0 where the
    result is 0 (a constant input), as torch's."""
    x = _as_tensor(x)
    return cast(_sqrt_zero_grad(_var_float32(x, dim, keepdim, correction, unbiased, axis, keepdims)), x.dtype)


def _sqrt_zero_grad(v: Tensor) -> Tensor:
    """sqrt whose gradient is 0 where the result is 0 (not inf * 0 = NaN): torch's rule
    for std and the 2-norm."""
    def rule(ctx, g):
        out = _out(ctx)
        return (where(eq(out, 0.0), 0.0, affine(g / out, 0.5)),)
    return _apply("sqrt", (v,), v.shape, rule, dtype=v.dtype)


def norm(x, p=2, dim=None, keepdim: bool = False) -> Tensor:
    """The vector p-norm over `dim` (all elements by default): p = 2, 1, inf, -inf, 0 (the
    count of nonzeros) or any other positive number; gradients as torch's (0 where the
    norm is 0, shared between ties for +-inf)."""
    x = _float(_as_tensor(x), "norm")
    if p == "fro":
        p = 2
    p = float(p)
    if p == 2:
        return _sqrt_zero_grad(sum(x * x, dim, keepdim))
    if p == 1:
        return sum(abs(x), dim, keepdim)
    if p == math.inf:
        return amax(abs(x), () if dim is None else dim, keepdim)
    if p == -math.inf:
        return amin(abs(x), () if dim is None else dim, keepdim)
    if not p >= 0:
        raise ValueError(f"norm: p must be positive, 0, 'fro' or +-inf, got {p}")
    with autograd.no_grad():
        if p == 0:
            out = sum(cast(ne(x, 0.0), x.dtype), dim, keepdim)
        else:
            out = pow(sum(pow(abs(x), p), dim, keepdim), 1.0 / p)
    if not (x.requires_grad and autograd.is_recording()):
        return out
    if p == 0:
        return _with_rule(out, (x,), lambda ctx, g: (full_like(x, 0.0),), "norm")
    kept = tuple(1 if i in _reduce_axes(x, dim) else n for i, n in enumerate(x.shape))

    def rule(ctx, g):  # torch's norm_backward for other p
        v, n = x.detach(), reshape(_out(ctx), kept)
        g = reshape(g, kept)
        if p < 1:
            scaled = sign(v) * where(eq(v, 0.0), 0.0, pow(abs(v), p - 1))
            return (scaled * g * pow(n, 1 - p),)
        scaled = sign(v) * pow(abs(v), p - 1) if p < 2 else v * pow(abs(v), p - 2)
        return (scaled * where(eq(n, 0.0), 0.0, g / pow(n, p - 1)),)
    return _with_rule(out, (x,), rule, "norm")


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


# ---- max, min and their indices -------------------------------------------------------------
# Built on `argmax_first` (below): the index of the first maximum of each row, NaN counting
# as the largest value, as torch's. The values are picked at that index (exact: nothing is
# multiplied, so -inf and NaN come out as they are).
_ARGMAX_MAX_COLUMNS = 2 ** 22  # its scores (up to 3 * columns) stay exact in float32


def _as_rows(x: Tensor, axes: tuple[int, ...]) -> tuple[Tensor, tuple[int, ...]]:
    """`x` with `axes` moved last and merged into one: a (rows, n) matrix; and the shape
    of what is left (the reduced result's shape)."""
    rest = [a for a in range(x.ndim) if a not in axes]
    order = rest + list(axes)
    moved = permute(x, order) if order != list(range(x.ndim)) else x
    left = tuple(x.shape[a] for a in rest)
    n = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    if n > _ARGMAX_MAX_COLUMNS:
        raise ValueError(f"max/argmax over {n} elements per row: at most {_ARGMAX_MAX_COLUMNS} are supported")
    return reshape(moved, (int(np.prod(left, dtype=np.int64)), n)), left


def _first_max(rows: Tensor) -> Tensor:
    """(rows,) int64: the index of each row's first maximum (NaN is the maximum)."""
    return _apply("argmax_first", (rows,), rows.shape[:1], dtype=dtypes.int64)


def _pick(rows: Tensor, index: Tensor, rule) -> Tensor:
    """(rows, 1): each row's element at `index`; `rule(ctx, g)` gives its gradient."""
    return _apply("take_rows", (rows, reshape(index, (rows.shape[0], 1))), (rows.shape[0], 1), rule,
                  dtype=rows.dtype)


def _one_hot(index: Tensor, n: int) -> Tensor:
    """float32 one-hot rows of `index`, an index computed here, in range by construction
    (F.one_hot would also count out-of-range device indices: a counter and its read)."""
    return _apply("onehot", (index,), index.shape + (n,), None, n)


def _to_index_rule(ctx, g):
    """torch's max(dim) gradient: all of it to the element the index points at, and
    exact zeros elsewhere (a product with the one-hot row spread a NaN g over the row)."""
    rows, index = ctx.parents
    hot = cast(_one_hot(reshape(index, (rows.shape[0],)), rows.shape[1]), dtypes.bool_)
    return where(hot, g, 0.0), None


def _shared_rule(nan_ties: bool):
    """torch's gradient of a full max() / min() (`nan_ties`: a NaN result is shared by the
    NaN elements) and of amax / amin (a NaN result gives NaN gradients): shared evenly
    between the elements equal to the result."""
    def rule(ctx, g):
        rows, out = ctx.parents[0].detach(), _out(ctx)
        ties = eq(rows, out)
        if nan_ties:
            ties = where(isnan(out), isnan(rows), ties)
        ties = cast(ties, g.dtype)
        return ties * (g / sum(ties, -1, keepdim=True)), None
    return rule


def _reduce_extreme(x: Tensor, dim, keepdim: bool, rule) -> Tensor:
    axes = _reduce_axes(x, dim)
    if x.ndim == 0:
        rows, left = reshape(x, (1, 1)), ()
    else:
        rows, left = _as_rows(x, axes)
    values = _pick(rows, _first_max(rows.detach()), rule)
    shape = tuple(1 if i in axes else n for i, n in enumerate(x.shape)) if keepdim else left
    return reshape(values, shape)


def one_hot_argmax(x: Tensor) -> Tensor:
    """1.0 at the first maximum of each row (last axis; NaN counts as the maximum), 0.0
    elsewhere; no gradient."""
    x = _as_tensor(x)
    rows = reshape(x.detach(), (int(np.prod(x.shape[:-1], dtype=np.int64)), x.shape[-1]))
    return cast(reshape(_one_hot(_first_max(rows), x.shape[-1]), x.shape), x.dtype)


def max(x, dim=None, keepdim: bool = False, *, axis=None, keepdims=None) -> Tensor:
    """Largest value along `dim` (or of all), NaN if there is one (torch's). Along a dim
    the gradient goes to the first maximum (the index argmax gives); of all elements it
    is shared between the ties, as torch's. (Tensor.max(dim) returns values and indices.)"""
    x = _as_tensor(x)
    dim, keepdim = _dims(dim, axis), _keep(keepdim, keepdims)
    if x.dtype is dtypes.bool_:
        return any(x, dim, keepdim)
    if dim is None:
        return _reduce_extreme(x, None, keepdim, _shared_rule(nan_ties=True))
    if not isinstance(dim, numbers.Integral):
        raise TypeError(f"max takes one dim (an int), got {dim!r}; amax reduces several")
    return _reduce_extreme(x, _axis(dim, x.ndim) if x.ndim else 0, keepdim, _to_index_rule)


def min(x, dim=None, keepdim: bool = False, *, axis=None, keepdims=None) -> Tensor:
    x = _as_tensor(x)
    if x.dtype is dtypes.bool_:
        return all(x, _dims(dim, axis), _keep(keepdim, keepdims))
    return -max(-x, dim, keepdim, axis=axis, keepdims=keepdims)


def amax(x, dim=(), keepdim: bool = False) -> Tensor:
    """Largest value over `dim` (an int, a tuple; () or None: all), NaN if there is one;
    the gradient is shared between the ties (NaN gradients for a NaN result), as torch's."""
    x = _as_tensor(x)
    if x.dtype is dtypes.bool_:
        return any(x, None if dim in ((), None) else dim, keepdim)
    return _reduce_extreme(x, None if dim in ((), None) else dim, keepdim, _shared_rule(nan_ties=False))


def amin(x, dim=(), keepdim: bool = False) -> Tensor:
    x = _as_tensor(x)
    if x.dtype is dtypes.bool_:
        return all(x, None if dim in ((), None) else dim, keepdim)
    return -amax(-x, dim, keepdim)


def _keepdim(out: Tensor, shape: tuple, axis: int) -> Tensor:
    return reshape(out, tuple(1 if i == axis else n for i, n in enumerate(shape)))


def argmax(x, dim=None, keepdim: bool = False, *, axis=None) -> Tensor:
    """Index (int64) of the first maximum along `dim` (NaN counts as the maximum, as
    torch's); of the flattened tensor by default."""
    x = _as_tensor(x)
    dim = _dims(dim, axis)
    if dim is None:
        out = argmax(reshape(x, (x.numel(),)), 0)
        return reshape(out, (1,) * x.ndim) if keepdim and x.ndim else out
    a = _axis(dim, x.ndim) if x.ndim else 0
    rows, left = _as_rows(x.detach(), (a,)) if x.ndim else (reshape(x.detach(), (1, 1)), ())
    out = reshape(_first_max(rows), left)
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
    values = _take_last(last, index)
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
    return narrow(values, a, 0, k), narrow(index, a, 0, k)


def take_along_last(x, index) -> Tensor:
    """x[..., index[..., j]] per row (last axis), as torch.take_along_dim(x, index, -1):
    values picked by integer indices of another tensor of the same rank; the gradient sums
    into the picked places. Indices must lie in [0, n): known on the host, a bad one raises
    IndexError now; computed on the device, they are read clamped into range and a bad
    one raises IndexError at the next host read (checks.py)."""
    x, index = _as_tensor(x), _as_tensor(index)
    if index.dtype.category != dtypes.int32.category:
        raise TypeError(f"take_along_last needs an integer index, got {index.dtype}")
    if x.ndim == 0 or index.ndim != x.ndim:
        raise ValueError(f"take_along_last: index {index.shape} and x {x.shape} need the same rank (at least 1)")
    if index.shape[:-1] != x.shape[:-1]:
        raise ValueError(f"take_along_last: index {index.shape} and x {x.shape} differ before the last axis")
    if len(x.shape) + 1 > 4 and int(np.prod(x.shape[:-1], dtype=np.int64)) > 1:
        raise ValueError("take_along_last supports tensors of at most 3 dimensions")
    return _take_last(x, checked_index(index, x.shape[-1], "take_along_last index", "columns"))


def _take_last(x: Tensor, index: Tensor) -> Tensor:
    """take_along_last of an index known to be in range (one computed here: argsort's)."""
    rows = int(np.prod(x.shape[:-1], dtype=np.int64))

    def rule(ctx, g):
        """Each pick's gradient to its element, exact zeros elsewhere (a product with the
        one-hot rows spread a NaN over the whole row; torch scatters)."""
        src, ix = ctx.parents
        k, n = g.shape[-1], src.shape[-1]
        hot = reshape(cast(_one_hot(ix, n), dtypes.bool_), (rows, k, n))
        return reshape(sum(where(hot, reshape(g, (rows, k, 1)), 0.0), -2), src.shape), None
    return _apply("take_rows", (x, index), index.shape, rule, dtype=x.dtype)


def logsumexp(x, dim: int = -1, keepdim: bool = False, *, axis=None, keepdims=None) -> Tensor:
    """log(sum(exp(x))) along `dim`, stable, as torch's: the shift by the maximum is 0 where
    that is infinite (all -inf gives -inf, an inf gives inf); gradient exp(x - result)."""
    x = _as_tensor(x)
    axis, keepdims = (dim if axis is None else axis), _keep(keepdim, keepdims)
    with autograd.no_grad():
        m = amax(x, axis, keepdim=True)
        m = where(isinf(m), 0.0, m)
        out = log(sum(exp(x - m), axis, keepdims=True)) + m
    if x.requires_grad and autograd.is_recording():
        out = _with_rule(out, (x,), lambda ctx, g: (g * exp(x.detach() - _out(ctx)),), "logsumexp")
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


# ---- ggml builders ------------------------------------------------------------------------
@compute("mean_to")
def _mean_to(ctx, s, node):
    """sum_to (node.arg: the kept shape) and the division by the count, both in float32
    before the one rounding to the node's dtype."""
    count = math.prod(s[0].contents.ne) // math.prod(node.arg)
    return G.ggml_scale(ctx, ops._sum_to(ctx, s, node), 1.0 / count)


@compute("argmax_first")
def _argmax_first(ctx, s, node):
    """Per row, the index of the first maximum, NaN counting as larger than any number
    (torch's argmax), alike on every backend. ggml's ARGMAX alone gives some maximum (the
    CPU's last, Vulkan's one its threads meet first, CUDA's -1 for a row of -inf) and
    skips NaN. Here it finds only the row's maximum m (exact where the row has no NaN);
        score_j = (n - j) * (1 - below_j) + 2n * isnan(x_j),
    with below_j = [x_j < m] - [x_j > m] (0 where x_j = m or x_j - m is NaN), has one
    largest entry, the wanted index, which every backend's ARGMAX finds."""
    n = s[0].contents.ne[0]
    rows = math.prod(node.shape)
    x = ops.reshape(ctx, s[0], (rows, n))
    some = G.ggml_argmax(ctx, x)
    if runtime.current().backend.info.kind == "cuda":  # CUDA: -1 where no element beat -FLT_MAX
        some = G.ggml_cast(ctx, G.ggml_relu(ctx, G.ggml_cast(ctx, some, ops.F32)), ops.I32)
    m = G.ggml_get_rows(ctx, ops.reshape(ctx, x, (rows, n, 1)), ops.reshape(ctx, some, (rows, 1)))
    d = G.ggml_sub(ctx, x, ops.reshape(ctx, m, (rows, 1)))
    # step(0) is 0 on the CPU and CUDA, 1 on Vulkan: it cancels in the difference
    below = G.ggml_sub(ctx, G.ggml_step(ctx, G.ggml_neg(ctx, d)), G.ggml_step(ctx, d))
    j_minus_n = G.ggml_arange(ctx, -float(n), 0.0, 1.0)  # -(n - j)
    nan_bonus = G.ggml_scale_bias(ctx, ops._not_nan(ctx, x), -2.0 * n, 2.0 * n)
    score = G.ggml_add(ctx, G.ggml_sub(ctx, nan_bonus, j_minus_n), G.ggml_mul(ctx, below, j_minus_n))
    return ops.reshape(ctx, G.ggml_argmax(ctx, score), node.shape)


def any(x, dim=None, keepdim: bool = False) -> Tensor:
    """Whether any element (along `dim`) is nonzero; a bool tensor."""
    return gt(sum(cast(as_bool(x), dtypes.float32), dim, keepdim), 0)


def all(x, dim=None, keepdim: bool = False) -> Tensor:
    x = as_bool(x)
    return eq(sum(cast(logical_not(x), dtypes.float32), dim, keepdim), 0)
