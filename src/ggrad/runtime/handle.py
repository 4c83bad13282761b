"""`Handle`: a tensor's data in one pool of one device, and the checks that keep it honest.

A handle is dead once its pool is reset (pass scope) or its device released (both
scopes). A dead handle never hands out its ggml tensor, so nothing reads freed memory.
When a device is released, the values of its live persistent handles are downloaded
first and kept in `host_copy`, so the layer above can move them to the next device.
"""

from __future__ import annotations

import ctypes
import functools

import ml_dtypes
import numpy as np
from ggml import ggml as G

from . import quants, streams, transfers
from .backend import ggml_library
from .critical import lock

BLOCK_SIZE = {kind.storage: kind.block for kind in quants.BLOCK_TYPES.values()}  # weights per storage item

DTYPES = {
    **{kind.storage: kind.ggml_type for kind in quants.BLOCK_TYPES.values()},
    np.dtype(np.float32): G.GGML_TYPE_F32,
    np.dtype(np.float16): G.GGML_TYPE_F16,
    np.dtype(ml_dtypes.bfloat16): G.GGML_TYPE_BF16,
    np.dtype(np.int32): G.GGML_TYPE_I32,
}
GGML_TO_NUMPY = {v: k for k, v in DTYPES.items()}


def logical_shape(storage_shape: tuple[int, ...], dtype: np.dtype) -> tuple[int, ...]:
    """A tensor's shape from its host array's: a quantized row of n blocks holds n * block weights."""
    block = BLOCK_SIZE.get(dtype, 1)
    return storage_shape if block == 1 else (*storage_shape[:-1], storage_shape[-1] * block)


def storage_shape(shape: tuple[int, ...], dtype: np.dtype) -> tuple[int, ...]:
    """The host array's shape for a tensor's (logical_shape's inverse)."""
    block = BLOCK_SIZE.get(dtype, 1)
    return shape if block == 1 else (*shape[:-1], shape[-1] // block)


MAX_DIMS = G.GGML_MAX_DIMS
HOST_ALIGNMENT = 32  # of a ggml CPU buffer over host memory (ggml's TENSOR_ALIGNMENT; it asserts it)
ALIGNED_COPY_BYTES = 64 << 10


@functools.cache
def _buffer_from_ptr():
    """ggml_backend_cpu_buffer_from_ptr, bound here: ggml-python's binding returns the
    buffer as a C int (the pointer cut to 32 bits)."""
    fn = ggml_library("libggml-base.so").ggml_backend_cpu_buffer_from_ptr
    fn.restype, fn.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t]
    return fn


