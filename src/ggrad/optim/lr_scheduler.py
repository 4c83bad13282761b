"""Learning-rate schedules: host arithmetic that sets each group's lr (PyTorch's formulas).

As torch's, a step computes each rate from the group's current one where torch's schedule
is chainable (StepLR: lr * gamma at a step boundary), so two schedulers stepping one
optimizer, or a ChainedScheduler, multiply their factors as torch's do; `lr_at` is the
closed form (base rate at an epoch) that SequentialLR takes at a milestone, as torch's
step(0). Setting an lr costs one 4-byte upload at the next optimizer step, and only when
it changed.
"""

from __future__ import annotations

import bisect
import copy
import math
import types

from .optimizer import Optimizer


class _Scheduler:
    """What every scheduler has: the current rates, and its state to resume from, as
    PyTorch's: every attribute but the optimizer (plain numbers, lists and tuples, which
    ggrad.save stores). The rates themselves are in the optimizer's param_groups: restore
    the optimizer's state dict too."""

    _not_state: tuple[str, ...] = ("optimizer",)  # attributes a subclass saves its own way, if at all

    def get_last_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        return copy.deepcopy({k: v for k, v in self.__dict__.items() if k not in self._not_state})

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict):
            raise TypeError(f"{type(self).__name__}.load_state_dict takes a dict, got {type(state).__name__}")
        unknown = set(state) - set(self.__dict__) | ({"optimizer"} & set(state))
        if unknown:
            raise ValueError(f"{type(self).__name__}.load_state_dict: unknown keys {sorted(unknown)} "
                             "(the state of another kind of scheduler?)")
        self.__dict__.update(copy.deepcopy(state))  # copies: two schedulers never share a list


def _function_state(fn):
    """What a state dict keeps of a schedule function, as torch's: an object's fields, not
    a plain function (None)."""
    return None if fn is None or isinstance(fn, types.FunctionType) else copy.deepcopy(fn.__dict__)


def _per_group(name: str, optimizer: Optimizer, value) -> list:
    """One value per parameter group: a list of them, or one for all (torch's _format_param)."""
    groups = len(optimizer.param_groups)
    if isinstance(value, (list, tuple)):
        if len(value) != groups:
            raise ValueError(f"{name} must have the same length as optimizer.param_groups. "
                             f"{name} has {len(value)} values, param_groups has {groups}.")
        return list(value)
    return [value] * groups


class LRScheduler(_Scheduler):
    """Calls to `step()` advance `last_epoch` and set every group's lr from `lr_at`."""

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(self).__name__} needs a ggrad optimizer, got {type(optimizer).__name__}")
        self.optimizer = optimizer
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._initial = True  # the construction's step (torch's _is_initial)
        self.step()
        self._initial = False

    def lr_at(self, epoch: int, base_lr: float) -> float:
        """The closed form: the rate at `epoch` from the base rate (torch's
        _get_closed_form_lr, or its get_lr where that is closed)."""
        raise NotImplementedError

    def lr_for(self, epoch: int, index: int, lr: float, base_lr: float) -> float:
        """Group `index`'s rate at `epoch`, from its current `lr` and its `base_lr`, as torch's
        get_lr: the closed form `lr_at` unless the schedule is chainable (then it scales
        `lr`; `self._initial` is torch's _is_initial, the construction's step)."""
        return self.lr_at(epoch, base_lr)

    def _closed(self, epoch: int, index: int, lr: float, base_lr: float) -> float:
        """The rate a SequentialLR's milestone sets (torch's step(0)): the closed form where
        the schedule has one, else its get_lr."""
        if type(self).lr_at is not LRScheduler.lr_at:
            return self.lr_at(epoch, base_lr)
        return self.lr_for(epoch, index, lr, base_lr)

    def step(self) -> None:
        self.last_epoch += 1
        for index, (group, base) in enumerate(zip(self.optimizer.param_groups, self.base_lrs)):
            group["lr"] = self.lr_for(self.last_epoch, index, group["lr"], base)


