"""The two memory pools of a device, carved out of a few large backend buffers.

One backend buffer per tensor would hit Vulkan's cap on allocations and pay an
allocation per tensor, so both pools hand out blocks of big chunks:

- `PersistentPool`: weights, optimizer state, user data. Blocks are freed one by one
  (first fit, neighbours coalesced) when their handle dies; chunks are kept until the
  device is released, so a training loop that frees what it allocates never grows it.
  A handle dies in whatever thread drops it last (or in the garbage collector, in the
  middle of any allocation), so a freed block only joins a queue; the next `alloc`
  (under the device lock) takes the queue in.
- `PassPool`: scratch for one pass. Blocks are bumped off a chunk and never freed
  singly; `reset` kills them all at once by advancing `generation`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ggml import ggml as G

from . import streams

MiB = 1 << 20


def _round_up(n: int, align: int) -> int:
    return (n + align - 1) // align * align


class Chunk:
    """One backend buffer."""

    def __init__(self, backend, size: int) -> None:
        if size > backend.max_buffer:  # a size no retry serves: not a MemoryError (lazy.py keeps those pending)
            raise RuntimeError(
                f"{size:,} bytes is more than one {backend.name} buffer can hold ({backend.max_buffer:,} bytes)")
        buffer = G.ggml_backend_buft_alloc_buffer(backend.buft, size)
        if not buffer:
            raise MemoryError(f"{backend.name}: could not allocate a buffer of {size} bytes")
        self.buffer = buffer
        self.base = G.ggml_backend_buffer_get_base(buffer)
        self.size = G.ggml_backend_buffer_get_size(buffer)

    def free(self) -> None:
        if self.buffer:
            streams.settle()
            G.ggml_backend_buffer_free(self.buffer)
            self.buffer = None


@dataclass
class Block:
    chunk: Chunk
    offset: int
    size: int

    @property
    def addr(self) -> int:
        return self.chunk.base + self.offset


class PersistentPool:
    """Chunks with free lists; blocks live until freed."""

    scope = "persistent"

    def __init__(self, backend, chunk_bytes: int = 16 * MiB) -> None:
        self.backend = backend
        self.chunk_bytes = min(chunk_bytes, backend.max_buffer)
        self.chunks: list[Chunk] = []
        self._free: dict[int, list[list[int]]] = {}  # id(chunk) -> sorted [offset, size]
        self._freed: deque[Block] = deque()  # blocks given back, not yet in the free lists
        self.generation = 0
        self.released = False

    @property
    def nbytes(self) -> int:
        return sum(c.size for c in self.chunks)

    @property
    def used(self) -> int:
        """Bytes of the blocks that are live (the chunks less their holes and freed blocks)."""
        holes = sum(size for holes in self._free.values() for _, size in holes)
        return self.nbytes - holes - sum(block.size for block in list(self._freed))

    def alloc(self, nbytes: int) -> Block:
        if self._freed:
            self._coalesce()
        size = _round_up(max(nbytes, 1), self.backend.alignment)
        for chunk in self.chunks:
            holes = self._free[id(chunk)]
            for i, (offset, hole) in enumerate(holes):
                if hole >= size:
                    if hole == size:
                        del holes[i]
                    else:
                        holes[i] = [offset + size, hole - size]
                    return Block(chunk, offset, size)
        chunk = Chunk(self.backend, max(self.chunk_bytes, size))
        self.chunks.append(chunk)
        self._free[id(chunk)] = [[size, chunk.size - size]] if chunk.size > size else []
        return Block(chunk, 0, size)

    def free(self, block: Block) -> None:
        """Give `block` back (safe from any thread and from a finalizer: one append)."""
        if not self.released:
            self._freed.append(block)

    def _coalesce(self) -> None:
        """The freed blocks into their chunks' free lists: each list sorted and merged once."""
        touched: set[int] = set()
        while self._freed:
            block = self._freed.popleft()
            holes = self._free.get(id(block.chunk))
            if holes is not None:  # (None: its chunk was released)
                holes.append([block.offset, block.size])
                touched.add(id(block.chunk))
        for key in touched:
            holes = self._free[key]
            holes.sort()
            merged: list[list[int]] = []
            for offset, size in holes:
                if merged and merged[-1][0] + merged[-1][1] == offset:
                    merged[-1][1] += size
                else:
                    merged.append([offset, size])
            holes[:] = merged

    def release(self) -> None:
        for chunk in self.chunks:
            chunk.free()
        self.chunks.clear()
        self._free.clear()
        self._freed.clear()
        self.released = True
        self.generation += 1


class PassPool:
    """Bump allocation; `reset` frees every block at once and bumps `generation`."""

    scope = "pass"

    def __init__(self, backend, chunk_bytes: int = 4 * MiB) -> None:
        self.backend = backend
        self.chunk_bytes = min(chunk_bytes, backend.max_buffer)
        self.chunks: list[Chunk] = []
        self._used = 0  # bytes used in the last chunk
        self._high_water = 0  # bytes handed out since the last reset
        self.generation = 0
        self.released = False

    @property
    def nbytes(self) -> int:
        return sum(c.size for c in self.chunks)

    def alloc(self, nbytes: int) -> Block:
        size = _round_up(max(nbytes, 1), self.backend.alignment)
        self._high_water += size
        if self.chunks and self._used + size <= self.chunks[-1].size:
            block = Block(self.chunks[-1], self._used, size)
            self._used += size
            return block
        grow = max(size, self.chunk_bytes, 2 * self.chunks[-1].size if self.chunks else 0)
        self.chunks.append(Chunk(self.backend, min(grow, max(size, self.backend.max_buffer))))
        self._used = size
        return Block(self.chunks[-1], 0, size)

    def reset(self) -> None:
        """Kill every block. A pass that spilled over several chunks gets one chunk big
        enough for all of it, so the next pass of the same size allocates nothing."""
        self.generation += 1
        if len(self.chunks) > 1:
            need = self._high_water
            for chunk in self.chunks:
                chunk.free()
            self.chunks = [Chunk(self.backend, min(max(need, self.chunk_bytes), self.backend.max_buffer))]
        self._used = 0
        self._high_water = 0

    def release(self) -> None:
        for chunk in self.chunks:
            chunk.free()
        self.chunks.clear()
        self.released = True
        self.generation += 1
