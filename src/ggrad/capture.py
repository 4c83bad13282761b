"""`compile`: capture a training step once, then replay its graph without running its Python.

A step written with ggrad's lazy ops already runs as one kept ggml graph, but Python
still records every op, builds every backward rule and hashes the graph each step:
for a small model that costs more than the graph's compute. ``step = ggrad.compile(fn)``
removes it. A call first runs `fn` for real (a trace) and, when the trace ran exactly
one graph at its end, keeps that graph; later calls with arguments of the same shapes
and dtypes upload the new data into the kept graph's input buffers and run it: one
dispatch, no recording.

What a replay repeats is what the trace did on the device. Python inside `fn` runs only
while tracing, as under ``jax.jit``: its control flow and the Python values it closes
over are frozen into the capture. Library code whose Python state changes per step
(optimizer step counts, the learning rate, train/eval flags) registers here while
tracing: checks that say whether the capture still holds, and the bookkeeping a replay
repeats. Host work between graphs that a replay must repeat (a collective across processes)
goes through `boundary`: the step is then captured as several graphs with that work
between them, replayed in order. What cannot be replayed (a value read on the host while tracing, gradients
left from an earlier call, a tensor computed inside `fn` that outlives it other than
through its return value) is not captured: such a call stays an ordinary one, and the
reason is kept in `Compiled.reason` (and warned about once).
"""

from __future__ import annotations

import functools
import math
import numbers
import warnings
import weakref
from typing import Any, Callable

import numpy as np

from . import autograd, dtypes, lazy, replay, runtime
from .runtime import precision
from .replay import invalidate, keep_flag, on_input, on_replay, refuse, tracing  # noqa: F401  (capture's API too)
from .runtime.critical import critical
from .tensor import Tensor

class _Trace:
    """What a tracing call registered and what it ran."""

    def __init__(self) -> None:
        self.runs: list[lazy.Run] = []  # the closing realize's graphs
        self.final = False  # set just before the closing realize
        self.early = 0  # graphs run before the closing realize, not at a boundary
        self.steps: list[lazy.Run | Callable[[], None]] = []  # boundaries' graphs and host work, in order
        self.at_boundary = False
        self.boundary_downloads = 0  # crossings the host work made (a replay repeats them)
        self.exchanged: set[int] = set()  # ids of the buffers the host work reads and writes
        ambient = precision.snapshot()  # a replay computes products as the trace did
        self.checks: list[Callable[[], bool]] = [lambda: precision.snapshot() == ambient]
        self.flags: dict[tuple[int, str, Any], tuple[Any, str, Any]] = {}  # replay.keep_flag's (object, name, value)
        self.advances: list[Callable[[], None]] = []
        self.input_checks: list[tuple[lazy.Node, tuple[Callable[[np.ndarray], None], tuple[int, int]]]] = []
        self.refusal: str | None = None
        # gradients that tracked optimizers' parameters held when the call began, and their
        # values then (an accumulation replaces a gradient's node, not its buffer)
        self.carried = [p._grad for opt in list(_optimizers) for g in opt.param_groups
                        for p in g["params"] if p._grad is not None]
        self.carried_nodes = [grad.node for grad in self.carried]

    def record(self, run: lazy.Run) -> None:
        """A graph the traced call ran (inside lazy's critical section): taken out of the
        device's reuse cache at once, before another thread's call of the same shape could
        take it and bind it to its own buffers (both captures would then run one graph)."""
        if self.final:
            run.dev.take_graph(run.key, run.graph)
            self.runs.append(run)
        elif self.at_boundary:
            run.dev.take_graph(run.key, run.graph)  # a later graph of the same shape must not reuse it
            self.steps.append(run)
        else:
            self.early += 1

    def boundary_runs(self) -> list[lazy.Run]:
        return [s for s in self.steps if isinstance(s, lazy.Run)]

    def graphs(self) -> list[lazy.Run]:
        return self.boundary_runs() + self.runs

    def give_back(self) -> None:
        """A refused trace: its graphs go back to the device's reuse cache."""
        for run in self.graphs():
            run.dev.held.discard(run.graph)
            if run.dev.cached_graph(run.key) is None:
                run.dev.keep_graph(run.key, run.graph)
            else:
                run.graph.free()


