"""Page-locked ("pinned") host memory of the current device, for batches on their way up
(`DataLoader(pin_memory=True)`).

A GPU copies from pinned memory directly: CUDA's DMA needs no staging copy, and
ggml-vulkan copies from its own pinned buffers without passing through its staging
buffer. Pinning costs far more than the copy it saves, so blocks are cached by size and
reused when the arrays over them die, as torch's caching host allocator does. A device
without pinned memory (the CPU, whose tensors are host memory already) has none:
`empty` returns None there.
"""

from __future__ import annotations

import threading

import numpy as np
from ggml import ggml as G

from .device import ActiveDevice, current, get_device, on_release
from .critical import critical

_MIN_BLOCK = 4096


class _Block:
    """A pinned ggml buffer; the base of the arrays over it, so it lives while they do."""

    __slots__ = ("buffer", "size", "key", "__array_interface__", "__weakref__")

    def __init__(self, buffer, size: int, key: str) -> None:
        self.buffer, self.size, self.key = buffer, size, key
        address = G.ggml_backend_buffer_get_base(buffer)
        self.__array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (address, False), "version": 3}

    def __del__(self) -> None:
        _give_back(self)


_lock = threading.Lock()
_free: dict[tuple[str, int], list] = {}  # (device, size) -> cached ggml buffers
_kinds: dict[str, object] = {}  # device -> its pinned buffer type (None: it has none)


def _host_type(active: ActiveDevice):
    if active.name not in _kinds:
        buft = G.ggml_backend_dev_host_buffer_type(active.backend._dev) if not active.backend.host_memory else None
        _kinds[active.name] = buft or None
    return _kinds[active.name]


def _give_back(block: _Block) -> None:
    with _lock:
        _free.setdefault((block.key, block.size), []).append(block.buffer)


def empty(shape: tuple[int, ...], dtype) -> np.ndarray | None:
    """An uninitialized array in the current device's pinned memory, or None where the
    device has none."""
    active = current()
    buft = _host_type(active)
    if buft is None:
        return None
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    size = max(_MIN_BLOCK, 1 << max(nbytes - 1, 0).bit_length())  # powers of two: sizes recur
    with _lock:
        cached = _free.get((active.name, size))
        buffer = cached.pop() if cached else None
    if buffer is None:
        with critical():
            buffer = G.ggml_backend_buft_alloc_buffer(buft, size)
        if not buffer:
            raise MemoryError(f"{active.name}: could not pin {size:,} bytes of host memory")
    raw = np.asarray(_Block(buffer, size, active.name))
    return raw[:nbytes].view(dtype).reshape(shape)


def pinned(array: np.ndarray) -> np.ndarray:
    """`array` copied into pinned memory; `array` itself where the device has none."""
    out = empty(array.shape, array.dtype)
    if out is None:
        return array
    np.copyto(out, array)
    return out


def is_pinned(array: np.ndarray) -> bool:
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, _Block)


def cached_bytes() -> int:
    """Pinned memory held for reuse (not under an array now)."""
    with _lock:
        return sum(size * len(buffers) for (_, size), buffers in _free.items())


def _release_cached() -> None:
    """Before the device is released: its cached blocks are freed (blocks under live
    arrays stay valid until those die)."""
    name = get_device()
    with _lock:
        for key in [k for k in _free if k[0] == name]:
            for buffer in _free.pop(key):
                G.ggml_backend_buffer_free(buffer)


on_release(_release_cached)
