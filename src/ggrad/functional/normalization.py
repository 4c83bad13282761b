"""Normalization over trailing axes: layer_norm."""

from __future__ import annotations

import math

from ggml import ggml as G

from .. import dtypes, runtime
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
