"""Building ggml graphs on the current device and running each as one dispatch.

`Graph` is the executor the layers above use: inputs are new host arrays (uploaded
after allocation) or slots bound to live handles (used where they are); results are
copied into handles. A graph can be kept and run again over other handles (reuse: no
rebuild, no re-allocation). Every node is checked with the backend's supports-op before
anything runs: ggml's Vulkan backend would silently skip an unsupported node.
"""

from __future__ import annotations

import ctypes
import math
import numbers
from typing import Callable, Sequence

import numpy as np
from ggml import ggml as G

from . import streams, transfers
from .critical import critical
from .device import ActiveDevice, current
from .handle import DTYPES, GGML_TO_NUMPY, HOST_ALIGNMENT, MAX_DIMS, Handle, ggml_ne, logical_shape, new_tensor

DEFAULT_MAX_NODES = 8192
SCOPES = ("pass", "persistent")


def as_host_array(data, what: str = "input") -> np.ndarray:
    """A C-contiguous array of a dtype ggml stores, or a clear error."""
    if isinstance(data, Handle):
        raise TypeError(f"{what} is already a device Handle; pass it where handles are accepted")
    try:
        array = np.asarray(data)
    except ValueError as err:  # numpy's message for ragged nesting is cryptic
        raise ValueError(f"{what} is ragged (rows of different lengths) or not numeric: {err}") from None
    if array.dtype not in DTYPES:
        names = ", ".join(str(d) for d in DTYPES)
        raise TypeError(f"{what} has dtype {array.dtype}; ggrad's runtime stores {names} "
                        f"(convert with .astype(np.float32))")
    if array.ndim > MAX_DIMS:
        raise ValueError(f"{what} has {array.ndim} dimensions; ggml supports at most {MAX_DIMS}")
    if array.size == 0:
        raise ValueError(f"{what} is empty (shape {array.shape}); ggml tensors need at least one element")
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)  # keeps 0-d as 0-d


def check_shape(shape, what: str = "shape") -> tuple[int, ...]:
    """A tuple of positive ints, at most 4 of them, or a clear error."""
    if isinstance(shape, numbers.Integral):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise TypeError(f"{what} must be a tuple of ints, got {shape!r}") from None
    out = []
    for d in dims:
        if isinstance(d, float) and math.isnan(d):
            raise ValueError(f"{what} {dims!r} contains NaN")
        if not isinstance(d, numbers.Integral) or isinstance(d, bool):
            raise TypeError(f"{what} {dims!r} must hold ints, got {type(d).__name__}")
        if d <= 0:
            raise ValueError(f"{what} {dims!r} must hold positive sizes")
        out.append(int(d))
    if len(out) > MAX_DIMS:
        raise ValueError(f"{what} {dims!r} has more than {MAX_DIMS} dimensions")
    return tuple(out)


def check_handle(handle, dev: ActiveDevice, what: str) -> Handle:
    if not isinstance(handle, Handle):
        raise TypeError(f"{what} must be a ggrad Handle, got {type(handle).__name__}")
    if not handle.live:
        handle.check_live()
    if handle.device != dev.name:
        raise ValueError(f"{what} lives on {handle.device!r}, but the current device is {dev.name!r}")
    return handle


def node_shape(node) -> tuple[int, int, int, int]:
    return tuple(node.contents.ne)  # type: ignore[return-value]


# ops that only describe memory (no kernel runs for them)
_NO_KERNEL = (G.GGML_OP_NONE, G.GGML_OP_VIEW, G.GGML_OP_RESHAPE, G.GGML_OP_PERMUTE, G.GGML_OP_TRANSPOSE)


