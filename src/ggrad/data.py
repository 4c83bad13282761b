"""Data: torch.utils.data's datasets, samplers and DataLoader, yielding ggrad tensors.

Two ways in. `DataLoader(x, y, batch_size=32, shuffle=True)` over in-memory arrays is the
fast path: each batch is a slice of the arrays, uploaded when first used. `DataLoader
(dataset, batch_size, ...)` takes any map-style dataset (`__getitem__` and `__len__`) or
an `IterableDataset`, as torch's: samples are collated into numpy batches (by
`collate_fn`, in worker processes with `num_workers > 0`) and converted to tensors in
this process. Either way a batch's device memory returns to the pool once it is dropped.
"""

from __future__ import annotations

import bisect
import math
import multiprocessing
import numbers
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from .random import generator
from .tensor import Tensor, tensor


# ---- datasets ---------------------------------------------------------------------------------
class Dataset:
    """A map-style dataset: `__getitem__(i)` and `__len__()`."""

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__} has no __getitem__")

    def __add__(self, other: Dataset) -> ConcatDataset:
        return ConcatDataset([self, other])


class IterableDataset:
    """A stream of samples: `__iter__()`."""

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
        sizes = [len(t) for t in self.tensors]
        if len(set(sizes)) != 1:
            raise ValueError(f"TensorDataset arrays differ in their first dimension: {sizes}")

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __len__(self) -> int:
        return len(self.tensors[0])


class Subset(Dataset):
    def __init__(self, dataset, indices: Sequence[int]) -> None:
        self.dataset, self.indices = dataset, list(indices)

    def __getitem__(self, index):
        return self.dataset[self.indices[index]]

    def __len__(self) -> int:
        return len(self.indices)


class ConcatDataset(Dataset):
    """The datasets one after another."""

    def __init__(self, datasets: Iterable) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("ConcatDataset needs at least one dataset")
        self.cumulative_sizes = list(np.cumsum([len(d) for d in self.datasets]))

    def __len__(self) -> int:
        return int(self.cumulative_sizes[-1])

    def __getitem__(self, index: int):
        if index < 0:
            if -index > len(self):
                raise IndexError(f"index {index} is out of range for a dataset of {len(self)}")
            index += len(self)
        if index >= len(self):
            raise IndexError(f"index {index} is out of range for a dataset of {len(self)}")
        which = bisect.bisect_right(self.cumulative_sizes, index)
        start = self.cumulative_sizes[which - 1] if which else 0
        return self.datasets[which][index - start]


def random_split(dataset, lengths: Sequence, seed: int | None = None) -> list[Subset]:
    """Disjoint random subsets of the given lengths (ints, or fractions summing to 1:
    sizes as torch's, floors with the remainder spread one by one). The permutation comes
    from `seed`, or ggrad's generator (`ggrad.manual_seed`)."""
    n = len(dataset)
    if all(isinstance(x, numbers.Real) and not isinstance(x, numbers.Integral) for x in lengths) \
            and math.isclose(sum(lengths), 1.0) and sum(lengths) <= 1.0 + 1e-9:
        sizes = [int(math.floor(n * f)) for f in lengths]
        for i in range(n - sum(sizes)):
            sizes[i % len(sizes)] += 1
    else:
        sizes = [int(x) for x in lengths]
    if sum(sizes) != n or min(sizes) < 0:
        raise ValueError(f"random_split: lengths {list(lengths)} do not add up to the dataset's {n}")
    order = (np.random.default_rng(seed) if seed is not None else generator()).permutation(n)
    offsets = np.cumsum([0] + sizes)
    return [Subset(dataset, order[a:b].tolist()) for a, b in zip(offsets[:-1], offsets[1:])]


