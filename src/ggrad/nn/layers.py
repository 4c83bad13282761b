"""Layers: Linear, activations, Flatten/Unflatten, Dropout, Embedding."""

from __future__ import annotations

import math

import numpy as np

from .. import functional as F
from ..random import generator
from ..tensor import Tensor, param
from .module import Module


def _uniform(shape, bound: float) -> np.ndarray:
    return generator().uniform(-bound, bound, shape).astype(np.float32)


class Linear(Module):
    """y = x @ W.T + b, W of shape (out, in). `init`: "kaiming" (PyTorch's default:
    U(-1/sqrt(in), 1/sqrt(in))), "kaiming_normal" (N(0, 2/in), for ReLU nets) or "glorot"."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, init: str = "kaiming") -> None:
        super().__init__()
        if in_features < 1 or out_features < 1:
            raise ValueError(f"Linear needs positive sizes, got {in_features}, {out_features}")
        self.in_features, self.out_features = int(in_features), int(out_features)
        shape = (self.out_features, self.in_features)
        if init == "kaiming":
            w = _uniform(shape, 1 / math.sqrt(in_features))
        elif init == "kaiming_normal":
            w = (generator().standard_normal(shape) * math.sqrt(2 / in_features)).astype(np.float32)
        elif init == "glorot":
            w = _uniform(shape, math.sqrt(6 / (in_features + out_features)))
        else:
            raise ValueError(f"init must be 'kaiming', 'kaiming_normal' or 'glorot', got {init!r}")
        self.weight = param(w)
        self.bias = param(_uniform((out_features,), 1 / math.sqrt(in_features))) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"Linear({self.in_features}, {self.out_features}) got input of shape {x.shape}")
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Bilinear(Module):
    """y = x1 . weight . x2 + bias, weight (out_features, in1_features, in2_features);
    torch's init: U(-1/sqrt(in1_features), 1/sqrt(in1_features)) for both."""

    def __init__(self, in1_features: int, in2_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in1_features, self.in2_features, self.out_features = int(in1_features), int(in2_features), int(out_features)
        bound = 1 / math.sqrt(in1_features)
        self.weight = param(_uniform((out_features, in1_features, in2_features), bound))
        self.bias = param(_uniform((out_features,), bound)) if bias else None

    def forward(self, input1: Tensor, input2: Tensor) -> Tensor:
        return F.bilinear(input1, input2, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}")


class PixelShuffle(Module):
    """(*, C r^2, H, W) -> (*, C, H r, W r)"""

    def __init__(self, upscale_factor: int) -> None:
        super().__init__()
        self.upscale_factor = int(upscale_factor)

    def forward(self, x: Tensor) -> Tensor:
        return F.pixel_shuffle(x, self.upscale_factor)

    def extra_repr(self) -> str:
        return f"upscale_factor={self.upscale_factor}"


class PixelUnshuffle(Module):
    """(*, C, H r, W r) -> (*, C r^2, H, W)"""

    def __init__(self, downscale_factor: int) -> None:
        super().__init__()
        self.downscale_factor = int(downscale_factor)

    def forward(self, x: Tensor) -> Tensor:
        return F.pixel_unshuffle(x, self.downscale_factor)

    def extra_repr(self) -> str:
        return f"downscale_factor={self.downscale_factor}"


class Identity(Module):
    """Returns its input (a placeholder, as torch.nn.Identity; arguments are ignored)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()

    def forward(self, x: Tensor) -> Tensor:
        return x


class _Activation(Module):
    fn = staticmethod(F.relu)

    def forward(self, x: Tensor) -> Tensor:
        return type(self).fn(x)


class ReLU(_Activation):
    fn = staticmethod(F.relu)


class Sigmoid(_Activation):
    fn = staticmethod(F.sigmoid)


class Tanh(_Activation):
    fn = staticmethod(F.tanh)


class SiLU(_Activation):
    fn = staticmethod(F.silu)


class GELU(Module):
    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(x, self.approximate)


class LeakyReLU(Module):
    def __init__(self, negative_slope: float = 0.01) -> None:
        super().__init__()
        self.negative_slope = float(negative_slope)

    def forward(self, x: Tensor) -> Tensor:
        return F.leaky_relu(x, self.negative_slope)


class Flatten(Module):
    """Axes start_dim..end_dim as one (by default all but the batch axis)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = int(start_dim), int(end_dim)

    def forward(self, x: Tensor) -> Tensor:
        return F.flatten(x, self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Unflatten(Module):
    """Axis `dim` as the axes `unflattened_size`."""

    def __init__(self, dim: int, unflattened_size) -> None:
        super().__init__()
        self.dim, self.unflattened_size = int(dim), tuple(unflattened_size)

    def forward(self, x: Tensor) -> Tensor:
        return F.unflatten(x, self.dim, self.unflattened_size)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"


class Dropout(Module):
    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = float(p)

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.p, self.training)  # mask drawn on the device

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Embedding(Module):
    """Rows of a (num_embeddings, dim) table, N(0, 1) initialised like PyTorch's; the
    `padding_idx` row starts at zero and is never trained."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 max_norm: float | None = None) -> None:
        super().__init__()
        if max_norm is not None:
            raise NotImplementedError("Embedding(max_norm=...) is not supported")
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"padding_idx {padding_idx} must be within num_embeddings {num_embeddings}")
            padding_idx = int(padding_idx) % num_embeddings
        self.padding_idx = padding_idx
        table = generator().standard_normal((num_embeddings, embedding_dim)).astype(np.float32)
        if padding_idx is not None:
            table[padding_idx] = 0.0
        self.weight = param(table)

    def forward(self, ids: Tensor) -> Tensor:
        return F.embedding(ids, self.weight, self.padding_idx)

    def extra_repr(self) -> str:
        text = f"{self.num_embeddings}, {self.embedding_dim}"
        return text + (f", padding_idx={self.padding_idx}" if self.padding_idx is not None else "")


class Upsample(Module):
    """Nearest-neighbour upsampling, torch.nn.Upsample(size or scale_factor, mode="nearest")."""

    def __init__(self, size=None, scale_factor=None, mode: str = "nearest") -> None:
        super().__init__()
        self.size, self.scale_factor, self.mode = size, scale_factor, mode

    def forward(self, x: Tensor) -> Tensor:
        return F.interpolate(x, self.size, self.scale_factor, self.mode)

    def extra_repr(self) -> str:
        return f"size={self.size}, scale_factor={self.scale_factor}, mode={self.mode!r}"
