"""Collation: samples into numpy batches (torch's default_collate), and numpy batches
into ggrad tensors."""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Mapping
from typing import Any, Callable, Iterator

import numpy as np

from ..tensor import tensor
from .datasets import IterableDataset, TensorDataset


def default_collate(samples: list) -> Any:
    """torch's default_collate into numpy: numbers, arrays and tensors are stacked; tuples
    (namedtuples too), lists and dicts are collated field by field; strings stay a list.
    One difference: a batch of tuples is a tuple (torch makes it a list)."""
    first = samples[0]
    if isinstance(first, (np.ndarray, numbers.Number, np.generic)) or hasattr(first, "__array__"):
        return np.stack([np.asarray(s) for s in samples])  # ggrad and torch tensors read to numpy
    if isinstance(first, (str, bytes)):
        return list(samples)
    if isinstance(first, Mapping):
        return {k: default_collate([s[k] for s in samples]) for k in first}
    if isinstance(first, (tuple, list)):
        if any(len(s) != len(first) for s in samples):
            raise ValueError("default_collate: samples of a batch have different lengths")
        fields = [default_collate(list(field)) for field in zip(*samples)]
        if hasattr(first, "_fields"):
            return type(first)(*fields)
        return tuple(fields) if isinstance(first, tuple) else fields
    raise TypeError(f"default_collate cannot batch {type(first).__name__}; pass a collate_fn")


def _to_tensors(batch: Any, pin: bool = False) -> Any:
    """numpy batches (in any nesting) as ggrad tensors, made here: uploaded when first used
    (`pin`: from the device's pinned memory, see Tensor.pin_memory)."""
    if isinstance(batch, np.ndarray):
        return tensor(batch).pin_memory() if pin else tensor(batch)
    if isinstance(batch, dict):
        return {k: _to_tensors(v, pin) for k, v in batch.items()}
    if isinstance(batch, tuple):
        fields = [_to_tensors(v, pin) for v in batch]
        return type(batch)(*fields) if hasattr(batch, "_fields") else tuple(fields)
    if isinstance(batch, list) and batch and not isinstance(batch[0], (str, bytes)):
        return [_to_tensors(v, pin) for v in batch]
    return batch


class _Fetcher:
    """Makes one batch, alike in this process and in a worker: from a list of indices, or
    (an IterableDataset) from the next `batch_size` samples, raising StopIteration at the end."""

    def __init__(self, dataset, collate_fn: Callable, batch_size: int, drop_last: bool) -> None:
        self.dataset, self.collate_fn, self.batch_size, self.drop_last = dataset, collate_fn, batch_size, drop_last
        self.iterator: Iterator | None = None

    def restart(self) -> None:
        if isinstance(self.dataset, IterableDataset):
            self.iterator = iter(self.dataset)

    def __call__(self, indices: list[int] | None) -> Any:
        if self.iterator is not None:
            samples = list(itertools.islice(self.iterator, self.batch_size))
            if not samples or (self.drop_last and len(samples) < self.batch_size):
                raise StopIteration
            return self.collate_fn(samples)
        if self.collate_fn is default_collate and type(self.dataset) is TensorDataset:
            return self.dataset[indices]  # the rows at once: what stacking them one by one gives
        return self.collate_fn([self.dataset[i] for i in indices])
