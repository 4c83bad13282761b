"""`detect_anomaly`: find the operation that made the first NaN, as torch.autograd's does.

While the mode is on, every operation is run as soon as it is made and its output is
checked on the host; the first one whose output holds a NaN while none of its inputs
does raises a RuntimeError that names it and the line of user code that called it. The
same holds inside backward: an operation run by a gradient rule is named as that rule
(``Function 'log_backward' returned nan values ...``) with the line that called the
forward operation.

It is slow, on purpose: one dispatch and one 4-byte download per operation (and a
`ggrad.compile` step is not captured while it is on: each check reads a value on the
host). Use it to debug, not to train. Infinities are not reported (log(0) = -inf and
masked attention are legitimate); NaN is.
"""

from __future__ import annotations

import functools
import os
import sys

from . import replay

_enabled = False
_checking = False  # a check runs operations itself: those are not checked
_backward_of: list[tuple[str, str]] = []  # (op, forward call site) of the rules running now
_PACKAGE = os.path.dirname(os.path.abspath(__file__))


class detect_anomaly:
    """``with ggrad.detect_anomaly():`` (or as a decorator): raise at the first operation,
    forward or backward, that returns NaN from inputs without NaN. `check_nan=False`
    turns the checks off, as torch's argument does."""

    def __init__(self, check_nan: bool = True) -> None:
        self.check_nan = bool(check_nan)
        self._previous = False

    def __enter__(self) -> detect_anomaly:
        global _enabled
        self._previous, _enabled = _enabled, self.check_nan
        if _enabled:
            _invalidate_captures()
        return self

    def __exit__(self, *exc) -> None:
        global _enabled
        _enabled = self._previous

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with detect_anomaly(self.check_nan):
                return fn(*args, **kwargs)
        return wrapped


def set_detect_anomaly(mode: bool, check_nan: bool = True) -> None:
    """Turn the anomaly checks on or off for the rest of the program."""
    global _enabled
    _enabled = bool(mode) and bool(check_nan)
    if _enabled:
        _invalidate_captures()


def _invalidate_captures() -> None:
    replay.invalidate()  # kept step graphs would replay without the checks


def is_anomaly_enabled() -> bool:
    return _enabled


def active() -> bool:
    """Whether operations made now are to be checked (the functional layer asks)."""
    return _enabled and not _checking


def _call_site() -> str:
    """The innermost frame outside ggrad: where the user's code made the operation."""
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame = frame.f_back
    if frame is None:
        return "an unknown place"
    return f"{frame.f_code.co_filename}:{frame.f_lineno} ({frame.f_code.co_name})"


def _has_nan(t) -> bool:
    return bool(t.isnan().any().item())  # Tensor's methods: this module sits below functional


def check(op: str, inputs: tuple, out) -> None:
    """Raise if `out` (just made by `op` from `inputs`) holds a NaN that no input held."""
    global _checking
    if not out.dtype.is_floating_point:
        return
    _checking = True
    try:
        if not _has_nan(out) or any(_has_nan(t) for t in inputs if t.dtype.is_floating_point):
            return
    finally:
        _checking = False
    if _backward_of:
        forward, site = _backward_of[-1]
        raise RuntimeError(f"Function '{forward}_backward' returned nan values in its output (its "
                           f"'{op}' step made them from inputs without NaN). The forward '{forward}' "
                           f"was called at {site}.")
    raise RuntimeError(f"Function '{op}' returned nan values in its output (from inputs without NaN), "
                       f"called at {_call_site()}.")


def checked_rule(op: str, rule):
    """`rule` (op's gradient), such that a NaN its operations make names `op`'s backward."""
    site = _call_site()

    def run(ctx, g):
        _backward_of.append((op, site))
        try:
            return rule(ctx, g)
        finally:
            _backward_of.pop()
    return run
