"""Seedable random sources: a numpy generator on the host (initialisation, shuffling) and
a state on the device for numbers drawn there (dropout masks, no crossing per draw)."""

from __future__ import annotations

import numpy as np

from . import replay
from .ops import RAND_GRID

_generator = np.random.default_rng()
_device_seed = float(np.random.default_rng().integers(0, 1000))
_device_state = None  # a (1,) Tensor, made on first use


def manual_seed(seed: int) -> None:
    """Make initialisation, dropout and shuffling reproducible."""
    global _generator, _device_seed, _device_state
    _generator = np.random.default_rng(int(seed))
    _device_seed = float(np.random.default_rng(int(seed)).integers(0, 1000))
    _device_state = None
    replay.invalidate()  # captured steps read the old device state


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
    values that `ggrad.save` stores; `set_rng_state` continues from it exactly.
    Reading the device state is one 4-byte crossing."""
    return {"host": _generator.bit_generator.state, "device_seed": _device_seed,
            "device": device_state().numpy().astype(np.float32).reshape(1).copy()}


_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")


def set_rng_state(state: dict) -> None:
    """Continue from a state `get_rng_state` returned (as it was, or through ggrad.save
    and ggrad.load). The device state is written in place, so steps captured by
    `ggrad.compile` read the restored state too."""
    if not isinstance(state, dict) or not {"host", "device_seed", "device"} <= set(state):
        got = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"set_rng_state takes what ggrad.get_rng_state returned (a dict of 'host', "
                         f"'device_seed' and 'device'), got {got}")
    host = state["host"]
    name = host.get("bit_generator") if isinstance(host, dict) else None
    if name not in _BIT_GENERATORS:
        raise ValueError(f"set_rng_state: the host state names no numpy bit generator ({name!r}; one of "
                         f"{', '.join(_BIT_GENERATORS)})")
    bit_generator = getattr(np.random, name)()
    try:
        bit_generator.state = host
    except (TypeError, ValueError, KeyError) as e:
        raise ValueError(f"set_rng_state: not a {name} state ({e})") from None
    device = np.asarray(state["device"], dtype=np.float32)
    if device.size != 1:
        raise ValueError(f"set_rng_state: the device state is one number, got shape {device.shape}")
    # onto the grid of the generator's steps (ops.RAND_STEP): a state an older ggrad saved lies off it
    device = (np.floor(device.astype(np.float64) * RAND_GRID) / RAND_GRID).astype(np.float32)
    global _generator, _device_seed
    _generator, _device_seed = np.random.Generator(bit_generator), float(state["device_seed"])
    from .autograd import no_grad
    with no_grad():
        device_state().assign_(device.reshape(1))  # in place: captured steps keep reading the same buffer
