"""Mixed precision: `autocast` (products in bfloat16 or float16) and `GradScaler`.

As torch.autocast: inside the region, matrix products (matmul, linear, convolutions,
attention's products) take float32 operands in the low dtype and sum in float32;
everything else (reductions, softmax, norms, losses, elementwise ops) stays float32.
Weights stay float32: their low copies are casts inside the graph, so a compiled step
still makes no crossing, and the optimizer updates float32 masters. Gradients of a
product are computed at the precision of its forward, as torch's are.

One documented difference: a product's result is float32 here (ggml's products write
float32), where torch rounds it to the low dtype. Values differ from torch's by that last
rounding; the speed is the product's, which is what autocast is for.

`GradScaler` keeps float16 gradients from underflowing: the loss is multiplied by a
scale, the gradients divided by it before the step, and a step whose gradients hold an
inf or NaN is undone on the device (optim/guard.py) while the scale backs off; after
`growth_interval` good steps it grows. The scale, the growth count and the skip count
live on the device: nothing crosses unless the user reads them.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from . import dtypes, runtime
from . import functional as F
from .autograd import no_grad
from .functional.elementwise import choose
from .optim import guard
from .optim.optimizer import resident_scalar
from .runtime import precision
from .tensor import Tensor

_LOW = (dtypes.bfloat16, dtypes.float16)


class autocast:
    """torch.autocast. `device_type` ("cpu", "cuda", "vulkan"; default: the current
    device's kind) picks the default dtype as torch does (float16 on CUDA, bfloat16
    elsewhere); `enabled=False` turns autocast off inside an enabled region. Usable as a
    decorator."""

    def __init__(self, device_type: str | None = None, dtype=None, enabled: bool = True,
                 cache_enabled: bool | None = None) -> None:
        if device_type is None:
            device_type = runtime.current().backend.info.kind
        if device_type not in ("cpu", "cuda", "vulkan"):
            raise ValueError(f"autocast: device_type must be 'cpu', 'cuda' or 'vulkan', got {device_type!r}")
        if dtype is None:
            dtype = dtypes.float16 if device_type == "cuda" else dtypes.bfloat16
        dtype = dtypes.as_dtype(dtype)
        if dtype not in _LOW:
            raise ValueError(f"autocast: dtype must be ggrad.bfloat16 or ggrad.float16, got {dtype}")
        self.device_type = device_type
        self.fast_dtype = dtype
        self._enabled = bool(enabled)

    def __enter__(self) -> autocast:
        precision.push_autocast(self.fast_dtype if self._enabled else None)
        return self

    def __exit__(self, *exc) -> None:
        precision.pop_autocast()

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with autocast(self.device_type, self.fast_dtype, self._enabled):
                return fn(*args, **kwargs)
        return wrapped


def is_autocast_enabled() -> bool:
    return precision.autocast_dtype() is not None


def get_autocast_dtype():
    """The dtype products use now under autocast (None outside it)."""
    return precision.autocast_dtype()


class GradScaler:
    """torch.amp.GradScaler: ``scaler.scale(loss).backward(); scaler.step(opt);
    scaler.update()``. `device` is accepted for torch's signature; the scale lives on the
    current device. Difference: a skipped step is undone on the device rather than not
    run (the optimizer's host step count still advances; its bias corrections, on the
    device, do not)."""

    def __init__(self, device: str | None = None, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True) -> None:
        if not growth_factor > 1.0:
            raise ValueError(f"growth_factor must be > 1, got {growth_factor}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor}")
        if not isinstance(growth_interval, int) or growth_interval < 1:
            raise ValueError(f"growth_interval must be a positive int, got {growth_interval!r}")
        if not init_scale > 0.0:
            raise ValueError(f"init_scale must be > 0, got {init_scale}")
        self._enabled = bool(enabled)
        self._init_scale = float(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = growth_interval
        self._scale: Tensor | None = None
        self._growth_tracker: Tensor | None = None
        self._skipped: Tensor | None = None
        self._per_optimizer: dict[int, dict[str, Any]] = {}  # id -> {"ok": flag, "stepped": bool}

    def _ensure_state(self) -> None:
        if self._scale is None:
            self._scale = resident_scalar(self._init_scale)
            self._growth_tracker = resident_scalar(0.0)
            self._skipped = resident_scalar(0.0)

    def is_enabled(self) -> bool:
        return self._enabled

    # ---- the loss and the gradients ----------------------------------------------------
    def scale(self, outputs):
        """`outputs` (a tensor, or a list/tuple of them) times the scale."""
        if not self._enabled:
            return outputs
        self._ensure_state()
        if isinstance(outputs, Tensor):
            return outputs * F.reshape(self._scale, ())  # float32: a float16 loss is promoted, as torch's
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise TypeError(f"scale() takes a tensor or a list/tuple of tensors, got {type(outputs).__name__}")

    def unscale_(self, optimizer) -> None:
        """Divide the optimizer's gradients by the scale (in place) and note on the device
        whether they are all finite; once per optimizer between updates, as torch's."""
        if not self._enabled:
            return
        state = self._per_optimizer.setdefault(id(optimizer), {})
        if "ok" in state:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if state.get("stepped"):
            raise RuntimeError("unscale_() is being called after step().")
        self._ensure_state()
        with no_grad():
            inverse = F.reshape(self._scale ** -1.0, ())
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad = (p.grad * inverse).to(p.grad.dtype)  # in float32, rounded once
            state["ok"] = guard.finite_flag(optimizer)

    def step(self, optimizer) -> None:
        """Unscale (unless done), run `optimizer.step()`, and undo it on the device if a
        gradient was inf or NaN."""
        if not self._enabled:
            optimizer.step()
            return
        state = self._per_optimizer.setdefault(id(optimizer), {})
        if state.get("stepped"):
            raise RuntimeError("step() has already been called since the last update().")
        if "ok" not in state:
            self.unscale_(optimizer)
        guard.step_unless(state["ok"], optimizer)
        state["stepped"] = True

    def update(self, new_scale: float | Tensor | None = None) -> None:
        """Back off the scale if a step was skipped since the last update, grow it after
        `growth_interval` good steps unless it would become inf; on the device."""
        if not self._enabled:
            return
        self._ensure_state()
        flags = [s["ok"] for s in self._per_optimizer.values() if "ok" in s]
        self._per_optimizer.clear()
        with no_grad():
            if new_scale is not None:
                value = new_scale.detach().float().reshape((1,)) if isinstance(new_scale, Tensor) else \
                    Tensor(np.array([float(new_scale)], dtype=np.float32))
                self._scale._assign(value)
                return
            if not flags:
                return
            ok = flags[0]
            for flag in flags[1:]:
                ok = F.logical_and(ok, flag)
            tracker = self._growth_tracker + 1.0
            grow = F.reshape(tracker >= float(self._growth_interval), ())
            larger = self._scale * self._growth_factor
            # as torch's: a growth that would overflow float32 keeps the scale (an inf scale
            # makes every gradient inf, and every later step would be skipped)
            grown = choose(F.logical_and(grow, F.reshape(F.isfinite(larger), ())), larger, self._scale)
            ok = F.reshape(ok, ())
            self._scale._assign(choose(ok, grown, self._scale * self._backoff_factor))
            self._growth_tracker._assign(choose(ok, F.where(grow, 0.0, tracker), tracker * 0.0))
            self._skipped._assign(self._skipped + F.where(ok, 0.0, 1.0))

    # ---- reading it (each a crossing) ----------------------------------------------------
    def get_scale(self) -> float:
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else float(self._scale.numpy()[0])

    @property
    def skipped_steps(self) -> int:
        """Steps undone since the scaler was made (a read from the device)."""
        return 0 if self._skipped is None else int(self._skipped.numpy()[0])

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def _get_growth_tracker(self) -> int:
        return 0 if self._growth_tracker is None else int(self._growth_tracker.numpy()[0])

    def state_dict(self) -> dict:
        """torch's keys; empty when disabled, as torch's."""
        if not self._enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
                "_growth_tracker": self._get_growth_tracker()}

    def load_state_dict(self, state_dict: dict) -> None:
        if not self._enabled:
            return
        if not state_dict:
            raise RuntimeError("The source state dict is empty, possibly because it was saved from a "
                               "disabled instance of GradScaler.")
        self._init_scale = float(state_dict["scale"])
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._ensure_state()
        self._scale._assign(Tensor(np.array([self._init_scale], dtype=np.float32)))
        self._growth_tracker._assign(Tensor(np.array([float(state_dict["_growth_tracker"])], dtype=np.float32)))
