"""`DataLoader`: batches of host arrays as device tensors, each uploaded once."""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np

from .random import generator
from .tensor import Tensor, tensor


class DataLoader:
    """Yields tuples of Tensors, one per array, `batch_size` rows at a time. A batch is
    uploaded when first used and its memory returns to the pool once it is dropped, so
    memory stays flat over epochs."""

    def __init__(self, *arrays, batch_size: int = 32, shuffle: bool = False, drop_last: bool = False,
                 seed: int | None = None) -> None:
        if not arrays:
            raise ValueError("DataLoader needs at least one array")
        self.arrays = [np.asarray(a.numpy() if isinstance(a, Tensor) else a) for a in arrays]
        n = len(self.arrays[0])
        if any(len(a) != n for a in self.arrays):
            raise ValueError(f"DataLoader arrays differ in length: {[len(a) for a in self.arrays]}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if n == 0:
            raise ValueError("DataLoader got empty arrays")
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self._rng = np.random.default_rng(seed) if seed is not None else None

    def __len__(self) -> int:
        n = len(self.arrays[0])
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self) -> Iterator[tuple[Tensor, ...]]:
        n = len(self.arrays[0])
        order = (self._rng or generator()).permutation(n) if self.shuffle else np.arange(n)
        for i in range(len(self)):
            rows = order[i * self.batch_size:(i + 1) * self.batch_size]
            yield tuple(tensor(a[rows]) for a in self.arrays)
