"""Adam (L2 weight decay added to the gradient) and AdamW (decoupled decay), with
PyTorch's bias correction and eps outside the square root. AdamW is Adam with the
decay moved out of the gradient, not a copy of it."""

from __future__ import annotations

import functools

import numpy as np

from .. import capture, dtypes, runtime
from .. import functional as F
from ..functional._core import _apply
from ..lazy import builder
from ..ops import compute
from ..runtime import backend, kernels
from ..tensor import Tensor, inplace
from .optimizer import Optimizer, _check_positive, count_group_step, device_scalar, float32, store


def adam_update(p: Tensor, g: Tensor, m: Tensor, v: Tensor, correction1: Tensor,
                correction2: Tensor, lr: Tensor, *, beta1: float, beta2: float, eps: float,
                weight_decay: float, decoupled: bool, v_max: Tensor | None = None) -> dict[str, Tensor]:
    """One step; returns the new p, m, v, bias corrections (and v_max with amsgrad).

        g = g + weight_decay * p                 (Adam)   p = p * (1 - lr * weight_decay)  (AdamW)
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g^2
        c1, c2 = 1 - beta1^t, 1 - beta2^t        (on the device, as c = (1 - beta) + beta * c
                                                  from c = 0: no cancellation in float32)
        v_max = max(v_max, v)                    (amsgrad; v below means v_max)
        p = p - lr / c1 * m / (sqrt(v) / sqrt(c2) + eps)
    """
    if weight_decay and not decoupled:
        g = g + F.affine(p, weight_decay)
    if weight_decay and decoupled:
        p = p - p * F.affine(lr, weight_decay)
    m = F.affine(m, beta1) + F.affine(g, 1.0 - beta1)
    v = F.affine(v, beta2) + F.affine(F.square(g), 1.0 - beta2)
    correction1 = F.affine(correction1, beta1, 1.0 - beta1)
    correction2 = F.affine(correction2, beta2, 1.0 - beta2)
    out = {"m": m, "v": v, "correction1": correction1, "correction2": correction2}
    second = v
    if v_max is not None:
        second = out["v_max"] = F.affine(v_max + v + F.abs(v_max - v), 0.5)  # elementwise max
    step_size = lr / correction1
    denom = F.sqrt(second) / F.sqrt(correction2) + eps
    out["p"] = p - step_size * m / denom
    return out


def kernel_update(p: Tensor, g: Tensor, m: Tensor, v: Tensor, hyper: Tensor, beta1: float) -> dict[str, Tensor]:
    """What ggml's AdamW kernel computes from `hyper` (9 elements: the exact form of
    scripts/patch_ggml_adamw.py; 7: ggml's own), from elementwise ops: a step that must
    not write in place (optim/guard.py) gets the kernel's numbers over the same state."""
    h = [hyper[i:i + 1] for i in range(hyper.shape[0])]
    lr, b1, b2, eps, wd = h[:5]
    p = p * (1.0 - lr * wd)
    if len(h) == 9:
        step_size, c2_sqrt, w1, w2 = h[5:]
        m = m + w1 * (g - m) if 1.0 - beta1 < 0.5 else g - (g - m) * (1.0 - w1)  # torch's lerp
        v = v * b2 + w2 * g * g
        return {"m": m, "v": v, "p": p - step_size * (m / (F.sqrt(v) / c2_sqrt + eps))}
    c1_inv, c2_inv = h[5:]
    m = m * b1 + g * (1.0 - b1)
    v = v * b2 + g * g * (1.0 - b2)
    return {"m": m, "v": v, "p": p - lr * (m * c1_inv) / (F.sqrt(v * c2_inv) + eps)}