class StepLR(LRScheduler):
    """lr = base * gamma ** (epoch // step_size): lr * gamma every step_size epochs"""

    def __init__(self, optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1) -> None:
        if step_size < 1:
            raise ValueError(f"step_size must be >= 1, got {step_size}")
        self.step_size, self.gamma = int(step_size), float(gamma)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, epoch, base_lr):
        return base_lr * self.gamma ** (epoch // self.step_size)

    def lr_for(self, epoch, index, lr, base_lr):
        return lr if epoch == 0 or epoch % self.step_size else lr * self.gamma


class MultiStepLR(LRScheduler):
    """lr = base * gamma ** (how many milestones, counted with repeats, are <= epoch)"""

    def __init__(self, optimizer, milestones, gamma: float = 0.1, last_epoch: int = -1) -> None:
        self.milestones, self.gamma = sorted(int(m) for m in milestones), float(gamma)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, epoch, base_lr):
        return base_lr * self.gamma ** bisect.bisect_right(self.milestones, epoch)

    def lr_for(self, epoch, index, lr, base_lr):
        repeats = self.milestones.count(epoch)
        return lr * self.gamma ** repeats if repeats else lr


class ExponentialLR(LRScheduler):
    """lr = base * gamma ** epoch: lr * gamma at every step"""

    def __init__(self, optimizer, gamma: float, last_epoch: int = -1) -> None:
        self.gamma = float(gamma)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, epoch, base_lr):
        return base_lr * self.gamma ** epoch

    def lr_for(self, epoch, index, lr, base_lr):
        return lr if self._initial else lr * self.gamma


class ConstantLR(LRScheduler):
    """lr = base * factor for the first total_iters epochs, then base"""

    def __init__(self, optimizer, factor: float = 1.0 / 3, total_iters: int = 5, last_epoch: int = -1) -> None:
        if not 0 <= factor <= 1:
            raise ValueError("Constant multiplicative factor expected to be between 0 and 1.")
        self.factor, self.total_iters = float(factor), int(total_iters)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, epoch, base_lr):
        return base_lr * (self.factor + (epoch >= self.total_iters) * (1 - self.factor))

    def lr_for(self, epoch, index, lr, base_lr):
        if epoch == 0:
            return lr * self.factor
        return lr * (1.0 / self.factor) if epoch == self.total_iters else lr


class LinearLR(LRScheduler):
    """lr = base * (start_factor + (end_factor - start_factor) * min(epoch, total_iters) / total_iters)"""

    def __init__(self, optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0, total_iters: int = 5,
                 last_epoch: int = -1) -> None:
        if not 0 < start_factor <= 1:
            raise ValueError("Starting multiplicative factor expected to be greater than 0 and less or equal to 1.")
        if not 0 <= end_factor <= 1:
            raise ValueError("Ending multiplicative factor expected to be between 0 and 1.")
        self.start_factor, self.end_factor, self.total_iters = float(start_factor), float(end_factor), int(total_iters)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, epoch, base_lr):
        change = self.end_factor - self.start_factor
        return base_lr * (self.start_factor + change * min(self.total_iters, epoch) / self.total_iters)

    def lr_for(self, epoch, index, lr, base_lr):
        if epoch == 0:
            return lr * self.start_factor
        if self._initial or epoch > self.total_iters:
            return lr
        change = self.end_factor - self.start_factor
        return lr * (1.0 + change / (self.total_iters * self.start_factor + (epoch - 1) * change))


class PolynomialLR(LRScheduler):
    """lr = base * (1 - min(epoch, total_iters) / total_iters) ** power"""

    def __init__(self, optimizer, total_iters: int = 5, power: float = 1.0, last_epoch: int = -1) -> None:
        self.total_iters, self.power = int(total_iters), float(power)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, epoch, base_lr):
        return base_lr * (1.0 - min(self.total_iters, epoch) / self.total_iters) ** self.power

    def lr_for(self, epoch, index, lr, base_lr):
        if self._initial or epoch > self.total_iters:
            return lr
        decay = ((1.0 - epoch / self.total_iters) / (1.0 - (epoch - 1) / self.total_iters)) ** self.power
        return lr * decay


