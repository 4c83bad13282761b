"""ggrad: PyTorch-style autograd and device-resident training on ggml backends."""

from . import runtime
from .runtime import count_transfers, device, devices, get_device, gpu_available, set_device

__version__ = "0.1.0"

__all__ = ["count_transfers", "device", "devices", "get_device", "gpu_available", "runtime",
           "set_device"]
