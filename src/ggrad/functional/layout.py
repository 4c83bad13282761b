"""Matrix products, layout (permute, transpose, views of shape), joining and splitting."""

from __future__ import annotations

import math
import numbers

import numpy as np

from .. import autograd, lazy
from ..runtime import precision
from ._core import (F32, Tensor, _apply, _as_tensor, _axis, _float, broadcast_shape, broadcast_to, cast, full_like, reshape,
                    result_type, sum_to)


# ---- matrices and layout -----------------------------------------------------------------
def matmul_nt(a: Tensor, b: Tensor) -> Tensor:
    """a @ b^T over the last two axes (ggml's native product: no transpose is built).
    Under autocast float operands of two dtypes meet in float32 first, as torch's do."""
    if precision.autocast_dtype() is not None and a.dtype is not b.dtype and a.dtype.is_floating_point \
            and b.dtype.is_floating_point:
        a, b = cast(a, F32), cast(b, F32)
    return _matmul_nt(a, b, _product_arg(a.dtype))


def _matmul_nt(a: Tensor, b: Tensor, arg: tuple) -> Tensor:
    _float(a, "matmul"), _float(b, "matmul")
    if a.dtype is not b.dtype:
        raise TypeError(f"matmul needs operands of one dtype, got {a.dtype} and {b.dtype}")
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-1]:
        raise ValueError(f"shape mismatch in matmul: {a.shape} @ {b.shape[:-2] + b.shape[:-3:-1]}")
    batch_a, batch_b = a.shape[:-2], b.shape[:-2]
    if batch_a == batch_b:  # matrices, or equal batches: nothing to broadcast
        return _apply("matmul_nt", (a, b), batch_a + (a.shape[-2], b.shape[-2]), _matmul_nt_rule, arg, a.dtype)
    batch = broadcast_shape(batch_a, batch_b)
    if batch is None:
        raise ValueError(f"shape mismatch in matmul: batch dims {batch_a} and {batch_b} do not broadcast")
    if len(batch) + 2 > 4:
        raise ValueError("matmul supports at most 2 batch dimensions")
    if batch_a != batch:  # ggml broadcasts only the second operand's batch
        a = broadcast_to(a, batch + a.shape[-2:])
    if not all(n % m == 0 for n, m in zip(reversed(batch), reversed(batch_b))):
        b = broadcast_to(b, batch + b.shape[-2:])
    return _apply("matmul_nt", (a, b), batch + (a.shape[-2], b.shape[-2]), _matmul_nt_rule, arg, a.dtype)


def linear(input, weight, bias=None) -> Tensor:
    """torch.nn.functional.linear: input @ weight^T + bias, weight (out, in) or (in,). The
    product is ggml's native one (weight's rows are read as they are: no transpose)."""
    input, weight = _as_tensor(input), _as_tensor(weight)
    if weight.ndim not in (1, 2):
        raise ValueError(f"linear needs a weight of shape (out_features, in_features) or (in_features,), "
                         f"got {weight.shape}")
    if isinstance(bias, Tensor) and input.ndim > 1 and bias.shape == weight.shape[:1] and weight.ndim == 2 \
            and input.dtype is F32 and weight.dtype is F32 and bias.dtype is F32 \
            and input.shape[-1] == weight.shape[1]:
        # one recorded op (a layer's forward and backward are ~14 us of Python fewer), the
        # same ggml nodes as the product and the sum below, or fewer: a GEMM kernel that adds
        # the bias (the CPU's, CUDA's under autocast too)
        return _apply("linear", (input, weight, bias), input.shape[:-1] + weight.shape[:1], _linear_rule,
                      _product_arg(F32))
    y = matmul_nt(input, weight) if input.ndim > 1 and weight.ndim == 2 else matmul(input, transpose(weight))
    return y if bias is None else y + bias


def _linear_rule(ctx, g):
    x, weight, bias = ctx.parents
    gx, gw = _product_grads(x, weight, g, ctx.saved["arg"])
    return gx, gw, (sum_to(g, bias.shape) if bias.requires_grad else None)


