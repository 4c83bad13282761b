"""ggrad: PyTorch-style autograd and device-resident training on ggml backends."""

from . import data, functional, nn, optim, runtime
from .autograd import backward, grad_tape, no_grad
from .capture import compile
from .data import DataLoader
from .gradcheck import gradcheck
from .io import export_gguf, load, save
from .random import manual_seed
from .runtime import count_transfers, device, devices, get_device, gpu_available, set_device
from .tensor import Tensor, full, ones, ones_like, param, realize, tensor, zeros, zeros_like
from .train import EarlyStopping, History, ModelCheckpoint, evaluate, fit

__version__ = "0.1.0"

__all__ = [
    "DataLoader", "EarlyStopping", "History", "ModelCheckpoint", "Tensor", "backward",
    "compile", "count_transfers", "data", "device", "devices", "evaluate", "export_gguf", "fit", "full",
    "functional", "get_device", "gpu_available", "grad_tape", "gradcheck", "load", "manual_seed",
    "nn", "no_grad", "ones", "ones_like", "optim", "param", "realize", "runtime", "save",
    "set_device", "tensor", "zeros", "zeros_like",
]