# ---- samplers -----------------------------------------------------------------------------------
class SequentialSampler:
    def __init__(self, data_source) -> None:
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler:
    """A fresh permutation every epoch (or num_samples draws with replacement)."""

    def __init__(self, data_source, replacement: bool = False, num_samples: int | None = None,
                 seed: int | None = None) -> None:
        self.data_source, self.replacement = data_source, bool(replacement)
        self._num_samples = num_samples
        self._rng = np.random.default_rng(seed) if seed is not None else None

    @property
    def num_samples(self) -> int:
        return len(self.data_source) if self._num_samples is None else int(self._num_samples)

    def __iter__(self) -> Iterator[int]:
        rng, n = self._rng or generator(), len(self.data_source)
        if self.replacement:
            return iter(rng.integers(0, n, self.num_samples).tolist())
        return iter(np.concatenate([rng.permutation(n) for _ in range(-(-self.num_samples // n))])
                    [:self.num_samples].tolist())

    def __len__(self) -> int:
        return self.num_samples


class BatchSampler:
    """Lists of `batch_size` indices from `sampler` (the last one shorter unless drop_last)."""

    def __init__(self, sampler, batch_size: int, drop_last: bool) -> None:
        if not isinstance(batch_size, numbers.Integral) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        self.sampler, self.batch_size, self.drop_last = sampler, int(batch_size), bool(drop_last)

    def __iter__(self) -> Iterator[list[int]]:
        batch: list[int] = []
        for index in self.sampler:
            batch.append(index)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


# ---- collation ----------------------------------------------------------------------------------
def default_collate(samples: list) -> Any:
    """torch's default_collate into numpy: numbers and arrays are stacked, tuples, lists
    and dicts are collated field by field, strings are kept as lists."""
    first = samples[0]
    if isinstance(first, Tensor):
        return np.stack([s.numpy() for s in samples])
    if isinstance(first, (np.ndarray, numbers.Number, np.generic)):
        return np.stack([np.asarray(s) for s in samples])
    if isinstance(first, str):
        return list(samples)
    if isinstance(first, dict):
        return {k: default_collate([s[k] for s in samples]) for k in first}
    if isinstance(first, (tuple, list)):
        if any(len(s) != len(first) for s in samples):
            raise ValueError("default_collate: samples of a batch have different lengths")
        return type(first)(default_collate(list(field)) for field in zip(*samples)) if isinstance(first, tuple) \
            else [default_collate(list(field)) for field in zip(*samples)]
    raise TypeError(f"default_collate cannot batch {type(first).__name__}; pass a collate_fn")


def _to_tensors(batch: Any) -> Any:
    """numpy batches (in any nesting) as ggrad tensors."""
    if isinstance(batch, np.ndarray):
        return tensor(batch)
    if isinstance(batch, dict):
        return {k: _to_tensors(v) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_to_tensors(v) for v in batch)
    if isinstance(batch, list) and batch and not isinstance(batch[0], str):
        return [_to_tensors(v) for v in batch]
    return batch


_worker_state: dict = {}


def _start_worker(dataset, collate_fn) -> None:
    _worker_state["dataset"], _worker_state["collate"] = dataset, collate_fn


def _load_batch(indices: list[int]):
    dataset = _worker_state["dataset"]
    return _worker_state["collate"]([dataset[i] for i in indices])


# ---- the loader ---------------------------------------------------------------------------------
class DataLoader:
    """Batches as ggrad tensors, from arrays (`DataLoader(x, y, batch_size=32)`: the fast
    path) or from a dataset (`DataLoader(dataset, batch_size=1, shuffle=False, sampler=None,
    batch_sampler=None, num_workers=0, collate_fn=None, drop_last=False, ...)`, as torch's).
    `seed` makes shuffling reproducible (else ggrad's generator, `ggrad.manual_seed`)."""

    def __init__(self, *data, batch_size: int | None = None, shuffle: bool = False, sampler=None,
                 batch_sampler=None, num_workers: int = 0, collate_fn: Callable | None = None,
                 drop_last: bool = False, seed: int | None = None, prefetch_factor: int = 2) -> None:
        if not data:
            raise ValueError("DataLoader needs arrays or a dataset")
        self.dataset = data[0] if _is_dataset(data[0]) else None
        if self.dataset is not None:
            if len(data) > 2 or (len(data) == 2 and batch_size is not None):
                raise TypeError("DataLoader(dataset, batch_size, ...) takes the rest as keywords")
            batch_size = data[1] if len(data) == 2 else (1 if batch_size is None else batch_size)
            self.arrays = None
        else:
            batch_size = 32 if batch_size is None else batch_size
            self.arrays = [_host(a) for a in data]
            n = len(self.arrays[0])
            if any(len(a) != n for a in self.arrays):
                raise ValueError(f"DataLoader arrays differ in length: {[len(a) for a in self.arrays]}")
            if n == 0:
                raise ValueError("DataLoader got empty arrays")
        if not isinstance(batch_size, numbers.Integral) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if not isinstance(num_workers, numbers.Integral) or num_workers < 0:
            raise ValueError(f"num_workers must be a non-negative int, got {num_workers!r}")
        if (sampler is not None or batch_sampler is not None) and shuffle:
            raise ValueError("shuffle cannot be combined with a sampler or batch_sampler")
        if batch_sampler is not None and (batch_size != 1 or drop_last or sampler is not None):
            raise ValueError("batch_sampler excludes batch_size, drop_last and sampler")
        if self.arrays is not None and (sampler or batch_sampler or num_workers or collate_fn):
            raise ValueError("samplers, workers and collate_fn need a dataset (wrap arrays in a TensorDataset)")
        if isinstance(self.dataset, IterableDataset) and (shuffle or sampler or batch_sampler):
            raise ValueError("an IterableDataset is read in its own order: no shuffle or sampler")
        if isinstance(self.dataset, IterableDataset) and num_workers:
            raise NotImplementedError("num_workers > 0 with an IterableDataset is not supported")
        self.batch_size, self.shuffle, self.drop_last = int(batch_size), bool(shuffle), bool(drop_last)
        self.num_workers, self.prefetch_factor = int(num_workers), max(int(prefetch_factor), 1)
        self.collate_fn = collate_fn or default_collate
        self._rng = np.random.default_rng(seed) if seed is not None else None
        if self.dataset is not None and not isinstance(self.dataset, IterableDataset):
            if batch_sampler is None:
                if sampler is None:
                    sampler = RandomSampler(self.dataset) if shuffle else SequentialSampler(self.dataset)
                    if shuffle and self._rng is not None:
                        sampler._rng = self._rng
                batch_sampler = BatchSampler(sampler, self.batch_size, self.drop_last)
        self.sampler, self.batch_sampler = sampler, batch_sampler

    def __len__(self) -> int:
        if self.arrays is not None:
            n = len(self.arrays[0])
            return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)
        if self.batch_sampler is None:
            raise TypeError("an IterableDataset's loader has no length")
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator:
        if self.arrays is not None:
            return self._array_batches()
        if self.batch_sampler is None:
            return self._stream_batches()
        return self._dataset_batches() if not self.num_workers else self._worker_batches()

    def _array_batches(self) -> Iterator[tuple[Tensor, ...]]:
        n = len(self.arrays[0])
        order = (self._rng or generator()).permutation(n) if self.shuffle else np.arange(n)
        for i in range(len(self)):
            rows = order[i * self.batch_size:(i + 1) * self.batch_size]
            yield tuple(tensor(a[rows]) for a in self.arrays)

    def _dataset_batches(self) -> Iterator:
        for indices in self.batch_sampler:
            yield _to_tensors(self.collate_fn([self.dataset[i] for i in indices]))

    def _stream_batches(self) -> Iterator:
        batch = []
        for sample in self.dataset:
            batch.append(sample)
            if len(batch) == self.batch_size:
                yield _to_tensors(self.collate_fn(batch))
                batch = []
        if batch and not self.drop_last:
            yield _to_tensors(self.collate_fn(batch))

    def _worker_batches(self) -> Iterator:
        """Batches loaded by worker processes (forked: the dataset is not pickled), up to
        num_workers * prefetch_factor ahead, yielded in order; a worker's exception is
        raised here with its traceback attached."""
        context = multiprocessing.get_context("fork")
        pool = ProcessPoolExecutor(self.num_workers, mp_context=context, initializer=_start_worker,
                                   initargs=(self.dataset, self.collate_fn))
        try:
            pending = []
            batches = iter(self.batch_sampler)
            ahead = self.num_workers * self.prefetch_factor
            for indices in batches:
                pending.append(pool.submit(_load_batch, list(indices)))
                if len(pending) >= ahead:
                    yield _to_tensors(pending.pop(0).result())
            while pending:
                yield _to_tensors(pending.pop(0).result())
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def _is_dataset(obj) -> bool:
    if isinstance(obj, (Dataset, IterableDataset)):
        return True
    if isinstance(obj, (np.ndarray, Tensor, list, tuple, numbers.Number)):
        return False
    return hasattr(obj, "__getitem__") and hasattr(obj, "__len__")
