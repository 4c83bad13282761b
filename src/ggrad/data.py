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
import itertools
import math
import multiprocessing
import numbers
import pickle
import random
import sys
import traceback
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from .random import generator as _global_generator, manual_seed
from .tensor import Tensor, tensor


def _rng(generator: np.random.Generator | None, seed: int | None) -> np.random.Generator | None:
    """The generator to draw from: `generator`, a new one from `seed`, or None for ggrad's
    own (`ggrad.manual_seed`), read when drawing so that reseeding takes effect."""
    if generator is not None and seed is not None:
        raise ValueError("pass a generator or a seed, not both")
    if generator is not None and not isinstance(generator, np.random.Generator):
        raise TypeError(f"generator must be a numpy Generator, got {type(generator).__name__}")
    return np.random.default_rng(seed) if seed is not None else generator


# ---- datasets ---------------------------------------------------------------------------------
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


# ---- samplers -----------------------------------------------------------------------------------
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


# ---- collation ----------------------------------------------------------------------------------
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


def _to_tensors(batch: Any) -> Any:
    """numpy batches (in any nesting) as ggrad tensors, made here: uploaded when first used."""
    if isinstance(batch, np.ndarray):
        return tensor(batch)
    if isinstance(batch, dict):
        return {k: _to_tensors(v) for k, v in batch.items()}
    if isinstance(batch, tuple):
        fields = [_to_tensors(v) for v in batch]
        return type(batch)(*fields) if hasattr(batch, "_fields") else tuple(fields)
    if isinstance(batch, list) and batch and not isinstance(batch[0], (str, bytes)):
        return [_to_tensors(v) for v in batch]
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


# ---- worker processes ---------------------------------------------------------------------------
@dataclass(frozen=True)
class WorkerInfo:
    """What `get_worker_info()` tells code running in a worker (an IterableDataset shards
    by `id` and `num_workers`); `seed` seeded `random`, numpy's and ggrad's generators."""
    id: int
    num_workers: int
    seed: int
    dataset: Any


_worker_info: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    """This worker's WorkerInfo; None in the main process."""
    return _worker_info


class _KeyErrorMessage(str):
    """KeyError shows its argument's repr: this keeps the traceback's newlines readable."""

    def __repr__(self) -> str:
        return self


def _caught(worker_id: int) -> tuple[type, str]:
    """The exception being handled, as (type, text with its traceback) that pickle; a type
    that does not pickle (a local class) becomes RuntimeError."""
    kind = sys.exc_info()[0]
    text = f"Caught {kind.__name__} in DataLoader worker process {worker_id}.\nOriginal {traceback.format_exc()}"
    try:
        pickle.dumps(kind)
    except Exception:
        kind = RuntimeError
    return kind, text


def _reraise(kind: type, text: str):
    message = _KeyErrorMessage(text) if kind is KeyError else text
    try:
        error = kind(message)
    except Exception:
        error = RuntimeError(text)  # a constructor that wants other arguments
    raise error


def _worker_loop(conn, fetch: _Fetcher, info: WorkerInfo, init_fn: Callable | None) -> None:
    """Answers (epoch, task, indices) with (epoch, task, kind, payload), kind "batch",
    "end" (the iterable is exhausted) or "error"; stops at None, or when the main process
    is gone (the pipe closes). A new epoch restarts an iterable dataset."""
    global _worker_info
    _worker_info = info
    random.seed(info.seed)
    np.random.seed(info.seed % 2**32)
    manual_seed(info.seed)
    failed, epoch = None, None
    try:
        if init_fn is not None:
            init_fn(info.id)
    except Exception:
        failed = _caught(info.id)  # answered to every task, as torch
    try:
        while (message := conn.recv()) is not None:
            task_epoch, task, indices = message
            if task_epoch != epoch:
                epoch = task_epoch
                fetch.restart()
            try:
                kind, payload = ("error", failed) if failed else ("batch", fetch(indices))
            except StopIteration:
                kind, payload = "end", None
            except Exception:
                kind, payload = "error", _caught(info.id)
            try:
                conn.send((task_epoch, task, kind, payload))
            except OSError:
                return  # the main process closed the pipe
            except Exception:
                text = _caught(info.id)[1]
                conn.send((task_epoch, task, "error", (RuntimeError, "the batch cannot be sent from the worker "
                                                       f"(it must pickle): {text}")))
    except (EOFError, KeyboardInterrupt):  # the main process is gone, or handles Ctrl-C
        return