class Graph:
    """One ggml graph on a device: built once, then run once or many times.

    Slots are tensors of the graph that point at pool handles given at run time, so a
    built and allocated graph runs again over other buffers: `run` re-points its slots
    and every view of them, and nothing is rebuilt, re-planned or re-allocated. A graph
    that is kept for reuse has its own allocator (another graph cannot move its scratch);
    a one-shot graph borrows the device's.
    """

    def __init__(self, dev: ActiveDevice, max_nodes: int = DEFAULT_MAX_NODES, shared_allocator: bool = True) -> None:
        """Room for `max_nodes` tensors; the graph can hold all of them as nodes, so only
        the context can run out (`room` says how much is left: ggml aborts past it)."""
        self.dev = dev
        mem = G.ggml_tensor_overhead() * max_nodes + G.ggml_graph_overhead_custom(max_nodes, False)
        self.ctx = G.ggml_init(G.ggml_init_params(mem_size=mem, mem_buffer=None, no_alloc=True))
        if not self.ctx:
            raise MemoryError("ggml_init failed for a graph context")
        self.graph = G.ggml_new_graph_custom(self.ctx, max_nodes, False)
        self._owns_allocator = not shared_allocator
        self.galloc = dev.galloc if shared_allocator else G.ggml_gallocr_new(dev.backend.buft)
        self.slots: list = []
        self._uploads: list[tuple[object, np.ndarray]] = []
        self._bound: list[tuple[int, int]] = []  # (buffer, data) each slot points at now
        self._views: list[list[tuple[object, int]]] | None = None  # per slot: (view, offset)
        self._twin: tuple | None = None  # (context, ggml graph): compute_twin's

    def n_nodes(self) -> int:
        return G.ggml_graph_n_nodes(self.graph)

    def compute_nodes(self) -> list[tuple[int, object]]:
        """(index, node) of each node that runs a kernel: views, reshapes and leaves, which
        only describe memory, are left out."""
        nodes = ((i, G.ggml_graph_node(self.graph, i)) for i in range(G.ggml_graph_n_nodes(self.graph)))
        return [(i, node) for i, node in nodes if node.contents.op not in _NO_KERNEL]

    def op_counts(self) -> dict[str, int]:
        """How many nodes of each ggml op the graph computes (the node budgets of issue 25)."""
        counts: dict[str, int] = {}
        for _, node in self.compute_nodes():
            name = G.ggml_op_desc(node).decode()
            counts[name] = counts.get(name, 0) + 1
        return counts

    def room(self) -> int:
        """How many more tensors the graph's context can hold."""
        return (G.ggml_get_mem_size(self.ctx) - G.ggml_used_mem(self.ctx)) // G.ggml_tensor_overhead()

    def input(self, array: np.ndarray):
        """A new leaf holding `array`, uploaded after allocation (one-shot graphs)."""
        tensor = new_tensor(self.ctx, array.dtype, array.shape)
        G.ggml_set_input(tensor)
        self._uploads.append((tensor, array))
        return tensor

    def slot(self, shape: tuple[int, ...], dtype) -> object:
        """A tensor of `shape` whose data is a handle given to `run` (in slot order)."""
        tensor = new_tensor(self.ctx, np.dtype(dtype), shape)
        self.slots.append(tensor)
        return tensor

    def write(self, node, dst) -> None:
        """Copy `node`'s value into the slot `dst` when the graph runs."""
        G.ggml_build_forward_expand(self.graph, G.ggml_cpy(self.ctx, node, dst))

    def computed(self, tensor):
        """`tensor` as a node of its own: a slot or a view of one is copied out (a later
        write into that buffer in this graph must not change it). A view of a computed
        node (a reshape of a gradient) is copied by the write itself."""
        root = tensor
        while root.contents.view_src:
            root = root.contents.view_src
        return G.ggml_cont(self.ctx, tensor) if root.contents.op == G.GGML_OP_NONE else tensor

    def expand(self, node) -> None:
        """Add `node` (and what it needs) to the graph: for ops that write in place."""
        G.ggml_build_forward_expand(self.graph, node)

    def run(self, bindings: Sequence[Handle]) -> None:
        """Point the slots at `bindings` (live handles on this device) and compute."""
        with critical():
            self._run(bindings)

    def _run(self, bindings: Sequence[Handle]) -> None:
        if self._views is None:
            self._check_supported()
            for slot, handle in zip(self.slots, bindings):
                src = handle.tensor.contents
                G.ggml_backend_tensor_alloc(src.buffer, slot, src.data)
                self._bound.append((src.buffer, src.data))
            streams.settle()  # the allocator may free and regrow scratch a queued graph uses
            if not G.ggml_gallocr_alloc_graph(self.galloc, self.graph):
                raise MemoryError(f"{self.dev.name}: could not allocate the graph's scratch memory")
            self._views = self._views_of_slots()
        else:
            bound = self._bound
            for i, handle in enumerate(bindings):
                if handle.location() != bound[i]:  # rebind's test, inlined: most slots stay put
                    self.rebind(i, handle)
        for tensor, array in self._uploads:
            if tensor.contents.buffer:  # an input no node reads is never allocated
                transfers.upload(tensor, array, self.dev.backend)
        self._uploads.clear()
        self.compute()

    def points_at(self, i: int, handle: Handle) -> bool:
        """Whether slot `i` points at `handle`'s data now."""
        return self._bound[i] == handle.location()

    def rebind(self, i: int, handle: Handle) -> None:
        """Point slot `i` (of a graph that ran before) at `handle`: only what moved is re-pointed."""
        where = handle.location()
        if where != self._bound[i]:
            self._bound[i] = where
            slot = self.slots[i].contents
            slot.buffer, slot.data = where
            for view, offset in self._views[i]:
                view.contents.buffer, view.contents.data = where[0], where[1] + offset

    def compute(self) -> None:
        """Run the graph over the buffers its slots point at now (one dispatch)."""
        with critical():
            self.dev.backend.compute(self.graph)
            transfers.count_dispatch()

    def compute_twin(self) -> None:
        """Run the same nodes as a second ggml graph, led by a node that computes nothing (a
        tensor of the twin's own without op or memory: every backend skips it). ggml-cuda
        keeps one CUDA graph per first node and runs a graph kernel by kernel until its
        buffers stay put again: a replay whose results take two buffers in turn (capture.py)
        gives each buffer a graph of its own, each captured once. The twin is built by
        expanding the nodes in their order, so ggml counts each node's uses as in the graph
        itself (a node added without them would never be fused with the next)."""
        if self._twin is None:
            size = G.ggml_graph_size(self.graph) + 1
            mem = G.ggml_tensor_overhead() + G.ggml_graph_overhead_custom(size, False)
            ctx = G.ggml_init(G.ggml_init_params(mem_size=mem, mem_buffer=None, no_alloc=True))
            if not ctx:
                raise MemoryError("ggml_init failed for a twin graph's context")
            twin = G.ggml_new_graph_custom(ctx, size, False)
            lead = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 1)
            G.ggml_set_param(lead)  # a node, not a leaf
            G.ggml_build_forward_expand(twin, lead)
            for i in range(G.ggml_graph_n_nodes(self.graph)):  # each one's inputs are expanded already
                G.ggml_build_forward_expand(twin, G.ggml_graph_node(self.graph, i))
            self._twin = (ctx, twin)
        with critical():
            self.dev.backend.compute(self._twin[1])
            transfers.count_dispatch()

    def scratch_bytes(self) -> int:
        return G.ggml_gallocr_get_buffer_size(self.galloc, 0) if self._owns_allocator and self.galloc else 0

    def free(self) -> None:
        """Under the ggml lock: a thread dropping its compiled steps' graphs frees backend
        buffers, which must not happen beside another thread's compute."""
        with critical():
            if self.ctx:
                G.ggml_free(self.ctx)
                self.ctx = None
            if self._twin is not None:
                G.ggml_free(self._twin[0])
                self._twin = None
            if self._owns_allocator and self.galloc:
                streams.settle()
                G.ggml_gallocr_free(self.galloc)
            self.galloc = None
            self._uploads.clear()

    def _views_of_slots(self) -> list[list[tuple[object, int]]]:
        index = {ctypes.addressof(s.contents): i for i, s in enumerate(self.slots)}
        views: list[list[tuple[object, int]]] = [[] for _ in self.slots]
        t = G.ggml_get_first_tensor(self.ctx)
        while t:
            src = t.contents.view_src
            if src and ctypes.addressof(src.contents) in index:
                views[index[ctypes.addressof(src.contents)]].append((t, t.contents.view_offs))
            t = G.ggml_get_next_tensor(self.ctx, t)
        return views

    def _check_supported(self) -> None:
        backend = self.dev.backend
        for i in range(G.ggml_graph_n_nodes(self.graph)):
            node = G.ggml_graph_node(self.graph, i)
            limit = backend.launch_problem(node)
            if limit is not None:
                raise RuntimeError(
                    f"{G.ggml_op_desc(node).decode()} of ggml shape {tuple(node.contents.ne)} is too large for "
                    f"ggml's {backend.info.kind} backend ({self.dev.name}): {limit}; nothing was run")
            if not backend.has_op(node):
                desc = G.ggml_op_desc(node).decode()
                ne = tuple(node.contents.ne)
                sources = ", ".join(G.ggml_type_name(src.contents.type).decode() for src in node.contents.src if src)
                raise NotImplementedError(
                    f"ggml's {backend.info.kind} backend ({self.dev.name}) does not support "
                    f"{desc} of {sources} into {G.ggml_type_name(node.contents.type).decode()} "
                    f"of ggml shape {ne}; nothing was run")


