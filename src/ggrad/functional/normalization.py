"""Normalizations: layer_norm over trailing axes, batch_norm (running statistics updated
in place), group_norm and instance_norm, torch.nn.functional's."""

from __future__ import annotations

import math
import numbers

from ggml import ggml as G

from .. import autograd, dtypes, runtime
from ..lazy import builder
from ..ops import compute, contiguous, contiguous_rows, reshape as ggml_reshape
from ..runtime import kernels
from ..tensor import inplace
from ._core import Tensor, _apply, _as_tensor, reshape, sum_to
from .elementwise import sqrt, square


def layer_norm(input, normalized_shape, weight=None, bias=None, eps: float = 1e-5) -> Tensor:
    """torch.nn.functional.layer_norm: (x - mean) / sqrt(var + eps) over the trailing
    `normalized_shape` axes (the biased variance), times `weight`, plus `bias`. In float32
    the normalization is ggml's NORM, one node, and its gradient ggrad's kernel where the
    backend has it (runtime/kernels.py), one node; elsewhere both are composed."""
    x = _as_tensor(input)
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not shape or x.shape[x.ndim - len(shape):] != shape:
        raise ValueError(f"layer_norm: normalized_shape {shape} is not the trailing shape of an input of shape "
                         f"{x.shape}")
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    width = math.prod(shape)
    count = math.prod(x.shape) // width if width else 0
    # ggml's NORM asserts eps >= 0 (torch's negative eps gives NaN: composed, as here); CUDA's
    # row kernels start a block a row (at most 2^31 - 1)
    if x.dtype is dtypes.float32 and eps >= 0 and width and count < 2**31:
        rows = reshape(x, (count, width))
        fused = _layer_norm_kernel(rows, shape, weight, bias, eps)
        if fused is not None:
            return reshape(fused, x.shape)
        y = reshape(_apply("layer_norm_rows", (rows,), rows.shape, _layer_norm_rule, float(eps), x.dtype), x.shape)
    else:
        y = _normalize(x, axes, eps)[0]
    if weight is not None:
        y = y * weight
    return y + bias if bias is not None else y


def _per_channel(t: Tensor, x: Tensor) -> Tensor:
    """A (C,) tensor shaped to broadcast over x's channels (axis 1)."""
    return reshape(t, (1, x.shape[1]) + (1,) * (x.ndim - 2))


def _affine(y: Tensor, x: Tensor, weight, bias) -> Tensor:
    if weight is not None:
        y = y * _per_channel(_as_tensor(weight), x)
    return y + _per_channel(_as_tensor(bias), x) if bias is not None else y


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training: bool = False,
               momentum=0.1, eps: float = 1e-5) -> Tensor:
    """torch.nn.functional.batch_norm over (N, C, ...): in training, the batch's statistics
    per channel, and the running ones (where given) moved toward them in place by
    `momentum` (a number, or a tensor: BatchNorm's cumulative average), the variance
    unbiased as torch's; otherwise the running statistics."""
    return counted_batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)


def counted_batch_norm(input, running_mean, running_var, weight=None, bias=None, training: bool = False,
                       momentum=0.1, eps: float = 1e-5, counter: Tensor | None = None) -> Tensor:
    """batch_norm that also counts `counter` (BatchNorm's num_batches_tracked) up by one
    where it moves the running statistics: in the running mean's node where the kernel
    counts (kernels.OP_VARIANTS' running_count), else composed."""
    x = _as_tensor(input)
    if x.ndim < 2:
        raise ValueError(f"batch_norm needs input of at least 2 dimensions (N, C, ...), got shape {x.shape}")
    c = x.shape[1]
    for name, t in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight),
                    ("bias", bias)):
        if t is not None and tuple(_as_tensor(t).shape) != (c,):
            raise ValueError(f"batch_norm: {name} must have shape ({c},) for an input of {c} channels, "
                             f"got {tuple(_as_tensor(t).shape)}")
    if training:
        count = x.numel() // c
        if count < 2:
            raise ValueError(f"Expected more than 1 value per channel when training, got input size {x.shape}")
        fused = _batch_norm_kernels(x, weight, bias, eps)
        if fused is not None:
            y, stats = fused
            mean, var = stats[0], stats[1]
        else:
            y, mean, var = _normalize(x, (0,) + tuple(range(2, x.ndim)), eps)
            y = _affine(y, x, weight, bias)
        moved = fused is not None and _move_running_stats(running_mean, running_var, stats, momentum, count, counter)
        if not moved and (running_mean is not None or running_var is not None):
            with autograd.no_grad():
                if counter is not None:
                    _count_up(counter)
                if running_mean is not None:
                    running_mean.assign_(running_mean * (1 - momentum) + reshape(mean, (c,)).detach() * momentum)
                if running_var is not None:
                    unbiased = reshape(var, (c,)).detach() * (momentum * (count / (count - 1)))
                    running_var.assign_(running_var * (1 - momentum) + unbiased)
    else:
        if running_mean is None or running_var is None:
            raise ValueError("batch_norm outside training needs running_mean and running_var")
        y = _batch_norm_eval_kernel(x, running_mean, running_var, weight, bias, eps)
        if y is None:
            y = _affine((x - _per_channel(running_mean, x)) / sqrt(_per_channel(running_var, x) + eps), x, weight,
                        bias)
    return y


