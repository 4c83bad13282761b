"""Normalizations: layer_norm over trailing axes, batch_norm (running statistics updated
in place), group_norm and instance_norm, torch.nn.functional's."""

from __future__ import annotations

import math

from ggml import ggml as G

from .. import autograd, dtypes, runtime
from ..ops import compute, contiguous_rows
from ..runtime import kernels
from ._core import Tensor, _apply, _as_tensor, reshape
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
    if x.dtype is dtypes.float32:
        width = math.prod(shape)
        rows = reshape(x, (math.prod(x.shape) // width, width))
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
        y, mean, var = _normalize(x, (0,) + tuple(range(2, x.ndim)), eps)
        if running_mean is not None or running_var is not None:
            with autograd.no_grad():
                if running_mean is not None:
                    running_mean.assign_(running_mean * (1 - momentum) + reshape(mean, (c,)).detach() * momentum)
                if running_var is not None:
                    unbiased = reshape(var, (c,)).detach() * (momentum * (count / (count - 1)))
                    running_var.assign_(running_var * (1 - momentum) + unbiased)
    else:
        if running_mean is None or running_var is None:
            raise ValueError("batch_norm outside training needs running_mean and running_var")
        y = (x - _per_channel(running_mean, x)) / sqrt(_per_channel(running_var, x) + eps)
    return _affine(y, x, weight, bias)


def group_norm(input, num_groups: int, weight=None, bias=None, eps: float = 1e-5) -> Tensor:
    """torch.nn.functional.group_norm: statistics over each group of C / num_groups
    channels and all their positions, then a per-channel affine."""
    x = _as_tensor(input)
    if x.ndim < 2 or num_groups < 1 or x.shape[1] % num_groups:
        raise ValueError(f"group_norm: an input of shape {x.shape} does not split into {num_groups} groups of "
                         "channels (axis 1)")
    grouped = reshape(x, (x.shape[0], num_groups, -1))
    return _affine(reshape(_normalize(grouped, (2,), eps)[0], x.shape), x, weight, bias)


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
    return _affine(_normalize(x, tuple(range(2, x.ndim)), eps)[0], x, weight, bias)


def _normalize(x: Tensor, axes: tuple, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """(x - mean) / sqrt(var + eps) over `axes` (biased variance), the mean and the variance,
    composed from ggrad's ops (nn's batch and group norms use it too)."""
    mean = x.mean(axes, keepdim=True)
    centered = x - mean
    var = square(centered).mean(axes, keepdim=True)
    return centered / sqrt(var + eps), mean, var


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


@compute("layer_norm_back_kernel")
def _layer_norm_back_kernel(ctx, s, node):
    x, g = contiguous_rows(ctx, s[0]), contiguous_rows(ctx, s[1])
    return kernels.op(ctx, kernels.LAYER_NORM_BACK, tuple(x.contents.ne[:2]), [x, g], [node.arg])