def boundary(nodes: list[lazy.Node], work: Callable[[list], None]) -> None:
    """Run the recorded work (at least `nodes`), then host work on their buffers:
    ``work(handles)``, e.g. a collective across processes that writes them in place.

    While tracing, the graph and the work become steps of the capture, repeated in order
    at every replay with the same buffers: the values computed up to a boundary land in
    persistent memory, which the capture keeps."""
    trace = replay.local.trace
    if trace is None:
        lazy.realize(nodes)
        work([lazy.ensure_on_device(n) for n in nodes])
        return
    state = lazy.local
    scope, state.default_scope = state.default_scope, "persistent"
    trace.at_boundary = True
    try:
        lazy.realize(nodes)
        handles = [lazy.ensure_on_device(n) for n in nodes]
    finally:
        trace.at_boundary = False
        state.default_scope = scope
    step = functools.partial(work, handles)
    trace.exchanged.update(id(h) for h in handles)
    downloads = runtime.transfers()["downloads"]
    step()
    trace.boundary_downloads += runtime.transfers()["downloads"] - downloads
    trace.steps.append(step)


_optimizers: weakref.WeakSet = weakref.WeakSet()


def track(optimizer) -> None:
    """Watch `optimizer`'s parameters' `.grad`: one set before a call (gradients carried
    over from earlier calls, or set by hand) is Python state a replay would not see."""
    _optimizers.add(optimizer)


def optimizers() -> list:
    """The live optimizers (each registers itself when it gets its parameters)."""
    return list(_optimizers)


def carried_over(grad) -> bool:
    """While tracing: whether `grad` was a parameter's gradient before the call began."""
    trace = replay.local.trace
    return trace is not None and any(grad is g for g in trace.carried)


CARRIED_GRADIENT = ("a gradient set before the call (accumulated over calls, e.g. by a micro-step called "
                    "several times per optimizer step, or set by hand) is read or added to: a replay "
                    "would use the buffer of the traced call's .grad, which zero_grad() replaces. "
                    "Accumulate with the optimizer's accumulate_steps=k (opt.step() inside the step), "
                    "or compile the whole iteration")


def _host_read() -> None:
    refuse("the function read a tensor's values on the host (numpy(), item(), float()...); "
           "its Python would not see the values of later calls")


# Backends that keep a graph's launch only while its buffers stay put: ggml-cuda replays a
# CUDA graph while every node's addresses are those of the last run, and runs a changed
# graph kernel by kernel until it is stable again. A replay there binds the same buffers
# every step: a device tensor argument is copied into a buffer of its own (as PyTorch's
# CUDA graphs copy into static inputs), and each result is written into one of two buffers
# of its own, taken in turn, each turn run as a ggml graph of its own (`Graph.compute_twin`:
# one CUDA graph per turn). A loop that holds its last loss while it calls again
# (`loss = step(x, y)`) finds the buffer of the loss before free; a result still held when
# its buffer's turn comes back is moved out first (a device copy, its node pointed at the
# copy). So neither a new batch nor a held loss moves a graph. Up to STABLE_COPY_BYTES a
# value (an H100 copies 16 MiB in ~10 us); a larger one is bound where it lies, as elsewhere.
STABLE_ADDRESS_KINDS = frozenset({"cuda"})
STABLE_COPY_BYTES = 16 << 20
BATCH_ALIGNMENT = 256  # each numpy argument's offset in a capture's batch buffer (and more where the device asks)
MAX_VARIANTS = 8  # kept graphs per argument signature (e.g. one per phase of accumulation)
MAX_SIGNATURES = 16  # argument signatures with kept graphs (static arguments make new ones)
_STATIC = (type(None), bool, numbers.Number, str, bytes)


