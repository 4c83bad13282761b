"""Samplers, torch.utils.data's: the order of a map-style dataset's indices, and
batches of them."""

from __future__ import annotations

import itertools
import numbers
from typing import Iterator

import numpy as np

from ..random import generator as _global_generator
from .datasets import _rng


class Sampler:
    """Base of samplers: `__iter__` yields indices (lists of them, for a batch_sampler)."""

    def __iter__(self) -> Iterator:
        raise NotImplementedError(f"{type(self).__name__} has no __iter__")


class SequentialSampler(Sampler):
    def __init__(self, data_source) -> None:
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(Sampler):
    """A fresh permutation every epoch (or num_samples draws, with replacement if asked),
    from `generator`, `seed`, or ggrad's generator."""

    def __init__(self, data_source, replacement: bool = False, num_samples: int | None = None,
                 generator: np.random.Generator | None = None, *, seed: int | None = None) -> None:
        self.data_source, self.replacement, self._num_samples = data_source, bool(replacement), num_samples
        self.generator = _rng(generator, seed)
        if not isinstance(self.num_samples, numbers.Integral) or self.num_samples <= 0:
            raise ValueError(f"num_samples should be a positive int, got {self.num_samples!r}")

    @property
    def num_samples(self) -> int:
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self) -> Iterator[int]:
        rng, n = self.generator or _global_generator(), len(self.data_source)
        if self.replacement:
            return iter(rng.integers(0, n, self.num_samples).tolist())
        return iter(np.concatenate([rng.permutation(n) for _ in range(-(-self.num_samples // n))])
                    [:self.num_samples].tolist())

    def __len__(self) -> int:
        return self.num_samples


class BatchSampler(Sampler):
    """Lists of `batch_size` indices from `sampler` (the last one shorter unless drop_last)."""

    def __init__(self, sampler, batch_size: int, drop_last: bool) -> None:
        if not isinstance(batch_size, numbers.Integral) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        self.sampler, self.batch_size, self.drop_last = sampler, int(batch_size), bool(drop_last)

    def __iter__(self) -> Iterator[list[int]]:
        indices = iter(self.sampler)
        while batch := list(itertools.islice(indices, self.batch_size)):
            if len(batch) < self.batch_size and self.drop_last:
                return
            yield batch

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
