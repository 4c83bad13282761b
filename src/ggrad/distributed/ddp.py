"""`DistributedDataParallel`: a replica per process whose gradients are averaged across
processes after each backward pass, in flat buckets (one collective per bucket)."""

from __future__ import annotations

import contextlib

from .. import autograd
from .. import functional as F
from ..nn.module import Module
from ..tensor import Tensor
from . import group
from .collectives import all_reduce, broadcast


class DistributedDataParallel(Module):
    """torch's DDP: rank 0's parameters and buffers are broadcast when wrapped; every
    backward pass through `forward` ends with the gradients averaged over the ranks, in
    buckets of about `bucket_mb` MiB (each: one concatenation on the device, one download,
    one MPI allreduce, one upload). `no_sync()` skips it (gradient accumulation)."""

    def __init__(self, module: Module, bucket_mb: float = 25.0) -> None:
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DistributedDataParallel wraps a ggrad Module, got {type(module).__name__}")
        if not bucket_mb > 0:
            raise ValueError(f"bucket_mb must be > 0, got {bucket_mb}")
        group.comm()  # the process group must exist
        self.module = module
        self.bucket_bytes = int(bucket_mb * 2 ** 20)
        self._sync = True
        with autograd.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                broadcast(t, src=0)

    def forward(self, *args, **kwargs):
        if self._sync and autograd.is_recording():
            autograd.queue_callback(self.average_gradients)
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside leave the gradients local (accumulate, then sync once)."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    def _buckets(self, params: list[Tensor]) -> list[list[Tensor]]:
        buckets, size = [[]], 0
        for p in params:
            nbytes = p.numel() * 4
            if buckets[-1] and size + nbytes > self.bucket_bytes:
                buckets.append([])
                size = 0
            buckets[-1].append(p)
            size += nbytes
        return [b for b in buckets if b]

    def average_gradients(self) -> None:
        """Average every parameter's gradient over the ranks (what a backward pass through
        `forward` ends with)."""
        params = [p for p in self.module.parameters() if p.requires_grad and p.grad is not None]
        if group.get_world_size() == 1:  # the average of one: nothing to move
            return
        with autograd.no_grad():
            for bucket in self._buckets(params):
                flat = F.cat([p.grad.float().reshape(-1) for p in bucket]) if len(bucket) > 1 else \
                    bucket[0].grad.float().reshape(-1)
                all_reduce(flat, op="mean")
                offset = 0
                for p in bucket:
                    n = p.numel()
                    p.grad = flat[offset:offset + n].reshape(p.shape).to(p.grad.dtype)
                    offset += n