def _argument_key(value) -> tuple:
    if isinstance(value, Tensor):
        # integer tensors known on the host (indices checked there) and computed on the
        # device (checked on the device: other nodes) trace apart
        on_host = value.node.host is not None if not value.dtype.is_floating_point else None
        return ("tensor", value.shape, value.dtype, value.requires_grad, on_host)
    if isinstance(value, np.ndarray):
        return ("array", value.shape, value.dtype)  # equal with byte order too: '>f2' is not float16 (dtypes.of_numpy)
    if isinstance(value, _STATIC) or (isinstance(value, tuple) and all(isinstance(v, _STATIC) for v in value)):
        return ("static", type(value).__name__, value)
    raise TypeError(f"ggrad.compile: an argument of type {type(value).__name__} cannot be passed; "
                    "pass tensors, numpy arrays, numbers or strings, and reach models and "
                    "optimizers through the function's closure")


def _own_leaf(arg: Tensor) -> Tensor:
    """What a traced function gets for a tensor argument: a leaf of its own over the same
    buffer, so that a replay can point it at the next call's argument without moving a
    read of the same tensor through the closure (or through another argument). A tensor
    that needs a gradient is passed itself (its .grad must reach it)."""
    lazy.ensure_on_device(arg.node)
    if arg.requires_grad:
        return arg
    node = arg.node
    return Tensor._wrap(lazy.Node(node.shape, node.dtype, handle=node.handle, host=node.host, scope=node.scope))


def _flatten(value, out: list[Tensor]) -> Callable[[list], Any]:
    """Collect the tensors of a returned value into `out`; returns how to rebuild it."""
    if value is None:
        return lambda tensors: None
    if isinstance(value, Tensor):
        i = len(out)
        out.append(value)
        return lambda tensors: tensors[i]
    if isinstance(value, (tuple, list)):
        parts = [_flatten(v, out) for v in value]
        kind = type(value)
        return lambda tensors: kind(p(tensors) for p in parts)
    if isinstance(value, dict):
        parts = {k: _flatten(v, out) for k, v in value.items()}
        return lambda tensors: {k: p(tensors) for k, p in parts.items()}
    raise TypeError(f"ggrad.compile: the function returned a {type(value).__name__}; a compiled "
                    "step returns tensors (or tuples, lists and dicts of them) or None")


class _Upload:
    """A numpy argument's way into its buffer at each replay: converted into a host array
    kept for it (the storage form `ggrad.tensor` makes, integers range-checked as it checks
    them) and checked there as the trace checked it, before anything is written. The
    argument's shape and numpy dtype are the traced call's (the capture's key). Integers'
    two extremes serve the int32 check and every index-range check (`replay.on_input`'s
    `passes`) at once, and where every check passes from 0 up, the greatest of the values
    read as unsigned does: a batch of class targets costs one reduction.

    The kept array lies in the capture's host block (`Compiled._staging`), which the
    replay uploads whole after every argument is staged (`_Capture._batch_buffer`)."""

    __slots__ = ("pos", "dtype", "checks", "staged", "unsigned", "below")

    def __init__(self, pos: int, dtype: dtypes.dtype, checks: list, staged: np.ndarray, source: np.dtype) -> None:
        """`source`: the argument's numpy dtype (the same at every replay: the capture's key)."""
        self.pos, self.dtype, self.checks = pos, dtype, checks
        self.staged = staged
        # integers that every check passes from 0 up to `below` (and int32's range with them):
        # one reduction of the values read as unsigned tells it, negatives wrapping to the top
        self.unsigned = self.below = None
        if source.kind in "iu" and source.isnative and all(first == 0 for _, (first, _) in checks):
            self.unsigned = np.dtype(f"u{source.itemsize}")
            self.below = min([end for _, (_, end) in checks] + [dtypes.INT32_MAX + 1])

    def stage(self, value: np.ndarray) -> None:
        if self.unsigned is not None and np.maximum.reduce(value.view(self.unsigned), axis=None, initial=0) < self.below:
            np.copyto(self.staged, value, casting="unsafe")  # every value in range: int32 holds it
            return
        low = high = None
        if value.dtype.kind in "iu" and value.size:
            low, high = np.minimum.reduce(value, axis=None), np.maximum.reduce(value, axis=None)
            dtypes.check_int32_extremes(low, high, self.dtype)
        np.copyto(self.staged, value, casting="unsafe")  # as astype: floats rounded, integers in range
        for check, (first, end) in self.checks:
            if low is None or not first <= low <= high < end:
                check(self.staged)


