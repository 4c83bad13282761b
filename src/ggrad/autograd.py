"""The gradient tape: which operations are recorded, and `backward`, which walks them.

Inside ``with grad_tape():`` every operation on a tensor that requires grad records a
`Context` on its result: the rule that maps the output's gradient to its inputs'
gradients, the inputs, and what the rule needs. `backward` walks the records in
reverse topological order. Rules are written with ggrad's own (lazy) operations, so
the backward pass is more nodes in the same graph as the forward pass; it runs when a
value is needed. After backward the records are dropped, like PyTorch's graph.

A rule reads its inputs when backward runs, so an input written in place after it was
recorded (``loss = (W * x).sum(); x += 1``) would give a wrong gradient: as in PyTorch,
every in-place write bumps the tensor's version, a record keeps the versions it saw,
and backward refuses a record whose inputs have changed since.

Recording is per thread: a tape entered in one thread records nothing of another's.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

from . import lazy, runtime


class _ThreadState(threading.local):
    recording = False
    tape_generation = 0  # bumps at every grad_tape entry


_local = _ThreadState()


class Context:
    """One recorded operation: ``rule(ctx, grad) -> grads of parents`` (None: no grad)."""

    __slots__ = ("rule", "parents", "saved", "generation", "versions")

    def __init__(self, rule: Callable, parents: tuple, saved: dict) -> None:
        self.rule = rule
        self.parents = parents
        self.saved = saved
        self.generation = _local.tape_generation
        self.versions = tuple([p._version for p in parents])

    def __getattr__(self, name: str):
        try:
            return self.saved[name]
        except KeyError:
            raise AttributeError(name) from None


# What a consumed record becomes: the tensor is still not a leaf, but its tape is gone.
FREED = Context(lambda ctx, g: (), (), {})
FREED.generation = -1


def is_recording() -> bool:
    return _local.recording


@contextlib.contextmanager
def grad_tape() -> Iterator[None]:
    """Record operations for `backward`. Entering starts a new pass: pending work that
    is still wanted runs first, values of the last pass that a tensor still holds move
    to the persistent pool (lazy.keep_pass_values), then the pass pool is reset.

    In a step being compiled, a later tape continues the first one's pass: nothing has run
    yet, and the step's micro-steps (gradient accumulation) become one graph, which
    computes what the tapes run apart would (ggml's allocator reuses one micro-step's
    scratch memory for the next)."""
    state, lazy_state = _local, lazy.local
    tapes = lazy_state.traced_tapes
    if not tapes:
        if lazy.has_pending_work():
            lazy.realize()
        lazy.keep_pass_values()
        runtime.reset_pass()
    if tapes is not None:
        tapes.append(lazy.pending_values())
    state.tape_generation += 1
    previous, state.recording = state.recording, True
    previous_scope, lazy_state.default_scope = lazy_state.default_scope, "pass"
    try:
        yield
    finally:
        state.recording = previous
        lazy_state.default_scope = previous_scope


@contextlib.contextmanager
def no_grad() -> Iterator[None]:
    """Suspend recording (inside a grad_tape): results need no gradient."""
    state = _local
    previous, state.recording = state.recording, False
    try:
        yield
    finally:
        state.recording = previous


def backward(loss, grad=None) -> None:
    """Accumulate d(loss)/d(leaf) into `.grad` of every leaf that requires grad. (The
    tensor layer sits on this module: `loss` is a ggrad Tensor, told apart by its tape
    slot, and makes its own seed.)"""
    if not hasattr(loss, "_ctx") or not hasattr(loss, "_seed"):
        raise TypeError(f"backward needs a ggrad Tensor, got {type(loss).__name__}")
    if loss._ctx is FREED:
        raise RuntimeError("backward: the tape of this tensor was already used by a backward "
                           "call and freed; record the forward pass again")
    if loss._ctx is None:
        if not loss.requires_grad:
            raise RuntimeError(
                "backward: this tensor was not recorded on a grad tape (wrap the forward pass in "
                "`with ggrad.grad_tape():`), or none of its inputs requires grad")
    elif loss._ctx.generation != _local.tape_generation:
        raise RuntimeError("backward: this tensor's tape was reset (a newer grad_tape was entered); "
                           "its pass memory is gone, record the forward pass again")
    if grad is None and loss.numel() != 1:
        raise ValueError(f"backward on a tensor of shape {loss.shape} needs an explicit grad= "
                         "seed of that shape (only a scalar loss has an implied seed of 1)")
    seed = loss._seed(grad)
    if seed.shape != loss.shape:
        raise ValueError(f"backward: grad has shape {seed.shape}, loss has shape {loss.shape}")

    order = _topological(loss)
    grads = {id(loss): seed}
    with no_grad():
        for t in reversed(order):
            g = grads.pop(id(t), None)
            if g is None:
                continue
            ctx = t._ctx
            if ctx is None:
                t._accumulate_grad(g)
                continue
            _check_versions(ctx)
            for parent, pg in zip(ctx.parents, ctx.rule(ctx, g)):
                if pg is None or not parent.requires_grad:
                    continue
                if pg.shape != parent.shape:
                    raise AssertionError(f"gradient rule gave {pg.shape} for an input of {parent.shape}")
                if pg.dtype is not parent.dtype:  # a float16 input of a float32 result
                    pg = pg.to(parent.dtype)
                prev = grads.get(id(parent))
                grads[id(parent)] = pg if prev is None else prev + pg
    for t in order:
        if t._ctx is not None:
            t._ctx = FREED
    callbacks, _local.after_backward = getattr(_local, "after_backward", []), []
    for callback in callbacks:
        callback()


def queue_callback(callback: Callable[[], None]) -> None:
    """Run `callback` once, when this thread's next backward pass has set the gradients
    (torch's engine queue_callback; DistributedDataParallel averages gradients there)."""
    if not hasattr(_local, "after_backward"):
        _local.after_backward = []
    if callback not in _local.after_backward:
        _local.after_backward.append(callback)


def _check_versions(ctx: Context) -> None:
    for i, (parent, seen) in enumerate(zip(ctx.parents, ctx.versions)):
        if parent._version != seen:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an "
                f"inplace operation: [{parent.dtype} {list(parent.shape)}] (input {i} of the op "
                f"recorded by {getattr(ctx.rule, '__qualname__', ctx.rule)}) is at version "
                f"{parent._version}; expected version {seen} instead")


def _topological(root) -> list:
    def parents(t):
        if t._ctx is FREED:
            raise RuntimeError("backward: part of this graph was already used by a backward call "
                               "and freed; record the forward pass again")
        return [p for p in t._ctx.parents if p.requires_grad] if t._ctx is not None else []
    return lazy.topological([root], parents)
