"""`DistributedDataParallel`: a replica per process whose gradients are averaged across
processes after each backward pass, in flat buckets (one collective per bucket)."""

from __future__ import annotations

import contextlib
import functools

import numpy as np

from .. import autograd, capture, dtypes
from .. import functional as F
from ..nn.module import Module
from ..tensor import Tensor, zeros_like
from . import group
from .collectives import all_reduce_coalesced, broadcast
from .rendezvous import Fingerprint, agree

UNUSED_PARAMETERS = (
    "Expected to have finished reduction in the prior iteration before starting a new one. This error "
    "indicates that your module has parameters that were not used in producing loss. You can enable unused "
    "parameter detection by passing the keyword argument `find_unused_parameters=True` to "
    "`DistributedDataParallel`, and by making sure all `forward` function outputs participate in calculating "
    "loss.\nParameters which did not receive grad for rank {rank}: {names}\nParameter indices which did not "
    "receive grad for rank {rank}: {indices}")


class DistributedDataParallel(Module):
    """torch's DDP: rank 0's parameters and buffers are broadcast when wrapped; every
    backward pass through `forward` ends with the gradients averaged over the ranks, in
    buckets of about `bucket_mb` MiB (one concatenation on the device each, exchanged
    after one graph). `no_sync()` skips it (gradient accumulation by hand); so does a
    backward pass before a step of an optimizer with ``accumulate_steps=k`` that does not
    apply: the step that applies averages the whole accumulated sum once. Under
    `ggrad.compile` the exchange is part of the captured step (graph, exchange, graph).

    A parameter without a gradient after backward (unused in producing the loss) is an
    error, as in torch, since the ranks would average different parameters' gradients;
    with `find_unused_parameters=True` the ranks first agree on which parameters some rank
    used (one more small exchange): those are averaged with zeros from the ranks that did
    not use them, and the others keep their gradients."""

    def __init__(self, module: Module, bucket_mb: float = 25.0, find_unused_parameters: bool = False) -> None:
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DistributedDataParallel wraps a ggrad Module, got {type(module).__name__}")
        if not bucket_mb > 0:
            raise ValueError(f"bucket_mb must be > 0, got {bucket_mb}")
        group.comm()  # the process group must exist
        self.module = module
        self.bucket_bytes = int(bucket_mb * 2 ** 20)
        self.find_unused_parameters = bool(find_unused_parameters)
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
        params = self._used_parameters(params)
        with autograd.no_grad():
            buckets = self._buckets(params)
            flats = [F.cat([self._flat_gradient(p) for p in bucket]) if len(bucket) > 1 else
                     self._flat_gradient(bucket[0]) for bucket in buckets]
            all_reduce_coalesced(flats, op="mean")
            for bucket, flat in zip(buckets, flats):
                offset = 0
                for p in bucket:
                    n = p.numel()
                    dtype = p.dtype if p.grad is None else p.grad.dtype  # (None: unused on this rank)
                    p.grad = flat[offset:offset + n].reshape(p.shape).to(dtype)
                    offset += n

    @staticmethod
    def _flat_gradient(p: Tensor) -> Tensor:
        """`p`'s gradient as float32 in one row; zeros where this rank did not use `p`."""
        return (zeros_like(p, dtypes.float32) if p.grad is None else p.grad.float()).reshape(-1)

    def _used_parameters(self, params: list[Tensor]) -> list[Tensor]:
        """The parameters whose gradients the ranks average: all of them (each must have a
        gradient on every rank), or with find_unused_parameters those some rank used."""
        used_here = np.array([p.grad is not None for p in params], np.int32)
        if not self.find_unused_parameters:
            if not used_here.all():
                names = {id(p): name for name, p in self.module.named_parameters()}
                unused = [i for i, used in enumerate(used_here) if not used]
                raise RuntimeError(UNUSED_PARAMETERS.format(
                    rank=group.get_rank(), names=", ".join(names[id(params[i])] for i in unused),
                    indices=" ".join(map(str, unused))))
            return params
        agree(group.lifeline(),
              Fingerprint("DistributedDataParallel.find_unused_parameters", (), ("int32",), (used_here.shape,)))
        used_anywhere = np.empty_like(used_here)
        group.comm().Allreduce(used_here, used_anywhere, op=group.mpi().MAX)
        return [p for p, used in zip(params, used_anywhere) if used]
