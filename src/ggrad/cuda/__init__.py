"""torch.cuda's names a training script asks before it starts (`is_available`,
`is_bf16_supported`, `set_device`, `manual_seed`, `amp.GradScaler`...), answered for
ggml's CUDA devices. ggrad runs one device at a time: `set_device` makes a CUDA device
the current one (moving live state there), as `ggrad.set_device("cuda:N")` does."""

from __future__ import annotations

import numbers

from .. import random, runtime
from ..lazy import realize
from . import amp

__all__ = ["amp", "current_device", "device_count", "get_device_name", "is_available", "is_bf16_supported",
           "manual_seed", "manual_seed_all", "set_device", "synchronize"]


def _devices() -> list:
    return [d for d in runtime.devices() if d.kind == "cuda"]


def is_available() -> bool:
    """Whether this ggml build sees a CUDA device."""
    return bool(_devices())


def device_count() -> int:
    return len(_devices())


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """bfloat16 runs wherever a CUDA device runs (ggml-cuda's products and casts)."""
    return is_available()


def _index(device) -> int:
    if device is None:
        return current_device()
    if isinstance(device, numbers.Integral) and not isinstance(device, bool):
        index = int(device)
    elif isinstance(device, str) and (device == "cuda" or device.startswith("cuda:")):
        index = int(device.partition(":")[2] or 0)
    else:
        raise ValueError(f"expected a CUDA device index or 'cuda[:N]', got {device!r}")
    if not 0 <= index < device_count():
        raise RuntimeError(f"CUDA device {index} does not exist: this ggml build sees {device_count()}")
    return index


def current_device() -> int:
    """The current device's index when it is a CUDA device, else 0 (torch's default)."""
    name = runtime.get_device()
    return int(name.partition(":")[2] or 0) if name.startswith("cuda") else 0


def set_device(device) -> None:
    runtime.set_device(f"cuda:{_index(device)}")


def get_device_name(device=None) -> str:
    return _devices()[_index(device)].description


def synchronize(device=None) -> None:
    """Run everything recorded and wait until the device has finished it (a CUDA graph
    compute returns once queued)."""
    realize()
    runtime.synchronize()


def manual_seed(seed: int) -> None:
    """ggrad has one generator for every device: torch.manual_seed's."""
    random.manual_seed(seed)


manual_seed_all = manual_seed
