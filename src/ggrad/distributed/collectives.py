"""Collectives on tensors, as torch.distributed's (in place where torch's are).

Each runs the work recorded so far, then exchanges the tensors' buffers across
processes: with NCCL (backend "nccl", CUDA) from device memory to device memory, nothing
crossing; with MPI staged through host memory (one counted download and one counted
upload per tensor; all_gather and reduce_scatter always take this way). Under
`ggrad.compile` the exchange is a step of the capture (`capture.boundary`), repeated at
every replay between the step's graphs. Every exchange begins with the ranks' rendezvous
(`rendezvous.agree`): the same collective on the same dtypes and shapes everywhere, or a
clear error on every rank."""

from __future__ import annotations

from typing import Callable

import numpy as np

from .. import capture, dtypes, runtime
from ..tensor import Tensor
from . import group
from .rendezvous import Fingerprint, agree

_OPS = ("sum", "mean", "max", "min")


def _mpi_op(op: str):
    if op not in _OPS:
        raise ValueError(f"op must be one of {_OPS}, got {op!r}")
    MPI = group.mpi()
    return {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]


def _tensors(tensors: list) -> list[Tensor]:
    for t in tensors:
        if not isinstance(t, Tensor):
            raise TypeError(f"collectives take ggrad Tensors, got {type(t).__name__}")
    return tensors


class _Staged:
    """A buffer's values on the host (downloaded when first read), in a type MPI reduces
    exactly: float16 and bfloat16 widened to float32; `store` writes values back."""

    def __init__(self, handle, dtype: dtypes.dtype) -> None:
        self.handle, self.dtype = handle, dtype
        self._values: np.ndarray | None = None

    @property
    def values(self) -> np.ndarray:
        if self._values is None:
            values = dtypes.from_storage(self.handle.numpy(), self.dtype)
            wide = self.dtype.is_floating_point and values.dtype.itemsize < 4
            self._values = np.ascontiguousarray(values.astype(np.float32) if wide else values)
        return self._values

    def store(self, values: np.ndarray) -> None:
        self.handle.write(np.ascontiguousarray(dtypes.to_storage(values, self.dtype)).reshape(self.handle.shape))


def _exchange(collective: str, options: tuple, tensors: list[Tensor], written: list[Tensor],
              work: Callable[[list[_Staged]], None], on_device: Callable[[list], None] | None = None) -> None:
    """Run the recorded work, then, once every rank has entered the same `collective` with
    the same `options` ((name, value) pairs) and tensors alike, exchange the tensors'
    buffers: `on_device(handles)` where NCCL serves the device, else `work` on their staged
    values. `written` are the tensors written in place."""
    kinds = [t.dtype for t in tensors]
    fingerprint = Fingerprint(collective, options, tuple(d.name for d in kinds), tuple(tuple(t.shape) for t in tensors))
    lifeline = group.lifeline()
    staged = on_device is None or _device_communicator() is None

    def exchange(handles: list) -> None:
        agree(lifeline, fingerprint)
        if staged:
            work([_Staged(h, d) for h, d in zip(handles, kinds)])
        else:
            on_device(handles)
    capture.boundary([t.node for t in tensors], exchange)
    for t in written:
        t._version += 1
        t.node.host = None  # an integer tensor's host copy is stale now


def _device_communicator():
    """NCCL's communicator when it serves this process's device, else None."""
    nccl = group.nccl_communicator()
    return nccl if nccl is not None and runtime.get_device().startswith("cuda") else None


def _count(handle) -> int:
    return int(np.prod(handle.shape, dtype=np.int64))


def _finish(out: np.ndarray, op: str) -> np.ndarray:
    """A sum over the ranks made into their mean where `op` is "mean" (floats in place)."""
    if op != "mean":
        return out
    size = group.get_world_size()
    return out / size if out.dtype.kind in "iu" else np.divide(out, size, out=out)


def _reduce(staged: list[_Staged], op: str) -> None:
    mpi_op = _mpi_op(op)
    for s in staged:
        out = np.empty_like(s.values)
        group.comm().Allreduce(s.values, out, op=mpi_op)
        s.store(_finish(out, op))


def all_reduce(tensor: Tensor, op: str = "sum") -> Tensor:
    """Reduce `tensor` over every rank and write the result into it (op: sum, mean, max, min)."""
    all_reduce_coalesced([tensor], op)
    return tensor


def all_reduce_coalesced(tensors: list[Tensor], op: str = "sum") -> list[Tensor]:
    """`all_reduce` of several tensors after one graph (DDP's gradient buckets)."""
    _mpi_op(op)
    tensors = _tensors(list(tensors))

    def on_device(handles: list) -> None:
        nccl = group.nccl_communicator()
        for h in handles:
            nccl.all_reduce(h.ptr, h.ptr, _count(h), h.dtype, op)
    _exchange("all_reduce", (("op", op),), tensors, tensors, lambda staged: _reduce(staged, op), on_device)
    return tensors


def broadcast(tensor: Tensor, src: int = 0) -> Tensor:
    """Rank `src`'s value into `tensor` on every rank."""
    size = group.get_world_size()
    if not 0 <= src < size:
        raise ValueError(f"broadcast: src must be a rank in [0, {size - 1}], got {src}")

    def work(staged: list[_Staged]) -> None:
        group.comm().Bcast(staged[0].values, root=src)
        if group.get_rank() != src:
            staged[0].store(staged[0].values)

    def on_device(handles: list) -> None:
        h = handles[0]
        group.nccl_communicator().broadcast(h.ptr, h.ptr, _count(h), h.dtype, root=src)
    _exchange("broadcast", (("src", src),), _tensors([tensor]), [tensor], work, on_device)
    return tensor


def all_gather(tensor_list: list, tensor: Tensor) -> list:
    """Every rank's `tensor` into `tensor_list[rank]` (tensors of its shape, written in place)."""
    size = group.get_world_size()
    if len(tensor_list) != size:
        raise ValueError(f"all_gather needs a list of {size} tensors, got {len(tensor_list)}")

    def work(staged: list[_Staged]) -> None:
        mine = staged[0].values
        out = np.empty((size,) + mine.shape, mine.dtype)
        group.comm().Allgather(mine, out)
        for s, part in zip(staged[1:], out):
            s.store(part)
    _exchange("all_gather", (), _tensors([tensor, *tensor_list]), list(tensor_list), work)
    return tensor_list


def reduce_scatter(output: Tensor, input_list: list, op: str = "sum") -> Tensor:
    """Reduce `input_list[i]` over the ranks and write it into `output` on rank i."""
    mpi_op = _mpi_op(op)
    size = group.get_world_size()
    if len(input_list) != size:
        raise ValueError(f"reduce_scatter needs a list of {size} tensors, got {len(input_list)}")

    def work(staged: list[_Staged]) -> None:
        host = np.stack([s.values for s in staged[1:]])
        out = np.empty_like(host[0])
        group.comm().Reduce_scatter_block(host, out, op=mpi_op)
        staged[0].store(_finish(out, op))
    _exchange("reduce_scatter", (("op", op),), _tensors([output, *input_list]), [output], work)
    return output
