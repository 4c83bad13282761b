"""Lazy values: nodes of pending ggml work, and `realize`, which runs them as one graph.

An operation on tensors only adds a `Node`. When a value is needed, `realize` gathers
every pending node that something still wants -- the node asked for, every pending
node a live Tensor wraps, and every pending in-place store -- builds them into one
ggml graph on the current device and runs it as one dispatch. Results land in pool
handles; intermediates live in the graph allocator's scratch and are gone after.

Stores are versioned: ``store(target, value)`` makes the writer's tensor point at
`value` from now on (later reads see the new value) and, when the graph runs, copies
`value` into the target's existing buffer (same address).

Effects are ops that write their targets' buffers themselves (ggml's fused optimizer
steps): ``inplace(op, srcs, targets)`` returns a new version node per target, realized
into the target's buffer once the effect ran. An op that reads a version before its
effect ran first runs the pending graph (a rare second dispatch: the normal loop enters a
new tape, which runs everything, before reading).

A graph runs in three phases, so no write lands before a read of the old value: every
computation (a value that is only a view of a buffer is copied out first), then the
effects, then the copies of outputs and stores into their buffers.

Pending work belongs to the thread that recorded it (each thread's `realize` runs its
own), and `realize` is a critical section (runtime/critical.py): one thread at a time
on the device, and a Ctrl-C arriving inside it is raised when it has finished, so a
graph that ran is always recorded as run.
"""

from __future__ import annotations

import itertools
import math
import threading
import weakref
from typing import Callable, Iterable

import numpy as np
from ggml import ggml as G

from . import dtypes, runtime
from .runtime import kernels
from .runtime.critical import critical
from .runtime.graph import Graph

# op name -> fn(ctx, src_ggml_tensors, node) -> ggml tensor of node.shape
BUILDERS: dict[str, Callable] = {}


def builder(name: str):
    def register(fn: Callable) -> Callable:
        BUILDERS[name] = fn
        return fn
    return register


# fn(ggml graph, memo): run over each graph once it is filled, before it is allocated (ops
# registers its rewrites here, from what its builders noted in the memo)
GRAPH_PASSES: list[Callable] = []


_sequence = itertools.count()


class Node:
    """A value: realized (a live `handle`), on the host (`host`, uploaded on first use),
    or pending (`op` applied to `srcs`). `dtype` is a ggrad dtype; `host` and the
    handle hold its storage form (dtypes.py)."""

    __slots__ = ("shape", "dtype", "op", "srcs", "arg", "handle", "host", "scope", "owners", "seq",
                 "__weakref__")

    def __init__(self, shape: tuple[int, ...], dtype, op: str | None = None, srcs: tuple = (),
                 arg=None, handle=None, host: np.ndarray | None = None, scope: str = "pass") -> None:
        self.shape = shape
        self.dtype = dtype if isinstance(dtype, dtypes.dtype) else dtypes.as_dtype(dtype)
        self.op = op
        self.srcs = srcs
        self.arg = arg
        self.handle = handle
        self.host = host
        self.scope = scope  # where the value goes when realized
        self.owners = 0  # live Tensors wrapping this node: a pending node with owners is wanted
        self.seq = next(_sequence)  # creation order: graphs list their outputs in it
        if op is not None and op is not VERSION:  # an effect's versions are settled by the effect, not looked up
            pending = local.pending
            pending.add(weakref.ref(self, pending.discard))

    @property
    def pending(self) -> bool:
        return self.op is not None

    def wanted(self) -> bool:
        return self.owners > 0

    def __repr__(self) -> str:
        state = f"op={self.op}" if self.op else ("realized" if self.handle is not None else "host")
        return f"Node({self.shape}, {self.dtype}, {state})"


def mark() -> int:
    """A point in recording order: nodes recorded after it have a larger `seq`."""
    return next(_sequence)


VERSION = "version"  # the op of a value an effect will leave in its target's buffer
FAILED = "failed"  # the op of a value whose graph failed; `arg` is the error


def failure(node: Node) -> Exception:
    """The error to raise where `node`, whose graph failed, is read."""
    error = node.arg
    message = f"{error} (raised when this value was computed; it has no value)"
    try:
        return type(error)(message)
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {message}")


