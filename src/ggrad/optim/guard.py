"""A step kept or undone on the device: the update is recorded whole, then every tensor it
changed gets its old value back unless a device flag says the step was good. Nothing is
read on the host (fit's on_nonfinite="skip", amp.GradScaler). A guarded step writes
nothing in place: an optimizer whose kernel would (ggml's AdamW) records the kernel's
formula from elementwise ops instead, over the same state."""

from __future__ import annotations

import contextlib

from .. import functional as F
from ..functional.elementwise import choose
from ..tensor import Tensor, zeros, zeros_like


def finite_flag(optimizer, *extra: Tensor) -> Tensor:
    """A bool on the device: `extra` and every gradient are finite (g * 0 is 0 for a
    finite g, NaN for inf and NaN, so the sum is finite exactly when all are)."""
    total = None
    for t in extra:
        part = F.affine(t.detach(), 0.0).sum().float()
        total = part if total is None else total + part
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                part = F.affine(p.grad, 0.0).sum().float()
                total = part if total is None else total + part
    return F.isfinite(total if total is not None else zeros(()))


def snapshot(optimizer) -> dict[int, tuple[Tensor, Tensor]]:
    """What a step may change, by id: each parameter and optimizer state tensor, with a
    handle on its value now. State the step would make is made first, outside it (a
    failed step would otherwise keep it as zeros: constants, bias corrections)."""
    optimizer.make_state()
    tensors = [p for group in optimizer.param_groups for p in group["params"]]
    tensors += [v for s in [*optimizer.state.values(), *optimizer.group_state] for v in s.values()
                if isinstance(v, Tensor)]
    return {id(t): (t, t.detach()) for t in tensors}


def keep_unless(ok: Tensor, before: dict, optimizer) -> None:
    """Undo the step just recorded unless `ok`: every tensor it changed gets back its old
    value (a state tensor it made gets zeros), chosen on the device."""
    for t, _ in snapshot(optimizer).values():
        old = before.get(id(t))
        if old is None:
            t._assign(choose(ok, t, zeros_like(t)))
        elif t.node is not old[1].node:
            t._assign(choose(ok, t, old[1]))


@contextlib.contextmanager
def out_of_place(optimizer):
    """Inside: the optimizer's steps write nothing in place (so `keep_unless` can undo them)."""
    previous, optimizer.in_place = optimizer.in_place, False
    try:
        yield
    finally:
        optimizer.in_place = previous