def _stop_workers(processes: list, conns: list) -> None:
    """Ask each worker to stop, close the pipes (a worker blocked sending gets an error),
    wait a little, then terminate those still running."""
    for conn in conns:
        try:
            conn.send(None)
        except OSError:
            pass
        conn.close()
    for process in reversed(processes):  # a later worker holds inherited ends of earlier pipes
        process.join(5)
        if process.is_alive():
            process.terminate()
            process.join()


class _Workers:
    """`num_workers` processes, each with its own pipe. Batch k of an epoch goes to worker
    k mod n (its shard); results are read as they arrive and kept until their turn, so at
    most `prefetch_factor` batches per worker are ahead in flight or in host memory."""

    def __init__(self, loader: DataLoader) -> None:
        context = loader.multiprocessing_context
        if context is None or isinstance(context, str):
            context = multiprocessing.get_context(context)
        # spawn() leaves the generator's stream alone: the shuffle is the same with and without workers
        base_seed = int((loader.generator or _global_generator()).spawn(1)[0].integers(2**62))
        self.timeout, self.ahead = loader.timeout, loader.num_workers * loader.prefetch_factor
        self.conns, self.processes, self.epoch = [], [], 0
        for i in range(loader.num_workers):
            mine, theirs = context.Pipe()
            info = WorkerInfo(i, loader.num_workers, base_seed + i, loader.dataset)
            process = context.Process(target=_worker_loop, daemon=True, name=f"DataLoader worker {i}",
                                      args=(theirs, loader._fetcher(), info, loader.worker_init_fn))
            process.start()
            theirs.close()
            self.conns.append(mine)
            self.processes.append(process)
        self.close = weakref.finalize(self, _stop_workers, self.processes, self.conns)

    def batches(self, tasks: Iterator) -> Iterator:
        """The epoch's batches in order. Results of an abandoned epoch are dropped when
        they arrive; a newer epoch started on these workers stops this one."""
        self.epoch += 1
        epoch, live = self.epoch, list(range(len(self.conns)))
        owner: dict[int, int] = {}  # task -> worker, for tasks in flight
        ready: dict[int, tuple[str, Any]] = {}
        sent = turn = 0
        while True:
            if self.epoch != epoch:
                raise RuntimeError("a newer iteration of this DataLoader took over its persistent workers")
            while live and len(owner) < self.ahead and (indices := next(tasks, StopIteration)) is not StopIteration:
                worker = live[sent % len(live)]
                self.conns[worker].send((epoch, sent, indices))
                owner[sent] = worker
                sent += 1
            if not owner:
                return
            while turn not in ready:
                self._receive(ready)
            kind, payload = ready.pop(turn)
            worker = owner.pop(turn)
            turn += 1
            if kind == "error":
                _reraise(*payload)
            if kind == "end":
                if worker in live:
                    live.remove(worker)
                continue
            yield payload

    def _receive(self, ready: dict) -> None:
        waited = wait(self.conns + [p.sentinel for p in self.processes], self.timeout or None)
        if not waited:
            raise RuntimeError(f"DataLoader timed out after {self.timeout} s waiting for a batch")
        for conn, process in zip(self.conns, self.processes):
            if conn not in waited and process.sentinel not in waited:
                continue
            try:
                epoch, task, kind, payload = conn.recv() if conn.poll() else (None,) * 4
            except (EOFError, OSError):  # the worker died (a reset pipe, when tasks were left unread)
                epoch = None
            if epoch is None and not process.is_alive():
                raise RuntimeError(f"DataLoader worker {process.name} (pid {process.pid}) exited unexpectedly "
                                   f"with exit code {process.exitcode}")
            if epoch == self.epoch:
                ready[task] = kind, payload


