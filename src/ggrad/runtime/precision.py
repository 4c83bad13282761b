"""How float32 products are computed: PyTorch's matmul precision, and autocast's dtype.

`set_float32_matmul_precision` has PyTorch's meaning and default ("highest": full float32).
It is recorded on each product when the product is made (so a compiled step made under
one setting is not replayed under another) and honoured per backend:

- CPU: float32 always (ggml's CPU products have no faster reduced mode).
- CUDA: "highest" runs float32 products with cuBLAS's float32 math and no TF32 tensor-core
  kernels; "high" and "medium" allow TF32 (ggml's own default). This needs a ggml-cuda built
  by `make cuda` (scripts/patch_ggml_cuda.py); another build runs TF32 whatever is set,
  and ggrad warns once.
- Vulkan: ggml's float32 shaders round their inputs to float16 on devices with float16
  arithmetic (values over 65504 become inf), and so do its matrix-core (cooperative
  matrix) shaders. That is a device-wide choice made when the device starts: both are
  turned off (GGML_VK_DISABLE_F16, GGML_VK_DISABLE_COOPMAT, GGML_VK_DISABLE_COOPMAT2)
  unless the precision is "medium" then. Lavapipe has neither.

The autocast dtype is per thread, as torch.autocast's state is.
"""

from __future__ import annotations

import threading
import warnings

PRECISIONS = ("highest", "high", "medium")
_precision = ["highest"]
_autocast = threading.local()


def set_float32_matmul_precision(precision: str) -> None:
    """torch.set_float32_matmul_precision: "highest" (float32), "high" (TF32 allowed),
    "medium" (reduced precision allowed)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    _precision[0] = precision
    _warn_started_vulkan()


def get_float32_matmul_precision() -> str:
    return _precision[0]


def vulkan_float16_allowed() -> bool:
    """Whether a Vulkan device starting now may use its float16 shaders for float32 data."""
    return _precision[0] == "medium"


_vulkan_started: dict[str, bool] = {}  # device name -> a float16 path (shaders, matrix cores) on


def vulkan_started(name: str, float16: bool) -> None:
    _vulkan_started[name] = float16


def vulkan_float16_on(name: str) -> bool:
    """Whether the Vulkan device `name` started with its float16 paths (shaders, matrix cores) on."""
    return _vulkan_started.get(name, False)


def _warn_started_vulkan() -> None:
    for name, float16 in _vulkan_started.items():
        if float16 != vulkan_float16_allowed():
            warnings.warn(f"{name} started with float16 paths (shaders, matrix cores) {'on' if float16 else 'off'}; "
                          f"on Vulkan the matmul precision is fixed when the device starts (the next process gets "
                          f"{_precision[0]!r})", RuntimeWarning, stacklevel=3)


def autocast_dtype():
    """The low-precision dtype of the innermost enabled autocast region, else None."""
    stack = getattr(_autocast, "stack", None)
    return stack[-1] if stack else None


def snapshot() -> tuple:
    """What decides how products are recorded now (a compiled step checks it before a replay)."""
    return _precision[0], autocast_dtype()


def push_autocast(dtype) -> None:
    if not hasattr(_autocast, "stack"):
        _autocast.stack = []
    _autocast.stack.append(dtype)


def pop_autocast() -> None:
    _autocast.stack.pop()