class LambdaLR(LRScheduler):
    """lr = base * lr_lambda(epoch); one function, or one per parameter group. The state
    dict keeps the functions that are objects with state (as torch's), not plain ones."""

    def __init__(self, optimizer, lr_lambda, last_epoch: int = -1) -> None:
        groups = len(optimizer.param_groups)
        self.lr_lambdas = list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [lr_lambda] * groups
        if len(self.lr_lambdas) != groups:
            raise ValueError(f"Expected {groups} lr_lambdas, but got {len(self.lr_lambdas)}")
        super().__init__(optimizer, last_epoch)

    def lr_for(self, epoch, index, lr, base_lr):
        return base_lr * self.lr_lambdas[index](epoch)

    _not_state = ("optimizer", "lr_lambdas")

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["lr_lambdas"] = [_function_state(fn) for fn in self.lr_lambdas]
        return state

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        saved = state.pop("lr_lambdas", [None] * len(self.lr_lambdas))
        super().load_state_dict(state)
        for fn, fields in zip(self.lr_lambdas, saved):
            if fields is not None:
                fn.__dict__.update(copy.deepcopy(fields))


class MultiplicativeLR(LambdaLR):
    """lr = previous lr * lr_lambda(epoch) at every step but the construction's (inside a
    SequentialLR its milestone's step multiplies by lr_lambda(0), as torch's)"""

    def lr_for(self, epoch, index, lr, base_lr):
        return lr if self._initial else lr * self.lr_lambdas[index](epoch)


class _OfSchedulers:
    """The state of a scheduler made of others (SequentialLR, ChainedScheduler), as
    torch's: its own, and theirs listed under "_schedulers"."""

    _not_state = ("optimizer", "_schedulers")

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        saved = state.pop("_schedulers")
        super().load_state_dict(state)
        for scheduler, inner in zip(self._schedulers, saved):
            scheduler.load_state_dict(inner)


class SequentialLR(_OfSchedulers, LRScheduler):
    """`schedulers` one after another: the i-th runs from milestones[i-1] (its epoch 0)
    to milestones[i], as torch's (which restarts each at its milestone)."""

    def __init__(self, optimizer, schedulers, milestones, last_epoch: int = -1) -> None:
        schedulers, milestones = list(schedulers), [int(m) for m in milestones]
        if not schedulers:
            raise ValueError("SequentialLR expects at least one scheduler")
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(f"Sequential Schedulers expects number of schedulers provided to be one more than the "
                             f"number of milestone points, but got number of schedulers {len(schedulers)} and the "
                             f"number of milestones to be equal to {len(milestones)}")
        for i, scheduler in enumerate(schedulers):
            if not isinstance(scheduler, LRScheduler) or isinstance(scheduler, SequentialLR):
                raise TypeError(f"SequentialLR takes the schedulers of lr_scheduler (not ReduceLROnPlateau or "
                                f"another SequentialLR), got {type(scheduler).__name__} at index {i}")
            if scheduler.optimizer is not optimizer:
                raise ValueError(f"Sequential Schedulers expects all schedulers to belong to the same optimizer, "
                                 f"but got scheduler {type(scheduler).__name__} at index {i} with another one")
        self._schedulers, self._milestones = schedulers, milestones
        for group in optimizer.param_groups:  # the schedulers' constructions stepped them: start again
            group["lr"] = group["initial_lr"]
        super().__init__(optimizer, last_epoch)

    def lr_for(self, epoch, index, lr, base_lr):
        active = bisect.bisect_right(self._milestones, epoch)
        inner = self._schedulers[active]
        if active and self._milestones[active - 1] == epoch:  # torch's step(0) of the next schedule
            return inner._closed(0, index, lr, base_lr)
        start = self._milestones[active - 1] if active else 0
        inner._initial = self._initial  # this construction's step is the active one's first too
        try:
            return inner.lr_for(epoch - start, index, lr, base_lr)
        finally:
            inner._initial = False


