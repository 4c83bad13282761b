"""Range checks of indices computed on the device, done where the indices are.

An index that came from host data is checked on the host before anything runs
(functional/indexing.py). One computed on the device (an argmax, a cast of a device
tensor) is unknown to the host until someone reads it, and ggml's gathers do not check
it: the CPU aborts the process, Vulkan reads whatever lies there. So a gather of device
indices reads them clamped into range (never out of bounds) and adds the number of
indices it clamped to an error counter on the device. The next read of a value on the
host (`numpy()`, `item()`, printing...) also reads the counter (4 bytes: one more
crossing on a GPU, none on the CPU), and a nonzero count raises `IndexError`: as
PyTorch's CUDA kernels report a device-side assert at the next synchronisation. The
step that hit it ran with the clamped rows; nothing is read out of bounds.

Counters are per thread, like pending work (lazy.py).
"""

from __future__ import annotations

import functools
import threading

import numpy as np
from ggml import ggml as G

from . import dtypes, lazy, replay, runtime
from .ops import F32, I32, compute, reshape
from .runtime.critical import critical
from .tensor import Tensor, read_checks


def _as_rows(ctx, x, size: int, wrap: bool):
    """Indices as float32 (exact below 2**24), negative ones counted from the end if `wrap`."""
    x = G.ggml_cast(ctx, x, F32) if x.contents.type != F32 else x
    if wrap:  # x + size * (x < 0), exactly: relu(-x) > 0 only for negatives, clamped to 1
        negative = G.ggml_clamp(ctx, G.ggml_relu(ctx, G.ggml_neg(ctx, x)), 0.0, 1.0)
        x = G.ggml_add(ctx, x, G.ggml_scale(ctx, negative, float(size)))
    return x


@compute("clamp_index", keep_int=True)
def _clamp_index(ctx, s, node):
    """Indices moved into [0, size): what a gather of them may read."""
    size, wrap = node.arg
    x = _as_rows(ctx, s[0], size, wrap)
    x = G.ggml_cont(ctx, x)  # ggml_clamp writes over its source
    return G.ggml_cast(ctx, G.ggml_clamp(ctx, x, 0.0, float(size - 1)), I32)


@compute("wrap_index", keep_int=True)
def _wrap_index(ctx, s, node):
    size, wrap = node.arg
    return G.ggml_cast(ctx, _as_rows(ctx, s[0], size, wrap), I32)


@compute("index_errors", keep_int=True)
def _index_errors(ctx, s, node):
    """How many indices lie outside [0, size): each distance past an end, at most 1."""
    size, wrap = node.arg
    x = _as_rows(ctx, s[0], size, wrap)
    below = G.ggml_relu(ctx, G.ggml_neg(ctx, x))
    above = G.ggml_relu(ctx, G.ggml_scale_bias(ctx, x, 1.0, -float(size - 1)))
    out = G.ggml_clamp(ctx, G.ggml_add(ctx, below, above), 0.0, 1.0)
    return reshape(ctx, G.ggml_sum(ctx, out), node.shape)


class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.counter: Tensor | None = None  # errors counted on the device, (1,) float32
        self.armed: dict[str, None] = {}  # what was checked since the counter was last read
        self.carried: str | None = None  # an error read off a device that was released


_local = _ThreadState()


def bounded(index: Tensor, size: int, what: str, wrap: bool = False) -> Tensor:
    """`index` (a device-computed integer tensor) clamped into [0, size), for a gather;
    out-of-range entries are counted on the device and raise IndexError at the next read.
    With `wrap`, negative indices count from the end first (as x[idx])."""
    arg = (int(size), bool(wrap))
    with critical():
        errors = lazy.apply("index_errors", (index.node,), (1,), dtypes.float32, arg)
        counter = _counter()
        counter._assign(Tensor._wrap(lazy.apply("add", (counter.node, errors), (1,))))
        _arm(what)
        replay.on_replay(advance=functools.partial(_arm, what))
    return Tensor._wrap(lazy.apply("clamp_index", (index.node,), index.shape, index.dtype, arg))


def wrapped(index: Tensor, size: int) -> Tensor:
    """`index` (checked on the host to lie in [-size, size)) with negative entries counted
    from the end, on the device: a captured step wraps every new batch too."""
    return Tensor._wrap(lazy.apply("wrap_index", (index.node,), index.shape, index.dtype, (int(size), True)))


def _arm(what: str) -> None:
    _local.armed[what] = None


def _counter() -> Tensor:
    """This thread's counter on the current device (made on first use, after reading the
    one a released device left)."""
    state = _local
    counter = state.counter
    if counter is not None:
        handle = counter.node.handle
        if counter.node.pending or (handle is not None and handle.live and handle.device == runtime.get_device()):
            return counter
        _read(state)  # left by a released device: its count is on the host now
    counter = state.counter = Tensor(np.zeros(1, dtype=np.float32))
    lazy.ensure_on_device(counter.node)
    return counter


def _read(state: _ThreadState) -> None:
    """Read the counter; a nonzero count is kept in `carried` (raised by `raise_errors`)."""
    counter, what = state.counter, list(state.armed)
    state.armed.clear()
    if counter is None or not what:
        return
    node = counter.node
    if node.pending or (node.handle.live and lazy.pending_write(node.handle)):
        lazy.realize([node])
    handle = node.handle
    count = int(handle.host_copy[0] if not handle.live else handle.numpy()[0])
    if not count:
        return
    if handle.live:
        counter._write_now(np.zeros(1, dtype=np.float32))
    else:
        state.counter = None
    state.carried = (f"index out of range: {count} out-of-range "
                     f"{'index' if count == 1 else 'indices'} in {' / '.join(what)} "
                     "(found on the device; the step that read them used clamped rows)")


def raise_errors() -> None:
    """Raise IndexError if a gather of device indices recorded since the last read was
    out of range (called before every host read)."""
    state = _local
    if state.armed:
        with critical():
            _read(state)
    if state.carried is not None:
        message, state.carried = state.carried, None
        raise IndexError(message)


def _read_before_release() -> None:
    if _local.armed:
        _read(_local)


read_checks.append(raise_errors)
runtime.on_release(_read_before_release)
