"""The one place where bytes cross between host and device, and the counters that prove it.

Every upload and download in ggrad goes through `upload` / `download`; every graph
compute through `count_dispatch`. Copies into and out of a host-memory backend (the
CPU device) are not crossings and are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np
from ggml import ggml as G

from . import streams


@dataclass
class Counters:
    uploads: int = 0
    downloads: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    dispatches: int = 0

    @property
    def crossings(self) -> int:
        return self.uploads + self.downloads

    def as_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["crossings"] = self.crossings
        return out

    def __sub__(self, other: Counters) -> Counters:
        return Counters(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))


_totals = Counters()


def transfers() -> dict:
    """Cumulative counts since the process started: uploads, downloads, bytes_up,
    bytes_down, dispatches (graph computes) and crossings (uploads + downloads)."""
    return _totals.as_dict()


class count_transfers:
    """``with count_transfers() as t:`` -- `t` holds the counts made inside the block.

    Read inside the block, the fields are the counts so far; after it, they are frozen.
    """

    def __init__(self) -> None:
        self._start = Counters()
        self._end: Counters | None = None

    def __enter__(self) -> count_transfers:
        self._start = replace(_totals)
        self._end = None
        return self

    def __exit__(self, *exc) -> None:
        self._end = replace(_totals)

    def _delta(self) -> Counters:
        return (self._end or _totals) - self._start

    uploads = property(lambda self: self._delta().uploads)
    downloads = property(lambda self: self._delta().downloads)
    bytes_up = property(lambda self: self._delta().bytes_up)
    bytes_down = property(lambda self: self._delta().bytes_down)
    dispatches = property(lambda self: self._delta().dispatches)
    crossings = property(lambda self: self._delta().crossings)

    def as_dict(self) -> dict:
        return self._delta().as_dict()

    def __repr__(self) -> str:
        return f"count_transfers({self.as_dict()})"


def upload(tensor, array: np.ndarray, backend) -> None:
    """Copy a C-contiguous `array` into the ggml `tensor`'s buffer on the started `backend`."""
    upload_from(tensor, array.ctypes.data, array.nbytes, backend, streams.pageable(array))  # data_as costs 2 us


def upload_from(tensor, address: int, nbytes: int, backend, pageable: bool) -> None:
    """Copy `nbytes` at host `address` into the ggml `tensor`'s buffer on the started
    `backend` (every upload comes here): queued behind its running graphs where they may
    still read the old values and the memory is `pageable` (streams.py), else once they
    have finished."""
    if streams.queues_upload(backend, pageable):
        G.ggml_backend_tensor_set_async(backend.handle, tensor, address, 0, nbytes)
    else:
        streams.settle()
        G.ggml_backend_tensor_set(tensor, address, 0, nbytes)
    if not backend.host_memory:
        _totals.uploads += 1
        _totals.bytes_up += nbytes


def download(tensor, shape: tuple, dtype: np.dtype, host_memory: bool) -> np.ndarray:
    """A fresh host array holding the ggml `tensor`'s data."""
    out = np.empty(shape, dtype=dtype)
    streams.settle()
    G.ggml_backend_tensor_get(tensor, out.ctypes.data, 0, out.nbytes)
    if not host_memory:
        _totals.downloads += 1
        _totals.bytes_down += out.nbytes
    return out


def count_dispatch() -> None:
    _totals.dispatches += 1
