"""Tensor factories beyond `ggrad.tensor`: ranges, identity, random tensors, as torch's.

Ranges and random numbers are made on the host and uploaded once, on first use (a
random tensor made inside a `ggrad.compile`d step would be frozen into the capture,
so it refuses capture; `rand_like` draws on the device and has no such limit).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from . import dtypes, replay
from .functional.losses import rand_like
from .random import generator
from .tensor import Tensor, _shape_args, full, zeros_like

__all__ = ["arange", "empty", "empty_like", "eye", "linspace", "rand", "rand_like", "randint",
           "randint_like", "randn", "randn_like"]


def arange(start, end=None, step=1, *, dtype=None, device: str | None = None, requires_grad: bool = False) -> Tensor:
    """[start, end) in steps; int64 when every bound is an integer, else float32."""
    if end is None:
        start, end = 0, start
    if step == 0:
        raise ValueError("arange step must be nonzero")
    integral = all(isinstance(v, numbers.Integral) for v in (start, end, step))
    dt = (dtypes.int64 if integral else dtypes.float32) if dtype is None else dtypes.as_dtype(dtype)
    count = math.ceil((end - start) / step)
    if count <= 0:
        raise ValueError(f"arange({start}, {end}, {step}) is empty; ggml tensors cannot be empty")
    values = start + step * np.arange(count, dtype=np.float64 if not integral else np.int64)
    return Tensor(values, requires_grad=requires_grad, device=device, dtype=dt)


def linspace(start, end, steps: int, *, dtype=None, device: str | None = None, requires_grad: bool = False) -> Tensor:
    if steps < 1:
        raise ValueError(f"linspace needs at least one step, got {steps}")
    return Tensor(np.linspace(start, end, steps), requires_grad=requires_grad, device=device,
                  dtype=dtypes.float32 if dtype is None else dtype)


def eye(n: int, m: int | None = None, *, dtype=None, device: str | None = None, requires_grad: bool = False) -> Tensor:
    return Tensor(np.eye(n, m), requires_grad=requires_grad, device=device,
                  dtype=dtypes.float32 if dtype is None else dtype)


def empty(*size, dtype=None, device: str | None = None, requires_grad: bool = False) -> Tensor:
    """Zeros (ggrad does not hand out uninitialised memory)."""
    return full(_shape_args(size), 0, dtype=dtypes.float32 if dtype is None else dtype, device=device,
                requires_grad=requires_grad)


def empty_like(t: Tensor, dtype=None) -> Tensor:
    return zeros_like(t, dtype)


def _random(draw, size, dtype, device, requires_grad, what: str) -> Tensor:
    replay.refuse(f"{what} draws on the host; a replay would reuse the first draw (use rand_like)")
    return Tensor(draw(_shape_args(size)), requires_grad=requires_grad, device=device,
                  dtype=dtypes.float32 if dtype is None else dtype)


def rand(*size, dtype=None, device: str | None = None, requires_grad: bool = False) -> Tensor:
    """Uniform [0, 1) from ggrad's host generator (`ggrad.manual_seed` seeds it)."""
    return _random(lambda s: generator().random(s), size, dtype, device, requires_grad, "ggrad.rand")


def randn(*size, dtype=None, device: str | None = None, requires_grad: bool = False) -> Tensor:
    return _random(lambda s: generator().standard_normal(s), size, dtype, device, requires_grad, "ggrad.randn")


def randint(low, high=None, size=(), *, dtype=None, device: str | None = None) -> Tensor:
    """Integers in [low, high) (int64), as torch.randint(low=0, high, size)."""
    if high is not None and not isinstance(high, numbers.Number) and size == ():  # randint(high, size)
        high, size = None, high
    if high is None:
        low, high = 0, low
    return _random(lambda s: generator().integers(low, high, s), size,
                   dtypes.int64 if dtype is None else dtype, device, False, "ggrad.randint")


def randn_like(t: Tensor, dtype=None) -> Tensor:
    return randn(t.shape, dtype=t.dtype if dtype is None else dtype)


def randint_like(t: Tensor, low, high=None, dtype=None) -> Tensor:
    return randint(low, high, t.shape, dtype=t.dtype if dtype is None else dtype)