class Effect:
    """An op that writes `targets` (all among `srcs`) in place; `versions` are the results."""

    __slots__ = ("op", "srcs", "arg", "targets", "versions")

    def __init__(self, op: str, srcs: tuple, arg, targets: tuple, versions: list) -> None:
        self.op, self.srcs, self.arg, self.targets, self.versions = op, srcs, arg, targets, versions


class _ThreadState(threading.local):
    """What one thread has recorded and not yet run, and how it records."""

    def __init__(self) -> None:
        # Weak references to the pending nodes: a node that dies leaves by its reference's
        # callback (the set's own discard, in C: cheaper per node than a WeakSet's Python).
        self.pending: set[weakref.ref] = set()
        self.stores: dict[int, tuple[Node, Node]] = {}  # id(target handle) -> (target, value)
        self.effects: list[Effect] = []
        self.recorder: Callable[[Run], None] | None = None  # told of every graph `realize` runs
        self.host_read_hook: Callable[[], None] | None = None  # called before a host read
        # "pass" while a grad tape is recording, else "persistent": see `_landing`.
        self.default_scope = "persistent"
        # while a graph is filled: ggml tensors builders share within it (`build_memo`)
        self.memo: dict | None = None
        # values computed into this thread's pass pool (read inside a tape): `keep_pass_values`
        self.pass_values: list[weakref.ref] = []
        # while a step is traced (`capture`): for each grad tape it entered, the values
        # pending at the entry. Its tapes after the first continue that pass, so its
        # micro-steps become one graph, computed micro-step by micro-step (`_fill_nodes`)
        self.traced_tapes: list[list[Node]] | None = None


local = _ThreadState()


class Run:
    """What one `realize` ran, for a recorder (step capture): the graph's slots are the
    leaves' handles, then the outputs' result handles, then the stores' targets."""

    __slots__ = ("dev", "key", "graph", "leaves", "outputs", "stores", "effects")

    def __init__(self, dev, key, graph: Graph, leaves: list[Node], outputs: list[Node],
                 stores: list, effects: list[Effect]) -> None:
        self.dev, self.key, self.graph = dev, key, graph
        self.leaves, self.outputs, self.stores, self.effects = leaves, outputs, stores, effects



def from_host(array: np.ndarray, dtype: dtypes.dtype, scope: str = "persistent") -> Node:
    """A leaf holding `array`, already in `dtype`'s storage form."""
    return Node(array.shape, dtype, host=array, scope=scope)


SMALL_VALUE = 4096  # elements: a value this small read inside a tape (a loss) is kept at once


def _landing(node: Node) -> str:
    """The pool a result goes to. A value computed while a tape records (read mid-pass)
    is scratch of that pass, unless it is small (a loss read with .item() inside the tape:
    kept, so that the next tape need not copy it out); one computed outside a tape -- the
    normal case, as the next tape's entry runs the step -- is kept."""
    if node.scope == "persistent" or local.default_scope == "persistent" or math.prod(node.shape) <= SMALL_VALUE:
        return "persistent"
    return "pass"


def apply(op: str, srcs: tuple[Node, ...], shape: tuple[int, ...], dtype=dtypes.float32, arg=None) -> Node:
    for src in srcs:
        kind = src.op
        if kind is None:
            handle = src.handle
            if handle is not None and handle.host_copy is None and not handle.live:
                handle.check_live()  # a value from a reset pass: say so here, not in a later graph
        elif kind == FAILED:
            raise failure(src) from src.arg
        elif kind == VERSION:  # its effect has not run: run it before reading the result
            realize()
            break
    return Node(tuple(shape), dtype, op=op, srcs=srcs, arg=arg, scope=local.default_scope)


def inplace(op: str, srcs: tuple[Node, ...], targets: tuple[Node, ...], arg=None, chained: bool = False) -> list[Node]:
    """Record an effect writing `targets`' buffers; returns their new versions. `chained`:
    the effect's ggml node writes its first target as its own memory (a view of it), so every
    backend runs it after an earlier node that wrote or read there (ggml-vulkan syncs nodes
    whose memory overlaps): a source or target that is a pending effect's version then stands
    for that effect's buffer (the effect runs first, in the graph's order) where it would
    otherwise run the pending graph first (BatchNorm used twice in a compiled step)."""
    if chained:
        srcs, targets = _buffers_of(srcs), _buffers_of(targets)
    if VERSION in [s.op for s in srcs]:
        realize()
    here = runtime.get_device()
    for target in targets:  # ensure_on_device, its common case (a live handle here) inlined
        handle = target.handle
        if target.op is not None or handle is None or not handle.live or handle.device != here:
            ensure_on_device(target)
    versions = [Node(t.shape, t.dtype, op=VERSION, scope=t.scope) for t in targets]
    local.effects.append(Effect(op, srcs, arg, targets, versions))
    return versions