def _product_arg(dtype) -> tuple:
    """How a product is computed (ops._product): the matmul precision now, and under
    autocast the low dtype's storage for float32 operands. The result stays float32: ggml's
    products write float32 (torch's autocast rounds it to the low dtype)."""
    low = precision.autocast_dtype()
    return precision.get_float32_matmul_precision(), (low.storage if low is not None and dtype is F32 else None)


def _matmul_nt_rule(ctx, g):
    a, b = ctx.parents
    return _product_grads(a, b, g, ctx.saved["arg"])


def _product_grads(a: Tensor, b: Tensor, g: Tensor, arg: tuple) -> tuple:
    """The gradients of a @ b^T: their products are computed as the forward one was
    (autocast included)."""
    ga = None
    if a.requires_grad:  # b^T is free where b is itself a swap (a swap undoes itself)
        w = b.detach()
        ga = sum_to(_matmul_nt(g, transpose(w), arg) if _is_swap(w) else _matmul_nn(g, w, arg), a.shape)
    gb = None
    if b.requires_grad and b.ndim == 2 and a.ndim > 2:
        # a matrix shared by every batch (a layer's weight): one product over all the rows,
        # not one per batch summed after (a REPEAT_BACK of batch x the weight's size)
        rows_g, rows_a = reshape(g, (-1, g.shape[-1])), reshape(a.detach(), (-1, a.shape[-1]))
        gb = _matmul_tn(rows_g, rows_a, arg)
    elif b.requires_grad and _is_swap(b) and b.shape[:-2] == g.shape[:-2] == a.shape[:-2]:
        # b is a transposed view (matmul's right operand): its source's gradient a^T @ g is
        # made in the source's own layout, and the view's transpose of it undoes itself
        gb = transpose(_matmul_tn(a.detach(), g, arg))
    elif b.requires_grad:
        gb = sum_to(_matmul_tn(g, a.detach(), arg), b.shape)
    return ga, gb


def _matmul_nn(x: Tensor, y: Tensor, arg: tuple) -> Tensor:
    """x @ y over the last two axes (a product's input gradient; y's batch dims divide
    x's): ops builds it without transposing y into a copy where the backend can."""
    batch = x.shape[:-2]
    return _apply("matmul_nn", (x, y), batch + (x.shape[-2], y.shape[-1]), dtype=x.dtype, arg=arg)


def _matmul_tn(x: Tensor, y: Tensor, arg: tuple) -> Tensor:
    """x^T @ y over the last two axes, for equal batch dims (a product's weight gradient)."""
    return _apply("matmul_tn", (x, y), x.shape[:-2] + (x.shape[-1], y.shape[-1]), dtype=x.dtype, arg=arg)