def _batch_norm_kernels(x: Tensor, weight, bias, eps: float) -> tuple[Tensor, Tensor] | None:
    """Training's batch norm as ggrad's kernels (BATCH_STATS, BATCH_NORM, BATCH_NORM_BACK: one
    node for the statistics, one for the normalization with its affine, one for all the
    gradients): (the output, the statistics: (2, C), each channel's mean then its biased
    variance), or None where they do not serve (then it is composed, as their test oracle)."""
    weight = None if weight is None else _as_tensor(weight)
    bias = None if bias is None else _as_tensor(bias)
    if not _kernels_serve(x, (weight, bias), (kernels.BATCH_STATS, kernels.BATCH_NORM, kernels.BATCH_NORM_BACK)):
        return None
    sizes = (math.prod(x.shape[2:]), x.shape[1], x.shape[0])
    stats = _apply("batch_stats", (x.detach(),), (2, x.shape[1]), arg=sizes)
    mean, var = stats[0], stats[1]
    inputs = (x, mean, var) + tuple(t for t in (weight, bias) if t is not None)
    arg = sizes + (float(eps), weight is not None, bias is not None)
    return _apply("batch_norm", inputs, x.shape, _batch_norm_rule, arg), stats


def _kernels_serve(x: Tensor, others: tuple, needed: tuple[int, ...]) -> bool:
    """Whether the batch-norm kernels `needed` take x and `others` (None for absent ones):
    float32 all, sizes within the kernels' int32 indices, on a backend that has them."""
    present = [t for t in (x, *others) if t is not None]
    backend = runtime.current().backend
    return all(t.dtype is dtypes.float32 for t in present) and x.numel() < 2**31 and \
        all(kernels.supported(backend, k) for k in needed)


def _batch_norm_eval_kernel(x: Tensor, running_mean, running_var, weight, bias, eps: float) -> Tensor | None:
    """Batch norm over the running statistics as the normalization kernel (BATCH_NORM: one
    node, where the composed form took six), or None where it does not serve: it has no
    gradient of its own there (BATCH_NORM_BACK's goes through a batch's statistics), so only
    where no gradient is wanted."""
    others = tuple(None if t is None else _as_tensor(t) for t in (running_mean, running_var, weight, bias))
    present = [t for t in (x, *others) if t is not None]
    if (autograd.is_recording() and any(t.requires_grad for t in present)) or \
            not _kernels_serve(x, others, (kernels.BATCH_NORM,)):
        return None
    weight, bias = others[2], others[3]
    arg = (math.prod(x.shape[2:]), x.shape[1], x.shape[0], float(eps), weight is not None, bias is not None)
    inputs = (x, others[0], others[1]) + tuple(t for t in (weight, bias) if t is not None)
    return _apply("batch_norm", inputs, x.shape, None, arg)


def _count_up(counter: Tensor) -> None:
    """`counter` (BatchNorm's num_batches_tracked) plus one, stored in its buffer."""
    counter._assign(counter + 1, temporary=True)