def _buffers_of(nodes: tuple[Node, ...]) -> tuple[Node, ...]:
    """Each pending effect's version in `nodes` as the buffer the effect writes."""
    if VERSION not in [n.op for n in nodes]:
        return nodes
    buffers = {id(v): t for e in local.effects for t, v in zip(e.targets, e.versions)}
    return tuple([buffers.get(id(n), n) for n in nodes])


def store(target: Node, value: Node) -> None:
    """Write `value` into `target`'s persistent buffer when the graph next runs."""
    handle = ensure_on_device(target)
    if value is target:
        return
    local.stores[id(handle)] = (target, value)


def restore(value: Node, newer: Node) -> None:
    """A second write before the first ran: the buffer `value` was to be stored into
    gets `newer` instead (which may read `value`)."""
    stores = local.stores
    for key, (target, stored) in stores.items():
        if stored is value:
            stores[key] = (target, newer)


def pending_write(handle) -> bool:
    """Whether a store or an effect not yet run will write `handle`'s buffer."""
    return id(handle) in local.stores or any(t.handle is handle for e in local.effects for t in e.targets)


def _pending_nodes(state: _ThreadState) -> list[Node]:
    """The live nodes of `state.pending` (a snapshot: a node may die while it is read)."""
    return [n for n in [ref() for ref in list(state.pending)] if n is not None]


def pending_reader(node: Node) -> bool:
    """Whether recorded work not yet run reads `node` (its buffer must not change yet)."""
    return any(node in n.srcs for n in _pending_nodes(local) if n.pending) or any(
        node in e.srcs for e in local.effects)


def _wanted_values(state: _ThreadState):
    """The pending values a tensor still holds (an effect's versions and failed values aside)."""
    return (n for n in _pending_nodes(state) if n.pending and n.op not in (VERSION, FAILED) and n.wanted())


def has_pending_work() -> bool:
    state = local
    return bool(state.stores or state.effects or state.pending and any(True for _ in _wanted_values(state)))


def pending_values() -> list[Node]:
    """The pending values still wanted, in recording order."""
    return sorted(_wanted_values(local), key=lambda n: n.seq)


EXACT_IN_FLOAT32 = 1 << 24  # integers this small survive the float32 an affine computes in


def host_integer(node: Node) -> int | None:
    """The value of a one-element integer node that is a host integer moved by integral
    affine steps (``i + 1``, ``i * 2 - 3`` of a host index), computed here: the device
    would compute the same (every value involved is an integer that float32 holds exactly),
    and an index read per element (``data[i:i + k] for i in ix``) costs no graph.
    None for anything else."""
    if node.dtype.is_floating_point or node.dtype is dtypes.bool_ or math.prod(node.shape) != 1:
        return None
    if node.op is None:
        return int(node.host.reshape(())) if node.host is not None else None
    if node.op != "affine" or not all(float(a).is_integer() for a in node.arg):
        return None
    x = host_integer(node.srcs[0])
    if x is None:
        return None
    scale, bias = (int(a) for a in node.arg)
    value = scale * x + bias
    return value if max(abs(x), abs(scale * x), abs(bias), abs(value)) < EXACT_IN_FLOAT32 else None


def ensure_on_device(node: Node):
    """A live handle on the current device for a leaf node: uploads host data once,
    and moves values that a released device left on the host."""
    if node.op is not None:  # pending (not the property: this runs for every leaf of every graph)
        realize([node])
        return node.handle
    handle = node.handle
    if handle is not None and handle.live and handle.device == runtime.get_device():
        return handle
    with critical():
        return _to_current_device(node)


def _to_current_device(node: Node):
    handle = node.handle
    if handle is not None and handle.live and handle.device == runtime.get_device():
        return handle  # another thread moved it meanwhile
    if handle is not None and handle.host_copy is not None:
        node.host, handle.host_copy = handle.host_copy, None  # the device was released
    elif handle is not None and handle.live:  # on another device: move it
        node.host = handle.numpy()
    elif handle is not None:
        handle.check_live()  # raises: its pass was reset
    # Integers and masks (targets, indices) stay checkable on the host; a float's array is
    # the node's own and is given to the device (which may compute on it where it lies).
    give = node.dtype.is_floating_point
    node.handle = runtime.to_device(node.host, scope=node.scope, give=give)
    if give:
        node.host = None
    return node.handle


