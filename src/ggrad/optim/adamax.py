"""Adamax (PyTorch's formula): Adam with the infinity norm in place of the second moment."""

from __future__ import annotations

import functools

import numpy as np

from .. import capture
from .. import functional as F
from ..tensor import Tensor
from .optimizer import Optimizer, _check_positive, count_group_step, float32, store
from .rmsprop import _lerp


class Adamax(Optimizer):
    """torch.optim.Adamax, resident and in place:

        g = g + weight_decay * p
        exp_avg = lerp(exp_avg, g, 1 - beta1)
        exp_inf = maximum(beta2 * exp_inf, |g| + eps)      (NaN propagates)
        p = p - lr / (1 - beta1^t) * exp_avg / exp_inf

    The group's bias correction 1 - beta1^t lives on the device, advanced as
    (1 - beta1) + beta1 * c (no cancellation in float32), so a step uploads nothing.
    State keys are torch's: exp_avg, exp_inf, step."""

    group_state_shapes = {"correction": (1,)}

    def __init__(self, params, lr: float = 2e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, accumulate_steps: int = 1, average: bool = True) -> None:
        for i, beta in enumerate(betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"Invalid beta parameter at index {i}: {beta}")
        _check_positive("epsilon value", eps)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay),
                         accumulate_steps, average)

    def _init_group(self, index, group) -> list:
        """The bias correction 1 - beta1^t, made again from the host formula when beta1
        changed (CyclicLR cycles it): torch's uses today's beta1."""
        shared = self.group_state[index]
        beta1 = group["betas"][0]
        if "correction" in shared and shared.get("correction_of", beta1) == beta1:
            return []
        t = shared["step"] if "step" in shared else self._steps_taken(group)
        shared["correction"] = Tensor(np.array([1 - beta1 ** t], dtype=np.float32))
        shared["step"], shared["correction_of"] = t, beta1
        return [shared["correction"]]

    def _init_state(self, p, group) -> list:
        return self._zero_state(p, ("exp_avg", "exp_inf"))

    def _update_group(self, index, group, items, lr) -> None:
        self._init_group(index, group)  # no-op unless the state was replaced
        shared = self.group_state[index]
        beta1 = group["betas"][0]
        shared["step"] += 1
        capture.on_replay(advance=functools.partial(count_group_step, shared))
        shared["correction"]._assign(F.affine(shared["correction"], beta1, 1.0 - beta1), temporary=True)
        clr = lr / shared["correction"]
        for p, g, state in items:
            own = clr
            if state["step"] != shared["step"]:
                capture.refuse("a parameter skipped steps: its Adamax rate uses a host constant")
                own = Tensor(np.array([group["lr"] / (1 - beta1 ** state["step"])], dtype=np.float32))
            self._update(p, g, own, group, state)

    def _update(self, p, g, lr, group, state) -> None:
        self._init_state(p, group)
        beta1, beta2 = group["betas"]
        p32, g = float32(p), float32(g)
        if group["weight_decay"]:
            g = g + F.affine(p32, group["weight_decay"])
        exp_avg = _lerp(float32(state["exp_avg"]), g, 1.0 - beta1)
        exp_inf = F.maximum(F.affine(float32(state["exp_inf"]), beta2), F.affine(F.abs(g), 1.0, group["eps"]))
        store(state["exp_avg"], exp_avg)
        store(state["exp_inf"], exp_inf)
        store(p, p32 - lr * exp_avg / exp_inf)
