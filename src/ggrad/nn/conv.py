"""Convolution layers: torch.nn's Conv1d, Conv2d and ConvTranspose2d (same constructor
arguments, parameter names, shapes and default initialisation)."""

from __future__ import annotations

import math
import numbers

import numpy as np

from .. import functional as F
from ..random import generator
from ..tensor import Tensor, param
from .module import Module


def _tuple(value, n: int, what: str) -> tuple[int, ...]:
    values = (value,) * n if isinstance(value, numbers.Integral) else tuple(value)
    if len(values) != n or not all(isinstance(v, numbers.Integral) for v in values):
        raise TypeError(f"{what} must be an int or a {n}-tuple of ints, got {value!r}")
    return tuple(int(v) for v in values)


class _ConvNd(Module):
    """What Conv1d, Conv2d and ConvTranspose2d share: sizes, checks and torch's default
    initialisation, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias alike (its
    kaiming_uniform_(a=sqrt(5)) comes to that), fan_in being weight.shape[1] * kernel size."""

    spatial = 2
    transposed = False

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros", output_padding=0) -> None:
        super().__init__()
        n = self.spatial
        if min(in_channels, out_channels, groups) < 1 or in_channels % groups or out_channels % groups:
            raise ValueError(f"{type(self).__name__}: channels ({in_channels}, {out_channels}) must be positive "
                             f"and divisible by groups={groups}")
        if padding_mode != "zeros":
            raise NotImplementedError(f"padding_mode={padding_mode!r}: only 'zeros' is supported")
        self.in_channels, self.out_channels, self.groups = int(in_channels), int(out_channels), int(groups)
        self.kernel_size = _tuple(kernel_size, n, "kernel_size")
        self.stride, self.dilation = _tuple(stride, n, "stride"), _tuple(dilation, n, "dilation")
        self.padding = padding if isinstance(padding, str) else _tuple(padding, n, "padding")
        self.output_padding = _tuple(output_padding, n, "output_padding")
        self.padding_mode = padding_mode
        if self.transposed:
            shape = (self.in_channels, self.out_channels // self.groups) + self.kernel_size
        else:
            shape = (self.out_channels, self.in_channels // self.groups) + self.kernel_size
        bound = 1 / math.sqrt(shape[1] * math.prod(self.kernel_size))
        self.weight = param(generator().uniform(-bound, bound, shape).astype(np.float32))
        self.bias = param(generator().uniform(-bound, bound, (self.out_channels,)).astype(np.float32)) \
            if bias else None

    def extra_repr(self) -> str:
        text = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}")
        if self.padding not in ((0,) * self.spatial, "valid"):
            text += f", padding={self.padding}"
        if self.dilation != (1,) * self.spatial:
            text += f", dilation={self.dilation}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        return text + ("" if self.bias is not None else ", bias=False")


class Conv1d(_ConvNd):
    """Input (N, C, L) or (C, L); weight (out_channels, in_channels / groups, kernel_size)."""

    spatial = 1

    def forward(self, x: Tensor) -> Tensor:
        return F.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class Conv2d(_ConvNd):
    """Input (N, C, H, W) or (C, H, W); weight (out_channels, in_channels / groups, KH, KW)."""

    def forward(self, x: Tensor) -> Tensor:
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class ConvTranspose2d(_ConvNd):
    """Input (N, C, H, W) or (C, H, W); weight (in_channels, out_channels / groups, KH, KW)."""

    transposed = True

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, output_padding=0,
                 groups: int = 1, bias: bool = True, dilation=1, padding_mode: str = "zeros") -> None:
        if isinstance(padding, str):
            raise ValueError("ConvTranspose2d takes an int or a pair as padding")
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, output_padding)

    def forward(self, x: Tensor) -> Tensor:
        return F.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding, self.output_padding,
                                  self.groups, self.dilation)


class Conv3d(Module):
    """Not available, said at once: its input (N, C, D, H, W) has five axes, and ggrad's
    tensors have at most four (ggml's limit)."""

    def __init__(self, *args, **kwargs) -> None:
        raise NotImplementedError("nn.Conv3d needs (N, C, D, H, W) inputs, five axes: ggrad's tensors have at most "
                                  "four (ggml's limit). Fold the batch into the channels or the depth into the "
                                  "batch and use Conv2d")
