"""Normalisation layers, torch.nn's: BatchNorm1d/2d, LayerNorm, GroupNorm, RMSNorm,
InstanceNorm2d. Each is mean/variance arithmetic on the device; running statistics are
buffers updated in place (no crossing)."""

from __future__ import annotations

import numbers

import numpy as np

from .. import dtypes
from .. import functional as F
from ..autograd import no_grad
from ..functional.normalization import _count_up, _normalize, counted_batch_norm
from ..tensor import Tensor, param, tensor
from .module import Module


class _BatchNorm(Module):
    """Batch statistics over every axis but the channels' (1) in training, the running
    ones in eval. The running variance is the unbiased one, as torch's; momentum=None
    keeps a cumulative average (factor 1 / num_batches_tracked, computed on the device)."""

    ndims: tuple[int, ...] = (4,)

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True) -> None:
        super().__init__()
        if num_features < 1:
            raise ValueError(f"{type(self).__name__} needs a positive num_features, got {num_features}")
        self.num_features, self.eps, self.momentum = int(num_features), float(eps), momentum
        self.affine, self.track_running_stats = bool(affine), bool(track_running_stats)
        self.weight = param(np.ones(num_features, np.float32)) if affine else None
        self.bias = param(np.zeros(num_features, np.float32)) if affine else None
        if track_running_stats:
            self.register_buffer("running_mean", tensor(np.zeros(num_features, np.float32)))
            self.register_buffer("running_var", tensor(np.ones(num_features, np.float32)))
            self.register_buffer("num_batches_tracked", tensor(np.array(0, np.int64)))
        else:
            self.running_mean = self.running_var = self.num_batches_tracked = None

    def forward(self, x: Tensor) -> Tensor:
        name, c = type(self).__name__, self.num_features
        if x.ndim not in self.ndims or x.shape[1] != c:
            raise ValueError(f"{name}({c}) needs input of {' or '.join(map(str, self.ndims))} dimensions with "
                             f"{c} channels on axis 1, got shape {x.shape}")
        if self.training and x.numel() // c < 2:
            raise ValueError(f"{name} in training needs more than 1 value per channel, got input {x.shape}")
        factor, counter = 0.0, None
        tracking = self.training and self.track_running_stats
        if tracking and self.momentum is None:  # the cumulative average's factor reads the count
            with no_grad():
                _count_up(self.num_batches_tracked)
            factor = 1.0 / F.cast(self.num_batches_tracked, dtypes.float32)
        elif tracking:  # counted where the running statistics move (one node on ggrad's kernels)
            factor, counter = float(self.momentum), self.num_batches_tracked
        batch = self.training or not self.track_running_stats
        return counted_batch_norm(x, self.running_mean if tracking or not batch else None,
                                  self.running_var if tracking or not batch else None, self.weight, self.bias, batch,
                                  factor, self.eps, counter)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Over (N, C) or (N, C, L)."""

    ndims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Over (N, C, H, W)."""

    ndims = (4,)


def _shape(normalized_shape) -> tuple[int, ...]:
    shape = (normalized_shape,) if isinstance(normalized_shape, numbers.Integral) else tuple(normalized_shape)
    if not shape or not all(isinstance(n, numbers.Integral) and n > 0 for n in shape):
        raise ValueError(f"normalized_shape must be a positive int or a tuple of them, got {normalized_shape!r}")
    return tuple(int(n) for n in shape)


def _check_trailing(x: Tensor, shape: tuple, name: str) -> tuple[int, ...]:
    if x.shape[x.ndim - len(shape):] != shape or x.ndim < len(shape):
        raise ValueError(f"{name}({shape}) got input of shape {x.shape}: its last axes must be {shape}")
    return tuple(range(x.ndim - len(shape), x.ndim))


class LayerNorm(Module):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last len(normalized_shape) axes."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True) -> None:
        super().__init__()
        self.normalized_shape, self.eps = _shape(normalized_shape), float(eps)
        self.elementwise_affine = bool(elementwise_affine)
        self.weight = param(np.ones(self.normalized_shape, np.float32)) if elementwise_affine else None
        self.bias = param(np.zeros(self.normalized_shape, np.float32)) if elementwise_affine and bias else None

    def forward(self, x: Tensor) -> Tensor:
        _check_trailing(x, self.normalized_shape, "LayerNorm")
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


_MACHINE_EPS = {"float32": float(np.finfo(np.float32).eps), "float16": float(np.finfo(np.float16).eps),
                "bfloat16": 2.0 ** -7}


class RMSNorm(Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last len(normalized_shape) axes; eps
    None is the input dtype's machine epsilon, as torch's."""

    def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True) -> None:
        super().__init__()
        self.normalized_shape, self.eps = _shape(normalized_shape), eps
        self.weight = param(np.ones(self.normalized_shape, np.float32)) if elementwise_affine else None

    def forward(self, x: Tensor) -> Tensor:
        axes = _check_trailing(x, self.normalized_shape, "RMSNorm")
        eps = self.eps if self.eps is not None else _MACHINE_EPS.get(x.dtype.name, _MACHINE_EPS["float32"])
        y = x / F.sqrt(F.square(x).mean(axes, keepdim=True) + eps)
        return y * self.weight if self.weight is not None else y

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.weight is not None}"


class GroupNorm(Module):
    """Statistics over each group of num_channels / num_groups channels (and all their
    positions), then a per-channel affine."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True) -> None:
        super().__init__()
        if num_groups < 1 or num_channels % num_groups:
            raise ValueError(f"GroupNorm: num_channels={num_channels} must be divisible by num_groups={num_groups}")
        self.num_groups, self.num_channels, self.eps, self.affine = int(num_groups), int(num_channels), float(eps), affine
        self.weight = param(np.ones(num_channels, np.float32)) if affine else None
        self.bias = param(np.zeros(num_channels, np.float32)) if affine else None

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim < 2 or x.shape[1] != self.num_channels:
            raise ValueError(f"GroupNorm({self.num_groups}, {self.num_channels}) got input of shape {x.shape}")
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


class InstanceNorm2d(Module):
    """Statistics over each sample's channel (H, W), torch's default: no running
    statistics, no affine."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = False,
                 track_running_stats: bool = False) -> None:
        super().__init__()
        if track_running_stats:
            raise NotImplementedError("InstanceNorm2d(track_running_stats=True) is not supported")
        self.num_features, self.eps, self.affine = int(num_features), float(eps), bool(affine)
        self.weight = param(np.ones(num_features, np.float32)) if affine else None
        self.bias = param(np.zeros(num_features, np.float32)) if affine else None

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim not in (3, 4) or x.shape[-3] != self.num_features:
            raise ValueError(f"InstanceNorm2d({self.num_features}) needs (N, C, H, W) or (C, H, W), got {x.shape}")
        y, _, _ = _normalize(x, (-2, -1), self.eps)
        if self.weight is None:
            return y
        per_channel = (self.num_features, 1, 1)
        return y * F.reshape(self.weight, per_channel) + F.reshape(self.bias, per_channel)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, affine={self.affine}"
