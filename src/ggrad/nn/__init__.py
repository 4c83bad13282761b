"""Layers and containers (PyTorch's torch.nn, on ggrad tensors)."""

from .attention import MultiheadAttention, TransformerBlock
from .layers import (GELU, BatchNorm1d, Dropout, Embedding, LayerNorm, LeakyReLU, Linear, ReLU,
                     Sigmoid, SiLU, Tanh)
from .module import Module, ModuleDict, ModuleList, Parameter, Sequential

__all__ = ["GELU", "BatchNorm1d", "Dropout", "Embedding", "LayerNorm", "LeakyReLU", "Linear",
           "Module", "ModuleDict", "ModuleList", "MultiheadAttention", "Parameter", "ReLU",
           "Sequential", "SiLU", "Sigmoid", "Tanh", "TransformerBlock"]
