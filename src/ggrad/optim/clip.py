"""Gradient clipping on the device: nothing is read unless the caller reads the norm."""

from __future__ import annotations

import math

from .. import autograd
from .. import functional as F
from ..tensor import Tensor, tensor


def _grads(params) -> list[Tensor]:
    params = [params] if isinstance(params, Tensor) else list(params)
    return [p.grad for p in params if p.grad is not None]


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach: bool | None = None) -> Tensor:
    """torch.nn.utils.clip_grad_norm_: scale every gradient in place by
    ``min(1, max_norm / (total_norm + 1e-6))``, where total_norm is the `norm_type` norm of
    the gradients' norms (``'inf'`` allowed); return total_norm, a lazy 0-d tensor (reading
    it is one crossing, not reading it none). As torch's, a non-finite total norm scales
    the gradients anyway (by 0: an inf entry becomes NaN, a NaN norm makes them all NaN)
    unless `error_if_nonfinite`, which raises RuntimeError instead: that reads the norm on
    the host (one crossing, and a `ggrad.compile` step doing it is not captured). No
    gradient: returns tensor(0.). `foreach` is accepted for torch's signature (one graph
    runs all the gradients either way)."""
    max_norm = float(max_norm)
    if math.isnan(max_norm) or max_norm < 0:
        raise ValueError(f"max_norm must be a number >= 0, got {max_norm}")
    norm_type = float(norm_type)
    if math.isnan(norm_type) or norm_type < 0 and norm_type != -math.inf:
        raise ValueError(f"norm_type must be >= 0 or +-inf, got {norm_type}")
    if foreach is not None and not isinstance(foreach, bool):
        raise TypeError(f"foreach must be None or a bool, got {foreach!r}")
    grads = _grads(parameters)
    if not grads:
        return tensor(0.0)
    with autograd.no_grad():
        norms = [F.norm(g, norm_type).reshape((1,)) for g in grads]
        total = F.norm(F.cat(norms) if len(norms) > 1 else norms[0], norm_type)
        if error_if_nonfinite and not bool(F.isfinite(total).item()):
            raise RuntimeError(
                f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it "
                "cannot be clipped. To disable this error and scale the gradients by the non-finite norm "
                "anyway, set `error_if_nonfinite=False`")
        coef = F.clamp(max_norm / F.affine(total, 1.0, 1e-6), max=1.0)  # torch: 1 / x, times max_norm
        for g in grads:
            g._assign(g * coef.to(g.dtype))
    return total


def clip_grad_value_(parameters, clip_value: float, foreach: bool | None = None) -> None:
    """Clamp every gradient to [-clip_value, clip_value], in place (NaN stays NaN)."""
    clip_value = float(clip_value)
    if math.isnan(clip_value) or clip_value <= 0:
        raise ValueError(f"clip_value must be positive, got {clip_value}")
    with autograd.no_grad():
        for g in _grads(parameters):
            g._assign(F.clamp(g, -clip_value, clip_value))
