"""LoRA: low-rank adapters on chosen Linear layers of a frozen model (Hu et al. 2021, as
PEFT and llama.cpp apply them): y = base(x) + (alpha / rank) * B(A(dropout(x))), A of
shape (rank, in) drawn as a Linear's weight, B of shape (out, rank) zeros, so a fresh
adapter changes nothing."""

from __future__ import annotations

import math

import numpy as np

from .. import autograd
from ..functional import quantized
from ..tensor import Tensor, param
from .layers import Dropout, Identity, Linear, _uniform
from .module import Module
from .quantized import QuantizedLinear


class LoRALinear(Module):
    """A frozen `base` Linear (or QuantizedLinear: its quantized weight is read in place) with
    a trainable low-rank update (`lora_A`, `lora_B`)."""

    def __init__(self, base: Linear | QuantizedLinear, rank: int, alpha: float, dropout: float = 0.0) -> None:
        super().__init__()
        if not isinstance(base, (Linear, QuantizedLinear)):
            raise TypeError(f"LoRALinear adapts a Linear or QuantizedLinear, got {type(base).__name__}")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= min(base.in_features,
                                                                                       base.out_features):
            raise ValueError(f"LoRA rank must be an int in [1, {min(base.in_features, base.out_features)}], "
                             f"got {rank!r}")
        if not alpha > 0:
            raise ValueError(f"LoRA alpha must be > 0, got {alpha!r}")
        base.requires_grad_(False)
        self.base = base
        self.rank, self.alpha, self.scaling = rank, float(alpha), float(alpha) / rank
        self.lora_A = param(_uniform((rank, base.in_features), 1 / math.sqrt(base.in_features)))
        self.lora_B = param(np.zeros((base.out_features, rank), np.float32))
        self.dropout = Dropout(dropout) if dropout > 0 else Identity()

    def forward(self, x: Tensor) -> Tensor:
        update = self.dropout(x) @ self.lora_A.T @ self.lora_B.T
        return self.base(x) + update * self.scaling

    def merged(self) -> Linear:
        """A float32 Linear whose weight is base + (alpha / rank) * B @ A (what llama.cpp
        computes when it merges an adapter; a quantized base is dequantized for it)."""
        out = Linear(self.base.in_features, self.base.out_features, bias=self.base.bias is not None)
        weight = self.base.weight
        if isinstance(self.base, QuantizedLinear):
            weight = Tensor(quantized.dequantize(weight))
        with autograd.no_grad():
            out.weight.assign_(weight + (self.lora_B @ self.lora_A) * self.scaling)
            if out.bias is not None:
                out.bias.assign_(self.base.bias)
        return out

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha}"


def _names(name: str, target: str) -> bool:
    """Whether a module's qualified `name` is `target` or ends with "." + `target`."""
    return name == target or name.endswith("." + target)


def add_lora(model: Module, targets, rank: int = 8, alpha: float = 16.0, dropout: float = 0.0) -> list[str]:
    """Freeze every parameter of `model`, then put a `LoRALinear` in place of each Linear
    (or QuantizedLinear) whose qualified name is, or ends with ".", one of `targets` (e.g. ("wq", "wv")).
    Returns the names adapted; an unmatched target raises."""
    targets = (targets,) if isinstance(targets, str) else tuple(targets)
    if not targets:
        raise ValueError("add_lora needs at least one target name")
    model.requires_grad_(False)
    chosen = [(name, m) for name, m in model.named_modules() if isinstance(m, (Linear, QuantizedLinear)) and name and
              any(_names(name, t) for t in targets)]
    unmatched = [t for t in targets if not any(_names(n, t) for n, _ in chosen)]
    if unmatched:
        raise ValueError(f"add_lora: no Linear is named {unmatched} in this model")
    for name, linear in chosen:
        model.set_submodule(name, LoRALinear(linear, rank, alpha, dropout))
    return [name for name, _ in chosen]


def lora_layers(model: Module) -> dict[str, LoRALinear]:
    """The adapted layers, by qualified name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def merge_lora(model: Module) -> Module:
    """Put each adapted layer's merged Linear in its place (frozen, like the rest); returns `model`."""
    for name, layer in lora_layers(model).items():
        merged = layer.merged()
        merged.requires_grad_(False)
        model.set_submodule(name, merged)
    return model
