"""Adagrad and Adadelta (PyTorch's formulas): per-element rates from running sums of
squared gradients (Adadelta: of squared updates too)."""

from __future__ import annotations

import functools

import numpy as np

from .. import capture
from .. import functional as F
from ..tensor import Tensor, full_like
from .optimizer import Optimizer, _check_positive, count_group_step, float32, store


class Adagrad(Optimizer):
    """torch.optim.Adagrad, resident and in place:

        g = g + weight_decay * p
        sum = sum + g * g
        p = p - clr * g / (sqrt(sum) + eps),   clr = lr / (1 + (step - 1) * lr_decay)

    With lr_decay the group keeps its count of steps on the device, so a step uploads
    nothing (a parameter that skipped steps uses its own count from the host). State keys
    are torch's: sum, step."""

    group_state_shapes = {"decays": (1,)}

    def __init__(self, params, lr: float = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0, eps: float = 1e-10, accumulate_steps: int = 1,
                 average: bool = True) -> None:
        _check_positive("lr_decay", lr_decay)
        _check_positive("initial_accumulator_value", initial_accumulator_value)
        _check_positive("epsilon value", eps)
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value, eps=eps),
                         accumulate_steps, average)

    def _init_group(self, index, group) -> list:
        shared = self.group_state[index]
        if not group["lr_decay"] or "decays" in shared:
            return []
        t = self._steps_taken(group)
        shared["decays"], shared["step"] = Tensor(np.array([t], dtype=np.float32)), t
        return [shared["decays"]]

    def _init_state(self, p, group) -> list:
        state = self.state.setdefault(p, {"step": 0})
        if "sum" in state:
            return []
        state["sum"] = full_like(p, group["initial_accumulator_value"])
        state["sum"].node.scope = "persistent"
        return [state["sum"]]

    def _update_group(self, index, group, items, lr) -> None:
        decay = group["lr_decay"]
        clr = lr
        if decay:
            self._init_group(index, group)  # no-op unless the state was replaced
            shared = self.group_state[index]
            shared["step"] += 1
            capture.on_replay(advance=functools.partial(count_group_step, shared))
            clr = lr / F.affine(shared["decays"], decay, 1.0)
            shared["decays"]._assign(F.affine(shared["decays"], 1.0, 1.0), temporary=True)
        for p, g, state in items:
            own = clr
            if decay and state["step"] != self.group_state[index]["step"]:
                capture.refuse("a parameter skipped steps: its Adagrad rate uses a host constant")
                own = Tensor(np.array([group["lr"] / (1 + (state["step"] - 1) * decay)], dtype=np.float32))
            self._update(p, g, own, group, state)

    def _update(self, p, g, lr, group, state) -> None:
        self._init_state(p, group)
        p32, g = float32(p), float32(g)
        if group["weight_decay"]:
            g = g + F.affine(p32, group["weight_decay"])
        total = float32(state["sum"]) + g * g  # torch's addcmul with value 1
        store(state["sum"], total)
        store(p, p32 - lr * g / F.affine(F.sqrt(total), 1.0, group["eps"]))


class Adadelta(Optimizer):
    """torch.optim.Adadelta, resident and in place:

        g = g + weight_decay * p
        square_avg = rho * square_avg + (1 - rho) * g * g
        delta = sqrt(acc_delta + eps) / sqrt(square_avg + eps) * g
        acc_delta = rho * acc_delta + (1 - rho) * delta * delta
        p = p - lr * delta

    State keys are torch's: square_avg, acc_delta, step."""

    def __init__(self, params, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6, weight_decay: float = 0.0,
                 accumulate_steps: int = 1, average: bool = True) -> None:
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"Invalid rho value: {rho}")
        _check_positive("epsilon value", eps)
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay), accumulate_steps, average)

    def _init_state(self, p, group) -> list:
        return self._zero_state(p, ("square_avg", "acc_delta"))

    def _update(self, p, g, lr, group, state) -> None:
        self._init_state(p, group)
        rho, eps = group["rho"], group["eps"]
        p32, g = float32(p), float32(g)
        if group["weight_decay"]:
            g = g + F.affine(p32, group["weight_decay"])
        square_avg = F.affine(float32(state["square_avg"]), rho) + F.affine(g, 1.0 - rho) * g
        store(state["square_avg"], square_avg)
        acc_delta = float32(state["acc_delta"])
        delta = F.sqrt(F.affine(acc_delta, 1.0, eps)) / F.sqrt(F.affine(square_avg, 1.0, eps)) * g
        store(state["acc_delta"], F.affine(acc_delta, rho) + F.affine(delta, 1.0 - rho) * delta)
        store(p, p32 - lr * delta)
