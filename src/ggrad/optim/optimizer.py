"""`Optimizer`: parameter groups, state, accumulation and the step loop.

A new update rule is a subclass with two methods (docs/coming_from_pytorch.md has one):

- ``_init_state(self, p, group) -> list[Tensor]``: make p's state tensors on the device
  (``self._zero_state(p, keys)`` for zeros, or ``device_zeros_like(p)`` into
  ``self.state.setdefault(p, {"step": 0})``), return them;
- ``_update(self, p, g, lr, group, state) -> None``: p's new value and new state from the
  gradient `g` and the group's learning rate `lr` (a (1,) tensor on the device), written
  in place with ``store(target, value)``. ``state["step"]`` already counts this step.

Nothing is read back, so a step adds nodes to the pending graph and costs no crossing:
the learning rate lives on the device (uploaded only when it changes) and so does
every piece of state, bias-correction powers included.
"""

from __future__ import annotations

import functools
import itertools
import math
import numbers
import operator
import warnings
from typing import Any, Callable

import numpy as np

from .. import autograd, capture, dtypes, lazy, replay
from .. import functional as F
from ..runtime.critical import critical
from ..tensor import Tensor, realize, zeros_like


def _check_positive(name: str, value: float, allow_zero: bool = True) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number, got {value!r}") from None
    if math.isnan(value) or value < 0 or (value == 0 and not allow_zero) or math.isinf(value):
        raise ValueError(f"Invalid {name}: {value}")
    return value


def device_zeros_like(p: Tensor) -> Tensor:
    """Zeros made on the device (no upload), kept in the persistent pool."""
    z = zeros_like(p)
    z.node.scope = "persistent"
    return z


def device_scalar(value: float) -> Tensor:
    """A (1,) float tensor in the persistent pool (one 4-byte upload on first use)."""
    return Tensor(np.array([value], dtype=np.float32))


def resident_scalar(value: float) -> Tensor:
    """A (1,) float tensor on the device from the start: resident, and written in place."""
    t = device_scalar(value)
    lazy.ensure_on_device(t.node)
    return t


def float32(t: Tensor | None) -> Tensor | None:
    """`t` in float32 (None stays None). A half-precision parameter's update is computed
    from float32 copies of it, its gradient and its state, and rounded once when written
    back (`store`): torch's fused CPU kernels load half values as float, compute, and
    store each result once; rounding every intermediate op to half would lose the small
    updates."""
    return None if t is None else F.cast(t, dtypes.float32)


def count_group_step(shared: dict) -> None:
    """A replayed step's advance of a group's host step count (capture.on_replay), with its
    parameters' counts (`Optimizer._advance` says when those move `_edits`)."""
    dict.__setitem__(shared, "step", shared["step"] + 1)


class _KeptStep:
    """An optimizer's step kept as a graph (capture.Compiled over `Optimizer._step_over`),
    and when to try it: after k refused traces (state made inside the first steps, RAdam's
    unrectified start) or runs of TRACES_IN_A_ROW traces that no replay used (the parameters
    with gradients change from step to step), the next 2^k steps are recorded without
    trying; state replaced since (a new capture epoch) starts afresh."""

    TRACES_IN_A_ROW = 3  # accumulation's micro-steps and applying steps are two variants

    def __init__(self, fn: Callable) -> None:
        self.compiled = capture.Compiled(fn, warn=False)
        self.backoffs = self.wait = self.traces_in_a_row = 0
        self.epoch = replay.epoch()

    def ready(self) -> bool:
        if self.epoch != replay.epoch():
            self.backoffs = self.wait = self.traces_in_a_row = 0
            self.epoch = replay.epoch()
        if self.wait:
            self.wait -= 1
            return False
        return True

    def run(self, *args) -> None:
        traces = self.compiled.traces
        self.compiled(*args)
        if self.compiled.traces == traces:  # a replay
            self.traces_in_a_row = 0
            return
        self.traces_in_a_row += 1
        if self.compiled.reason is not None or self.traces_in_a_row >= self.TRACES_IN_A_ROW:
            self.traces_in_a_row = 0
            self.backoffs += 1
            self.wait = 2 ** min(self.backoffs, 10)


_STEP = operator.itemgetter("step")
_REQUIRES_GRAD = operator.attrgetter("requires_grad")


