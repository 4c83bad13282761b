"""`DistributedDataParallel`: a replica per process whose gradients are averaged across
processes after each backward pass, in flat buckets (one collective per bucket)."""

from __future__ import annotations

import contextlib
import functools

from .. import autograd, capture
from .. import functional as F
from ..nn.module import Module
from ..tensor import Tensor
from . import group
from .collectives import all_reduce_coalesced, broadcast


class DistributedDataParallel(Module):
    """torch's DDP: rank 0's parameters and buffers are broadcast when wrapped; every
    backward pass through `forward` ends with the gradients averaged over the ranks, in
    buckets of about `bucket_mb` MiB (one concatenation on the device each, exchanged
    after one graph). `no_sync()` skips it (gradient accumulation by hand); so does a
    backward pass before a step of an optimizer with ``accumulate_steps=k`` that does not
    apply: the step that applies averages the whole accumulated sum once. Under
    `ggrad.compile` the exchange is part of the captured step (graph, exchange, graph)."""

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
        self._no_sync_traced = 0  # no_sync blocks entered inside a function compile is tracing
        with autograd.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                broadcast(t, src=0)

    def forward(self, *args, **kwargs):
        if autograd.is_recording():
            if not self._no_sync_traced:  # else the function itself turns syncing off
                capture.on_replay(check=functools.partial(self._syncs, self._sync))
            if self._sync:
                autograd.queue_callback(self.average_gradients)
        return self.module(*args, **kwargs)

    def _syncs(self, traced: bool) -> bool:
        return self._sync == traced

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside leave the gradients local (accumulate, then sync once)."""
        previous, self._sync = self._sync, False
        inside = capture.tracing()
        self._no_sync_traced += inside
        try:
            yield
        finally:
            self._sync = previous
            self._no_sync_traced -= inside

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

    def _accumulating(self, params: list[Tensor]) -> list:
        """The optimizers with accumulate_steps > 1 that update some of `params`."""
        ids = {id(p) for p in params}
        return [o for o in capture.optimizers() if o.accumulate_steps > 1 and
                any(id(p) in ids for g in o.param_groups for p in g["params"])]

    def average_gradients(self) -> None:
        """Average every parameter's gradient over the ranks (what a backward pass through
        `forward` ends with)."""
        if group.get_world_size() == 1:  # the average of one: nothing to move
            return
        params = [p for p in self.module.parameters() if p.requires_grad]
        accumulating = self._accumulating(params)
        phase = tuple(o.next_step_applies for o in accumulating)
        capture.on_replay(check=lambda: tuple(o.next_step_applies for o in accumulating) == phase)
        if not all(phase):  # a micro-step that does not apply: the gradients stay local
            return
        for optimizer in accumulating:
            optimizer.merge_accumulated(params)
        params = [p for p in params if p.grad is not None]
        with autograd.no_grad():
            buckets = self._buckets(params)
            flats = [F.cat([p.grad.float().reshape(-1) for p in bucket]) if len(bucket) > 1 else
                     bucket[0].grad.float().reshape(-1) for bucket in buckets]
            all_reduce_coalesced(flats, op="mean")
            for bucket, flat in zip(buckets, flats):
                offset = 0
                for p in bucket:
                    n = p.numel()
                    p.grad = flat[offset:offset + n].reshape(p.shape).to(p.grad.dtype)
                    offset += n
