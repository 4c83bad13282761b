"""The ggml runtime: devices, memory pools, handles, graph execution, counted transfers."""

from .backend import DeviceInfo, devices, gpu_available
from .device import current, device, get_device, memory, on_release, reset_pass, set_device
from .graph import Graph, run_op, to_device
from .handle import Handle, aligned_copy
from .streams import settle as synchronize
from .transfers import count_transfers, transfers

__all__ = [
    "DeviceInfo", "Graph", "Handle", "aligned_copy", "count_transfers", "current", "device", "devices",
    "get_device", "gpu_available", "memory", "on_release", "reset_pass", "run_op", "set_device",
    "synchronize", "to_device", "transfers",
]