_edits = 0  # moved by every change to a _Watched dict or _WatchedList


def _moved() -> None:
    global _edits
    _edits += 1


def _moving(method):
    """`method` of dict or list, moving `_edits` first."""
    def moving(self, *args, **kwargs):
        _moved()
        return method(self, *args, **kwargs)
    moving.__name__ = method.__name__
    return moving


class _Watched(dict):
    """One of an optimizer's own dicts (the state table, a parameter's or a group's state)
    whose every change moves `_edits`: a replayed step checks again what its graph baked in
    from them only after something changed one (`Optimizer._replayable`). A dict that is
    not one (a subclass's, a user's) is checked at every replay, as before."""

    __slots__ = ()

    __setitem__ = _moving(dict.__setitem__)
    __delitem__ = _moving(dict.__delitem__)
    __ior__ = _moving(dict.__ior__)
    update = _moving(dict.update)
    pop = _moving(dict.pop)
    popitem = _moving(dict.popitem)
    clear = _moving(dict.clear)

    def setdefault(self, key, default=None):
        """A new plain dict stored here is made a watched one (`self.state.setdefault(p,
        {"step": 0})` makes a watched state)."""
        if key not in self:
            self[key] = _Watched(default) if type(default) is dict else default
        return dict.__getitem__(self, key)


class _WatchedGroup(_Watched):
    """A parameter group: its "lr" is read on the device at every step (`_lr_tensor`), so
    a new one (a scheduler's) moves nothing."""

    __slots__ = ()

    def __setitem__(self, key, value) -> None:
        if key != "lr":
            _moved()
        dict.__setitem__(self, key, value)


class _WatchedList(list):
    """One of an optimizer's own lists (its groups, a group's parameters, its group states):
    every change moves `_edits`, as a _Watched dict's."""

    __slots__ = ()

    __setitem__ = _moving(list.__setitem__)
    __delitem__ = _moving(list.__delitem__)
    __iadd__ = _moving(list.__iadd__)
    __imul__ = _moving(list.__imul__)
    append = _moving(list.append)
    extend = _moving(list.extend)
    insert = _moving(list.insert)
    pop = _moving(list.pop)
    remove = _moving(list.remove)
    clear = _moving(list.clear)
    reverse = _moving(list.reverse)
    sort = _moving(list.sort)


def _same_objects(a: list, b: list) -> bool:
    """Whether two `Optimizer._bindings` lists hold the same objects, in order."""
    return len(a) == len(b) and all(map(operator.is_, a, b))


def _count_writes(writes: list[tuple[Tensor, int]]) -> None:
    """A replayed step's in-place writes, counted as the recorded step counted them."""
    for t, count in writes:
        t._version += count


def store(target: Tensor, value: Tensor) -> None:
    """Write `value` into `target` in place, rounded once to `target`'s dtype."""
    target._assign(F.cast(value, target.dtype))


def _index(key, count: int) -> int:
    """A saved state's parameter index, checked."""
    try:
        index = int(key)
    except (TypeError, ValueError):
        raise ValueError(f"optimizer state is keyed by parameter index, got {key!r}") from None
    if index != key and str(index) != key or not 0 <= index < count:
        raise ValueError(f"optimizer state for parameter {key!r}: the optimizer has {count} parameters")
    return index