def to_device(array, scope: str = "pass", give: bool = False) -> Handle:
    """Upload a host array into a new handle of `scope` on the current device. With
    `give`, the caller gives the array up: a device that computes in host memory keeps
    it as the handle's buffer (no copy) when it is aligned for ggml (`aligned_copy`)."""
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
    host = as_host_array(array)
    with critical():
        dev = current()
        shape = logical_shape(host.shape, host.dtype)
        if give and host is array and dev.backend.host_memory and host.ctypes.data % HOST_ALIGNMENT == 0:
            return dev.new_handle(shape, host.dtype, scope, over=host)
        handle = dev.new_handle(shape, host.dtype, scope)
        handle.write(host)
    return handle


def run_op(fn: Callable, inputs: Sequence, out_shape, scope: str = "pass",
           out: Handle | None = None) -> Handle:
    """Run ``fn(ctx, tensors) -> node`` as one graph and return the result's handle.

    `inputs` are host arrays (uploaded) or live handles (read in place). With `out`, the
    result is written into that handle's buffer and the same handle is returned: no
    allocation, so a persistent tensor updated this way keeps its address and its pool
    never grows.
    """
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
    shape = check_shape(out_shape, "out_shape")
    dev = current()
    if out is not None:
        check_handle(out, dev, "out")
        if out.shape != shape:
            raise ValueError(f"shape mismatch: out has shape {out.shape}, out_shape is {shape}")
    if isinstance(inputs, (np.ndarray, Handle)):
        raise TypeError("inputs must be a sequence of arrays or handles, e.g. [a, b]")
    prepared = [check_handle(x, dev, f"inputs[{i}]") if isinstance(x, Handle)
                else as_host_array(x, f"inputs[{i}]") for i, x in enumerate(inputs)]

    with critical():
        return _run_op(dev, fn, prepared, shape, scope, out)


