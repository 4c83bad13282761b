"""NAdam and RAdam (PyTorch's formulas): Adam with Nesterov momentum, and Adam with its
variance rectified while the second moment's average is short."""

from __future__ import annotations

import functools
import math

import numpy as np

from .. import capture
from .. import functional as F
from ..tensor import Tensor
from .optimizer import Optimizer, _check_positive, count_group_step, float32, store
from .rmsprop import _lerp


def _check_betas(betas) -> tuple[float, float]:
    for i, beta in enumerate(betas):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {beta}")
    return tuple(betas)


class _StepScalars(Optimizer):
    """An Adam-like optimizer whose update takes scalars that follow the step count t.
    The group keeps t on the device (a float: exact to 2^24 steps) and the bias correction
    1 - beta2^t (advanced as (1 - beta2) + beta2 * c: no cancellation in float32), so a
    step uploads nothing. A parameter whose own step count differs (it skipped steps) gets
    its scalars from the host."""

    group_state_shapes = {"t": (1,), "correction2": (1,)}

    def _init_group(self, index, group) -> list:
        """t and the correction, made again from the host formula when beta2 changed:
        torch's is 1 - beta2^t with today's beta2 (as Adam's and Adamax's)."""
        shared = self.group_state[index]
        beta2 = group["betas"][1]
        if "t" in shared and shared.get("correction2_of", beta2) == beta2:
            return []
        t = shared["step"] if "step" in shared else self._steps_taken(group)
        made = [] if "t" in shared else [Tensor(np.array([t], dtype=np.float32))]
        if made:
            shared["t"] = made[0]
        shared["correction2"] = Tensor(np.array([1 - beta2 ** t], dtype=np.float32))
        shared["step"], shared["correction2_of"] = t, beta2
        return made + [shared["correction2"]]

    def _init_state(self, p, group) -> list:
        return self._zero_state(p, ("exp_avg", "exp_avg_sq"))

    def _update_group(self, index, group, items, lr) -> None:
        self._init_group(index, group)  # no-op unless the state was replaced
        shared = self.group_state[index]
        beta2 = group["betas"][1]
        shared["step"] += 1
        capture.on_replay(advance=functools.partial(count_group_step, shared))
        shared["t"]._assign(F.affine(shared["t"], 1.0, 1.0), temporary=True)
        shared["correction2"]._assign(F.affine(shared["correction2"], beta2, 1.0 - beta2), temporary=True)
        for p, g, state in items:
            t, c2 = shared["t"], shared["correction2"]
            if state["step"] != shared["step"]:
                capture.refuse(f"a parameter skipped steps: its {type(self).__name__} scalars are host constants")
                t = Tensor(np.array([state["step"]], dtype=np.float32))
                c2 = Tensor(np.array([1 - beta2 ** state["step"]], dtype=np.float32))
            self._update(p, g, lr, group, state, t, c2)

    def _moments(self, p, g, group, state, lr) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(p, g, exp_avg, exp_avg_sq) after weight decay and the moments' update, stored."""
        self._init_state(p, group)
        beta1, beta2 = group["betas"]
        p32, g = float32(p), float32(g)
        if group["weight_decay"]:
            if group["decoupled_weight_decay"]:
                p32 = p32 * F.affine(lr, -group["weight_decay"], 1.0)
            else:
                g = g + F.affine(p32, group["weight_decay"])
        exp_avg = _lerp(float32(state["exp_avg"]), g, 1.0 - beta1)
        exp_avg_sq = F.affine(float32(state["exp_avg_sq"]), beta2) + F.affine(g * g, 1.0 - beta2)
        store(state["exp_avg"], exp_avg)
        store(state["exp_avg_sq"], exp_avg_sq)
        return p32, g, exp_avg, exp_avg_sq


