"""Seedable random sources: a numpy generator on the host (initialisation, shuffling) and
a state on the device for numbers drawn there (dropout masks, no crossing per draw)."""

from __future__ import annotations

import numpy as np

from . import capture

_generator = np.random.default_rng()
_device_seed = float(np.random.default_rng().integers(0, 1000))
_device_state = None  # a (1,) Tensor, made on first use


def manual_seed(seed: int) -> None:
    """Make initialisation, dropout and shuffling reproducible."""
    global _generator, _device_seed, _device_state
    _generator = np.random.default_rng(int(seed))
    _device_seed = float(np.random.default_rng(int(seed)).integers(0, 1000))
    _device_state = None
    capture.invalidate()  # captured steps read the old device state


def generator() -> np.random.Generator:
    return _generator


def device_state():
    """The device generator's state (one float, advanced in place by every draw)."""
    global _device_state
    if _device_state is None:
        from .tensor import Tensor
        _device_state = Tensor(np.array([_device_seed], dtype=np.float32))
    return _device_state


def get_rng_state() -> dict:
    """Everything random ggrad draws from: the host generator (initialisation,
    shuffling) and the device generator (dropout, nn.init), as arrays and JSON-able
    values that `ggrad.save` stores; `set_rng_state` continues from it exactly."""
    return {"host": _generator.bit_generator.state, "device_seed": _device_seed,
            "device": device_state().numpy().copy()}


def set_rng_state(state: dict) -> None:
    global _generator, _device_seed
    generator = np.random.default_rng()
    generator.bit_generator.state = state["host"]
    _generator, _device_seed = generator, float(state["device_seed"])
    device = np.asarray(state["device"], dtype=np.float32).reshape(1)
    from .autograd import no_grad
    with no_grad():
        device_state().assign_(device)  # in place: captured steps keep reading the same buffer
