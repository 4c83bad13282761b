"""Layers and containers (PyTorch's torch.nn, on ggrad tensors)."""

from . import functional, init, lora, utils
from .attention import (MultiheadAttention, Transformer, TransformerBlock, TransformerDecoder, TransformerDecoderLayer,
                        TransformerEncoder, TransformerEncoderLayer)
from .conv import Conv1d, Conv2d, Conv3d, ConvTranspose2d
from .layers import (GELU, Bilinear, Dropout, Embedding, Flatten, Identity, LeakyReLU, Linear, PixelShuffle,
                     PixelUnshuffle, ReLU, Sigmoid, SiLU, Tanh, Unflatten, Upsample)
from .loss import (BCELoss, BCEWithLogitsLoss, CrossEntropyLoss, HuberLoss, KLDivLoss, L1Loss, MSELoss, NLLLoss,
                   SmoothL1Loss)
from .module import IncompatibleKeys, Module, ModuleDict, ModuleList, Parameter, ParameterList, Sequential
from .normalization import BatchNorm1d, BatchNorm2d, GroupNorm, InstanceNorm2d, LayerNorm, RMSNorm
from .recurrent import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell
from .pooling import AdaptiveAvgPool2d, AvgPool1d, AvgPool2d, MaxPool1d, MaxPool2d
from .quantized import QuantizedEmbedding, QuantizedLinear

__all__ = ["GRU", "LSTM", "RNN", "GRUCell", "LSTMCell", "RNNCell", "BCELoss", "BCEWithLogitsLoss", "CrossEntropyLoss", "HuberLoss", "KLDivLoss", "L1Loss", "MSELoss",
           "NLLLoss", "SmoothL1Loss", "GELU", "AdaptiveAvgPool2d", "Bilinear", "PixelShuffle", "PixelUnshuffle", "AvgPool1d", "AvgPool2d", "BatchNorm1d", "BatchNorm2d", "Conv1d", "Conv2d", "Conv3d",
           "ConvTranspose2d", "Dropout", "Embedding", "Flatten", "GroupNorm", "Identity", "InstanceNorm2d", "LayerNorm", "LeakyReLU", "Linear",
           "MaxPool1d", "MaxPool2d", "QuantizedEmbedding", "QuantizedLinear", "RMSNorm", "Unflatten", "Upsample",
           "IncompatibleKeys", "Module", "ModuleDict", "ModuleList", "ParameterList", "MultiheadAttention", "Parameter", "ReLU",
           "Sequential", "SiLU", "Sigmoid", "Tanh", "Transformer", "TransformerBlock", "TransformerDecoder",
           "TransformerDecoderLayer", "TransformerEncoder", "TransformerEncoderLayer"]
