"""A step kept or undone on the device: the update is recorded whole, then every tensor it
changed gets its old value back unless a device flag says the step was good. Nothing is
read on the host (fit's on_nonfinite="skip", amp.GradScaler). A guarded step writes
nothing in place: an optimizer whose kernel would (ggml's AdamW) records the kernel's
formula from elementwise ops instead, over the same state."""

from __future__ import annotations

import contextlib
import functools
import operator

from .. import functional as F
from ..autograd import no_grad
from ..functional.elementwise import choose
from ..tensor import Tensor, zeros, zeros_like


def finite_flag(optimizer, *extra: Tensor) -> Tensor:
    """A bool on the device: `extra` and every gradient are finite (g * 0 is 0 for a
    finite g, NaN for inf and NaN, so the sum is finite exactly when all are)."""
    checked = [t.detach() for t in extra] + [p.grad for group in optimizer.param_groups
                                             for p in group["params"] if p.grad is not None]
    parts = [F.affine(t, 0.0).sum().float() for t in checked] or [zeros(())]
    return F.isfinite(functools.reduce(operator.add, parts))


def step_unless(ok: Tensor, optimizer) -> None:
    """`optimizer.step()`, undone on the device unless the bool `ok` holds: the step is
    recorded out of place, then every tensor it changed is chosen between its new and
    its old value."""
    before = snapshot(optimizer)
    with out_of_place(optimizer):
        optimizer.step()
    with no_grad():
        for t in _changeable(optimizer):
            old = before.get(id(t))
            if old is None:  # a state tensor the step made (SGD's momentum buffer) gets zeros
                t._assign(choose(ok, t, zeros_like(t)))
            elif t.node is not old.node:
                t._assign(choose(ok, t, old))


def snapshot(optimizer) -> dict[int, Tensor]:
    """A handle on the value now of each tensor a step may change, by id. State the step
    would make is made first, outside it (a failed step would otherwise keep it as zeros:
    constants, bias corrections)."""
    optimizer.make_state()
    return {id(t): t.detach() for t in _changeable(optimizer)}


def _changeable(optimizer) -> list[Tensor]:
    """Each parameter and optimizer state tensor."""
    return optimizer._parameters() + optimizer._state_tensors()


@contextlib.contextmanager
def out_of_place(optimizer):
    """Inside: the optimizer's steps write nothing in place (so `step_unless` can undo them)."""
    previous, optimizer.in_place = optimizer.in_place, False
    try:
        yield
    finally:
        optimizer.in_place = previous