def realize(nodes: Iterable[Node] = ()) -> None:
    """Run every pending node that is asked for or still wanted, and every store, as one graph.

    A graph with the same signature as one run before (the same operations on the same
    shapes: the normal training step) is not rebuilt: the kept ggml graph runs again with
    its slots pointed at this step's buffers.
    """
    with critical():
        _realize(list(nodes))


def _realize(nodes: list[Node]) -> None:
    state = local
    stores = list(state.stores.values())
    effects = list(state.effects)
    skip = {id(value) for _, value in stores}  # a stored value lands in its target's buffer
    for n in nodes:
        if n.op == FAILED:
            raise failure(n) from n.arg
    asked = [n for n in nodes if n.pending and n.op != VERSION and id(n) not in skip]
    skip.update(id(n) for n in asked)
    # pending and wanted, inlined (not the properties: this looks at every pending node)
    wanted = [n for n in _pending_nodes(state)
              if n.owners > 0 and n.op is not None and n.op not in (VERSION, FAILED) and id(n) not in skip]
    outputs = asked + sorted(wanted, key=lambda n: n.seq)  # a set's order would vary the signature
    for n in nodes:  # leaves asked for go to the device too
        if not n.pending:
            ensure_on_device(n)
    if not outputs and not stores and not effects:
        return
    try:
        _run(state, outputs, stores, effects)
    except BaseException as error:
        # The failed writes are dropped (the error says why) so that they cannot fail every
        # later graph too; an effect that did not run leaves its targets as they were.
        state.stores.clear()
        del state.effects[:len(effects)]
        _settle(effects)
        if isinstance(error, Exception) and not isinstance(error, MemoryError):
            _quarantine(state, outputs)
        raise
    state.stores.clear()
    del state.effects[:len(effects)]
    _settle(effects)


def _quarantine(state: _ThreadState, outputs: list[Node]) -> None:
    """After a graph failed for a reason that would fail it again (an op the backend lacks,
    a dead input), run each of its values on its own: those that fail are marked failed
    (reading one, or building on it, raises its error) and no later graph takes them in,
    so one bad value does not fail every graph after it. A shortage of memory is not
    decided: those values stay pending."""
    recorder, state.recorder = state.recorder, None  # a trace that failed is not kept anyway
    try:
        for node in sorted(outputs, key=lambda n: n.seq):
            if not node.pending:
                continue
            try:
                _run(state, [node], [], [])
            except MemoryError:
                continue
            except Exception as error:
                node.op, node.srcs, node.arg = FAILED, (), error
    finally:
        state.recorder = recorder


def _run(state: _ThreadState, outputs: list[Node], stores: list, effects: list[Effect]) -> None:
    """Build (or reuse) and run the graph of `outputs`, `stores` and `effects`."""
    order, index, entries = _walk([*outputs, *(value for _, value in stores), *(s for e in effects for s in e.srcs)])
    for node in order:
        if node.op == FAILED:
            raise failure(node) from node.arg
    leaves = [n for n in order if n.op is None]
    here = runtime.get_device()
    for leaf in leaves:  # ensure_on_device, its common case (a live handle here) inlined
        handle = leaf.handle
        if handle is None or not handle.live or handle.device != here:
            ensure_on_device(leaf)
    for target, _ in stores:
        ensure_on_device(target)
    dev = runtime.current()
    key = _signature(entries, index, outputs, stores, effects)
    graph = dev.cached_graph(key)
    fresh = graph is None
    if fresh:
        graph = _build(dev, order, outputs, stores, effects)
        limit = dev.backend.max_graph_nodes
        pending = [n for n in order if n.pending]
        if limit and graph.n_nodes() > limit and len(pending) > 1:
            graph.free()  # too large for the device: run its first half on its own first
            _run(state, _first_half(pending, outputs, stores, effects), [], [])
            return _run(state, [n for n in outputs if n.pending], stores, effects)
    try:
        results = [(node, dev.new_handle(node.shape, node.dtype.storage, _landing(node))) for node in outputs]
        results += [(value, target.handle) for target, value in stores]
        graph.run([leaf.handle for leaf in leaves] + [handle for _, handle in results])
    except BaseException:
        if fresh:
            graph.free()
        raise
    if fresh:
        dev.keep_graph(key, graph)
    if state.recorder is not None:
        state.recorder(Run(dev, key, graph, leaves, outputs, stores, effects))
    for node, handle in results:
        node.op, node.srcs, node.arg, node.handle = None, (), None, handle
        state.pending.discard(weakref.ref(node))
        if handle.scope == "pass":
            state.pass_values.append(weakref.ref(node))


