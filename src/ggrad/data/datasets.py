"""Datasets, torch.utils.data's: map-style and iterable, TensorDataset, Subset,
ConcatDataset, random_split."""

from __future__ import annotations

import bisect
import itertools
import math
from typing import Iterable, Sequence

import numpy as np

from ..random import generator as _global_generator
from ..tensor import Tensor


def _rng(generator: np.random.Generator | None, seed: int | None) -> np.random.Generator | None:
    """The generator to draw from: `generator`, a new one from `seed`, or None for ggrad's
    own (`ggrad.manual_seed`), read when drawing so that reseeding takes effect."""
    if generator is not None and seed is not None:
        raise ValueError("pass a generator or a seed, not both")
    if generator is not None and not isinstance(generator, np.random.Generator):
        raise TypeError(f"generator must be a numpy Generator, got {type(generator).__name__}")
    return np.random.default_rng(seed) if seed is not None else generator


class Dataset:
    """A map-style dataset: `__getitem__(i)` and `__len__()`."""

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__} has no __getitem__")

    def __add__(self, other: Dataset) -> ConcatDataset:
        return ConcatDataset([self, other])


class IterableDataset(Dataset):
    """A stream of samples: `__iter__()`. Each worker process iterates its own copy; shard
    by `get_worker_info()` or every worker yields every sample (as torch)."""

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__} has no __iter__")


def _host(array) -> np.ndarray:
    return np.asarray(array.numpy() if isinstance(array, Tensor) else array)


class TensorDataset(Dataset):
    """Row i of each array (or tensor), as a tuple."""

    def __init__(self, *tensors) -> None:
        if not tensors:
            raise ValueError("TensorDataset needs at least one array")
        self.tensors = tuple(_host(t) for t in tensors)
        if any(t.ndim == 0 for t in self.tensors):
            raise ValueError("TensorDataset arrays need a first dimension (got a 0-d array)")
        sizes = [len(t) for t in self.tensors]
        if len(set(sizes)) != 1:
            raise ValueError(f"TensorDataset arrays differ in their first dimension: {sizes}")

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __len__(self) -> int:
        return len(self.tensors[0])


class Subset(Dataset):
    """`dataset` seen through `indices` (a list index reads several at once, as torch's)."""

    def __init__(self, dataset, indices: Sequence[int]) -> None:
        self.dataset, self.indices = dataset, list(indices)

    def __getitem__(self, index):
        if isinstance(index, list):
            return self.dataset[[self.indices[i] for i in index]]
        return self.dataset[self.indices[index]]

    def __len__(self) -> int:
        return len(self.indices)


class ConcatDataset(Dataset):
    """The datasets one after another."""

    def __init__(self, datasets: Iterable) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("ConcatDataset needs at least one dataset")
        if any(isinstance(d, IterableDataset) for d in self.datasets):
            raise TypeError("ConcatDataset does not take an IterableDataset (it has no indices)")
        self.cumulative_sizes = list(itertools.accumulate(len(d) for d in self.datasets))

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, index: int):
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} is out of range for a dataset of {len(self)}")
        index %= len(self)
        which = bisect.bisect_right(self.cumulative_sizes, index)
        start = self.cumulative_sizes[which - 1] if which else 0
        return self.datasets[which][index - start]


def random_split(dataset, lengths: Sequence, generator: np.random.Generator | None = None, *,
                 seed: int | None = None) -> list[Subset]:
    """Disjoint random subsets of the given lengths: ints, or fractions summing to 1 (sizes
    as torch's: floors, then the remainder spread one by one from the first). The
    permutation comes from `generator`, `seed`, or ggrad's generator (`ggrad.manual_seed`)."""
    rng, n = _rng(generator, seed), len(dataset)
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        if any(not 0 <= f <= 1 for f in lengths):
            raise ValueError(f"random_split: fractions {list(lengths)} must lie between 0 and 1")
        sizes = [int(math.floor(n * f)) for f in lengths]
        for i in range(n - sum(sizes)):
            sizes[i % len(sizes)] += 1
    else:
        sizes = [int(x) for x in lengths]
    if sum(sizes) != n or min(sizes) < 0:
        raise ValueError(f"random_split: lengths {list(lengths)} do not add up to the dataset's {n}")
    order = (rng or _global_generator()).permutation(n)
    offsets = list(itertools.accumulate(sizes, initial=0))
    return [Subset(dataset, order[a:b].tolist()) for a, b in zip(offsets[:-1], offsets[1:])]
