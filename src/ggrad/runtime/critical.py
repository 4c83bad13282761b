"""Critical sections: the lock around ggml's shared state, and Ctrl-C held back inside them.

ggml's backends, allocators and graphs are single-thread objects, and the pools and
kept graphs of a device are shared by every thread of the process. `critical()` holds
one process-wide re-entrant lock around every use of them, so threads that train
independent models (each with its own tensors) take turns on the device instead of
corrupting it.

A `KeyboardInterrupt` raised between the statements of a state transition would tear
it: a graph that ran but whose results were not yet recorded runs again (an optimizer
update applied twice), or an in-place update recorded for some parameters and not for
others. Inside a critical section on the main thread, SIGINT is recorded and re-raised
when the outermost section ends: a step runs whole or not at all. This costs nothing
per section: the handler is installed once, wrapping the handler that was there.
"""

from __future__ import annotations

import signal
import threading

lock = threading.RLock()

_MAIN = threading.main_thread().ident
_depth = 0  # critical sections the main thread is in
_held_back: list = []  # SIGINT frames that arrived inside a critical section
_wrapped = None  # the handler ours stands in front of
_tried = False  # installing is tried once, on the main thread


def _on_sigint(signum, frame) -> None:
    if _depth:
        _held_back.append(frame)
    elif callable(_wrapped):
        _wrapped(signum, frame)


def _install() -> None:
    """Stand in front of the SIGINT handler, unless it is not a Python function (ignored,
    or the OS default): then there is no KeyboardInterrupt to hold back."""
    global _wrapped, _tried
    _tried = True
    current = signal.getsignal(signal.SIGINT)
    if current is _on_sigint or not callable(current):
        return
    try:
        signal.signal(signal.SIGINT, _on_sigint)
    except ValueError:  # not the main interpreter
        return
    _wrapped = current


class critical:
    """``with critical():`` -- hold the ggml lock; on the main thread, hold Ctrl-C back
    until the outermost section ends (then the interrupt is raised as usual)."""

    __slots__ = ("_main",)

    def __enter__(self) -> None:
        global _depth
        lock.acquire()
        self._main = threading.get_ident() == _MAIN
        if self._main:
            if not _tried:
                _install()
            _depth += 1

    def __exit__(self, *exc) -> None:
        global _depth
        try:
            if self._main:
                _depth -= 1
                if not _depth and _held_back:
                    frame = _held_back[0]
                    _held_back.clear()
                    if callable(_wrapped):
                        _wrapped(signal.SIGINT, frame)
        finally:
            lock.release()