def _first_half(pending: list[Node], outputs: list[Node], stores: list, effects: list[Effect]) -> list[Node]:
    """The nodes of the first half of `pending` (in topological order) that the rest reads."""
    half = len(pending) // 2
    read_later = {id(s) for n in pending[half:] for s in n.srcs}
    read_later.update(id(n) for n in [*outputs, *(v for _, v in stores), *(s for e in effects for s in e.srcs)])
    return [n for n in pending[:half] if id(n) in read_later]


def _settle(effects: list[Effect]) -> None:
    """Each effect's versions become their targets' buffers (which hold the effect's
    result if it ran, the old values if it did not)."""
    for effect in effects:
        for target, version in zip(effect.targets, effect.versions):
            version.op, version.srcs, version.arg, version.handle = None, (), None, target.handle


# A label for the graphs built from here on, part of their reuse key: code that changes how
# nodes are built (a test forcing a path, a benchmark's A/B of one of ggrad's choices) sets
# its own, so it never runs a graph built under other choices. None normally.
BUILD_TAG = None


def _signature(entries: list[tuple], index: dict[Node, int], outputs: list[Node], stores: list,
               effects: list[Effect]) -> tuple:
    """What makes two graphs the same: ops, shapes, dtypes, arguments and wiring (the
    nodes' `entries` and `index` from `_walk`), the kernels they were built to ask for and
    the BUILD_TAG they were built under."""
    return (*entries, tuple([index[n] for n in outputs]), tuple([index[value] for _, value in stores]),
            tuple([(e.op, e.arg, tuple([index[s] for s in e.srcs])) for e in effects]), kernels.choices(), BUILD_TAG)


# The most ggml tensors one builder makes (AdamW over a 3e9-element parameter makes ~1000
# views; everything else a few dozen): a graph with less room left is rebuilt larger.
BUILDER_ROOM = 1024


class _GraphFull(Exception):
    pass


def reserve(ctx, tensors: int) -> None:
    """For a builder that makes more than BUILDER_ROOM tensors (a fold over many kernel
    taps): rebuild the graph larger unless `ctx` holds `tensors` more (ggml aborts past it)."""
    if (G.ggml_get_mem_size(ctx) - G.ggml_used_mem(ctx)) // G.ggml_tensor_overhead() < tensors:
        raise _GraphFull


def _build(dev, order: list[Node], outputs: list[Node], stores: list, effects: list[Effect]) -> Graph:
    """The ggml graph of `order`. Its size is a guess from the node count (builders make
    1 to ~30 ggml tensors each); one that runs short is built again, twice as large."""
    capacity = 8 * len(order) + 2 * BUILDER_ROOM
    while True:
        graph = Graph(dev, max_nodes=capacity, shared_allocator=False)
        try:
            _fill(graph, order, outputs, stores, effects)
            return graph
        except _GraphFull:
            graph.free()
            capacity *= 2
        except BaseException:
            graph.free()
            raise


def build_memo() -> dict | None:
    """A dict that lives while one graph is filled, None otherwise: builders keep ggml
    tensors there that later builders of the same graph may reuse (a weight's cast to
    bfloat16 made once per graph, not once per product that reads it)."""
    return local.memo


def _fill(graph: Graph, order: list[Node], outputs: list[Node], stores: list, effects: list[Effect]) -> None:
    local.memo = memo = {}
    try:
        _fill_nodes(graph, order, outputs, stores, effects)
        for rewrite in GRAPH_PASSES:
            rewrite(graph.graph, memo)
    finally:
        local.memo = None