def matmul(a, b) -> Tensor:
    """torch.matmul: 1-d @ 1-d is the dot product (a 0-d tensor); a 1-d operand is a
    vector otherwise (a row on the left, a column on the right; its axis is dropped from
    the result); batch dims broadcast."""
    a, b = _as_tensor(a), _as_tensor(b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul needs operands of at least 1 dimension, got {a.shape} @ {b.shape}")
    if a.ndim == 1 and b.ndim == 1:
        if a.shape != b.shape:
            raise ValueError(f"shape mismatch in matmul: the dot product of vectors {a.shape} and {b.shape}")
        return reshape(matmul_nt(reshape(a, (1,) + a.shape), reshape(b, (1,) + b.shape)), ())
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
    node = x.node
    if node.pending and node.op == "permute" and tuple(node.arg[a] for a in axes) == tuple(range(x.ndim)):
        # undoes a pending permute: its source itself (the recorded one, if the permute was
        # recorded: a rule recorded over the permute's node by another op has other parents)
        if x._ctx is not None and x._ctx.parents[0].node is node.srcs[0]:
            return x._ctx.parents[0]
        if not x.requires_grad:
            return Tensor._wrap(node.srcs[0])
    inverse = tuple(axes.index(i) for i in range(len(axes)))
    return _apply("permute", (x,), tuple(x.shape[a] for a in axes),
                  lambda ctx, g: (permute(g, inverse),), axes, x.dtype)


def _swap_axes(ndim: int) -> tuple[int, ...]:
    return tuple(range(ndim - 2)) + (ndim - 1, ndim - 2)


def _is_swap(x: Tensor) -> bool:
    """Whether `x` is a pending swap of its last two axes (transpose(x) is then its source)."""
    return x.ndim >= 2 and x.node.pending and x.node.op == "permute" and x.node.arg == _swap_axes(x.ndim)


def transpose(x, dim0: int = -2, dim1: int = -1) -> Tensor:
    x = _as_tensor(x)
    if x.ndim < 2:
        if (dim0, dim1) != (-2, -1):  # torch: a 0-d or 1-d tensor has dims -1 and 0
            _axis(dim0, 1), _axis(dim1, 1)
        return x
    if x.ndim == 2 and {dim0, dim1} in ({-2, -1}, {0, 1}):
        axes = (1, 0)
    else:
        axes = list(range(x.ndim))
        d0, d1 = _axis(dim0, x.ndim), _axis(dim1, x.ndim)
        axes[d0], axes[d1] = axes[d1], axes[d0]
        axes = tuple(axes)
    return permute(x, axes)  # (a swap of a swap undoes itself there)


# ---- views of shape ------------------------------------------------------------------------
def flatten(x, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    x = _as_tensor(x)
    if x.ndim == 0:  # torch: a 0-d tensor has dims -1 and 0
        _axis(start_dim, 1), _axis(end_dim, 1)
        return reshape(x, (1,))
    a, b = _axis(start_dim, x.ndim), _axis(end_dim, x.ndim)
    if a > b:
        raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    return reshape(x, x.shape[:a] + (int(np.prod(x.shape[a:b + 1], dtype=np.int64)),) + x.shape[b + 1:])


def unflatten(x, dim: int, sizes) -> Tensor:
    x = _as_tensor(x)
    a = _axis(dim, x.ndim)
    sizes = tuple(int(n) for n in sizes)
    if sizes.count(-1) == 1:
        known = int(np.prod([n for n in sizes if n != -1], dtype=np.int64))
        sizes = tuple(x.shape[a] // known if n == -1 else n for n in sizes)
    if int(np.prod(sizes, dtype=np.int64)) != x.shape[a]:
        raise ValueError(f"unflatten: sizes {sizes} do not multiply to {x.shape[a]} (dim {dim} of {x.shape})")
    return reshape(x, x.shape[:a] + sizes + x.shape[a + 1:])


def squeeze(x, dim=None) -> Tensor:
    """Drop axes of size 1 (all of them, or those in `dim` that have size 1, as torch)."""
    x = _as_tensor(x)
    if dim is None:
        dims = {i for i, n in enumerate(x.shape) if n == 1}
    else:
        dims = {_axis(d, max(x.ndim, 1)) for d in ((dim,) if isinstance(dim, numbers.Integral) else dim)}
        dims = {d for d in dims if d < x.ndim and x.shape[d] == 1}
    shape = tuple(n for i, n in enumerate(x.shape) if i not in dims)
    return x if shape == x.shape else reshape(x, shape)


def unsqueeze(x, dim: int) -> Tensor:
    x = _as_tensor(x)
    if not isinstance(dim, numbers.Integral) or not -x.ndim - 1 <= dim <= x.ndim:
        raise IndexError(f"unsqueeze: dim {dim} out of range for a tensor of {x.ndim} dimensions")
    d = int(dim) % (x.ndim + 1)
    if x.ndim + 1 > 4:
        raise ValueError(f"unsqueeze of a {x.ndim}-d tensor: ggml tensors have at most 4 dimensions")
    return reshape(x, x.shape[:d] + (1,) + x.shape[d:])


def expand(x, *sizes) -> Tensor:
    """Broadcast to `sizes` (-1 keeps a size), as torch's expand (a copy here, not a view)."""
    x = _as_tensor(x)
    if len(sizes) == 1 and not isinstance(sizes[0], numbers.Integral):
        sizes = tuple(sizes[0])
    lead = len(sizes) - x.ndim
    if lead < 0:
        raise ValueError(f"expand: {len(sizes)} sizes for a tensor of {x.ndim} dimensions")
    shape = tuple(x.shape[i - lead] if n == -1 and i >= lead else n for i, n in enumerate(sizes))
    return broadcast_to(x, shape)


def repeat(x, *repeats) -> Tensor:
    """Tile `x` `repeats[i]` times along each axis (torch's repeat, numpy's tile)."""
    x = _as_tensor(x)
    if len(repeats) == 1 and not isinstance(repeats[0], numbers.Integral):
        repeats = tuple(repeats[0])
    repeats = tuple(int(r) for r in repeats)
    if len(repeats) < x.ndim:
        raise ValueError(f"repeat: {len(repeats)} repeats for a tensor of {x.ndim} dimensions")
    if any(r < 1 for r in repeats):
        raise ValueError(f"repeat counts must be positive, got {repeats}")
    shape = (1,) * (len(repeats) - x.ndim) + x.shape
    tiled = tuple(r * n for r, n in zip(repeats, shape))
    if all(n == 1 for r, n in zip(repeats, shape) if r > 1):  # only unit axes grow: a broadcast
        return broadcast_to(reshape(x, shape), tiled)
    if 2 * len(shape) > 4:  # the interleaved view would need more than 4 dims: concatenate
        out = reshape(x, shape)
        for axis, r in enumerate(repeats):
            if r > 1:
                out = concat([out] * r, axis)
        return out
    inter = tuple(v for r, n in zip(repeats, shape) for v in (r, n))
    spread = broadcast_to(reshape(x, tuple(v for n in shape for v in (1, n))), inter)
    return reshape(spread, tiled)


def movedim(x, source: int, destination: int) -> Tensor:
    x = _as_tensor(x)
    s, d = _axis(source, x.ndim), _axis(destination, x.ndim)
    axes = [a for a in range(x.ndim) if a != s]
    axes.insert(d, s)
    return permute(x, axes)


# ---- slicing, joining, splitting ----------------------------------------------------------
def _slice(x: Tensor, axis: int, start: int, stop: int, step: int = 1) -> Tensor:
    """Elements start, start+step, ... < stop along `axis` (a view, then one copy)."""
    count = len(range(start, stop, step))
    if count == x.shape[axis] and step == 1:
        return x
    if step != 1 and axis == x.ndim - 1 == 3:  # the builder needs a spare dim here: merge two
        merged = reshape(x, (x.shape[0] * x.shape[1],) + x.shape[2:])
        return reshape(_slice(merged, 2, start, stop, step), x.shape[:3] + (count,))
    shape = x.shape[:axis] + (count,) + x.shape[axis + 1:]

    def rule(ctx, g):
        n = ctx.parents[0].shape[axis]
        if step == 1:
            return (_apply("pad", (g,), ctx.parents[0].shape, None, (axis, start, n - stop), g.dtype),)
        return (_unstride(g, axis, start, step, n),)
    return _apply("slice", (x,), shape, rule, (axis, start, step), x.dtype)


PLACEMENTS = ("pad", "place")  # ops that only place smaller tensors into zeros along one axis


def _placement(node) -> tuple | None:
    """(axis, ((start, piece node), ...)) of a node that only places pieces into zeros
    along one axis (a slice's gradient, or a sum of them), else None."""
    if node.op == "pad":
        axis, before, _ = node.arg
        return axis, ((before, node.srcs[0]),)
    if node.op == "place":
        axis, starts = node.arg
        return axis, tuple(zip(starts, node.srcs))
    return None


def placed_sum(a: Tensor, b: Tensor) -> Tensor | None:
    """a + b where both place pieces into zeros along one axis at ranges that do not
    overlap (the gradients of a split's pieces, summed by backward): one node over the
    pieces (CONCAT where they tile the axis) instead of a padded copy of each and their
    sums. None where that does not apply (then a + b is an ordinary sum)."""
    pa, pb = _placement(a.node), _placement(b.node)
    if pa is None or pb is None or pa[0] != pb[0] or a.shape != b.shape or a.dtype is not b.dtype \
            or autograd.is_recording() and (a.requires_grad or b.requires_grad):
        return None
    axis = pa[0]
    pieces = sorted(pa[1] + pb[1], key=lambda piece: piece[0])
    for (start, node), (following, _) in zip(pieces, pieces[1:]):
        if start + node.shape[axis] > following:
            return None
    return _apply("place", tuple([Tensor._wrap(node) for _, node in pieces]), a.shape, _place_rule,
                  (axis, tuple([start for start, _ in pieces])), a.dtype)


def _place_rule(ctx, g):
    axis, starts = ctx.arg
    return tuple(_slice(g, axis, start, start + piece.shape[axis]) for start, piece in zip(starts, ctx.parents))


def _unstride(g: Tensor, axis: int, start: int, step: int, n: int) -> Tensor:
    """The gradient of a stepped slice: g's elements back at start + k*step, zeros elsewhere.
    Worked on g as (before, count, after), so a 4-d g has the spare dim it needs."""
    count = g.shape[axis]
    before, after = int(np.prod(g.shape[:axis], dtype=np.int64)), int(np.prod(g.shape[axis + 1:], dtype=np.int64))
    spaced = _apply("pad", (reshape(g, (before, count, 1, after)),), (before, count, step, after), None,
                    (2, 0, step - 1), g.dtype)
    flat = reshape(spaced, (before, count * step, after))
    end = start + count * step
    if end > n:
        flat = _slice(flat, 1, 0, n - start)
        end = n
    out = _apply("pad", (flat,), (before, n, after), None, (1, start, n - end), g.dtype)
    return reshape(out, g.shape[:axis] + (n,) + g.shape[axis + 1:])


def narrow(x, dim: int, start: int, length: int) -> Tensor:
    x = _as_tensor(x)
    a = _axis(dim, x.ndim)
    n = x.shape[a]
    start = start + n if start < 0 else start
    if not 0 <= start or length < 1 or start + length > n:
        raise IndexError(f"narrow: [{start}, {start + length}) is outside dim {dim} of size {n}")
    return _slice(x, a, start, start + length)


def concat(tensors, axis: int = 0, *, dim=None) -> Tensor:
    """Join along an existing axis (torch.cat); dtypes promote as torch.cat's."""
    tensors = [_as_tensor(t) for t in tensors]
    if not tensors:
        raise ValueError("concat needs at least one tensor")
    axis = axis if dim is None else dim
    dtype = result_type(*tensors)
    tensors = [cast(t, dtype) for t in tensors]
    first = tensors[0]
    a = _axis(axis, first.ndim)
    for t in tensors[1:]:
        if t.ndim != first.ndim or any(p != q for i, (p, q) in enumerate(zip(t.shape, first.shape)) if i != a):
            raise ValueError(f"shape mismatch in concat along axis {a}: {first.shape} and {t.shape}")
    hosts = _host_arrays(tensors)
    if hosts is not None:
        return Tensor._wrap(lazy.from_host(np.concatenate(hosts, a), dtype))
    out = first
    for t in tensors[1:]:
        out = _concat2(out, t, a)
    return out


cat = concat


def _host_arrays(tensors: list[Tensor]) -> list[np.ndarray] | None:
    """The host data of tensors not yet on the device, none needing a gradient (a batch
    made of rows read from numpy): joined on the host, they go up as one upload instead of
    one each and a node per join. None if any is elsewhere."""
    hosts = []
    for t in tensors:
        node = t.node
        if t.requires_grad or node.op is not None or node.handle is not None or node.host is None:
            return None
        hosts.append(node.host)
    return hosts


def _concat2(x: Tensor, y: Tensor, axis: int) -> Tensor:
    n = x.shape[axis]
    shape = x.shape[:axis] + (n + y.shape[axis],) + x.shape[axis + 1:]

    def rule(ctx, g):
        return _slice(g, axis, 0, n), _slice(g, axis, n, shape[axis])
    return _apply("concat", (x, y), shape, rule, axis, x.dtype)


def pixel_shuffle(input, upscale_factor: int) -> Tensor:
    """torch.nn.functional.pixel_shuffle: (*, C r^2, H, W) -> (*, C, H r, W r), out[c, h r + i,
    w r + j] = in[c r^2 + i r + j, h, w]. Built in 4 dimensions (ggml's limit; torch's view
    is 6-d): each i's r channels turned to the last axis, the r rows stacked."""
    x, r = _as_tensor(input), upscale_factor
    if not isinstance(r, numbers.Integral) or r < 1 or x.ndim not in (3, 4) or x.shape[-3] % (r * r):
        raise ValueError(f"pixel_shuffle needs (N, C*r^2, H, W) or (C*r^2, H, W) and a positive int r; got shape "
                         f"{x.shape} and upscale_factor={r!r}")
    if r == 1:
        return x
    c, h, w = x.shape[-3] // (r * r), x.shape[-2], x.shape[-1]
    groups = math.prod(x.shape[:-3]) * c
    flat = reshape(x, (groups, r * r, h, w))
    rows = [reshape(permute(_slice(flat, 1, i * r, (i + 1) * r), (0, 2, 3, 1)), (groups, h, w * r)) for i in range(r)]
    return reshape(stack(rows, 2), x.shape[:-3] + (c, h * r, w * r))


def pixel_unshuffle(input, downscale_factor: int) -> Tensor:
    """torch.nn.functional.pixel_unshuffle: pixel_shuffle's inverse, (*, C, H r, W r) ->
    (*, C r^2, H, W)."""
    x, r = _as_tensor(input), downscale_factor
    if not isinstance(r, numbers.Integral) or r < 1 or x.ndim not in (3, 4) or x.shape[-2] % r or x.shape[-1] % r:
        raise ValueError(f"pixel_unshuffle needs (N, C, H*r, W*r) or (C, H*r, W*r) and a positive int r; got shape "
                         f"{x.shape} and downscale_factor={r!r}")
    if r == 1:
        return x
    c, h, w = x.shape[-3], x.shape[-2] // r, x.shape[-1] // r
    groups = math.prod(x.shape[:-3]) * c
    flat = reshape(x, (groups, h, r, w * r))
    parts = [permute(reshape(_slice(flat, 2, i, i + 1), (groups, h, w, r)), (0, 3, 1, 2)) for i in range(r)]
    return reshape(cat(parts, 1), x.shape[:-3] + (c * r * r, h, w))


def bilinear(input1, input2, weight, bias=None) -> Tensor:
    """torch.nn.functional.bilinear: y[..., o] = x1 . weight[o] . x2 + bias[o], weight
    (out, in1, in2); one product against the weight laid out (in1, out * in2)."""
    x1, x2, w = _as_tensor(input1), _as_tensor(input2), _as_tensor(weight)
    if w.ndim != 3 or x1.shape[-1] != w.shape[1] or x2.shape[-1] != w.shape[2] or x1.shape[:-1] != x2.shape[:-1]:
        raise ValueError(f"bilinear: inputs {x1.shape} and {x2.shape} do not fit a weight of shape {w.shape} "
                         "(out, in1, in2) with equal leading axes")
    out, in1, in2 = w.shape
    rows = math.prod(x1.shape[:-1])
    mixed = matmul(reshape(x1, (rows, in1)), reshape(permute(w, (1, 0, 2)), (in1, out * in2)))
    y = (reshape(mixed, (rows, out, in2)) * reshape(x2, (rows, 1, in2))).sum(-1)
    if bias is not None:
        y = y + bias
    return reshape(y, x1.shape[:-1] + (out,))


def stack(tensors, dim: int = 0) -> Tensor:
    """Join along a new axis."""
    tensors = [_as_tensor(t) for t in tensors]
    if not tensors:
        raise ValueError("stack needs at least one tensor")
    if any(t.shape != tensors[0].shape for t in tensors):
        raise ValueError(f"stack needs tensors of one shape, got {[t.shape for t in tensors]}")
    hosts = _host_arrays(tensors) if len({t.dtype for t in tensors}) == 1 else None
    if hosts is not None:
        return Tensor._wrap(lazy.from_host(np.stack(hosts, _axis(dim, tensors[0].ndim + 1)), tensors[0].dtype))
    return concat([unsqueeze(t, dim) for t in tensors], dim)


def split(x, split_size_or_sections, dim: int = 0) -> tuple[Tensor, ...]:
    """Pieces of `split_size` along `dim` (the last may be smaller), or of the listed sizes."""
    x = _as_tensor(x)
    a = _axis(dim, x.ndim)
    n = x.shape[a]
    if isinstance(split_size_or_sections, numbers.Integral):
        size = int(split_size_or_sections)
        if size < 1:
            raise ValueError(f"split size must be positive, got {size}")
        sizes = [min(size, n - i) for i in range(0, n, size)]
    else:
        sizes = [int(k) for k in split_size_or_sections]
        if sum(sizes) != n or any(k < 1 for k in sizes):
            raise ValueError(f"split sizes {sizes} must be positive and add up to {n}")
    starts = np.cumsum([0] + sizes[:-1])
    return tuple(_slice(x, a, int(s), int(s) + k) for s, k in zip(starts, sizes))


def chunk(x, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """At most `chunks` pieces of ceil(n / chunks) along `dim`, as torch.chunk."""
    x = _as_tensor(x)
    if chunks < 1:
        raise ValueError(f"chunk needs a positive number of chunks, got {chunks}")
    n = x.shape[_axis(dim, x.ndim)]
    return split(x, -(-n // chunks), dim)


def pad(x, pad: tuple, mode: str = "constant", value: float = 0.0) -> Tensor:
    """torch.nn.functional.pad, constant mode: `pad` lists (before, after) pairs from the
    last axis backwards; negative amounts crop."""
    x = _as_tensor(x)
    if mode != "constant":
        raise NotImplementedError(f"pad mode {mode!r}: only 'constant' is supported")
    if len(pad) % 2 or len(pad) // 2 > x.ndim:
        raise ValueError(f"pad needs (before, after) pairs for at most {x.ndim} axes, got {pad}")
    out = x
    for i in range(len(pad) // 2):
        axis = x.ndim - 1 - i
        before, after = int(pad[2 * i]), int(pad[2 * i + 1])
        n = out.shape[axis]
        if before < 0 or after < 0:
            lo, hi = max(-before, 0), n - max(-after, 0)
            if hi <= lo:
                raise ValueError(f"pad {pad} crops axis {axis} of size {n} to nothing")
            out = _slice(out, axis, lo, hi)
            before, after = max(before, 0), max(after, 0)
        if before or after:
            shape = out.shape[:axis] + (out.shape[axis] + before + after,) + out.shape[axis + 1:]
            padded = _apply("pad", (out,), shape, _pad_rule, (axis, before, after), out.dtype)
            if value != 0.0:  # the value in x's dtype (1.5 pads an int tensor with 1, as torch)
                from .compare import _scalar_like, where
                from .. import dtypes
                inside = _apply("pad", (full_like(out, 1.0, dtypes.bool_),), shape, None,
                                (axis, before, after), dtypes.bool_)
                padded = where(inside, padded, _scalar_like(value, padded, padded.dtype))
            out = padded
    return out


def _pad_rule(ctx, g):
    axis, before, after = ctx.arg
    return (_slice(g, axis, before, g.shape[axis] - after),)
