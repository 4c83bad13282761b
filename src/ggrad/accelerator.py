"""torch.accelerator: the GPU a script should use, if there is one (CUDA first, then
Vulkan, as `ggrad.set_device("gpu")` picks)."""

from __future__ import annotations

from . import runtime

__all__ = ["current_accelerator", "device_count", "is_available"]


def _gpus() -> list:
    return [d for d in runtime.devices() if d.is_gpu]


def is_available() -> bool:
    return bool(_gpus())


def device_count() -> int:
    gpus = _gpus()
    return sum(d.kind == gpus[0].kind for d in gpus) if gpus else 0


def current_accelerator() -> str | None:
    """The kind of GPU ("cuda" or "vulkan"), or None without one."""
    gpus = _gpus()
    return gpus[0].kind if gpus else None
