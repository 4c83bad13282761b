"""Worker processes that load batches ahead, in order, as torch's DataLoader's."""

from __future__ import annotations

import multiprocessing
import itertools
import pickle
import random
import signal
import sys
import traceback
import types
import weakref
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Callable, Iterator

import numpy as np

from ..random import generator as _global_generator, manual_seed
from ..tensor import Tensor
from .collate import _Fetcher


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


def _device_tensor_in(dataset, budget: int = 10_000, per_container: int = 1_000) -> tuple[str, Tensor] | None:
    """Where `dataset` holds a ggrad tensor that lives on a device other than the CPU (a
    path such as "dataset.x[2]", and the tensor), looking through attributes, lists,
    tuples and dicts breadth-first: at most `budget` objects, and the first
    `per_container` of each container (a huge list of samples is not walked whole).
    None when none is found."""
    queue, seen = [("dataset", dataset)], set()
    for path, value in itertools.islice(queue, budget):
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, Tensor):
            if value.device != "cpu":
                return path, value
        else:
            queue += itertools.islice(_members(path, value), per_container)
    return None


def _members(path: str, value) -> Iterator[tuple[str, Any]]:
    """What a dict, list, tuple or plain object holds, with the path to each."""
    if isinstance(value, dict):
        yield from ((f"{path}[{k!r}]", v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        yield from ((f"{path}[{i}]", v) for i, v in enumerate(value))
    elif hasattr(value, "__dict__") and not isinstance(value, (type, types.ModuleType)) and not callable(value):
        yield from ((f"{path}.{k}", v) for k, v in vars(value).items())


def _refuse_device_tensors(dataset, context) -> None:
    """A forked worker inherits the parent's Vulkan (or CUDA) handles but not the driver's
    state behind them: reading one crashes the worker or returns another batch's data.
    torch refuses CUDA tensors in forked workers; so does this, before forking."""
    if context.get_start_method() != "fork":
        return
    found = _device_tensor_in(dataset)
    if found is not None:
        path, t = found
        raise RuntimeError(f"DataLoader workers are forked processes, and {path} is a ggrad tensor on "
                           f"{t.device}: a forked process cannot use that device (its driver's state does "
                           "not survive the fork). Keep the dataset's data on the host (numpy arrays, or "
                           "TensorDataset, which copies tensors there) and let the loader move each "
                           "batch, or use num_workers=0")


def _death(process) -> str:
    """How a worker ended, as torch says it: its exit code, or the signal that killed it."""
    process.join(1)  # its pipe broke as it exited: reap it to read how
    code = process.exitcode
    if code is None:
        how = "closed its pipe while still running"
    elif code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:  # a real-time signal has no name
            name = str(-code)
        how = f"was killed by signal {name} ({signal.strsignal(-code)})"
    else:
        how = f"exited unexpectedly with exit code {code}"
    return f"{process.name} (pid {process.pid}) {how}"


class _Workers:
    """`num_workers` processes, each with its own pipe. Batch k of an epoch goes to worker
    k mod n (its shard); results are read as they arrive and kept until their turn, so at
    most `prefetch_factor` batches per worker are ahead in flight or in host memory."""

    def __init__(self, dataset, fetcher: _Fetcher, count: int, prefetch_factor: int, timeout: float,
                 context=None, generator: np.random.Generator | None = None,
                 worker_init_fn: Callable | None = None) -> None:
        """`count` workers over `dataset`, each making batches with `fetcher`; the rest
        has DataLoader's meaning (the loader passes its own)."""
        if context is None or isinstance(context, str):
            context = multiprocessing.get_context(context)
        _refuse_device_tensors(dataset, context)
        # spawn() leaves the generator's stream alone: the shuffle is the same with and without workers
        base_seed = int((generator or _global_generator()).spawn(1)[0].integers(2**62))
        self.timeout, self.ahead = timeout, count * prefetch_factor
        self.conns, self.processes, self.epoch = [], [], 0
        for i in range(count):
            mine, theirs = context.Pipe()
            info = WorkerInfo(i, count, base_seed + i, dataset)
            process = context.Process(target=_worker_loop, daemon=True, name=f"DataLoader worker {i}",
                                      args=(theirs, fetcher, info, worker_init_fn))
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
                try:
                    self.conns[worker].send((epoch, sent, indices))
                except OSError:  # the worker is gone (a broken or reset pipe)
                    raise RuntimeError(_death(self.processes[worker])) from None
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
                raise RuntimeError(_death(process))
            if epoch == self.epoch:
                ready[task] = kind, payload
