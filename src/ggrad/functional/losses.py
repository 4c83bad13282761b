"""Training helpers (device random numbers, dropout) and the losses."""

from __future__ import annotations

import numpy as np

from .. import autograd, capture
from ._core import Tensor, _apply, _as_tensor, _float, cast, reshape, result_type, tensor
from .elementwise import _with_rule, abs, affine, exp, log, relu, sigmoid, square, step
from .indexing import checked_index
from .reduce import _one_hot, log_softmax, mean, sum


# ---- training helpers and losses ---------------------------------------------------------------
def rand_like(x) -> Tensor:
    """Uniform [0, 1) numbers shaped like `x`, drawn on the device: no crossing. The
    device generator's state advances in place (`ggrad.manual_seed` resets it)."""
    from ..random import device_state
    x = _as_tensor(x)
    if not x.dtype.is_floating_point:
        raise TypeError(f"rand_like needs a floating-point tensor, got {x.dtype}")
    state = device_state()
    u = _apply("rand", (state,), x.shape, dtype=x.dtype)
    with autograd.no_grad():
        state._assign(_apply("rand_next", (state,), (1,)))
    return u


def dropout(x, p: float = 0.5, training: bool = True, rng: np.random.Generator | None = None) -> Tensor:
    """Zero each element with probability p and scale the rest by 1/(1-p). The mask is
    drawn on the device (no crossing); with `rng` it is drawn on the host from that
    generator and uploaded instead (a reproducible reference)."""
    x = _as_tensor(x)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if not training or p == 0.0:
        return x
    if rng is not None:
        capture.refuse("dropout with a host rng draws its mask on the host; a replay would reuse it")
        mask = tensor((rng.random(x.shape) >= p).astype(np.float32) / np.float32(1.0 - p))
    else:
        mask = affine(step(affine(rand_like(x), 1.0, -p)), 1.0 / (1.0 - p))
    return x * (mask if mask.dtype is x.dtype else cast(mask, x.dtype))


def _reduce(loss: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return mean(loss)
    if reduction == "sum":
        return sum(loss)
    if reduction == "none":
        return loss
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _same_shape(a: Tensor, b: Tensor, what: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch in {what}: input {a.shape}, target {b.shape}")


def mse_loss(input, target, reduction: str = "mean") -> Tensor:
    input, target = _as_tensor(input), _as_tensor(target)
    _same_shape(input, target, "mse_loss")
    return _reduce(square(input - target), reduction)


def l1_loss(input, target, reduction: str = "mean") -> Tensor:
    input, target = _as_tensor(input), _as_tensor(target)
    _same_shape(input, target, "l1_loss")
    return _reduce(abs(input - target), reduction)


def cross_entropy(logits, target, reduction: str = "mean") -> Tensor:
    """Softmax cross-entropy over the last axis of `logits` (N, C). `target` holds class
    indices (N,) or probabilities (N, C); the mean is over the batch. The result has the
    logits' dtype (with probabilities: both promoted, as torch's)."""
    logits, target = _float(_as_tensor(logits), "cross_entropy"), _as_tensor(target)
    if logits.ndim != 2:
        raise ValueError(f"cross_entropy needs logits of shape (N, C), got {logits.shape}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    n, classes = logits.shape
    if not target.dtype.is_floating_point:
        if target.shape != (n,):
            raise ValueError(f"shape mismatch in cross_entropy: logits {logits.shape}, class targets {target.shape} (want ({n},))")
        index = checked_index(target, classes, "class index", "classes")
        per_sample = _apply("class_cross_entropy", (logits, index), (n,), _class_cross_entropy_rule, dtype=logits.dtype)
        return _reduce(per_sample, reduction)
    if target.shape != logits.shape:
        raise ValueError(f"shape mismatch in cross_entropy: logits {logits.shape}, probability targets {target.shape}")
    dtype = result_type(logits, target)
    logits, target = cast(logits, dtype), cast(target, dtype)
    per_sample = _apply("softmax_cross_entropy", (logits, target), (n,), _cross_entropy_rule, dtype=logits.dtype)
    return _reduce(per_sample, reduction)


def _class_cross_entropy_rule(ctx, g):
    """d/dlogits = g * (softmax - one_hot(index)), per row."""
    logits, index = ctx.parents
    hot = cast(_one_hot(index, logits.shape[1]), logits.dtype)
    return _apply("softmax_cross_entropy_back", (logits.detach(), hot, g), logits.shape, dtype=logits.dtype), None


def _cross_entropy_rule(ctx, g):
    """d/dlogits = g * (softmax * sum(target) - target); d/dtarget = -g * log_softmax(logits)."""
    logits, target = ctx.parents
    g_logits = _apply("softmax_cross_entropy_back", (logits.detach(), target.detach(), g), logits.shape,
                      dtype=logits.dtype) if logits.requires_grad else None
    g_target = -(log_softmax(logits.detach()) * reshape(g, (g.shape[0], 1))) if target.requires_grad else None
    return g_logits, g_target


def binary_cross_entropy_with_logits(logits, target, reduction: str = "mean") -> Tensor:
    """(1 - y) x + max(-x, 0) + log(1 + exp(-|x|)), stable for large |x| and torch's at
    infinite x. The gradient is torch's, sigmoid(x) - y (and -x for the target): the
    formula's kinks at x = 0 gave the wrong one there (-0.5 for y = 0.5, not 0)."""
    x, y = _as_tensor(logits), _as_tensor(target)
    _same_shape(x, y, "binary_cross_entropy_with_logits")
    with autograd.no_grad():
        loss = affine(y, -1.0, 1.0) * x + relu(-x) + log(affine(exp(-abs(x)), 1.0, 1.0))
    if (x.requires_grad or y.requires_grad) and autograd.is_recording():
        loss = _with_rule(loss, (x, y), _bce_with_logits_rule, "binary_cross_entropy_with_logits")
    return _reduce(loss, reduction)


def _bce_with_logits_rule(ctx, g):
    x, y = (t.detach() for t in ctx.parents)
    return (g * (sigmoid(x) - y) if ctx.parents[0].requires_grad else None,
            -(g * x) if ctx.parents[1].requires_grad else None)