def _move_running_stats(running_mean, running_var, stats: Tensor, momentum, count: int, counter=None) -> bool:
    """The running statistics moved toward the batch's `stats` by ggrad's RUNNING_STAT
    kernel, a node each (composed: two SCALEs and an ADD), with the composed form's rounding:
    True where it did (and `counter` counted up). Not for a momentum tensor (BatchNorm's
    cumulative average) or another dtype. From kernel set 47 each node writes its buffer in
    place (an effect, as Adam's: no copy into the buffer after it) and the running mean's
    counts `counter` too (composed, a cast, a SCALE, a cast back and a copy, before)."""
    if not isinstance(momentum, numbers.Real):  # before any arithmetic: a tensor's would record ops
        return False
    moves = [(t, offset, take) for t, offset, take in
             ((running_mean, 0, momentum), (running_var, stats.shape[1], momentum * (count / (count - 1))))
             if t is not None]
    backend = runtime.current().backend
    if not moves or not kernels.supported(backend, kernels.RUNNING_STAT) or \
            any(t.dtype is not dtypes.float32 for t, _, _ in moves):
        return False
    in_place = kernels.variant(backend, "running_count")
    with autograd.no_grad():
        if counter is not None and not in_place:
            _count_up(counter)
        for i, (t, offset, take) in enumerate(moves):
            arg = (offset, float(1 - momentum), float(take))
            if in_place:
                counted = (counter,) if counter is not None and i == 0 else ()
                inplace("running_stat_in_place", (t, stats) + counted, (t,) + counted, arg, chained=True)
            else:
                moved = _apply("running_stat", (t, stats), t.shape, arg=arg)
                t._assign(moved, temporary=True)  # only this holds it: stored as it is, no copy first
    return True


@compute("running_stat")
def _running_stat(ctx, s, node):
    offset, keep, take = node.arg
    moved = kernels.op(ctx, kernels.RUNNING_STAT, (node.shape[0], 1), [contiguous(ctx, t) for t in s],
                       [offset, keep, take])
    return ggml_reshape(ctx, moved, node.shape)


@builder("running_stat_in_place")
def _running_stat_in_place(ctx, s, effect):
    """The running buffer (s[0], a kept buffer: contiguous) moved in its own memory, and a
    counter (s[2]) counted up where given."""
    running, stats, *counter = s
    return [kernels.op_in_place(ctx, kernels.RUNNING_STAT, running, [contiguous(ctx, stats), *counter], list(effect.arg))]


def _batch_norm_rule(ctx, g):
    """dx (through the batch's statistics too), the weight's sum(g xhat) and the bias's
    sum(g), from one kernel."""
    spatial, channels, batch, _, has_weight, has_bias = ctx.arg
    x, mean, var = ctx.parents[:3]
    weight = ctx.parents[3] if has_weight else None
    n = spatial * channels * batch
    inputs = (x.detach(), g, mean, var) + (() if weight is None else (weight.detach(),))
    grads = _apply("batch_norm_back", inputs, (n + 2 * channels,), arg=ctx.arg)
    d_weight = grads[n:n + channels] if has_weight and weight.requires_grad else None
    d_bias = grads[n + channels:] if has_bias and ctx.parents[-1].requires_grad else None
    return (reshape(grads[:n], x.shape) if x.requires_grad else None, None, None) + \
        ((d_weight,) if has_weight else ()) + ((d_bias,) if has_bias else ())


