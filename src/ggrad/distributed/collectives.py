"""Collectives on tensors, as torch.distributed's (in place where torch's are). With MPI
they are staged through host memory: one counted download and one counted upload each."""

from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from . import group

_OPS = ("sum", "mean", "max", "min")


def _mpi_op(op: str):
    if op not in _OPS:
        raise ValueError(f"op must be one of {_OPS}, got {op!r}")
    MPI = group.mpi()
    return {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]


def _host(t: Tensor) -> np.ndarray:
    if not isinstance(t, Tensor):
        raise TypeError(f"collectives take ggrad Tensors, got {type(t).__name__}")
    return np.ascontiguousarray(t.numpy())


def all_reduce(tensor: Tensor, op: str = "sum") -> Tensor:
    """Reduce `tensor` over every rank and write the result into it (op: sum, mean, max, min)."""
    mpi_op = _mpi_op(op)
    host = _host(tensor)
    out = np.empty_like(host)
    group.comm().Allreduce(host, out, op=mpi_op)
    if op == "mean":
        out = (out / group.get_world_size()).astype(host.dtype)
    return tensor.assign_(out)


def broadcast(tensor: Tensor, src: int = 0) -> Tensor:
    """Rank `src`'s value into `tensor` on every rank."""
    host = _host(tensor)
    group.comm().Bcast(host, root=src)
    return tensor.assign_(host) if group.get_rank() != src else tensor


def all_gather(tensor_list: list, tensor: Tensor) -> list:
    """Every rank's `tensor` into `tensor_list[rank]` (tensors of its shape, written in place)."""
    size = group.get_world_size()
    if len(tensor_list) != size:
        raise ValueError(f"all_gather needs a list of {size} tensors, got {len(tensor_list)}")
    host = _host(tensor)
    out = np.empty((size,) + host.shape, host.dtype)
    group.comm().Allgather(host, out)
    for t, part in zip(tensor_list, out):
        t.assign_(part)
    return tensor_list


def reduce_scatter(output: Tensor, input_list: list, op: str = "sum") -> Tensor:
    """Reduce `input_list[i]` over the ranks and write it into `output` on rank i."""
    mpi_op = _mpi_op(op)
    size = group.get_world_size()
    if len(input_list) != size:
        raise ValueError(f"reduce_scatter needs a list of {size} tensors, got {len(input_list)}")
    host = np.stack([_host(t) for t in input_list])
    out = np.empty_like(host[0])
    group.comm().Reduce_scatter_block(host, out, op=mpi_op)
    if op == "mean":
        out = (out / size).astype(host.dtype)
    return output.assign_(out)
