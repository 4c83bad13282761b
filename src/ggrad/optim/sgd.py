"""SGD with momentum, dampening, Nesterov and L2 weight decay (PyTorch's formula)."""

from __future__ import annotations

from .. import functional as F
from ..tensor import Tensor
from .optimizer import Optimizer, _check_positive, float32, store


def sgd_update(p: Tensor, g: Tensor, buf: Tensor | None, lr: Tensor, *, momentum: float,
               dampening: float, nesterov: bool, weight_decay: float) -> tuple[Tensor, Tensor | None]:
    """One step; returns (new p, new momentum buffer).

        g = g + weight_decay * p
        buf = g                                    (first step)
        buf = momentum * buf + (1 - dampening) * g (later steps)
        g = g + momentum * buf if nesterov else buf
        p = p - lr * g
    """
    if weight_decay:
        g = g + F.affine(p, weight_decay)
    if momentum:
        buf = g if buf is None else F.affine(buf, momentum) + F.affine(g, 1.0 - dampening)
        g = g + F.affine(buf, momentum) if nesterov else buf
    return p - lr * g, buf


class SGD(Optimizer):
    """SGD; a float16/bfloat16 parameter and its momentum buffer are updated from float32
    copies, rounded once when written back (torch rounds its buffer at each op)."""

    def __init__(self, params, lr: float, momentum: float = 0.0, dampening: float = 0.0,
                 nesterov: bool = False, weight_decay: float = 0.0, accumulate_steps: int = 1,
                 average: bool = True) -> None:
        _check_positive("momentum", momentum)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      nesterov=nesterov, weight_decay=weight_decay),
                         accumulate_steps, average)

    def _update(self, p, g, lr, group, state) -> None:
        new_p, buf = sgd_update(float32(p), float32(g), float32(state.get("momentum_buffer")), lr,
                                momentum=group["momentum"], dampening=group["dampening"],
                                nesterov=group["nesterov"], weight_decay=group["weight_decay"])
        if buf is not None:
            if "momentum_buffer" in state:
                store(state["momentum_buffer"], buf)
            else:
                state["momentum_buffer"] = Tensor(buf, dtype=p.dtype)  # a persistent copy of the first gradient
        store(p, new_p)