class ChainedScheduler(_OfSchedulers, _Scheduler):
    """`schedulers` stepped one after another at every `step()`, as torch's: each scales the
    rate the one before it set (their factors multiply). No step at construction: each
    scheduler made its own."""

    def __init__(self, schedulers, optimizer: Optimizer | None = None) -> None:
        schedulers = list(schedulers)
        if not schedulers:
            raise ValueError("ChainedScheduler expects at least one scheduler to be chained, but got no scheduler.")
        optimizer = optimizer or schedulers[0].optimizer
        for i, scheduler in enumerate(schedulers):
            if isinstance(scheduler, ReduceLROnPlateau):
                raise ValueError("ChainedScheduler does not support `ReduceLROnPlateau` scheduler as it requires "
                                 "additional kwargs to be specified when calling `step`, but got one at index "
                                 f"{i} in the given schedulers sequence.")
            if not isinstance(scheduler, _Scheduler):
                raise TypeError(f"ChainedScheduler takes the schedulers of lr_scheduler, got "
                                f"{type(scheduler).__name__} at index {i}")
            if scheduler.optimizer is not optimizer:
                raise ValueError(f"ChainedScheduler expects all schedulers to belong to the same optimizer, but "
                                 f"got scheduler {type(scheduler).__name__} at index {i} with another one")
        self.optimizer, self._schedulers = optimizer, schedulers

    def step(self) -> None:
        for scheduler in self._schedulers:
            scheduler.step()


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (base - eta_min) * (1 + cos(pi * epoch / T_max)) / 2"""

    def __init__(self, optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1) -> None:
        if T_max < 1:
            raise ValueError(f"T_max must be >= 1, got {T_max}")
        self.T_max, self.eta_min = int(T_max), float(eta_min)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, epoch, base_lr):
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * epoch / self.T_max)) / 2

    def lr_for(self, epoch, index, lr, base_lr):
        if self._initial:
            return lr
        if (epoch - 1 - self.T_max) % (2 * self.T_max) == 0:  # the ratio below divides by 0 here
            return lr + (base_lr - self.eta_min) * (1 - math.cos(math.pi / self.T_max)) / 2
        return ((1 + math.cos(math.pi * epoch / self.T_max)) / (1 + math.cos(math.pi * (epoch - 1) / self.T_max))
                * (lr - self.eta_min) + self.eta_min)


class CyclicLR(LRScheduler):
    """torch's cyclical rate: from base_lr up to max_lr over step_size_up steps and down
    over step_size_down, each cycle scaled by `mode` (triangular: 1, triangular2: halved
    every cycle, exp_range: gamma ** step) or `scale_fn`; with cycle_momentum the momentum
    (Adam's beta1) goes the other way, between max_momentum and base_momentum. The base
    and max values are one per group or one for all."""

    def __init__(self, optimizer, base_lr, max_lr, step_size_up: int = 2000, step_size_down: int | None = None,
                 mode: str = "triangular", gamma: float = 1.0, scale_fn=None, scale_mode: str = "cycle",
                 cycle_momentum: bool = True, base_momentum=0.8, max_momentum=0.9, last_epoch: int = -1) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        base_lrs = _per_group("base_lr", optimizer, base_lr)
        if last_epoch == -1:
            for lr, group in zip(base_lrs, optimizer.param_groups):
                group["lr"] = lr
        self.max_lrs = _per_group("max_lr", optimizer, max_lr)
        up = float(step_size_up)
        down = float(step_size_down) if step_size_down is not None else up
        self.total_size = up + down
        self.step_ratio = up / self.total_size
        if mode not in ("triangular", "triangular2", "exp_range") and scale_fn is None:
            raise ValueError("mode is invalid and scale_fn is None")
        self.mode, self.gamma, self._scale_fn_custom = mode, gamma, scale_fn
        self.scale_mode = scale_mode if scale_fn is not None else ("iterations" if mode == "exp_range" else "cycle")
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueError("optimizer must support momentum or beta1 with `cycle_momentum` option enabled")
            self.use_beta1 = "betas" in optimizer.defaults
            self.base_momentums = _per_group("base_momentum", optimizer, base_momentum)
            self.max_momentums = _per_group("max_momentum", optimizer, max_momentum)
            if last_epoch == -1:
                for high, low, group in zip(self.max_momentums, self.base_momentums, optimizer.param_groups):
                    self._set_momentum(group, high)
                    group["max_momentum"], group["base_momentum"] = high, low
        super().__init__(optimizer, last_epoch)
        self.base_lrs = base_lrs

    def _set_momentum(self, group: dict, momentum: float) -> None:
        if self.use_beta1:
            group["betas"] = (momentum, *group["betas"][1:])
        else:
            group["momentum"] = momentum

    def _scale(self, x: float) -> float:
        if self._scale_fn_custom is not None:
            return self._scale_fn_custom(x)
        if self.mode == "triangular":
            return 1.0
        return 1 / (2.0 ** (x - 1)) if self.mode == "triangular2" else self.gamma ** x

    def lr_for(self, epoch, index, lr, base_lr):
        """The group's rate (and, with cycle_momentum, its momentum, set here) at `epoch`."""
        cycle = math.floor(1 + epoch / self.total_size)
        x = 1.0 + epoch / self.total_size - cycle
        rise = x / self.step_ratio if x <= self.step_ratio else (x - 1) / (self.step_ratio - 1)
        scale = self._scale(cycle if self.scale_mode == "cycle" else epoch)
        if self.cycle_momentum:
            high, low = self.max_momentums[index], self.base_momentums[index]
            self._set_momentum(self.optimizer.param_groups[index], high - (high - low) * rise * scale)
        return base_lr + (self.max_lrs[index] - base_lr) * rise * scale

    _not_state = ("optimizer", "_scale_fn_custom")

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["_scale_fn_custom"] = _function_state(self._scale_fn_custom)
        return state

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        fields = state.pop("_scale_fn_custom", None)
        super().load_state_dict(state)
        if fields is not None:
            self._scale_fn_custom.__dict__.update(copy.deepcopy(fields))


class CosineAnnealingWarmRestarts(LRScheduler):
    """Cosine from base to eta_min over T_i epochs, then restart with T_i *= T_mult."""

    def __init__(self, optimizer, T_0: int, T_mult: int = 1, eta_min: float = 0.0, last_epoch: int = -1) -> None:
        if T_0 < 1 or T_mult < 1:
            raise ValueError(f"T_0 and T_mult must be >= 1, got {T_0}, {T_mult}")
        self.T_0, self.T_mult, self.eta_min = int(T_0), int(T_mult), float(eta_min)
        super().__init__(optimizer, last_epoch)

    def _cycle(self, epoch: int) -> tuple[int, int]:
        if self.T_mult == 1:
            return epoch % self.T_0, self.T_0
        n = int(math.log(epoch / self.T_0 * (self.T_mult - 1) + 1, self.T_mult))
        t_cur = epoch - self.T_0 * (self.T_mult ** n - 1) // (self.T_mult - 1)
        return t_cur, self.T_0 * self.T_mult ** n

    def lr_at(self, epoch, base_lr):
        t_cur, t_i = self._cycle(epoch)
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * t_cur / t_i)) / 2


