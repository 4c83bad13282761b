"""DataLoader: batches as ggrad tensors, from arrays (the fast path) or a dataset."""

from __future__ import annotations

import copy
import itertools
import math
import numbers
from typing import Callable, Iterator

import numpy as np

from ..distributed import group
from ..random import generator as _global_generator
from ..tensor import Tensor
from .collate import _Fetcher, _to_tensors, default_collate
from .datasets import Dataset, IterableDataset, _host, _rng
from .distributed import DistributedSampler
from .samplers import BatchSampler, RandomSampler, SequentialSampler
from .workers import _Workers


class DataLoader:
    """Batches as ggrad tensors, from arrays or from a dataset.

    `DataLoader(x, y, ..., batch_size=32, shuffle=False, drop_last=False, seed=None)`:
    the fast path, when the first argument is array-like (numpy, a ggrad or torch tensor,
    a list): tuples of row slices, every epoch a new permutation from `seed` (or ggrad's
    generator), or the rows a `sampler` (any sized iterable of indices) names, in its
    order. A batch_sampler, workers and collate_fn need a dataset (`TensorDataset(x, y)`).

    `DataLoader(dataset, batch_size=1, shuffle=False, sampler=None, batch_sampler=None,
    num_workers=0, collate_fn=None, drop_last=False, timeout=0, worker_init_fn=None,
    multiprocessing_context=None, generator=None, prefetch_factor=2, persistent_workers=
    False, pin_memory=False, pin_memory_device="", seed=None)`: as torch's (only
    `batch_size` may also be positional), over any
    object with `__getitem__` and `__len__`, or an IterableDataset. `collate_fn` makes
    numpy batches (default_collate), turned into tensors here. With `num_workers > 0`
    batches are made in worker processes (Python's default start method, or
    `multiprocessing_context`), batch k by worker k mod num_workers, and yielded in
    order; a worker's exception is raised here with its traceback in the message, and a
    worker's death with its exit code or signal. As torch refuses CUDA tensors in forked
    workers, a dataset holding ggrad tensors on a device other than the CPU is refused
    before forking (keep its data in numpy arrays).
    Workers stop when the iteration ends or is dropped (with `persistent_workers`, when
    the loader is garbage collected). Automatic batching cannot be turned off:
    `batch_size=None` means the default. A batch is uploaded once, when first used; with
    `pin_memory` its arrays wait in the current device's pinned (page-locked) host memory,
    so that the upload is one direct copy (CUDA, Vulkan: `Tensor.pin_memory`); where the
    device has none (the CPU) it changes nothing, as torch's without an accelerator.
    `pin_memory_device` is accepted for torch's signature (ggrad pins for the current device).

    Under a process group of more than one rank (`ggrad.distributed.is_initialized()`),
    a loader given no sampler or batch_sampler reads only its rank's shard, through a
    `ggrad.distributed.DistributedSampler` (shuffled when `shuffle`; its seed is `seed`,
    else one draw from `generator`, else 0, so every rank agrees without ggrad's global
    generator); the sampler's epoch advances each time an iteration starts, so every epoch
    is a new permutation, the same on every rank. `len` is then the shard's batches. Pass a
    `sampler` to choose the rows yourself (e.g. every row on every rank). An IterableDataset
    is never sharded (it decides its own order: see `get_worker_info`).
    """

    def __init__(self, *data, batch_size: int | None = None, shuffle: bool = False, sampler=None,
                 batch_sampler=None, num_workers: int = 0, collate_fn: Callable | None = None,
                 drop_last: bool = False, timeout: float = 0, worker_init_fn: Callable | None = None,
                 multiprocessing_context=None, generator: np.random.Generator | None = None,
                 prefetch_factor: int = 2, persistent_workers: bool = False, pin_memory: bool = False,
                 pin_memory_device: str = "", seed: int | None = None) -> None:
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
        if not isinstance(prefetch_factor, numbers.Integral) or prefetch_factor < 1:
            raise ValueError(f"prefetch_factor must be a positive int, got {prefetch_factor!r}")
        if timeout < 0:
            raise ValueError(f"timeout must be non-negative, got {timeout!r}")
        if persistent_workers and not num_workers:
            raise ValueError("persistent_workers needs num_workers > 0")
        if (sampler is not None or batch_sampler is not None) and shuffle:
            raise ValueError("shuffle cannot be combined with a sampler or batch_sampler")
        if batch_sampler is not None and (batch_size != 1 or drop_last or sampler is not None):
            raise ValueError("batch_sampler excludes batch_size, drop_last and sampler")
        if self.arrays is not None and (batch_sampler is not None or num_workers or collate_fn is not None):
            raise ValueError("a batch_sampler, workers and collate_fn need a dataset (wrap arrays in a "
                             "TensorDataset)")
        if isinstance(self.dataset, IterableDataset) and (shuffle or sampler is not None or batch_sampler is not None):
            raise ValueError("an IterableDataset is read in its own order: no shuffle or sampler")
        self.batch_size, self.shuffle, self.drop_last = int(batch_size), bool(shuffle), bool(drop_last)
        self.num_workers, self.prefetch_factor, self.timeout = int(num_workers), int(prefetch_factor), timeout
        self.collate_fn = collate_fn or default_collate
        self.worker_init_fn, self.multiprocessing_context = worker_init_fn, multiprocessing_context
        self.persistent_workers = bool(persistent_workers)
        self.pin_memory = bool(pin_memory)
        self.generator = _rng(generator, seed)
        self._workers: _Workers | None = None
        self._epoch: int | None = None  # the DistributedSampler's next epoch, when this loader made it
        if sampler is None and batch_sampler is None and not isinstance(self.dataset, IterableDataset) \
                and group.size_or_one() > 1:
            seed = seed if seed is not None else 0 if generator is None else int(generator.integers(2 ** 31))
            sampler = DistributedSampler(self.arrays[0] if self.dataset is None else self.dataset,
                                         shuffle=self.shuffle, seed=seed)
            self._epoch = 0
        if self.dataset is not None and not isinstance(self.dataset, IterableDataset) and batch_sampler is None:
            if sampler is None:
                sampler = RandomSampler(self.dataset, generator=self.generator) if shuffle \
                    else SequentialSampler(self.dataset)
            batch_sampler = BatchSampler(sampler, self.batch_size, self.drop_last)
        self.sampler, self.batch_sampler = sampler, batch_sampler

    def __len__(self) -> int:
        """Batches per epoch; for an IterableDataset, from its `len` (TypeError without one)."""
        if self.arrays is not None:
            n = len(self.arrays[0] if self.sampler is None else self.sampler)
        elif self.batch_sampler is not None:
            return len(self.batch_sampler)
        else:
            n = len(self.dataset)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self) -> Iterator:
        if self._epoch is not None:
            self.sampler.set_epoch(self._epoch)
            self._epoch += 1
        if self.arrays is not None:
            return self._array_batches()
        return self._worker_batches() if self.num_workers else self._batches()

    def _rank_share(self) -> DataLoader:
        """For evaluation: this rank's rows r, r + N, ... (N ranks) without the sampler's
        padding, shares uneven, so that sums over the ranks are one process's over every row.
        A loader that did not shard itself is returned as it is."""
        if self._epoch is None:
            return self
        share = copy.copy(self)
        share._epoch, share._workers = None, None
        share.sampler = range(group.get_rank(), len(self.sampler.dataset), group.get_world_size())
        if share.dataset is not None:
            share.batch_sampler = BatchSampler(share.sampler, self.batch_size, self.drop_last)
        return share

    def _array_batches(self) -> Iterator[tuple[Tensor, ...]]:
        if self.sampler is not None:
            order = np.fromiter(iter(self.sampler), np.int64)
        else:
            n = len(self.arrays[0])
            order = (self.generator or _global_generator()).permutation(n) if self.shuffle else np.arange(n)
        for i in range(len(self)):
            rows = order[i * self.batch_size:(i + 1) * self.batch_size]
            yield tuple(_to_tensors(a[rows], self.pin_memory) for a in self.arrays)

    def _fetcher(self) -> _Fetcher:
        return _Fetcher(self.dataset, self.collate_fn, self.batch_size, self.drop_last)

    def _tasks(self) -> Iterator:
        """Per batch, its indices; None (the next samples) for an IterableDataset."""
        return iter(self.batch_sampler) if self.batch_sampler is not None else itertools.repeat(None)

    def _batches(self) -> Iterator:
        fetch = self._fetcher()
        fetch.restart()
        for indices in self._tasks():
            try:
                batch = fetch(indices)
            except StopIteration:
                return
            yield _to_tensors(batch, self.pin_memory)

    def _worker_batches(self) -> Iterator:
        workers = self._workers or _Workers(self.dataset, self._fetcher(), self.num_workers, self.prefetch_factor,
                                            self.timeout, self.multiprocessing_context, self.generator,
                                            self.worker_init_fn)
        if self.persistent_workers:
            self._workers = workers
        try:
            for batch in workers.batches(self._tasks()):
                yield _to_tensors(batch, self.pin_memory)
        finally:
            if not self.persistent_workers:
                workers.close()


def _is_dataset(obj) -> bool:
    """A dataset is indexable and sized but not array-like (numpy and torch tensors, ggrad
    Tensors and lists are the arrays of the fast path)."""
    if isinstance(obj, Dataset):
        return True
    if isinstance(obj, (list, tuple, numbers.Number)) or hasattr(obj, "__array__"):
        return False
    return hasattr(obj, "__getitem__") and hasattr(obj, "__len__")