def _checked_step(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{what} must be a count of steps (an int >= 0), got {value!r}")
    return int(value)


def _checked_array(value, shape: tuple[int, ...], what: str) -> np.ndarray:
    """`value` as float32 when it is a floating-point array of `shape`."""
    if not (isinstance(value, np.ndarray) and _floating(value.dtype)):
        raise ValueError(f"{what} must be a floating-point array, got {type(value).__name__}"
                         f"{' of ' + str(value.dtype) if isinstance(value, np.ndarray) else ''}")
    if value.shape != tuple(shape):
        raise ValueError(f"{what} has shape {value.shape}, expected {tuple(shape)}")
    return value.astype(np.float32)


def _floating(host: np.dtype) -> bool:
    try:
        return dtypes.of_numpy(host).is_floating_point
    except TypeError:
        return False


class Optimizer:
    """Base class: validates, groups parameters, keeps state, runs the step loop."""

    # What load_state_dict checks each entry against: per-parameter state of shape (1,)
    # (every other array has its parameter's shape) and the group-shared arrays' shapes.
    scalar_state: tuple[str, ...] = ()
    group_state_shapes: dict[str, tuple[int, ...]] = {}
    # group-shared buffers each step writes before it reads them: not saved, made when missing
    scratch_group_state: tuple[str, ...] = ()

    def __init__(self, params, defaults: dict, accumulate_steps: int = 1, average: bool = True) -> None:
        if not isinstance(accumulate_steps, int) or isinstance(accumulate_steps, bool) or accumulate_steps < 1:
            raise ValueError(f"Invalid accumulate_steps: {accumulate_steps!r} (a positive int)")
        self.defaults = dict(defaults)
        self.accumulate_steps = accumulate_steps
        self.average = bool(average)
        self.param_groups: list[dict[str, Any]] = _WatchedList()
        self.state: dict[Tensor, dict[str, Any]] = _Watched()
        self.group_state: list[dict[str, Any]] = _WatchedList()  # state shared by a group's parameters
        self._micro_steps = 0
        self.in_place = True  # False while a guarded step runs (guard.out_of_place)
        self._lr_tensors: list[tuple[Tensor, float]] = []
        for group in self._groups(params):
            self.add_param_group(group)

    # ---- parameters ------------------------------------------------------------------
    @staticmethod
    def _groups(params) -> list[dict]:
        if isinstance(params, Tensor):
            raise TypeError("params must be an iterable of tensors (or dicts of groups), not one tensor")
        if isinstance(params, dict):
            params = list(params.values())
        params = list(params)
        if not params:
            raise ValueError("optimizer got an empty parameter list")
        if all(isinstance(g, dict) for g in params):
            return [dict(g) for g in params]
        return [{"params": params}]

    def add_param_group(self, group: dict) -> None:
        """Add a group, as PyTorch's: a parameter already in another group is an error; one
        listed twice in this group is kept once, with a warning (PyTorch warns and keeps
        both, updating it twice per step)."""
        params = group.get("params")
        if isinstance(params, Tensor):
            params = [params]
        if isinstance(params, dict):
            params = list(params.values())
        elsewhere = {id(p) for g in self.param_groups for p in g["params"]}
        kept: list[Tensor] = []
        for p in params or ():
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer params must be ggrad Tensors, got {type(p).__name__}")
            if not p.requires_grad:
                raise ValueError(f"optimizer got a tensor of shape {p.shape} that does not require grad")
            if id(p) in elsewhere:
                raise ValueError("some parameters appear in more than one parameter group")
            if any(p is q for q in kept):
                warnings.warn("optimizer contains a parameter group with duplicate parameters; "
                              "each is kept once", UserWarning, stacklevel=3)
                continue
            kept.append(p)
        full = _WatchedGroup({**self.defaults, **{k: v for k, v in group.items() if k != "params"},
                              "params": _WatchedList(kept)})
        self._validate(full)
        lr = resident_scalar(full["lr"])
        self.param_groups.append(full)
        self.group_state.append(_Watched())
        self._lr_tensors.append((lr, float(full["lr"])))
        made = self._make(len(self.param_groups) - 1, full)
        if made:
            realize(*made)
        capture.invalidate()  # a kept step graph does not update the new group
        capture.track(self)

    def _parameters(self) -> list[Tensor]:
        """Every group's parameters, in order (a saved state's indices count them so)."""
        return [p for group in self.param_groups for p in group["params"]]

    def make_state(self) -> None:
        """Make now whatever state the next step would make for its groups and parameters
        (a guarded step must not make state: optim/guard.py)."""
        made = [t for index, group in enumerate(self.param_groups) for t in self._make(index, group)]
        if made:
            realize(*made)
            capture.invalidate()

    def _make(self, index: int, group: dict) -> list[Tensor]:
        """The state group `index` and its parameters lack, made (not yet run)."""
        return self._init_group(index, group) + [t for p in group["params"] for t in self._init_state(p, group)]

    def _init_group(self, index: int, group: dict) -> list[Tensor]:
        """State shared by group `index` that an optimizer makes when the group is added;
        returns the tensors made. The base class makes none."""
        return []

    def _steps_taken(self, group: dict) -> int:
        """The most steps any of the group's parameters has taken (a group state made after
        a load starts there)."""
        return max((self.state[p]["step"] for p in group["params"] if p in self.state), default=0)

    def _init_state(self, p: Tensor, group: dict) -> list[Tensor]:
        """State an optimizer makes for `p` when it is added (PyTorch makes it at the first
        step; here it is made at once, on the device, so the optimizer is resident from the
        start); returns the tensors made. The base class makes none."""
        return []

    def _zero_state(self, p: Tensor, keys) -> list[Tensor]:
        """Zeros like `p` on the device for each of `keys` p's state lacks, stored there
        (the state made if needed); returns those made (what `_init_state` returns)."""
        state = self.state.setdefault(p, {"step": 0})
        made = {key: device_zeros_like(p) for key in keys if key not in state}
        state.update(made)
        return list(made.values())

    def _validate(self, group: dict) -> None:
        _check_positive("learning rate", group["lr"])
        _check_positive("weight_decay", group.get("weight_decay", 0.0))

    # ---- the learning rate -------------------------------------------------------------
    @property
    def lr(self) -> float:
        return self.param_groups[0]["lr"]

    @lr.setter
    def lr(self, value: float) -> None:
        value = _check_positive("learning rate", value)
        for group in self.param_groups:
            group["lr"] = value

    def _lr_tensor(self, index: int) -> Tensor:
        """The group's learning rate on the device; re-uploaded only when it changed."""
        tensor, uploaded = self._lr_tensors[index]
        wanted = float(self.param_groups[index]["lr"])
        if wanted != uploaded:
            _check_positive("learning rate", wanted)
            if not tensor._write_now(np.array([wanted], dtype=np.float32)):
                capture.refuse("the learning rate changed while recorded work still read the old one")
                tensor.assign_(np.array([wanted], dtype=np.float32))
            self._lr_tensors[index] = (tensor, wanted)
        return tensor

    # ---- the step -----------------------------------------------------------------------
    def step(self) -> None:
        """Add `.grad` into the accumulator; every `accumulate_steps`-th call, update.
        A step is recorded whole or not at all: a Ctrl-C inside it is raised after it.

        A step over gradients already computed, with nothing else recorded (after a
        collective averaged them, or a value was read), is not recorded again each time:
        it runs at once as its kept graph (`_kept_step`), the same update without the
        Python that records it."""
        with critical():
            params = self._kept_step_params()
            if params is None:
                self._step()
            else:
                self._run_kept_step(params)

    # A step's kept graph (_KeptStep over `_step_over`), made at the first step; False where the
    # class is not ggrad's own: a subclass written elsewhere may compute from Python state (a
    # host bias correction) that a replay would freeze, so its steps are recorded.
    _kept_step: Any = None

    def _kept_step_params(self) -> list[Tensor] | None:
        """Every parameter, when this step can run as its kept graph: nothing recorded is
        pending (the step would otherwise join that graph, one dispatch), each gradient is
        a computed value, the step writes in place, nothing is being traced or taped, and
        the kept step is not backing off."""
        kept = self._kept_step
        if kept is None:
            kept = self._kept_step = _KeptStep(self._step_over) if type(self).__module__.startswith("ggrad.") else False
        if kept is False or not self.in_place or replay.tracing() or autograd.is_recording():
            return None
        params = self._parameters()
        # pending gradients first: the common case, and cheap (has_pending_work looks at every pending node)
        if any(p._grad is not None and p._grad.node.op is not None for p in params) or lazy.has_pending_work():
            return None
        return params if kept.ready() else None

    def _run_kept_step(self, params: list[Tensor]) -> None:
        """Replay the step's kept graph over this call's gradients (trace it if none fits)."""
        which = tuple([i for i, p in enumerate(params) if p._grad is not None])
        grads = [params[i]._grad for i in which]
        for i in which:  # passed as arguments: a gradient held before the call is not one the trace may keep
            params[i]._grad = None
        try:
            self._kept_step.run(which, *grads)
        finally:
            for i, g in zip(which, grads):
                params[i]._grad = g

    def _step_over(self, which: tuple[int, ...], *grads: Tensor) -> None:
        """`_kept_step`'s function: the step with the given parameters' gradients. A replay
        repeats the trace's in-place version counts (autograd checks them)."""
        params = self._parameters()
        for i, g in zip(which, grads):
            params[i]._grad = g
        written = params + self._state_tensors()
        before, bound = [t._version for t in written], self._bindings()
        self._step()
        after = self._bindings()
        if not _same_objects(after, bound):
            capture.refuse("the step made or replaced state (its first step, or bias corrections remade from "
                           "host values when the betas change)")
        changed = [(t, t._version - version) for t, version in zip(written, before) if t._version != version]
        capture.on_replay(advance=functools.partial(_count_writes, changed))

    def _step(self) -> None:
        self._micro_steps += 1
        apply = self._micro_steps % self.accumulate_steps == 0
        k = self.accumulate_steps
        stepped: list[dict] = []  # states whose step count advanced
        updated: list[int] = []  # groups updated
        with autograd.no_grad():
            for index, group in enumerate(self.param_groups):
                items = []
                for p in group["params"]:
                    accumulated = "accumulator" in self.state.get(p, {})
                    if p.grad is None and not (apply and accumulated):
                        continue  # no gradient now, and none accumulated to apply
                    if p.grad is not None and capture.carried_over(p.grad):
                        capture.refuse("a gradient set before the call (accumulated over calls, or "
                                       "by hand) is read; accumulate with accumulate_steps=k, or "
                                       "call zero_grad() inside the step")
                    state = self.state.setdefault(p, {"step": 0})
                    if k > 1 and "accumulator" not in state:
                        state["accumulator"] = device_zeros_like(p)
                    if not apply:
                        state["accumulator"] += p.grad
                        continue
                    g = p.grad
                    if k > 1:
                        acc = state["accumulator"]
                        g = acc.detach() if g is None else acc + g  # detach: a view of this value, kept when acc is cleared
                        g = g * (1.0 / k) if self.average else g
                        acc.zero_()
                    state["step"] += 1
                    items.append((p, g, state))
                if items:
                    stepped += [state for _, _, state in items]
                    updated.append(index)
                    self._update_group(index, group, items, self._lr_tensor(index))
        if capture.tracing():
            capture.on_replay(functools.partial(self._replayable, apply, self._hyperparameters(), stepped, updated,
                                                self._step_counts(stepped, updated), self._bindings(), []),
                              functools.partial(self._advance, stepped, updated, not stepped or (
                                                len(stepped) == len(self.state) and len(updated) == len(self.param_groups))))

    # ---- gradient accumulation seen from outside (DistributedDataParallel) ---------------
    @property
    def next_step_applies(self) -> bool:
        """Whether the next `step()` updates the parameters (with accumulate_steps=k, every
        k-th does; the others only add `.grad` into the accumulator)."""
        return (self._micro_steps + 1) % self.accumulate_steps == 0

    def merge_accumulated(self, params: list[Tensor]) -> None:
        """Move what the accumulator holds for `params` into their `.grad` (the accumulator
        is cleared): a reducer that averages gradients across processes calls it before
        the step that applies them, and then averages the whole sum once."""
        with autograd.no_grad():
            for p in params:
                acc = self.state.get(p, {}).get("accumulator")
                if acc is None:
                    continue
                p.grad = acc.detach() if p.grad is None else acc + p.grad  # detach: kept when acc is cleared
                acc.zero_()

    # ---- replaying a captured step (ggrad.compile) ---------------------------------------
    def _hyperparameters(self) -> list:
        """What a step graph bakes in: the groups' settings but the lr (read on the device),
        which parameters train, and how gradients are accumulated (which parameters hold an
        accumulated gradient, applied even without a new one, `_bindings` tells). Built of
        C-level copies and maps: a replay compares it every step."""
        return [(self.accumulate_steps, self.average)] + [
            ({**g, "params": None, "lr": None}, [*map(_REQUIRES_GRAD, g["params"])]) for g in self.param_groups]

    def _bindings(self) -> list:
        """What a step graph reads and writes, by identity: the state table, each group's
        parameters, each state dict and each state tensor (whose buffer an in-place write
        keeps). A table, a parameter or a tensor replaced by hand (`opt.state = {}`, a new
        momentum buffer) is read from where the kept graph does not look."""
        entries = [*self.state.values(), *self.group_state]
        return [self.state, *itertools.chain.from_iterable([g["params"] for g in self.param_groups]), *entries,
                *[value for entry in entries for value in entry.values() if isinstance(value, Tensor)]]

    def _step_counts(self, stepped: list[dict], updated: list[int]) -> list[int]:
        """The step counts of the stepped parameters and their groups."""
        base = stepped[0]["step"] if stepped else 0
        return [*map(_STEP, stepped), *[self.group_state[i].get("step", base) for i in updated]]

    def _parameters_watched(self) -> list[Tensor] | None:
        """Every parameter, where every container a step reads is one of this optimizer's
        watched ones (so none changes without moving `_edits`); None where one is not (a
        subclass's, a user's)."""
        groups = self.param_groups
        if type(self.state) is not _Watched or type(groups) is not _WatchedList \
                or type(self.group_state) is not _WatchedList \
                or not all(type(g) is _WatchedGroup and type(g["params"]) is _WatchedList for g in groups) \
                or not all(type(d) is _Watched for d in itertools.chain(self.state.values(), self.group_state)):
            return None
        return [p for g in groups for p in g["params"]]

    def _replayable(self, apply: bool, hyperparameters: list, stepped: list[dict], updated: list[int],
                    counts: list[int], bindings: list, seen: list) -> bool:
        """Whether the next step does what the captured one did, over the same tensors. The
        step counts may have moved on since the trace, but together: a parameter that
        skipped steps (no gradient in an eager step) has bias corrections of its own, which
        a replay of shared ones would not give it. `seen` holds `_edits`, the state table,
        group list and group-state list, the parameters and which train, as this check last
        passed over watched containers only (`_parameters_watched`): until one of them
        changes (the counts too: `_advance`), what they hold is as it was then, and only
        the rest is compared."""
        if self.next_step_applies != apply or (self.accumulate_steps, self.average) != hyperparameters[0]:
            return False
        if seen and seen[0] == _edits and self.state is seen[1] and self.param_groups is seen[2] \
                and self.group_state is seen[3] and [*map(_REQUIRES_GRAD, seen[4])] == seen[5]:
            return True
        if self._hyperparameters() != hyperparameters or not _same_objects(self._bindings(), bindings) \
                or len(set(map(operator.sub, self._step_counts(stepped, updated), counts))) > 1:
            return False
        params = self._parameters_watched()
        seen[:] = [] if params is None else [_edits, self.state, self.param_groups, self.group_state, params,
                                             [*map(_REQUIRES_GRAD, params)]]
        return True

    def _advance(self, stepped: list[dict], updated: list[int], every: bool) -> None:
        """A replayed step's bookkeeping: the counts, and the lr uploaded if it changed. A
        step over `every` state and group moves every count together, which leaves every
        kept step's counts as far apart as they were (as does one that moves none, an
        accumulating micro-step): no _Watched dict moves. One over some moves `_edits`:
        the next replay of each compares the counts again."""
        self._micro_steps += 1
        for state in stepped:
            dict.__setitem__(state, "step", state["step"] + 1)
        if not every:
            _moved()
        for index in updated:
            self._lr_tensor(index)

    def _update_group(self, index: int, group: dict, items: list, lr: Tensor) -> None:
        """Update every (param, gradient, state) of a group; by default one by one."""
        for p, g, state in items:
            self._update(p, g, lr, group, state)

    def _update(self, p: Tensor, g: Tensor, lr: Tensor, group: dict, state: dict) -> None:
        raise NotImplementedError

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none or p.grad is None:
                    p.grad = None
                else:
                    with autograd.no_grad():
                        p.grad.zero_()

    # ---- where the state lives ----------------------------------------------------------
    def _state_tensors(self) -> list[Tensor]:
        states = [*self.state.values(), *self.group_state]
        return [v for s in states for v in s.values() if isinstance(v, Tensor)]

    @property
    def resident(self) -> bool:
        """True when every piece of state is on the current device, live, persistent."""
        from .. import runtime
        tensors = self._state_tensors() + [t for t, _ in self._lr_tensors]
        if not tensors:
            return False
        for t in tensors:
            node = t.node
            if node.pending:
                if node.scope != "persistent":
                    return False
                continue
            h = node.handle
            if h is None or not h.live or h.scope != "persistent" or h.device != runtime.get_device():
                return False
        return True

    # ---- saving ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Host copies of every state tensor, the step counts and the hyperparameters."""
        index = {id(p): i for i, p in enumerate(self._parameters())}
        state = {}
        for p, s in self.state.items():
            state[index[id(p)]] = {k: (v.numpy() if isinstance(v, Tensor) else v) for k, v in s.items()}
        groups = [{k: v for k, v in g.items() if k != "params"} | {"params": [index[id(p)] for p in g["params"]]}
                  for g in self.param_groups]
        shared = [{k: (v.numpy() if isinstance(v, Tensor) else v) for k, v in s.items()
                   if k not in self.scratch_group_state} for s in self.group_state]
        return {"state": state, "param_groups": groups, "group_state": shared, "micro_steps": self._micro_steps}

    def load_state_dict(self, state_dict: dict) -> None:
        """Load what `state_dict()` saved. Every entry is checked against the parameter or
        group it belongs to before anything changes (a moment of the wrong shape, or a
        shared array of the wrong size, would reach a ggml assert at the next step).
        Moments take their parameter's dtype, as torch's do."""
        settings, states, shared = self._checked_state_dict(state_dict)
        params = self._parameters()
        self.state = _Watched()
        for i, s in states.items():
            p = params[i]
            self.state[p] = _Watched({k: (v if k == "step" else Tensor(v, dtype=None if k in self.scalar_state else p.dtype))
                                      for k, v in s.items()})
        for group, saved in zip(self.param_groups, settings):
            group.update(saved)
        self.group_state = _WatchedList([_Watched({k: (v if k == "step" else Tensor(v)) for k, v in s.items()})
                                         for s in shared])
        self._micro_steps = int(state_dict.get("micro_steps", 0))
        self.make_state()  # what this optimizer's update needs and the saved one lacked (another Adam form)
        capture.invalidate()  # the state tensors were replaced

    def _checked_state_dict(self, state_dict) -> tuple[list[dict], dict[int, dict], list[dict]]:
        """The groups' settings, each parameter's state by index (float32 arrays) and the
        group states of `state_dict`, all checked; a ValueError names the first wrong
        entry. What a group state holds besides its arrays and step (the settings its
        constants were made from) is left out: the constants are made again from the
        loaded settings rather than trusted."""
        if not isinstance(state_dict, dict) or not {"state", "param_groups"} <= state_dict.keys():
            raise ValueError("an optimizer state dict is a dict with 'state' and 'param_groups'")
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
                len(g["params"]) != len(mine["params"]) for g, mine in zip(groups, self.param_groups)):
            raise ValueError("loaded state dict has a different number of parameter groups or parameters")
        settings = []
        for group, saved in zip(self.param_groups, groups):
            saved = {k: v for k, v in saved.items() if k != "params"}
            self._validate({**group, **saved})
            settings.append(saved)
        params = self._parameters()
        states = {}
        for i, s in state_dict["state"].items():
            index = _index(i, len(params))
            if not isinstance(s, dict) or "step" not in s:
                raise ValueError(f"the state of parameter {index} must be a dict with a 'step'")
            shape = params[index].shape
            states[index] = {key: _checked_step(value, f"state 'step' of parameter {index}") if key == "step" else
                             _checked_array(value, (1,) if key in self.scalar_state else shape,
                                            f"state {key!r} of parameter {index} (a parameter of shape {shape})")
                             for key, value in s.items()}
        shared = state_dict.get("group_state", [{}] * len(groups))
        if not isinstance(shared, list) or len(shared) != len(groups):
            raise ValueError(f"the state dict's group_state must list {len(groups)} group states")
        kept = []
        for index, s in enumerate(shared):
            if not isinstance(s, dict):
                raise ValueError(f"group_state {index} must be a dict")
            checked = {}
            for key, value in s.items():
                where = f"group_state {index} {key!r}"
                if key == "step":
                    checked[key] = _checked_step(value, where)
                elif isinstance(value, np.ndarray) or key in self.group_state_shapes:
                    if key not in self.group_state_shapes:
                        raise ValueError(f"{where} is not state of {type(self).__name__}")
                    checked[key] = _checked_array(value, self.group_state_shapes[key], where)
            kept.append(checked)
        return settings, states, kept

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, g in enumerate(self.param_groups):
            hp = ", ".join(f"{k}={v}" for k, v in g.items() if k != "params")
            lines.append(f"  group {i}: {len(g['params'])} params, {hp}")
        return "\n".join(lines + [")"])