class OneCycleLR(LRScheduler):
    """Warm up from max_lr/div_factor to max_lr over pct_start of the steps, then anneal
    (cosine or linear) to max_lr/(div_factor*final_div_factor); optionally three phases."""

    def __init__(self, optimizer, max_lr: float, total_steps: int, pct_start: float = 0.3,
                 anneal_strategy: str = "cos", div_factor: float = 25.0,
                 final_div_factor: float = 1e4, three_phase: bool = False, last_epoch: int = -1) -> None:
        if total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {total_steps}")
        if not 0.0 <= pct_start <= 1.0:
            raise ValueError(f"pct_start must be in [0, 1], got {pct_start}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        self.total_steps, self.anneal = int(total_steps), anneal_strategy
        initial = max_lr / div_factor
        final = initial / final_div_factor
        warm_end = float(pct_start * total_steps) - 1
        if three_phase:
            self.phases = [(warm_end, initial, max_lr), (2 * warm_end, max_lr, initial),
                           (total_steps - 1, initial, final)]
        else:
            self.phases = [(warm_end, initial, max_lr), (total_steps - 1, max_lr, final)]
        for group in optimizer.param_groups:
            group["initial_lr"] = initial
        super().__init__(optimizer, last_epoch)

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self.anneal == "cos":
            return end + (start - end) / 2 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def lr_at(self, epoch, base_lr):
        if epoch > self.total_steps:  # torch's bound: a step to total_steps itself is allowed
            raise ValueError(f"Tried to step {epoch} times. The specified number of total steps is {self.total_steps}")
        start_step = 0.0
        for i, (end_step, start, end) in enumerate(self.phases):
            if epoch <= end_step or i == len(self.phases) - 1:
                pct = (epoch - start_step) / (end_step - start_step) if end_step > start_step else 1.0
                return self._anneal(start, end, pct)
            start_step = end_step
        raise AssertionError("unreachable")


class LinearWarmupCosine(LRScheduler):
    """Linear warm-up from base*start_factor to base over warmup_steps, then cosine
    annealing to eta_min until total_steps (PyTorch's SequentialLR of LinearLR and
    CosineAnnealingLR, in closed form)."""

    def __init__(self, optimizer, warmup_steps: int, total_steps: int, eta_min: float = 0.0,
                 start_factor: float | None = None, last_epoch: int = -1) -> None:
        if not 0 <= warmup_steps < total_steps:
            raise ValueError(f"need 0 <= warmup_steps < total_steps, got {warmup_steps}, {total_steps}")
        self.warmup, self.total, self.eta_min = int(warmup_steps), int(total_steps), float(eta_min)
        self.start_factor = float(start_factor) if start_factor is not None else 1.0 / max(warmup_steps, 1)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, epoch, base_lr):
        if epoch < self.warmup:
            return base_lr * (self.start_factor + (1 - self.start_factor) * epoch / self.warmup)
        t = min(epoch - self.warmup, self.total - self.warmup)
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * t / (self.total - self.warmup))) / 2