def _run_op(dev: ActiveDevice, fn: Callable, prepared: list, shape: tuple, scope: str, out: Handle | None) -> Handle:
    graph = Graph(dev)
    try:
        handles = [x for x in prepared if isinstance(x, Handle)]
        tensors = [graph.slot(x.shape, x.dtype) if isinstance(x, Handle) else graph.input(x) for x in prepared]
        node = fn(graph.ctx, tensors)
        if not isinstance(node, ctypes.POINTER(G.ggml_tensor)) or not node:
            raise TypeError(f"fn must return a ggml tensor, got {type(node).__name__}")
        if node_shape(node) != ggml_ne(shape):
            got = tuple(reversed([d for d in node_shape(node)]))
            raise ValueError(f"shape mismatch: fn's result has ggml sizes {node_shape(node)} "
                             f"(numpy order {got}), out_shape is {shape}")
        dtype = GGML_TO_NUMPY.get(node.contents.type)
        if dtype is None:
            raise TypeError(f"fn's result has ggml type {node.contents.type}, which ggrad does not store")
        if out is not None and out.dtype != dtype:
            raise TypeError(f"dtype mismatch: fn's result is {dtype}, out is {out.dtype}")
        target = out if out is not None else dev.new_handle(shape, dtype, scope)
        graph.write(node, graph.slot(shape, dtype))
        graph.run(handles + [target])
    finally:
        graph.free()
    return target