# ---- the loader ---------------------------------------------------------------------------------
class DataLoader:
    """Batches as ggrad tensors, from arrays or from a dataset.

    `DataLoader(x, y, ..., batch_size=32, shuffle=False, drop_last=False, seed=None)`:
    the fast path, when the first argument is array-like (numpy, a ggrad or torch tensor,
    a list): tuples of row slices, every epoch a new permutation from `seed` (or ggrad's
    generator). Samplers, workers and collate_fn need a dataset (`TensorDataset(x, y)`).

    `DataLoader(dataset, batch_size=1, shuffle=False, sampler=None, batch_sampler=None,
    num_workers=0, collate_fn=None, drop_last=False, timeout=0, worker_init_fn=None,
    multiprocessing_context=None, generator=None, prefetch_factor=2, persistent_workers=
    False, seed=None)`: as torch's (only `batch_size` may also be positional), over any
    object with `__getitem__` and `__len__`, or an IterableDataset. `collate_fn` makes
    numpy batches (default_collate), turned into tensors here. With `num_workers > 0`
    batches are made in worker processes (Python's default start method, or
    `multiprocessing_context`), batch k by worker k mod num_workers, and yielded in
    order; a worker's exception is raised here with its traceback in the message.
    Workers stop when the iteration ends or is dropped (with `persistent_workers`, when
    the loader is garbage collected). Automatic batching cannot be turned off:
    `batch_size=None` means the default.
    """

    def __init__(self, *data, batch_size: int | None = None, shuffle: bool = False, sampler=None,
                 batch_sampler=None, num_workers: int = 0, collate_fn: Callable | None = None,
                 drop_last: bool = False, timeout: float = 0, worker_init_fn: Callable | None = None,
                 multiprocessing_context=None, generator: np.random.Generator | None = None,
                 prefetch_factor: int = 2, persistent_workers: bool = False, seed: int | None = None) -> None:
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
        if self.arrays is not None and (sampler is not None or batch_sampler is not None or num_workers
                                        or collate_fn is not None):
            raise ValueError("samplers, workers and collate_fn need a dataset (wrap arrays in a TensorDataset)")
        if isinstance(self.dataset, IterableDataset) and (shuffle or sampler is not None or batch_sampler is not None):
            raise ValueError("an IterableDataset is read in its own order: no shuffle or sampler")
        self.batch_size, self.shuffle, self.drop_last = int(batch_size), bool(shuffle), bool(drop_last)
        self.num_workers, self.prefetch_factor, self.timeout = int(num_workers), int(prefetch_factor), timeout
        self.collate_fn = collate_fn or default_collate
        self.worker_init_fn, self.multiprocessing_context = worker_init_fn, multiprocessing_context
        self.persistent_workers = bool(persistent_workers)
        self.generator = _rng(generator, seed)
        self._workers: _Workers | None = None
        if self.dataset is not None and not isinstance(self.dataset, IterableDataset) and batch_sampler is None:
            if sampler is None:
                sampler = RandomSampler(self.dataset, generator=self.generator) if shuffle \
                    else SequentialSampler(self.dataset)
            batch_sampler = BatchSampler(sampler, self.batch_size, self.drop_last)
        self.sampler, self.batch_sampler = sampler, batch_sampler

    def __len__(self) -> int:
        """Batches per epoch; for an IterableDataset, from its `len` (TypeError without one)."""
        if self.arrays is not None:
            n = len(self.arrays[0])
        elif self.batch_sampler is not None:
            return len(self.batch_sampler)
        else:
            n = len(self.dataset)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self) -> Iterator:
        if self.arrays is not None:
            return self._array_batches()
        return self._worker_batches() if self.num_workers else self._batches()

    def _array_batches(self) -> Iterator[tuple[Tensor, ...]]:
        n = len(self.arrays[0])
        order = (self.generator or _global_generator()).permutation(n) if self.shuffle else np.arange(n)
        for i in range(len(self)):
            rows = order[i * self.batch_size:(i + 1) * self.batch_size]
            yield tuple(tensor(a[rows]) for a in self.arrays)

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
            yield _to_tensors(batch)

    def _worker_batches(self) -> Iterator:
        workers = self._workers or _Workers(self)
        if self.persistent_workers:
            self._workers = workers
        try:
            for batch in workers.batches(self._tasks()):
                yield _to_tensors(batch)
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
