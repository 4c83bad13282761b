"""RMSprop (PyTorch's formula): a running mean of squared gradients scales each step;
optionally centered (minus the squared running mean of gradients) and with momentum."""

from __future__ import annotations

import numpy as np

from .. import functional as F
from .optimizer import Optimizer, _check_positive, float32, store


class RMSprop(Optimizer):
    """torch.optim.RMSprop, its state on the device and updated in place:

        g = g + weight_decay * p
        square_avg = alpha * square_avg + (1 - alpha) * g * g
        avg = sqrt(square_avg - grad_avg^2) if centered (grad_avg = alpha * grad_avg + (1 - alpha) * g)
              else sqrt(square_avg);  avg = avg + eps
        buf = momentum * buf + g / avg;  p = p - lr * buf     (momentum > 0)
        p = p - lr * g / avg                                  (otherwise)

    Each product is evaluated in torch's order (its addcmul is (value * a) * b), so the
    float32 results are torch's. State keys are torch's: square_avg, momentum_buffer,
    grad_avg, step."""

    def __init__(self, params, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8, weight_decay: float = 0.0,
                 momentum: float = 0.0, centered: bool = False, accumulate_steps: int = 1,
                 average: bool = True) -> None:
        _check_positive("alpha value", alpha)
        _check_positive("epsilon value", eps)
        _check_positive("momentum value", momentum)
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                                      centered=bool(centered)), accumulate_steps, average)

    def _init_state(self, p, group) -> list:
        wanted = ["square_avg"] + (["momentum_buffer"] if group["momentum"] > 0 else []) + \
            (["grad_avg"] if group["centered"] else [])
        return self._zero_state(p, wanted)

    def _update(self, p, g, lr, group, state) -> None:
        self._init_state(p, group)  # no-op unless the state was replaced
        alpha, eps, momentum = group["alpha"], group["eps"], group["momentum"]
        p32, g = float32(p), float32(g)
        if group["weight_decay"]:
            g = g + F.affine(p32, group["weight_decay"])
        square_avg = F.affine(float32(state["square_avg"]), alpha) + F.affine(g, 1.0 - alpha) * g
        store(state["square_avg"], square_avg)
        if group["centered"]:
            grad_avg = float32(state["grad_avg"])
            grad_avg = _lerp(grad_avg, g, 1.0 - alpha)
            store(state["grad_avg"], grad_avg)
            avg = F.sqrt(square_avg + F.affine(grad_avg, -1.0) * grad_avg)
        else:
            avg = F.sqrt(square_avg)
        avg = F.affine(avg, 1.0, eps)
        if momentum > 0:
            buf = F.affine(float32(state["momentum_buffer"]), momentum) + g / avg
            store(state["momentum_buffer"], buf)
            store(p, p32 - lr * buf)
        else:
            store(p, p32 - lr * g / avg)


def _lerp(start, end, weight: float):
    """torch.lerp's two forms (each exact at its end of the weight's range), the weight
    in float32 as torch's kernel has it (1 - weight is then exact)."""
    weight = float(np.float32(weight))
    if weight < 0.5:
        return start + F.affine(end - start, weight)
    return end - F.affine(end - start, 1.0 - weight)
