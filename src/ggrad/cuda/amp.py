"""torch.cuda.amp's names: `GradScaler`, and `autocast` with CUDA's default dtype."""

from __future__ import annotations

from ..amp import GradScaler
from ..amp import autocast as _autocast

__all__ = ["GradScaler", "autocast"]


def autocast(enabled: bool = True, dtype=None, cache_enabled: bool = True) -> _autocast:
    """torch.cuda.amp.autocast(...): torch.autocast("cuda", ...)."""
    return _autocast("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