class _Part:
    """A stretch of a device block, where graph slots can point (Graph.rebind asks for
    `location`): a capture's numpy argument in its batch buffer."""

    __slots__ = ("block", "offset")

    def __init__(self, block, offset: int) -> None:
        self.block, self.offset = block, offset

    def location(self) -> tuple[int, int]:
        buffer, data = self.block.location()
        return buffer, data + self.offset


class _Capture:
    """One traced call's graphs (one, or several with host work between them: `boundary`)
    and how to run them again over new arguments."""

    def __init__(self, trace: _Trace, arrays: dict[int, Tensor], sources: dict[int, np.dtype],
                 tensor_args: dict[int, Tensor], returned: list[Tensor], rebuild,
                 staging: Callable[[int, tuple, np.dtype], np.ndarray]) -> None:
        """`arrays`: the tensors made from numpy arguments, `sources` those arguments' numpy
        dtypes; `tensor_args`: what the function got for tensor arguments (a leaf of their
        own, or the tensor itself if it needs a gradient), by argument position;
        `staging(position, shape, storage)`: the host array a numpy argument is converted
        into at each replay."""
        runs = trace.graphs()
        last = runs[-1]
        self.dev = last.dev
        self.graphs = [run.graph for run in runs]
        self.steps = [s.graph.compute if isinstance(s, lazy.Run) else s for s in [*trace.steps, *trace.runs]]
        flags = list(trace.flags.values())
        values = [value for _, _, value in flags]
        self.checks = [lambda: [getattr(obj, name) for obj, name, _ in flags] == values] if flags else []
        self.checks += trace.checks
        self.advances = trace.advances
        self.rebuild = rebuild
        self.fixed: list[lazy.Node] = []  # leaves read where they are, and values between graphs: kept alive
        self.uploads: list[_Upload] = []
        self.rebinds: list[tuple[Any, int, int]] = []  # (graph, slot, argument): a tensor argument
        self.argument_checks: dict[int, list] = {}  # tensor argument -> checks on its host data
        self.buffers: dict[int, Any] = {}  # argument -> where a tensor argument still on the host goes
        arg_of_node = {id(t.node): pos for pos, t in arrays.items()}
        tensor_arg_of_node = {id(t.node): pos for pos, t in tensor_args.items()}
        checked = {**tensor_arg_of_node, **arg_of_node}
        checks: dict[int, list] = {}
        for node, check in trace.input_checks:
            if id(node) in checked:
                checks.setdefault(checked[id(node)], []).append(check)
        read_at: dict[int, list[tuple[Any, int]]] = {}  # numpy argument -> the (graph, slot)s reading it
        leaves: dict[int, lazy.Node] = {}
        for run in runs:
            for slot, leaf in enumerate(run.leaves):
                if id(leaf) in arg_of_node:
                    pos = arg_of_node[id(leaf)]
                    leaves.setdefault(pos, leaf)  # read by several graphs: one upload
                    read_at.setdefault(pos, []).append((run.graph, slot))
                elif id(leaf) in tensor_arg_of_node:
                    pos = tensor_arg_of_node[id(leaf)]
                    self.rebinds.append((run.graph, slot, pos))
                    self.argument_checks[pos] = checks.get(pos, [])
                elif leaf.handle.scope != "persistent":
                    raise _Refused("the function reads a value computed in an earlier grad tape (pass "
                                   "memory, gone at the next tape); pass it as an argument")
                else:
                    self.fixed.append(leaf)
        self.batch = self._batch_buffer(leaves, read_at, arrays, sources, checks, staging)
        arguments = {id(t.node.handle) for t in [*arrays.values(), *tensor_args.values()]}
        written = {id(t.handle) for run in runs for t, _ in run.stores} | {
            id(t.handle) for run in runs for e in run.effects for t in e.targets}
        if written & arguments:
            raise _Refused("the function writes into one of its arguments in place")
        carried = {id(n.handle) for n in trace.carried_nodes if n.handle is not None}
        if carried & (written | {id(leaf.handle) for run in runs for leaf in run.leaves}):
            raise _Refused(CARRIED_GRADIENT)
        if trace.exchanged & arguments:
            raise _Refused("the function exchanges one of its arguments across processes; a replay "
                           "would exchange the traced call's buffer")
        # values computed before the last graph stay where they are: nothing outside may hold one
        for run in runs[:-1]:
            for node in run.outputs:
                if node.owners:
                    raise _Refused(f"a tensor of shape {node.shape} computed before a collective inside "
                                   "the function is kept outside it; a replay would overwrite it")
                self.fixed.append(node)
        # outputs: each is a returned tensor's value, nothing else may hold it
        self.outputs: list[tuple[int, tuple, dtypes.dtype, list[int]]] = []  # (slot, shape, dtype, returned)
        first = len(last.leaves)
        positions: dict[int, list[int]] = {}
        for i, t in enumerate(returned):
            positions.setdefault(id(t.node), []).append(i)
        for j, node in enumerate(last.outputs):
            where = positions.get(id(node), [])
            if node.owners != len({id(returned[i]) for i in where}):
                raise _Refused(f"a tensor of shape {node.shape} computed inside the function is kept "
                               "outside it (a .grad not cleared by zero_grad(), or a tensor stored on "
                               "an object); return it instead, or clear it before returning")
            self.outputs.append((first + j, node.shape, node.dtype, where))
        # returned tensors computed before the call: the same objects again, except an
        # argument (or a view of one), which is this call's argument
        self.static = [(i, t, checked.get(id(t.node))) for i, t in enumerate(returned)
                       if not any(i in out[3] for out in self.outputs)]
        # each output's last two results: a loop that holds the newest while it calls again
        # (`loss = step(x, y)`) leaves the one before free, whose buffer the next result takes
        self._recent: list[list[lazy.Node]] = [[] for _ in self.outputs]
        self.written: list = []  # `_written`'s pairs of buffers
        self._on_written: list[list] = [[None, None] for _ in self.outputs]  # the last result in each
        self._turn = 0  # which of each pair the last replay wrote
        self.returned_count = len(returned)

    def _batch_buffer(self, leaves: dict, read_at: dict, arrays: dict, sources: dict, checks: dict, staging):
        """The numpy arguments' buffer: one device block holding each at an aligned offset,
        every graph slot that reads one pointed there, so that a replay uploads the whole
        batch in one copy from one host block laid out alike (each upload is a driver call:
        ~5 us of an H100 host's step, and a synchronous copy each where the device waits).
        Returns (device block, host address, bytes), or None without numpy arguments."""
        if not leaves:
            return None
        align = max(BATCH_ALIGNMENT, self.dev.backend.alignment)
        layout, offsets, end = [], [], 0
        for pos, leaf in leaves.items():
            layout.append((pos, leaf.handle.shape, arrays[pos].dtype.storage))
            offsets.append(end)
            end += -(-leaf.handle.nbytes // align) * align
        host, views = staging(tuple(layout), offsets, end)
        block = self.dev.new_handle((end // 4,), np.float32, "persistent")
        for pos, offset, view in zip(leaves, offsets, views):
            self.uploads.append(_Upload(pos, arrays[pos].dtype, checks.get(pos, []), view, sources[pos]))
            part = _Part(block, offset)
            for graph, slot in read_at[pos]:
                graph.rebind(slot, part)
        return block, host.ctypes.data, end

    def matches(self) -> bool:
        """Whether the next call would do what the traced one did (state as before it)."""
        return all(check() for check in self.checks)

    def replay(self, values: list) -> Any:
        for upload in self.uploads:
            upload.stage(values[upload.pos])
        for pos, checks in self.argument_checks.items():
            host = values[pos].node.host  # known on the host: checked as an eager step would
            for check, _ in checks if host is not None else ():
                check(host)
        if self.batch is not None:
            block, address, nbytes = self.batch
            block.write_from(address, nbytes, pageable=True)
        stable = self.dev.backend.info.kind in STABLE_ADDRESS_KINDS
        bound: dict[int, Any] = {}
        for graph, slot, pos in self.rebinds:
            if pos not in bound:
                node = values[pos].node
                if node.handle is None and not node.pending:  # a batch still on the host
                    bound[pos] = self._buffer(pos, node)
                    bound[pos].write(node.host)
                else:
                    source = bound[pos] = lazy.ensure_on_device(node)
                    if stable and not graph.points_at(slot, source) and source.nbytes <= STABLE_COPY_BYTES:
                        bound[pos] = self._buffer(pos, node)
                        bound[pos].copy_from(source)
            graph.rebind(slot, bound[pos])
        returned: list[Tensor | None] = [None] * self.returned_count
        nodes, moved = [], []
        written = self._written() if stable else ()
        turn = 1 - self._turn if any(written) else 0
        for k, (slot, shape, dtype, where) in enumerate(self.outputs):
            pair = written[k] if written else None
            if pair is not None:
                # the graph of this turn writes where it always does; a result the caller
                # still holds there moves out first (a device copy queued before the graph)
                held = self._on_written[k][turn]
                if held is not None and held.owners > 0:
                    spare = self._spare(k, shape, dtype)
                    spare.copy_from(pair[turn])
                    held.handle = spare
                    moved.append((k, held))
                handle = pair[turn]
            else:
                handle = self._spare(k, shape, dtype)
            self.graphs[-1].rebind(slot, handle)
            nodes.append(lazy.Node(shape, dtype, handle=handle, scope="persistent"))
        for advance in self.advances:  # last before the compute: what can fail has run
            advance()
        for step in self.steps[:-1]:
            step()
        if turn:
            self.graphs[-1].compute_twin()
        else:
            self.steps[-1]()
        self._turn = turn
        for k, node in moved:
            self._recent[k] = [node, *self._recent[k][:1]]
        for k, (_, _, _, where) in enumerate(self.outputs):
            pair = written[k] if written else None
            if pair is not None:
                self._on_written[k][turn] = nodes[k]
            else:
                self._recent[k] = [nodes[k], *self._recent[k][:1]]
            for i in where:
                returned[i] = Tensor._wrap(nodes[k])
        self._fill_static(returned, values)
        return self.rebuild(returned)

    def _buffer(self, pos: int, node: lazy.Node):
        """The capture's own buffer for tensor argument `pos` (made once)."""
        buffer = self.buffers.get(pos)
        if buffer is None:
            buffer = self.buffers[pos] = self.dev.new_handle(node.shape, node.dtype.storage, "persistent")
        return buffer

    def _written(self) -> list:
        """Per output, the two buffers the graph writes it into in turn on a
        STABLE_ADDRESS_KINDS backend (made once), or None for an output over
        STABLE_COPY_BYTES (a new buffer each call, as elsewhere)."""
        if not self.written:
            self.written = [None] * len(self.outputs)
            for i, (_, shape, dtype, _) in enumerate(self.outputs):
                if math.prod(shape) * dtype.storage.itemsize <= STABLE_COPY_BYTES:  # as an argument's
                    self.written[i] = tuple(self.dev.new_handle(shape, dtype.storage, "persistent") for _ in "ab")
        return self.written

    def _spare(self, k: int, shape: tuple, dtype: dtypes.dtype):
        """A buffer for output `k`: one of its recent results' that nobody holds, or a new one."""
        recent = self._recent[k]
        free = next((node for node in recent if node.owners == 0 and node.handle.live), None)
        if free is None:
            return self.dev.new_handle(shape, dtype.storage, "persistent")
        recent.remove(free)
        return free.handle

    def _fill_static(self, returned: list, values: list) -> None:
        for i, t, pos in self.static:
            value = t if pos is None else values[pos]
            returned[i] = value if isinstance(value, Tensor) else Tensor(value)

    def traced_result(self, returned: list[Tensor], values: list, result):
        """The traced call's own result, with an argument returned as the argument (the
        function saw a leaf of its own, whose buffer the next replays write)."""
        if all(pos is None for _, _, pos in self.static):
            return result
        returned = list(returned)
        self._fill_static(returned, values)
        return self.rebuild(returned)

    def free(self) -> None:
        if not self.dev.released:
            for graph in self.graphs:
                graph.free()
        self.graphs = []
        self.steps = []
        self.buffers.clear()
        self.written = []
        self._on_written = [[None, None] for _ in self.outputs]


class _Refused(Exception):
    pass


class Compiled:
    """A step function that is traced once per argument signature and then replayed."""

    def __init__(self, fn: Callable, warn: bool = True) -> None:
        """`warn`: say once when calls keep failing to be captured (library code that
        falls back on its own passes False)."""
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.reason: str | None = None  # why the last trace was not captured
        self.traces = 0  # calls that ran the function's Python (the rest were replays)
        self._captures: dict[tuple, list[_Capture]] = {}  # per signature, newest first
        self._epoch = replay.epoch()
        self._dev = None  # the device the kept graphs belong to
        self._staged: dict[tuple, tuple] = {}  # `_staging`'s host blocks and arrays
        self._failures = 0
        self._warned = not warn
        _compiled.add(self)

    @property
    def captured(self) -> int:
        """How many kept graphs this function has (one per signature and state variant)."""
        return sum(len(c) for c in self._captures.values())

    def __call__(self, *args, **kwargs):
        if autograd.is_recording():
            raise RuntimeError("ggrad.compile: a compiled function was called inside a grad_tape; "
                               "its replays record nothing, so put the tape inside the function")
        names = sorted(kwargs) if kwargs else []
        values = [*args, *map(kwargs.__getitem__, names)]
        key = (len(args), tuple(names), tuple(map(_argument_key, values)))
        if self._epoch != replay.epoch() or (self._captures and self._dev is not runtime.current()):
            self.release()
        if lazy.has_pending_work():  # work recorded outside runs first, as a grad tape would
            lazy.realize()
        with critical():  # a replay's bookkeeping and its graph happen together or not at all
            for capture in self._captures.get(key, ()):
                if capture.matches():
                    return capture.replay(values)
        return self._trace(key, values, len(args), names)

    def _trace(self, key: tuple, values: list, positional: int, names: list[str]):
        if replay.local.trace is not None:
            raise RuntimeError("ggrad.compile: a compiled function was called from inside another "
                               "compiled function while that one was being traced; compile the "
                               "outer function only")
        self.traces += 1
        arrays = {i: Tensor(v) for i, v in enumerate(values) if isinstance(v, np.ndarray)}
        tensor_args = {i: _own_leaf(v) for i, v in enumerate(values) if isinstance(v, Tensor)}
        call = [arrays.get(i, tensor_args.get(i, v)) for i, v in enumerate(values)]
        trace = replay.local.trace = _Trace()
        state = lazy.local
        previous, state.recorder = state.recorder, trace.record
        state.host_read_hook = _host_read
        state.traced_tapes = []
        downloads = runtime.transfers()["downloads"]
        try:
            result = self.fn(*call[:positional], **dict(zip(names, call[positional:])))
            returned: list[Tensor] = []
            rebuild = _flatten(result, returned)
            if trace.steps:  # a value computed before a boundary is returned as a copy made by the last graph
                between = {id(n) for run in trace.boundary_runs() for n in run.outputs}
                returned = [t.detach().clone() if id(t.node) in between else t for t in returned]
                result = rebuild(returned)
            trace.final = True
            lazy.realize([t.node for t in returned])
        except BaseException:
            trace.give_back()
            raise
        finally:
            replay.local.trace = None
            state.recorder = previous
            state.host_read_hook = None
            state.traced_tapes = None
        try:
            if trace.refusal:
                raise _Refused(trace.refusal)
            if trace.early or runtime.transfers()["downloads"] - trace.boundary_downloads != downloads:
                raise _Refused("the function ran device work before its end (it read a value, or "
                               "entered a grad tape with work pending)")
            if not trace.runs:
                raise _Refused("the function did no device work")
            if len(trace.runs) > 1:
                raise _Refused("the function's last graph was too large for the device and ran in parts")
            sources = {i: v.dtype for i, v in enumerate(values) if isinstance(v, np.ndarray)}
            capture = _Capture(trace, arrays, sources, tensor_args, returned, rebuild, self._staging)
        except _Refused as why:
            trace.give_back()
            self._refused(str(why))
            return result
        run = trace.runs[0]
        if key not in self._captures and len(self._captures) >= MAX_SIGNATURES:
            for old in self._captures.pop(next(iter(self._captures))):  # the oldest signature
                old.free()
        variants = self._captures.setdefault(key, [])
        variants.insert(0, capture)
        for old in variants[MAX_VARIANTS:]:
            old.free()
        del variants[MAX_VARIANTS:]
        self._dev = run.dev
        self.reason = None
        self._failures = 0
        return capture.traced_result(returned, values, result)

    def op_counts(self) -> dict[str, int]:
        """The ggml ops its kept graphs compute, counted per op name (views left out):
        what one replay launches. Empty before the first capture."""
        counts: dict[str, int] = {}
        for variants in self._captures.values():
            for capture in variants:
                for graph in capture.graphs:
                    for name, n in graph.op_counts().items():
                        counts[name] = counts.get(name, 0) + n
        return counts

    def _refused(self, reason: str) -> None:
        self.reason = reason
        self._failures += 1
        if self._failures >= 3 and not self._warned:
            self._warned = True
            warnings.warn(f"ggrad.compile({getattr(self.fn, '__name__', 'fn')}): not captured in "
                          f"{self._failures} calls, which ran as ordinary steps (later calls try again): "
                          f"{reason}", RuntimeWarning, stacklevel=4)

    def _staging(self, layout: tuple, offsets: list[int], nbytes: int) -> tuple[np.ndarray, list[np.ndarray]]:
        """The host block a capture's numpy arguments are converted into at each replay
        (`layout`: each one's position, shape and storage type; `offsets`: where each
        starts), and each one's array in it: one for every capture with that layout
        (replays run one at a time). numpy's own memory, so CUDA may queue its upload."""
        key = (layout, tuple(offsets), nbytes)
        if key not in self._staged:
            host = np.empty(nbytes, np.uint8)
            self._staged[key] = (host, [host[start:start + math.prod(shape) * storage.itemsize].view(storage).reshape(shape)
                                        for (_, shape, storage), start in zip(layout, offsets)])
        return self._staged[key]

    def release(self) -> None:
        """Drop every kept graph (the next call traces again)."""
        for variants in self._captures.values():
            for capture in variants:
                capture.free()
        self._captures.clear()
        self._staged.clear()
        self._epoch = replay.epoch()


_compiled: weakref.WeakSet[Compiled] = weakref.WeakSet()


def _release_all() -> None:
    for compiled in list(_compiled):
        compiled.release()


runtime.on_release(_release_all)


# Types ggrad.compile returns as they are: nn.Module registers itself (a model's forward
# runs inside a step's grad tape; the step is what ggrad captures).
RETURNED_AS_IS: list[type] = []


def compile(fn: Callable) -> Compiled:
    """Capture `fn` (a training or evaluation step) on its first calls and replay it after.

    ``fn``'s arguments are tensors, numpy arrays (the batch: uploaded into the kept graph's
    input buffers at each call) and static numbers or strings (part of the signature);
    models and optimizers are reached through its closure. It returns tensors or None.

    A model (``model = ggrad.compile(model)``, as ported torch.compile calls read) is
    returned as it is: ggrad captures the whole step, so compile the function that runs
    the forward, backward and optimizer step instead.
    """
    if isinstance(fn, tuple(RETURNED_AS_IS)):
        return fn
    if not callable(fn):
        raise TypeError(f"ggrad.compile needs a function, got {type(fn).__name__}")
    return Compiled(fn)