class ReduceLROnPlateau(_Scheduler):
    """Multiply lr by `factor` once the metric has not improved for `patience` epochs."""

    def __init__(self, optimizer: Optimizer, mode: str = "min", factor: float = 0.1, patience: int = 10,
                 threshold: float = 1e-4, threshold_mode: str = "rel", cooldown: int = 0,
                 min_lr: float = 0.0, eps: float = 1e-8) -> None:
        if factor >= 1.0:
            raise ValueError("factor should be < 1.0")
        if mode not in ("min", "max") or threshold_mode not in ("rel", "abs"):
            raise ValueError(f"mode must be 'min'/'max' and threshold_mode 'rel'/'abs', got {mode!r}, {threshold_mode!r}")
        self.optimizer = optimizer
        self.mode, self.factor, self.patience = mode, float(factor), int(patience)
        self.threshold, self.threshold_mode = float(threshold), threshold_mode
        self.cooldown, self.min_lr, self.eps = int(cooldown), float(min_lr), float(eps)
        self.best = math.inf if mode == "min" else -math.inf
        self.num_bad_epochs = 0
        self.cooldown_counter = 0
        self.last_epoch = 0

    def _better(self, value: float) -> bool:
        if self.mode == "min":
            bound = self.best * (1 - self.threshold) if self.threshold_mode == "rel" else self.best - self.threshold
            return value < bound
        bound = self.best * (1 + self.threshold) if self.threshold_mode == "rel" else self.best + self.threshold
        return value > bound

    def step(self, metric) -> None:
        value = float(metric)
        self.last_epoch += 1
        if self._better(value):
            self.best, self.num_bad_epochs = value, 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            for group in self.optimizer.param_groups:
                new = max(group["lr"] * self.factor, self.min_lr)
                if group["lr"] - new > self.eps:
                    group["lr"] = new
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0

