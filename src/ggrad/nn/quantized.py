"""Frozen layers whose weights stay in ggml's Q8_0 blocks on the device (a quantized
llama.cpp model loaded as it is): a Linear and an Embedding. Their weights are not
parameters and not in the state dict; LoRA adapters (nn/lora.py) train beside them."""

from __future__ import annotations

from .. import dtypes
from ..functional import quantized
from ..tensor import Tensor
from .layers import Embedding, Linear
from .module import Module


class QuantizedLinear(Module):
    """y = x @ W^T (+ bias) with W frozen in Q8_0; the gradient reaches x, never W."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        super().__init__()
        if weight.dtype is not dtypes.q8_0:
            raise TypeError(f"QuantizedLinear takes a q8_0 weight (functional.quantized.quantize), got {weight.dtype}")
        self.out_features, self.in_features = weight.shape
        self.weight = weight
        self.bias = bias

    @classmethod
    def from_linear(cls, linear: Linear) -> QuantizedLinear:
        """`linear` with its weight quantized to Q8_0 (its bias kept in float32, frozen)."""
        bias = None if linear.bias is None else linear.bias.detach()
        return cls(quantized.quantize(linear.weight), bias)

    def forward(self, x: Tensor) -> Tensor:
        y = quantized.linear(x, self.weight)
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, q8_0"


class QuantizedEmbedding(Module):
    """Rows of a frozen Q8_0 table, read as float32."""

    def __init__(self, weight: Tensor) -> None:
        super().__init__()
        if weight.dtype is not dtypes.q8_0:
            raise TypeError(f"QuantizedEmbedding takes a q8_0 table, got {weight.dtype}")
        self.num_embeddings, self.embedding_dim = weight.shape
        self.weight = weight

    @classmethod
    def from_embedding(cls, embedding: Embedding) -> QuantizedEmbedding:
        return cls(quantized.quantize(embedding.weight))

    def forward(self, index) -> Tensor:
        return quantized.embedding(index, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, q8_0"
