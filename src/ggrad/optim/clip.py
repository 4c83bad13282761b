"""Gradient clipping on the device: nothing is read unless the caller reads the norm."""

from __future__ import annotations

import math

from .. import autograd
from .. import functional as F
from ..tensor import Tensor


def _grads(params) -> list[Tensor]:
    params = [params] if isinstance(params, Tensor) else list(params)
    return [p.grad for p in params if p.grad is not None]


def clip_grad_norm_(params, max_norm: float, eps: float = 1e-6) -> Tensor:
    """Scale every gradient by min(1, max_norm / (total_norm + eps)), in place; return the
    total 2-norm as a lazy scalar tensor (reading it is one crossing, not reading it none)."""
    max_norm = float(max_norm)
    if math.isnan(max_norm) or max_norm <= 0:
        raise ValueError(f"max_norm must be positive, got {max_norm}")
    grads = _grads(params)
    if not grads:
        raise ValueError("clip_grad_norm_: no parameter has a gradient")
    with autograd.no_grad():
        total = F.sqrt(sum((F.square(g).sum() for g in grads[1:]), F.square(grads[0]).sum()))
        coef = F.clamp(max_norm / F.affine(total, 1.0, eps), max=1.0)
        for g in grads:
            g._assign(g * coef)
    return total


def clip_grad_value_(params, clip_value: float) -> None:
    """Clamp every gradient to [-clip_value, clip_value], in place."""
    clip_value = float(clip_value)
    if math.isnan(clip_value) or clip_value <= 0:
        raise ValueError(f"clip_value must be positive, got {clip_value}")
    with autograd.no_grad():
        for g in _grads(params):
            g._assign(F.clamp(g, -clip_value, clip_value))
