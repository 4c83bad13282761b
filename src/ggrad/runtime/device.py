"""The current device and its state: backend, pools, graph allocator, live handles.

One device is active at a time. Switching away from it releases it: every live
persistent handle is first downloaded to the host (nothing lost), then its pools and
backend are freed.

Threads share the device and its persistent pool; each thread has a pass pool of its
own, so a grad tape entered in one thread does not kill another thread's pass.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict

import numpy as np
from ggml import ggml as G

from . import backend as _backend, streams
from .critical import critical
from .handle import Handle
from .pools import PassPool, PersistentPool


class ActiveDevice:
    """A started device: everything that must be freed together when it is released."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.backend = _backend.start(name)
        self.persistent = PersistentPool(self.backend)
        self._passes: dict[int, PassPool] = {}  # thread ident -> that thread's pass pool
        self.galloc = G.ggml_gallocr_new(self.backend.buft)
        self._persistent_handles: weakref.WeakSet[Handle] = weakref.WeakSet()
        self.graphs: OrderedDict = OrderedDict()  # signature -> runtime.graph.Graph, for reuse
        self.held: weakref.WeakSet = weakref.WeakSet()  # graphs taken out for a caller to keep
        self.released = False

    @property
    def passes(self) -> PassPool:
        """The calling thread's pass pool (made on its first use; the pools of threads
        that ended are freed then)."""
        me = threading.get_ident()
        pool = self._passes.get(me)
        if pool is None:
            alive = {t.ident for t in threading.enumerate()}
            for ident in [i for i in self._passes if i not in alive]:
                self._passes.pop(ident).release()
            pool = self._passes[me] = PassPool(self.backend)
        return pool

    def pass_bytes(self) -> int:
        return sum(pool.nbytes for pool in self._passes.values())

    def cached_graph(self, key):
        graph = self.graphs.get(key)
        if graph is not None:
            self.graphs.move_to_end(key)
        return graph

    def keep_graph(self, key, graph, limit: int = 8) -> None:
        """Keep a built graph for reuse; the least recently used beyond `limit` is freed."""
        self.graphs[key] = graph
        while len(self.graphs) > limit:
            _, old = self.graphs.popitem(last=False)
            old.free()

    def take_graph(self, key, graph) -> None:
        """`graph` leaves the reuse cache: its caller keeps (and frees) it from now on; its
        scratch memory still counts in `memory()`."""
        if self.graphs.get(key) is graph:
            del self.graphs[key]
        self.held.add(graph)

    def new_handle(self, shape: tuple[int, ...], dtype, scope: str, over: np.ndarray | None = None) -> Handle:
        """A handle in the pool of `scope`; `over`: see `Handle` (a host-memory backend only)."""
        pool = self.persistent if scope == "persistent" else self.passes
        handle = Handle(pool, shape, dtype, self.name, over)
        if scope == "persistent":
            self._persistent_handles.add(handle)
        return handle

    def scratch_bytes(self) -> int:
        shared = G.ggml_gallocr_get_buffer_size(self.galloc, 0) if self.galloc else 0
        kept = [*self.graphs.values(), *self.held]
        return shared + sum(g.scratch_bytes() for g in kept)

    def release(self) -> None:
        for handle in list(self._persistent_handles):
            handle.evict()
        self._persistent_handles = weakref.WeakSet()
        for graph in [*self.graphs.values(), *self.held]:
            graph.free()
        self.graphs.clear()
        streams.settle()
        G.ggml_gallocr_free(self.galloc)
        self.galloc = None
        for pool in self._passes.values():
            pool.release()
        self.persistent.release()
        self.backend.free()
        self.released = True


_name = "cpu"
_active: ActiveDevice | None = None
_before_release: list = []  # callbacks run before a device is released (pending work)


def on_release(callback) -> None:
    """Run `callback()` before the active device is released (the lazy layer finishes
    its pending work there, so nothing recorded is lost)."""
    _before_release.append(callback)


def current() -> ActiveDevice:
    """The active device, started on first use."""
    global _active
    active = _active
    if active is None:
        with critical():
            if _active is None:
                _active = ActiveDevice(_name)
            active = _active
    return active


def _one_thread_after_fork() -> None:
    """A forked child (a DataLoader worker) has none of the CPU backend's OpenMP threads:
    a graph computed with several waits for them forever. One thread works (torch's
    workers use one too)."""
    if _active is not None and _active.backend.info.kind == "cpu":
        G.ggml_backend_cpu_set_n_threads(_active.backend.handle, 1)


os.register_at_fork(after_in_child=_one_thread_after_fork)


def get_device() -> str:
    return _name


def set_device(name: str) -> str:
    """Make `name` the current device and return the previous name. Switching releases
    the previous device after moving its live persistent data to the host."""
    global _name, _active
    new = _backend.resolve(name)
    with critical():
        previous = _name
        if new != _name:
            if _active is not None:
                for callback in _before_release:
                    callback()
                _active.release()
                _active = None
            _name = new
    return previous


DEVICE_TYPES = ("cpu", "cuda", "vulkan", "gpu")


class device(str):  # noqa: N801  (torch's name)
    """torch.device: a device name ("cpu", "cuda:0", "vulkan") with its `type` and
    `index`, made without touching the device. It is a str, so it goes wherever ggrad
    takes a device name (`.to(d)`, `device=d`, `d == "cpu"`). ``with device("vulkan"):``
    runs the block on that device and restores the previous one afterwards, also when
    the block raises (torch's `with torch.device(...)` sets the default device)."""

    def __new__(cls, type: str, index: int | None = None) -> device:  # noqa: A002  (torch's argument)
        if not isinstance(type, str):
            raise TypeError(f"device() takes a device name, got {type!r}")
        name = type.strip().lower()
        kind, _, number = name.partition(":")
        if kind not in DEVICE_TYPES or (number and not number.isdigit()):
            raise RuntimeError(f"Expected one of {', '.join(DEVICE_TYPES)} device type at start of device string: "
                               f"{type}")
        if index is not None:
            if number:
                raise RuntimeError(f"type (string) must not include an index because index was passed explicitly: "
                                   f"{type}")
            name = f"{kind}:{int(index)}"
        made = super().__new__(cls, name)
        made._previous = []
        return made

    @property
    def type(self) -> str:
        return str.__str__(self).partition(":")[0]  # a plain str (partition may hand back self)

    @property
    def index(self) -> int | None:
        number = str.__str__(self).partition(":")[2]
        return int(number) if number else None

    def __repr__(self) -> str:
        return f"device(type={self.type!r}" + (f", index={self.index})" if self.index is not None else ")")

    def __enter__(self) -> str:
        self._previous.append(set_device(self))
        return get_device()

    def __exit__(self, *exc) -> None:
        set_device(self._previous.pop())


def reset_pass() -> None:
    """Start a new pass of the calling thread: every pass-scope handle it made before is
    dead from now on."""
    if _active is not None:
        with critical():
            _active.passes.reset()


def memory() -> dict:
    """Bytes of backend buffers held now by the current device's pools; of the persistent
    pool's, `persistent_used_bytes` are in live tensors (the rest is free for reuse)."""
    if _active is None:
        return {"device": _name, "persistent_bytes": 0, "persistent_used_bytes": 0, "pass_bytes": 0,
                "scratch_bytes": 0}
    return {"device": _name, "persistent_bytes": _active.persistent.nbytes,
            "persistent_used_bytes": _active.persistent.used, "pass_bytes": _active.pass_bytes(),
            "scratch_bytes": _active.scratch_bytes()}
