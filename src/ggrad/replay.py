"""What a compiled step must know while it is traced: the surface through which library
code (the functional ops, checks, the random generator, optimizers and modules) tells
`capture` what a replay has to repeat or check, and that a capture went stale.

It sits low so that every layer can call it; `capture.py`, high up, does the tracing and
the replaying and sets `local.trace` while a call is traced.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np

_epoch = 0  # bumped when state a capture reads is replaced: every capture is then stale


def invalidate() -> None:
    """Make every capture stale (a parameter, optimizer state or the device RNG state was
    replaced by a new tensor, so a kept graph would read the old buffer)."""
    global _epoch
    _epoch += 1


def epoch() -> int:
    return _epoch


class _ThreadState(threading.local):
    trace: Any = None  # the call this thread is tracing (a capture._Trace)


local = _ThreadState()


def tracing() -> bool:
    return local.trace is not None


def on_replay(check: Callable[[], bool] | None = None, advance: Callable[[], None] | None = None) -> None:
    """While tracing: `check()` must stay true for the capture to be replayed (it runs
    before a replay, with the state as it was before the traced call), and `advance()`
    repeats the traced call's Python bookkeeping at every replay."""
    trace = local.trace
    if trace is None:
        return
    if check is not None:
        trace.checks.append(check)
    if advance is not None:
        trace.advances.append(advance)


def keep_flag(obj, name: str) -> None:
    """While tracing: the capture holds only while `obj.<name>` (a hashable flag, such as a
    module's `training`) has the value it has now. One check compares every kept flag at a
    replay: a model's dozens of modules cost one list comparison, not a call each. A flag
    seen with two values in one trace (the function switched a module's mode) never holds,
    so such a step is traced every call, as before."""
    trace = local.trace
    if trace is not None:
        value = getattr(obj, name)
        trace.flags.setdefault((id(obj), name, value), (obj, name, value))


def on_input(node, check: Callable[[np.ndarray], None], passes: tuple[int, int] | None = None) -> None:
    """While tracing: run `check(host_array)` on every replay's data for the argument that
    `node` (a lazy.Node) holds (host-side validation, e.g. index ranges, that the trace did).
    `passes` (low, end): integer data within [low, end) passes it, which a replay that has
    the data's extremes at hand tells without calling it."""
    trace = local.trace
    if trace is not None:
        trace.input_checks.append((node, (check, passes or (1, 0))))


def refuse(reason: str) -> None:
    """While tracing: this call cannot be replayed (say why)."""
    trace = local.trace
    if trace is not None and trace.refusal is None:
        trace.refusal = reason
