"""Frozen layers whose weights stay in ggml's quantized blocks on the device (Q4_0 ... Q8_0,
Q4_K, Q5_K, Q6_K: a quantized llama.cpp model loaded as it is): a Linear and an
Embedding. Their weights are not parameters and not in the state dict; LoRA adapters
(nn/lora.py) train beside them."""

from __future__ import annotations

from .. import dtypes
from ..functional import quantized
from ..tensor import Tensor
from .layers import Embedding, Linear
from .module import Module


class QuantizedLinear(Module):
    """y = x @ W^T (+ bias) with W frozen in its blocks; the gradient reaches x, never W. The
    bias is float32, frozen too: a buffer, so the state dict holds it (qwen2's q/k/v
    biases load and save with their quantized weights)."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = quantized.frozen_weight(weight, "QuantizedLinear").shape
        self.weight = weight
        if bias is None:
            self.bias = None
        else:
            self.register_buffer("bias", bias.detach())

    @classmethod
    def from_linear(cls, linear: Linear, dtype=dtypes.q8_0) -> QuantizedLinear:
        """`linear` with its weight quantized to `dtype` (its bias kept in float32, frozen)."""
        bias = None if linear.bias is None else linear.bias.detach()
        return cls(quantized.quantize(linear.weight, dtype), bias)

    def forward(self, x: Tensor) -> Tensor:
        y = quantized.linear(x, self.weight)
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.weight.dtype.name}"


class QuantizedEmbedding(Module):
    """Rows of a frozen quantized table, read as float32."""

    def __init__(self, weight: Tensor) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = quantized.frozen_weight(weight, "QuantizedEmbedding", "table").shape
        self.weight = weight

    @classmethod
    def from_embedding(cls, embedding: Embedding, dtype=dtypes.q8_0) -> QuantizedEmbedding:
        return cls(quantized.quantize(embedding.weight, dtype))

    def forward(self, index) -> Tensor:
        return quantized.embedding(index, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.weight.dtype.name}"
