"""`gradcheck`: compare ggrad's gradients with central finite differences."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from . import autograd
from .tensor import Tensor


def _loss_value(fn: Callable, arrays: Sequence[np.ndarray], weights: np.ndarray | None) -> tuple:
    with autograd.no_grad():
        out = fn(*[Tensor(a) for a in arrays]).numpy().astype(np.float64)
    w = weights if weights is not None else np.random.default_rng(0).standard_normal(out.shape)
    return float(np.sum(out * w)), w


def numerical_grads(fn: Callable, inputs: Sequence, eps: float = 1e-2) -> list[np.ndarray]:
    """d sum(fn(*inputs) * w)/d input by central differences; the differences and the
    weighted sum are taken in float64 on the host."""
    arrays = [np.asarray(a, dtype=np.float64) for a in inputs]
    _, w = _loss_value(fn, arrays, None)
    grads = []
    for i, a in enumerate(arrays):
        g = np.zeros_like(a)
        for j in np.ndindex(a.shape):
            shifted = [x.copy() for x in arrays]
            shifted[i][j] = a[j] + eps
            up, _ = _loss_value(fn, shifted, w)
            shifted[i][j] = a[j] - eps
            down, _ = _loss_value(fn, shifted, w)
            g[j] = (up - down) / (2 * eps)
        grads.append(g)
    return grads


def analytic_grads(fn: Callable, inputs: Sequence) -> list[np.ndarray]:
    arrays = [np.asarray(a, dtype=np.float64) for a in inputs]
    _, w = _loss_value(fn, arrays, None)
    params = [Tensor(a, requires_grad=True) for a in arrays]
    with autograd.grad_tape():
        out = fn(*params)
        out.backward(Tensor(w))
    return [p.grad.numpy().astype(np.float64) for p in params]


def gradcheck(fn: Callable, inputs: Sequence, eps: float = 1e-2, rtol: float = 1e-2,
              atol: float = 1e-3) -> bool:
    """True when ggrad's gradients of ``sum(fn(*inputs) * w)`` (w random, fixed) match
    central finite differences; raises AssertionError naming the input otherwise.
    ggml computes in float32, so the step `eps` is large and the tolerances loose."""
    analytic = analytic_grads(fn, inputs)
    numeric = numerical_grads(fn, inputs, eps)
    for i, (a, n) in enumerate(zip(analytic, numeric)):
        if not np.allclose(a, n, rtol=rtol, atol=atol):
            worst = np.unravel_index(np.argmax(np.abs(a - n)), a.shape)
            raise AssertionError(f"gradcheck: input {i} differs at {worst}: analytic {a[worst]:.6g}, "
                                 f"numerical {n[worst]:.6g}\nanalytic:\n{a}\nnumerical:\n{n}")
    return True
