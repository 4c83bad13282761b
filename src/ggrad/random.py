"""One seedable random source for initialisation, dropout masks and shuffling."""

from __future__ import annotations

import numpy as np

_generator = np.random.default_rng()


def manual_seed(seed: int) -> None:
    """Make initialisation, dropout and shuffling reproducible."""
    global _generator
    _generator = np.random.default_rng(int(seed))


def generator() -> np.random.Generator:
    return _generator
