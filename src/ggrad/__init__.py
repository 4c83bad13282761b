"""ggrad: PyTorch-style autograd and device-resident training on ggml backends."""

from . import functional, optim, runtime
from .autograd import backward, grad_tape, no_grad
from .gradcheck import gradcheck
from .runtime import count_transfers, device, devices, get_device, gpu_available, set_device
from .tensor import Tensor, full, ones, ones_like, param, realize, tensor, zeros, zeros_like

__version__ = "0.1.0"

__all__ = [
    "Tensor", "backward", "count_transfers", "device", "devices", "full", "functional",
    "get_device", "gpu_available", "grad_tape", "gradcheck", "no_grad", "ones", "ones_like",
    "optim", "param", "realize", "runtime", "set_device", "tensor", "zeros", "zeros_like",
]