def aligned_copy(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of `array`. One of ALIGNED_COPY_BYTES or more starts on a
    HOST_ALIGNMENT boundary, so that a host-memory device can compute on it where it lies
    (a `Handle` over it) instead of copying it again; a smaller one is numpy's plain
    copy (aligning costs ~2 us, more than copying it into a pool)."""
    if array.nbytes < ALIGNED_COPY_BYTES:
        return np.array(array, order="C")
    raw = np.empty(array.nbytes + HOST_ALIGNMENT, dtype=np.uint8)
    out = np.ndarray(array.shape, array.dtype, raw, -raw.ctypes.data % HOST_ALIGNMENT)
    np.copyto(out, array)
    return out


def ggml_ne(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """ggml's sizes for a numpy shape: innermost first, padded with ones."""
    ne = tuple(reversed(shape)) + (1,) * (MAX_DIMS - len(shape))
    return ne  # type: ignore[return-value]


def new_tensor(ctx, dtype: np.dtype, shape: tuple[int, ...]):
    ne = (ctypes.c_int64 * MAX_DIMS)(*ggml_ne(shape))
    return G.ggml_new_tensor(ctx, DTYPES[dtype], max(len(shape), 1), ne)


def _metadata_context(n_tensors: int = 1):
    params = G.ggml_init_params(mem_size=n_tensors * G.ggml_tensor_overhead(), mem_buffer=None,
                                no_alloc=True)
    ctx = G.ggml_init(params)
    if not ctx:
        raise MemoryError("ggml_init failed for a tensor's metadata")
    return ctx


class Handle:
    """Data of one tensor in a device pool: `.ptr`, `.shape`, `.dtype`, `.scope`, `.live`."""

    __slots__ = ("shape", "dtype", "scope", "device", "host_copy", "_pool", "_generation",
                 "_tensor", "_block", "_host_memory", "_location", "_ctx", "_borrowed", "_nbytes", "__weakref__")

    def __init__(self, pool, shape: tuple[int, ...], dtype: np.dtype, device: str,
                 over: np.ndarray | None = None) -> None:
        """A block of `pool`; or, with `over` (a device that computes in host memory: the
        CPU), `over`'s own memory, with no block and no copy: the caller gives the array up
        (later writes through the handle land in it); it holds the handle's storage form,
        C-contiguous, from a HOST_ALIGNMENT boundary. Either lives and dies with `pool`."""
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.scope: str = pool.scope
        self.device = device
        self.host_copy: np.ndarray | None = None
        self._pool = pool
        self._generation = pool.generation
        self._host_memory = pool.backend.host_memory
        self._block = None
        self._borrowed = None
        self._nbytes: int | None = None
        self._ctx = ctx = _metadata_context()
        tensor = new_tensor(ctx, self.dtype, self.shape)
        if over is not None:
            address = over.ctypes.data
            buffer = ctypes.c_void_p(_buffer_from_ptr()(address, over.nbytes))
            self._borrowed = (buffer, over)
            G.ggml_backend_tensor_alloc(buffer, tensor, ctypes.c_void_p(address))
        else:
            with lock:
                block = pool.alloc(G.ggml_backend_buft_get_alloc_size(pool.backend.buft, tensor))
                if G.ggml_is_quantized(tensor.contents.type):
                    streams.settle()  # ggml-cuda clears the padding outside the stream: not under a running graph
                G.ggml_backend_tensor_alloc(block.chunk.buffer, tensor, ctypes.c_void_p(block.addr))
            self._block = block
        self._tensor = tensor
        self._location = (tensor.contents.buffer, tensor.contents.data)

    def __del__(self) -> None:
        """The metadata, and a persistent block, go back when the handle dies (in whatever
        thread drops it last). A method, not weakref.finalize: its registry cost every
        upload ~3 us."""
        try:
            ctx = self._ctx
        except AttributeError:  # __init__ failed before the context was made
            return
        G.ggml_free(ctx)
        if self._borrowed is not None:
            G.ggml_backend_buffer_free(self._borrowed[0])  # the struct only: the memory is the array's
        if self._block is not None and self.scope == "persistent":
            self._pool.free(self._block)

    @property
    def live(self) -> bool:
        pool = self._pool
        return not pool.released and pool.generation == self._generation

    @property
    def nbytes(self) -> int:
        if self._nbytes is None:  # counted once: a replay asks every step
            self._nbytes = int(np.prod(storage_shape(self.shape, self.dtype), dtype=np.int64)) * self.dtype.itemsize
        return self._nbytes

    def _why_dead(self) -> str:
        if self._pool.released:
            return (f"its device {self.device!r} was released (ggrad.set_device switched away); "
                    "its values were moved to the host")
        return (f"the pass pool of {self.device!r} was reset (generation {self._generation}, "
                f"now {self._pool.generation}); pass-scope data lives for one pass only")

    def check_live(self) -> None:
        if not self.live:
            raise RuntimeError(f"dead handle {self.shape} {self.dtype}: {self._why_dead()}")

    @property
    def tensor(self):
        """The ggml tensor; only handed out while the handle is live."""
        self.check_live()
        return self._tensor

    def location(self) -> tuple[int, int]:
        """(backend buffer, data address) of a live handle: what a graph slot points at
        (`live` inlined: a kept graph asks for every slot at every run)."""
        pool = self._pool
        if pool.released or pool.generation != self._generation:
            self.check_live()
        return self._location

    @property
    def ptr(self) -> int:
        """Address of the data in its backend buffer; stable while the handle is live."""
        self.check_live()
        return self._location[1]

    def numpy(self) -> np.ndarray:
        """Download the values (a counted crossing unless the device is host memory)."""
        with lock:
            self.check_live()
            return transfers.download(self._tensor, storage_shape(self.shape, self.dtype), self.dtype,
                                      self._host_memory)

    def write(self, array: np.ndarray) -> None:
        """Upload a host array of this handle's shape and dtype into its buffer."""
        with lock:
            self.check_live()
            transfers.upload(self._tensor, array, self._pool.backend)

    def write_from(self, address: int, nbytes: int, pageable: bool) -> None:
        """`write` from a C-contiguous host array known by its address and size, which a
        caller uploading from the same array every step keeps (the lookup costs ~1.5 us)."""
        with lock:
            self.check_live()
            transfers.upload_from(self._tensor, address, nbytes, self._pool.backend, pageable)

    def copy_from(self, source: "Handle") -> None:
        """Copy `source` (same shape, dtype and device) into this buffer on the device, no
        host crossing: queued behind the work before it where the backend orders it
        (streams.QUEUED_UPLOAD_KINDS), else after that work and done before this returns
        (ggml-vulkan records the copy with no barrier after the shaders before it, nor
        before those after it)."""
        with lock:
            self.check_live()
            source.check_live()
            backend = self._pool.backend
            queued = backend.info.kind in streams.QUEUED_UPLOAD_KINDS and streams.enabled
            if not queued:
                streams.settle()
            G.ggml_backend_tensor_copy_async(backend.handle, backend.handle, source._tensor, self._tensor)
            if not queued:
                G.ggml_backend_synchronize(backend.handle)

    def evict(self) -> None:
        """Keep the values on the host; called just before the device is released."""
        if self.live and self.scope == "persistent":
            self.host_copy = self.numpy()

    def __repr__(self) -> str:
        state = "live" if self.live else "dead"
        return f"Handle(shape={self.shape}, dtype={self.dtype}, scope={self.scope!r}, device={self.device!r}, {state})"