class NAdam(_StepScalars):
    """torch.optim.NAdam, resident and in place (t counts this parameter's steps):

        mu_t = beta1 (1 - 0.96 ** (t psi) / 2),  psi = momentum_decay
        mu_product = mu_product * mu_t
        exp_avg = lerp(exp_avg, g, 1 - beta1);  exp_avg_sq = beta2 exp_avg_sq + (1 - beta2) g^2
        denom = sqrt(exp_avg_sq / (1 - beta2^t)) + eps
        p = p - lr (1 - mu_t) / (1 - mu_product) g / denom
        p = p - lr mu_{t+1} / (1 - mu_product mu_{t+1}) exp_avg / denom

    Weight decay adds weight_decay * p to g, or with decoupled_weight_decay multiplies p
    by 1 - lr weight_decay first. The mu's are computed on the device from the group's t.
    State keys are torch's: step, mu_product, exp_avg, exp_avg_sq."""

    scalar_state = ("mu_product",)

    def __init__(self, params, lr: float = 2e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum_decay: float = 4e-3, decoupled_weight_decay: bool = False,
                 accumulate_steps: int = 1, average: bool = True) -> None:
        _check_positive("epsilon value", eps)
        if not momentum_decay >= 0.0:
            raise ValueError(f"Invalid momentum_decay value: {momentum_decay}")
        super().__init__(params, dict(lr=lr, betas=_check_betas(betas), eps=eps, weight_decay=weight_decay,
                                      momentum_decay=momentum_decay, decoupled_weight_decay=decoupled_weight_decay),
                         accumulate_steps, average)

    def _init_state(self, p, group) -> list:
        made = super()._init_state(p, group)
        state = self.state[p]
        if "mu_product" not in state:
            state["mu_product"] = Tensor(np.ones(1, dtype=np.float32))
            made.append(state["mu_product"])
        return made

    def _update(self, p, g, lr, group, state, t, c2) -> None:
        beta1 = group["betas"][0]
        p32, g, exp_avg, exp_avg_sq = self._moments(p, g, group, state, lr)
        rate = group["momentum_decay"] * math.log(0.96)  # 0.96 ** (t psi) = exp(t psi ln 0.96)
        mu = F.affine(F.exp(F.affine(t, rate)), -0.5 * beta1, beta1)
        mu_next = F.affine(F.exp(F.affine(t, rate, rate)), -0.5 * beta1, beta1)
        mu_product = float32(state["mu_product"]) * mu
        store(state["mu_product"], mu_product)
        denom = F.affine(F.sqrt(exp_avg_sq / c2), 1.0, group["eps"])
        p32 = p32 - lr * F.affine(mu, -1.0, 1.0) / F.affine(mu_product, -1.0, 1.0) * g / denom
        p32 = p32 - lr * mu_next / F.affine(mu_product * mu_next, -1.0, 1.0) * exp_avg / denom
        store(p, p32)


class RAdam(_StepScalars):
    """torch.optim.RAdam, resident and in place (t counts this parameter's steps):

        exp_avg = lerp(exp_avg, g, 1 - beta1);  exp_avg_sq = beta2 exp_avg_sq + (1 - beta2) g^2
        rho_inf = 2 / (1 - beta2) - 1;  rho_t = rho_inf - 2 t beta2^t / (1 - beta2^t)
        rho_t > 5:  p = p - exp_avg / (1 - beta1^t) lr sqrt(1 - beta2^t) / (sqrt(exp_avg_sq) + eps) rect,
                    rect = sqrt((rho_t - 4)(rho_t - 2) rho_inf / ((rho_inf - 4)(rho_inf - 2) rho_t))
        else:       p = p - exp_avg / (1 - beta1^t) lr

    Weight decay as NAdam's. Which branch a step takes follows t alone, known on the host
    (ggrad.compile captures no step before the rectified ones); the scalars are computed
    on the device from the group's t (beta^t as exp(t ln beta)).
    State keys are torch's: step, exp_avg, exp_avg_sq."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, decoupled_weight_decay: bool = False, accumulate_steps: int = 1,
                 average: bool = True) -> None:
        _check_positive("epsilon value", eps)
        super().__init__(params, dict(lr=lr, betas=_check_betas(betas), eps=eps, weight_decay=weight_decay,
                                      decoupled_weight_decay=decoupled_weight_decay), accumulate_steps, average)

    def _update(self, p, g, lr, group, state, t, c2) -> None:
        beta1, beta2 = group["betas"]
        p32, g, exp_avg, exp_avg_sq = self._moments(p, g, group, state, lr)
        c1 = F.affine(F.exp(F.affine(t, math.log(beta1))), -1.0, 1.0) if beta1 > 0 else F.affine(t, 0.0, 1.0)
        corrected = exp_avg / c1 * lr
        step = state["step"]
        rho_inf = 2 / (1 - beta2) - 1
        if rho_inf - 2 * step * beta2 ** step / (1 - beta2 ** step) > 5.0:  # torch's test, in doubles
            power2 = F.exp(F.affine(t, math.log(beta2))) if beta2 > 0 else F.affine(t, 0.0, 0.0)
            rho_t = F.affine(t * power2 / c2, -2.0, rho_inf)
            rect = F.sqrt(F.affine(rho_t, 1.0, -4.0) * F.affine(rho_t, 1.0, -2.0) * rho_inf
                          / (F.affine(rho_t, (rho_inf - 4) * (rho_inf - 2))))
            adaptive = F.sqrt(c2) / F.affine(F.sqrt(exp_avg_sq), 1.0, group["eps"])
            corrected = corrected * adaptive * rect
        else:  # rho_t grows with t: from the first rectified step on, a captured step holds for good
            capture.refuse("RAdam's first steps are not rectified (rho_t <= 5): their update differs from later ones")
        store(p, p32 - corrected)