def _parts(spatial: int, channels: int, batch: int, kernel: int) -> int:
    """How many parts of at least 4096 values each channel's sums are split into, for about
    2048 workgroups in all, on a backend with the split kernels (1: one kernel a channel)."""
    if not kernels.supported(runtime.current().backend, kernel):
        return 1
    return max(1, min(-(-spatial * batch // 4096), -(-2048 // channels), 256))


@compute("batch_stats")
def _batch_stats(ctx, s, node):
    spatial, channels, batch = node.arg
    x = contiguous(ctx, s[0])
    parts = _parts(spatial, channels, batch, kernels.BATCH_STATS_PARTS)
    if parts > 1:
        shape = [spatial, channels, batch, 0.0, parts]
        sums = kernels.op(ctx, kernels.BATCH_STATS_PARTS, (2 * channels * parts, 1), [x], shape)
        stats = kernels.op(ctx, kernels.BATCH_STATS_JOIN, (2 * channels, 1), [sums], shape)
    else:
        stats = kernels.op(ctx, kernels.BATCH_STATS, (2 * channels, 1), [x], [spatial, channels, batch, 0.0])
    return ggml_reshape(ctx, stats, node.shape)


@compute("batch_norm")
def _batch_norm(ctx, s, node):
    spatial, channels, batch, eps, has_weight, has_bias = node.arg
    srcs = [contiguous(ctx, t) for t in s]
    weight = srcs[3] if has_weight else None
    bias = srcs[-1] if has_bias else None
    y = kernels.op(ctx, kernels.BATCH_NORM, (spatial * channels * batch, 1), srcs[:3] + [weight, bias],
                   [spatial, channels, batch, eps])
    return ggml_reshape(ctx, y, node.shape)


@compute("batch_norm_back")
def _batch_norm_back(ctx, s, node):
    spatial, channels, batch, eps, has_weight, _ = node.arg
    srcs = [contiguous(ctx, t) for t in s]
    weight = srcs[4] if has_weight else None
    parts = _parts(spatial, channels, batch, kernels.BATCH_NORM_BACK_PARTS)
    if parts > 1:
        shape = [spatial, channels, batch, eps, parts]
        sums = kernels.op(ctx, kernels.BATCH_NORM_BACK_PARTS, (2 * channels * parts, 1), srcs[:4], shape)
        return kernels.op(ctx, kernels.BATCH_NORM_BACK_JOIN, (node.shape[0], 1), srcs[:4] + [weight, sums], shape)
    return kernels.op(ctx, kernels.BATCH_NORM_BACK, (node.shape[0], 1), srcs[:4] + [weight],
                      [spatial, channels, batch, eps])


def group_norm(input, num_groups: int, weight=None, bias=None, eps: float = 1e-5) -> Tensor:
    """torch.nn.functional.group_norm: statistics over each group of C / num_groups
    channels and all their positions, then a per-channel affine."""
    x = _as_tensor(input)
    if x.ndim < 2 or num_groups < 1 or x.shape[1] % num_groups:
        raise ValueError(f"group_norm: an input of shape {x.shape} does not split into {num_groups} groups of "
                         "channels (axis 1)")
    return _affine(_normalize_rows(x, x.shape[0] * num_groups, eps), x, weight, bias)


def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats: bool = True,
                  momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """torch.nn.functional.instance_norm over (N, C, ...): each sample's channel normalized
    over its positions, then a per-channel affine. Running statistics are not kept."""
    if running_mean is not None or running_var is not None or not use_input_stats:
        raise NotImplementedError("instance_norm with running statistics is not supported (torch's default keeps "
                                  "none)")
    x = _as_tensor(input)
    if x.ndim < 3:
        raise ValueError(f"instance_norm needs input of at least 3 dimensions (N, C, ...), got shape {x.shape}")
    return _affine(_normalize_rows(x, x.shape[0] * x.shape[1], eps), x, weight, bias)


def _normalize_rows(x: Tensor, rows: int, eps: float) -> Tensor:
    """x normalized over each of `rows` equal runs of its elements (group_norm's groups,
    instance_norm's channels): the batch-norm kernels over x as one sample of `rows`
    channels where they serve (two nodes, one back), else composed."""
    runs = reshape(x, (1, rows, x.numel() // rows))
    fused = _batch_norm_kernels(runs, None, None, eps)
    return reshape(fused[0] if fused is not None else _normalize(runs, (0, 2), eps)[0], x.shape)


def _normalize(x: Tensor, axes: tuple, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """(x - mean) / sqrt(var + eps) over `axes` (biased variance), the mean and the variance,
    composed from ggrad's ops (nn's batch and group norms use it too)."""
    mean = x.mean(axes, keepdim=True)
    centered = x - mean
    var = square(centered).mean(axes, keepdim=True)
    return centered / sqrt(var + eps), mean, var


def _layer_norm_kernel(rows: Tensor, shape: tuple, weight, bias, eps: float) -> Tensor | None:
    """LayerNorm of float32 rows with its affine as ggrad's kernels (LAYER_NORM: one node where
    NORM, MUL and ADD were three passes; its gradient LAYER_NORM_AFFINE_BACK, which also writes
    g * xhat for the weight's sum), or None where they do not serve (then composed, their test
    oracle): a weight or bias of `shape` in float32, on a backend that has the kernels."""
    params = [None if t is None else _as_tensor(t) for t in (weight, bias)]
    present = [t for t in params if t is not None]
    if not present or any(t.dtype is not dtypes.float32 or t.shape != shape for t in present):
        return None
    backend = runtime.current().backend
    needed = (kernels.LAYER_NORM, kernels.LAYER_NORM_AFFINE_BACK if params[0] is not None else kernels.LAYER_NORM_BACK)
    if rows.shape[1] >= 2**31 or not all(kernels.supported(backend, k) for k in needed):  # columns: int32
        return None
    flat = tuple(reshape(t, (rows.shape[1],)) for t in present)
    arg = (float(eps), params[0] is not None, params[1] is not None)
    return _apply("layer_norm", (rows,) + flat, rows.shape, _layer_norm_affine_rule, arg)


def _layer_norm_affine_rule(ctx, g):
    """dx through the normalization and the weight in one kernel, which writes g * xhat beside
    it where the weight wants a gradient (its sum over the rows); the bias's, g's sum."""
    eps, has_weight, has_bias = ctx.arg
    x = ctx.parents[0]
    weight = ctx.parents[1] if has_weight else None
    bias = ctx.parents[-1] if has_bias else None
    rows, width = x.shape
    d_weight = d_bias = None
    if weight is None:
        dx = _apply("layer_norm_back_kernel", (x.detach(), g), x.shape, arg=eps, dtype=x.dtype)
    else:
        terms = weight.requires_grad
        out = _apply("layer_norm_affine_back", (x.detach(), g, weight.detach()), ((2 if terms else 1) * rows, width),
                     arg=(eps, terms))
        dx = out[:rows] if terms else out
        d_weight = sum_to(out[rows:], (width,)) if terms else None
    if bias is not None and bias.requires_grad:
        d_bias = sum_to(g, (width,))
    return (dx if x.requires_grad else None,) + ((d_weight,) if has_weight else ()) + ((d_bias,) if has_bias else ())


def _layer_norm_rule(ctx, g):
    """dx = rstd (g - mean(g) - xhat mean(g xhat)): ggrad's kernel, or composed."""
    x = ctx.parents[0].detach()
    eps = ctx.arg
    if kernels.supported(runtime.current().backend, kernels.LAYER_NORM_BACK):
        return (_apply("layer_norm_back_kernel", (x, g), x.shape, arg=eps, dtype=x.dtype),)
    centered = x - x.mean(-1, keepdim=True)
    rstd = 1.0 / sqrt(square(centered).mean(-1, keepdim=True) + eps)
    xhat = centered * rstd
    return (rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True)),)


@compute("layer_norm_rows")
def _layer_norm_rows(ctx, s, node):
    return G.ggml_norm(ctx, contiguous_rows(ctx, s[0]), node.arg)


@compute("layer_norm")
def _layer_norm(ctx, s, node):
    eps, has_weight, has_bias = node.arg
    weight = contiguous(ctx, s[1]) if has_weight else None
    bias = contiguous(ctx, s[-1]) if has_bias else None
    x = contiguous_rows(ctx, s[0])
    return kernels.op(ctx, kernels.LAYER_NORM, tuple(x.contents.ne[:2]), [x, weight, bias], [eps])


@compute("layer_norm_affine_back")
def _layer_norm_affine_back(ctx, s, node):
    eps, terms = node.arg
    x, g = contiguous_rows(ctx, s[0]), contiguous_rows(ctx, s[1])
    return kernels.op(ctx, kernels.LAYER_NORM_AFFINE_BACK, (node.shape[1], node.shape[0]), [x, g, contiguous(ctx, s[2])],
                      [eps, int(terms)])


@compute("layer_norm_back_kernel")
def _layer_norm_back_kernel(ctx, s, node):
    x, g = contiguous_rows(ctx, s[0]), contiguous_rows(ctx, s[1])
    return kernels.op(ctx, kernels.LAYER_NORM_BACK, tuple(x.contents.ne[:2]), [x, g], [node.arg])