def _fill_nodes(graph: Graph, order: list[Node], outputs: list[Node], stores: list, effects: list[Effect]) -> None:
    def room(needed: int = BUILDER_ROOM) -> None:
        if graph.room() < needed:
            raise _GraphFull
    built: dict[int, object] = {}
    for node in order:
        room()
        if node.pending:
            built[id(node)] = BUILDERS[node.op](graph.ctx, [built[id(s)] for s in node.srcs], node)
        else:
            built[id(node)] = graph.slot(node.shape, node.dtype.storage)
    values = [*outputs, *(value for _, value in stores)]
    room(3 * len(values) + BUILDER_ROOM)  # a copy-out, a destination and a copy-in each
    for node in values:  # a value still in a buffer (a view, a slot) is copied out first
        built[id(node)] = graph.computed(built[id(node)])
    # 0. a traced step's micro-steps one after another: what each tape started with
    # (gradients so far) comes first, so one micro-step's scratch memory is free for the next
    for tape in local.traced_tapes or ():
        for node in tape:
            if id(node) in built:
                graph.expand(built[id(node)])
    for node in [*values, *(s for e in effects for s in e.srcs)]:
        graph.expand(built[id(node)])  # 1. every computation, reading the old buffers
    destinations = [graph.slot(node.shape, node.dtype.storage) for node in values]
    for effect in effects:  # 2. ops that write their targets in place
        room()
        for node in BUILDERS[effect.op](graph.ctx, [built[id(s)] for s in effect.srcs], effect):
            graph.expand(node)
    for node, destination in zip(values, destinations):  # 3. copies into kept buffers
        graph.write(built[id(node)], destination)


def topological(roots: list, inputs: Callable) -> list:
    """Everything reachable from `roots` through `inputs(x)`, inputs first: depth first,
    inputs in their order. Iterative (a stack of (item, its inputs not yet looked at)),
    so a deep graph cannot hit Python's recursion limit."""
    order: list = []
    seen: set[int] = set()
    for root in roots:
        if id(root) in seen:
            continue
        seen.add(id(root))
        stack = [(root, iter(inputs(root)))]
        while stack:
            item, rest = stack[-1]
            for s in rest:
                if id(s) not in seen:
                    seen.add(id(s))
                    stack.append((s, iter(inputs(s))))
                    break
            else:  # every input placed: place the item
                stack.pop()
                order.append(item)
    return order


def _walk(roots: list[Node]) -> tuple[list[Node], dict[Node, int], list[tuple]]:
    """`topological` over the pending graph under `roots` (written out for nodes: it runs
    at every realize), with each node's position and its signature entry, made as it is
    placed (its inputs are placed before it): (op, shape, dtype, arg, the inputs'
    positions), or (None, shape, dtype) for a leaf. Nodes key the positions themselves
    (they hash by identity): no id() call per visit."""
    order: list[Node] = []
    index: dict[Node, int] = {}  # position; -1 while the node's inputs are walked
    entries: list[tuple] = []
    for root in roots:
        if root in index:
            continue
        index[root] = -1
        stack = [(root, iter(root.srcs if root.op is not None else ()))]
        while stack:
            node, rest = stack[-1]
            for s in rest:
                if s not in index:
                    if s.op is None:  # a leaf is placed at once (half the nodes of a step)
                        index[s] = len(order)
                        order.append(s)
                        entries.append((None, s.shape, s.dtype))
                        continue
                    index[s] = -1
                    stack.append((s, iter(s.srcs)))
                    break
            else:
                stack.pop()
                index[node] = len(order)
                order.append(node)
                entries.append((node.op, node.shape, node.dtype, node.arg, tuple([index[s] for s in node.srcs]))
                               if node.op is not None else (None, node.shape, node.dtype))
    return order, index, entries


def keep_pass_values() -> None:
    """Before this thread's pass pool resets (a new tape): the values computed into it that
    a Tensor still holds (read inside the tape now ending, e.g. a batch prefetched there)
    move to the persistent pool, one device copy for all and no crossing, instead of
    dying with the pass. Their old handles die with it, as the pool's contract says."""
    state = local
    nodes = [ref() for ref in state.pass_values]
    state.pass_values = []
    kept = [n for n in nodes if n is not None and n.owners > 0 and n.op is None and n.handle is not None
            and n.handle.scope == "pass" and n.handle.live]
    if not kept:
        return
    copies = [Node(n.shape, n.dtype, op="cont", srcs=(n,), scope="persistent") for n in kept]
    realize(copies)
    for node, copy in zip(kept, copies):
        node.handle = copy.handle


def _finish_before_release() -> None:
    if has_pending_work():
        realize()


runtime.on_release(_finish_before_release)