class Adam(Optimizer):
    """Adam. One ggml AdamW kernel per parameter: a single pass over p, g, m, v.

    `fused` picks how (PyTorch's argument, default None):
    - None: the kernel where ggml's is exact (built by ggrad's bootstrap with
      scripts/patch_ggml_adamw.py: PyTorch's formula to float32 rounding), else the update
      composed from elementwise ops (as exact, ~20 nodes per parameter).
    - True: the kernel always; an unpatched ggml's forms 1 - beta2 from a float32 beta2,
      so v's increment is off by up to ~1.3e-5 relative for beta2 = 0.999.
    - False: the composed update.
    amsgrad (which ggml's kernel lacks) is always composed.
    float16 and bfloat16 parameters keep moments of their dtype (as torch's) and are
    updated from float32 copies, rounded once (torch's fused CPU Adam): ggml's kernel is
    float32-only, so the kernel form computes its formula from elementwise ops for them."""

    decoupled = False
    scalar_state = ("correction1", "correction2")
    group_state_shapes = {"constants": (4,), "betas": (2,), "inflow": (2,), "corrections": (2,)}
    scratch_group_state = ("hyper",)  # the kernel's 9 constants of the last step (set 55)

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False,
                 fused: bool | None = None, accumulate_steps: int = 1, average: bool = True) -> None:
        self._corrections_of: dict[int, tuple] = {}  # id(p) -> the betas of its composed-form corrections
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      amsgrad=bool(amsgrad), fused=None if fused is None else bool(fused)),
                         accumulate_steps, average)

    def _validate(self, group: dict) -> None:
        super()._validate(group)
        _check_positive("epsilon", group["eps"])
        beta1, beta2 = group["betas"]
        for i, beta in enumerate((beta1, beta2)):
            if not 0.0 <= float(beta) < 1.0:
                raise ValueError(f"Invalid beta parameter at index {i}: {beta}")

    @staticmethod
    def _kernel(group: dict) -> bool:
        """Whether the group is updated by ggml's AdamW kernel (see the class docstring)."""
        if group["amsgrad"] or group["fused"] is False:
            return False
        return group["fused"] or backend.adamw_exact()

    def _update_group(self, index, group, items, lr) -> None:
        """ggml's AdamW kernel, one per parameter, in place. The bias corrections are
        shared by the group and advance on the device; a parameter that skipped steps
        uses host constants for its own t."""
        if not self._kernel(group):
            return super()._update_group(index, group, items, lr)
        shared = self.group_state[index]
        beta1, beta2 = group["betas"]
        self._init_group(index, group)  # no-op unless the hyperparameters or the state were replaced
        constants = shared["constants_of"]
        shared["step"] += 1
        capture.on_replay(advance=functools.partial(count_group_step, shared))
        exact = backend.adamw_exact()
        hyper_in_place = False
        if exact and kernels.supported(runtime.current().backend, kernels.ADAM_HYPER):
            # one kernel: this step's corrections and the 9 constants, as composed below
            sources = (shared["corrections"], lr, shared["constants"], shared["inflow"])
            hyper_in_place = self._hyper_in_place(shared, items)
            if hyper_in_place:  # into the group's buffers: no copy of the corrections after it
                inplace("adam_hyper_in_place", (shared["hyper"], *sources), (shared["hyper"], shared["corrections"]),
                        chained=True)
                hyper = shared["hyper"]
            else:
                both = _apply("adam_hyper", sources, (11,))
                shared["corrections"]._assign(both[9:], temporary=True)
                hyper = both[:9]
        else:
            # c = (1 - beta) + beta * c from c = 0 is 1 - beta^t, without cancellation in float32
            shared["corrections"]._assign(shared["corrections"] * shared["betas"] + shared["inflow"], temporary=True)
            corrections = shared["corrections"]
            if exact:  # lr, beta1, beta2, eps, wd, lr / c1, sqrt(c2), 1 - beta1, 1 - beta2
                hyper = F.concat([lr, shared["constants"], lr / corrections[:1], F.sqrt(corrections[1:]),
                                  shared["inflow"]])
            else:  # lr, beta1, beta2, eps, wd, 1 / c1, 1 / c2
                hyper = F.concat([lr, shared["constants"], corrections ** -1])
        in_place = []  # (p, g, m, v) of the parameters the kernel updates in place with `hyper`
        for p, g, state in items:
            if state["step"] != shared["step"]:
                capture.refuse("a parameter skipped steps: its Adam step uses host constants")
                t = state["step"]
                c1, c2 = 1 - beta1 ** t, 1 - beta2 ** t
                own = [group["lr"], *constants] + ([group["lr"] / c1, c2 ** 0.5, 1 - beta1, 1 - beta2] if exact
                                                   else [1 / c1, 1 / c2])
                own_hyper = Tensor(np.array(own, dtype=np.float32))
                operands = self._fused(p, g, state, group, own_hyper)
                if operands:
                    inplace("adamw", (*operands, own_hyper), (p, state["m"], state["v"]))
            else:
                in_place += self._fused(p, g, state, group, hyper)
        if in_place:  # one effect for the group: one record, one signature entry (after the constants' effect)
            inplace("adamw", (*in_place, hyper), tuple([t for i in range(0, len(in_place), 4)
                                                       for t in (in_place[i], in_place[i + 2], in_place[i + 3])]),
                    chained=hyper_in_place)

    def _hyper_in_place(self, shared: dict, items: list) -> bool:
        """Whether this step's constants may be written into the group's own buffer by set
        55's in-place ADAM_HYPER: every parameter is updated in place by the kernel at the
        group's count. A composed update (a guarded step, a half-precision parameter) reads
        the constants as a value: an effect's pending version would run the step as two
        graphs, and a guarded step must leave the corrections to the guard."""
        return self.in_place and kernels.variant(runtime.current().backend, "adam_hyper_in_place") and all(
            p.dtype is dtypes.float32 and state["step"] == shared["step"] for p, _, state in items)

    def _init_group(self, index: int, group: dict) -> list[Tensor]:
        """The kernel's per-group tensors: its constants, the shared bias corrections and the
        buffer of the 9 constants it reads, made when the group is added (not inside a step,
        where a guarded step that failed would zero what it made: optim/guard.py)."""
        if not self._kernel(group):
            return []
        shared, made = self.group_state[index], []
        beta1, beta2 = group["betas"]
        constants = (beta1, beta2, group["eps"], group["weight_decay"] if self.decoupled else 0.0)
        if shared.get("constants_of") != constants:
            made += [Tensor(np.array(constants, dtype=np.float32)), Tensor(np.array([beta1, beta2], dtype=np.float32)),
                     Tensor(np.array([1 - beta1, 1 - beta2], dtype=np.float32))]
            shared["constants"], shared["betas"], shared["inflow"] = made
            if shared.get("constants_of", constants)[:2] != constants[:2]:
                # betas changed (CyclicLR cycles beta1): torch's corrections are 1 - beta^t with
                # today's betas, which the recurrence below only follows from a fresh start
                shared.pop("corrections", None)
            shared["constants_of"] = constants
        if "hyper" not in shared:  # the kernel's 9 constants, written each step where it runs in place
            shared["hyper"] = Tensor(np.zeros(9, dtype=np.float32))
            made.append(shared["hyper"])
        if not {"corrections", "step"} <= shared.keys():  # 1 - beta^t for the steps the group's state has taken
            t = shared["step"] if "step" in shared else self._steps_taken(group)
            shared["corrections"] = Tensor(np.array([1 - beta1 ** t, 1 - beta2 ** t], dtype=np.float32))
            shared["step"] = t
            made.append(shared["corrections"])
        return made

    def _init_state(self, p: Tensor, group: dict) -> list[Tensor]:
        """Zero moments (and bias corrections) on the device, in the persistent pool."""
        made = self._zero_state(p, ("m", "v", "v_max") if group["amsgrad"] else ("m", "v"))
        state = self.state[p]
        composed = not self._kernel(group)  # the kernel shares them per group
        if composed and not {"correction1", "correction2"} <= state.keys():  # 1 - beta^t for the t steps taken
            beta1, beta2 = group["betas"]
            t = state["step"]
            state["correction1"], state["correction2"] = device_scalar(1 - beta1 ** t), device_scalar(1 - beta2 ** t)
            made += [state["correction1"], state["correction2"]]
        return made

    def _fused(self, p, g, state, group, hyper) -> tuple:
        """ggml's AdamW kernel over p, in place: the kernel's operands (p, g, m, v), for
        the caller to record. Where the kernel may not run, its formula from elementwise
        ops, recorded here (and no operands): a step that must not write in place
        (optim/guard.py), and a half-precision p (ggml's kernel is float32-only; its CPU
        form aborts on float16)."""
        self._init_state(p, group)  # no-op unless the state was replaced
        g = float32(g)
        if group["weight_decay"] and not self.decoupled:
            g = g + F.affine(float32(p), group["weight_decay"])
        if self.in_place and p.dtype is dtypes.float32:
            return p, g, state["m"], state["v"]
        new = kernel_update(float32(p), g, float32(state["m"]), float32(state["v"]), hyper, group["betas"][0])
        for key in ("m", "v"):
            store(state[key], new[key])
        store(p, new["p"])
        return ()

    def _update(self, p, g, lr, group, state) -> None:
        self._init_state(p, group)  # no-op unless the state was replaced or fused switched off
        beta1, beta2 = group["betas"]
        if self._corrections_of.setdefault(id(p), (beta1, beta2)) != (beta1, beta2):
            # CyclicLR cycles beta1: torch's corrections are 1 - beta^t with today's betas
            t = state["step"] - 1  # the steps before this one; adam_update advances them to this one
            state["correction1"], state["correction2"] = device_scalar(1 - beta1 ** t), device_scalar(1 - beta2 ** t)
            self._corrections_of[id(p)] = (beta1, beta2)
        new = adam_update(float32(p), float32(g), float32(state["m"]), float32(state["v"]), state["correction1"],
                          state["correction2"], lr, beta1=beta1, beta2=beta2, eps=group["eps"],
                          weight_decay=group["weight_decay"], decoupled=self.decoupled,
                          v_max=float32(state.get("v_max")))
        for key in ("m", "v", "correction1", "correction2", "v_max"):
            if key in new:
                store(state[key], new[key])
        store(p, new["p"])


class AdamW(Adam):
    decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False,
                 fused: bool | None = None, accumulate_steps: int = 1, average: bool = True) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, fused, accumulate_steps, average)


@compute("adam_hyper")
def _adam_hyper(ctx, s, node):
    """This step's bias corrections and the exact AdamW kernel's 9 constants, one node
    (runtime/kernels.py ADAM_HYPER)."""
    return kernels.op(ctx, kernels.ADAM_HYPER, (11, 1), list(s), [])


@builder("adam_hyper_in_place")
def _adam_hyper_in_place(ctx, s, effect):
    """ADAM_HYPER into the 9 constants' buffer (s[0]), this step's bias corrections over
    the corrections (s[1], read first): a write the ggml graph does not show (ggml-vulkan's
    sync table is told), so nothing else in the step reads them after it."""
    hyper, *sources = s
    return [kernels.op_in_place(ctx, kernels.ADAM_HYPER, hyper, sources, [])]
