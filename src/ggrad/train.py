"""`fit`: the training loop, its metrics, callbacks and the per-epoch `History`.

The running loss and accuracy are sums kept on the device; the progress bar reads them
once per refresh and the epoch summary once per epoch, so a step itself crosses nothing.
A non-finite loss is caught there too: the sum turns non-finite with it, and a counter
on the device says which step it was (read only then).

Under a process group of more than one rank (`ggrad.distributed`), each rank trains on
its shard and the sums and counts are all-reduced once per epoch (and once per
evaluation), so every rank logs the same means, those of one process over all the data.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Callable, Iterable

import numpy as np

from . import distributed as dist
from . import functional as F
from .autograd import grad_tape, no_grad
from .capture import compile
from .data import DataLoader
from .optim import guard
from .optim.lr_scheduler import ReduceLROnPlateau
from .tensor import Tensor, realize, zeros_like


class History:
    """Per-epoch metrics: ``history.history["loss"]``, ``history["val_accuracy"]``..."""

    def __init__(self) -> None:
        self.history: dict[str, list[float]] = {}
        self.epochs: list[int] = []

    def append(self, epoch: int, logs: dict[str, float]) -> None:
        self.epochs.append(epoch)
        for k, v in logs.items():
            self.history.setdefault(k, []).append(v)

    def __getitem__(self, key: str) -> list[float]:
        return self.history[key]

    def plot(self, path: str) -> str:
        """Write the learning curves to `path` (PNG, matplotlib)."""
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        keys = [k for k in self.history if k not in ("lr", "skipped")]
        groups = sorted({k.removeprefix("val_") for k in keys})
        fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 3.5), squeeze=False)
        for ax, name in zip(axes[0], groups):
            for key in (name, f"val_{name}"):
                if key in self.history:
                    ax.plot(self.epochs, self.history[key], marker="o", label=key)
            ax.set_xlabel("epoch")
            ax.set_title(name)
            ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path


class Callback:
    """Hooks of the loop; `on_epoch_end` returning True stops training."""

    def on_train_begin(self, model, optimizer) -> None:
        return None

    def on_epoch_end(self, epoch: int, logs: dict[str, float], model, optimizer) -> bool:
        return False

    def on_train_end(self, model, optimizer) -> None:
        return None


def _improved(value: float, best: float, mode: str, min_delta: float) -> bool:
    return value < best - min_delta if mode == "min" else value > best + min_delta


class EarlyStopping(Callback):
    """Stop when `monitor` has not improved for `patience` epochs; optionally put back
    the best weights."""

    def __init__(self, monitor: str = "val_loss", patience: int = 5, mode: str = "min",
                 min_delta: float = 0.0, restore_best_weights: bool = True) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        self.monitor, self.patience, self.mode, self.min_delta = monitor, patience, mode, min_delta
        self.restore_best_weights = restore_best_weights
        self.best = math.inf if mode == "min" else -math.inf
        self.best_state: dict | None = None
        self.wait = 0
        self.stopped_epoch: int | None = None

    def on_epoch_end(self, epoch, logs, model, optimizer) -> bool:
        if self.monitor not in logs:
            raise KeyError(f"EarlyStopping monitors {self.monitor!r}, the loop logs {sorted(logs)}")
        if _improved(logs[self.monitor], self.best, self.mode, self.min_delta):
            self.best, self.wait = logs[self.monitor], 0
            if self.restore_best_weights:
                self.best_state = {k: v.numpy() for k, v in model.state_dict().items()}
            return False
        self.wait += 1
        if self.wait >= self.patience:
            self.stopped_epoch = epoch
            return True
        return False

    def on_train_end(self, model, optimizer) -> None:
        if self.restore_best_weights and self.best_state is not None:
            model.load_state_dict(self.best_state)


class ModelCheckpoint(Callback):
    """Save the model's state dict to `path` (safetensors) whenever `monitor` improves.

    With `save_optimizer`, one file to resume training from instead: {"model",
    "optimizer", "epoch" (epochs completed), "rng" (`ggrad.get_rng_state()`), and
    "scheduler" when `scheduler` is given (fit does not hand its scheduler to callbacks)}.
    To resume: ``ckpt = ggrad.load(path)``; ``model.load_state_dict(ckpt["model"])``,
    ``optimizer.load_state_dict(ckpt["optimizer"])``, ``scheduler.load_state_dict(
    ckpt["scheduler"])``, ``ggrad.set_rng_state(ckpt["rng"])``, then fit the epochs left.
    Under a process group, rank 0 writes (through `ggrad.save`) and the others wait for it."""

    def __init__(self, path: str, monitor: str = "val_loss", mode: str = "min", save_optimizer: bool = False,
                 scheduler=None) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        if scheduler is not None and not callable(getattr(scheduler, "state_dict", None)):
            raise TypeError(f"scheduler must be an lr scheduler (with state_dict), got {type(scheduler).__name__}")
        if scheduler is not None and not save_optimizer:
            raise ValueError("ModelCheckpoint saves a scheduler only in the resumable checkpoint: "
                             "pass save_optimizer=True too")
        self.path, self.monitor, self.mode, self.save_optimizer = str(path), monitor, mode, bool(save_optimizer)
        self.scheduler = scheduler
        self.best = math.inf if mode == "min" else -math.inf
        self.best_epoch: int | None = None

    def on_epoch_end(self, epoch, logs, model, optimizer) -> bool:
        from .io import save
        value = logs.get(self.monitor)
        if value is None:
            raise KeyError(f"ModelCheckpoint monitors {self.monitor!r}, the loop logs {sorted(logs)}")
        if _improved(value, self.best, self.mode, 0.0):
            self.best, self.best_epoch = value, epoch
            if self.save_optimizer:
                from .random import get_rng_state
                ckpt = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch,
                        "rng": get_rng_state()}
                if self.scheduler is not None:
                    ckpt["scheduler"] = self.scheduler.state_dict()
                save(ckpt, self.path)
            else:
                save(model, self.path)
        return False


class CSVLogger(Callback):
    """Each epoch's logs as a row of a CSV file: "epoch", then the first epoch's keys in
    their order (Keras's CSVLogger). Every row is flushed as it is written, so a run that
    dies keeps the rows of the epochs it finished; `append` continues an existing file
    (its header kept). Under a process group, rank 0 writes (the logs are the same)."""

    def __init__(self, filename: str, separator: str = ",", append: bool = False) -> None:
        self.filename, self.separator, self.append = str(filename), separator, bool(append)
        self.keys: list[str] | None = None
        self._file = None
        self._writer = None

    def on_train_begin(self, model, optimizer) -> None:
        if dist.is_initialized() and dist.get_rank() != 0:
            return
        import csv
        import os
        resume = self.append and os.path.exists(self.filename) and os.path.getsize(self.filename) > 0
        if resume:
            with open(self.filename, newline="") as f:
                self.keys = next(csv.reader(f, delimiter=self.separator))[1:]
        self._file = open(self.filename, "a" if resume else "w", newline="")
        self._writer = csv.writer(self._file, delimiter=self.separator)

    def on_epoch_end(self, epoch, logs, model, optimizer) -> bool:
        if self._writer is None:
            return False
        if self.keys is None:
            self.keys = list(logs)
            self._writer.writerow(["epoch", *self.keys])
        self._writer.writerow([epoch, *(logs.get(key, "NA") for key in self.keys)])
        self._file.flush()
        return False

    def on_train_end(self, model, optimizer) -> None:
        if self._file is not None:
            self._file.close()
            self._file = self._writer = None


class TensorBoard(Callback):
    """Keras's TensorBoard callback for `fit`, writing through `ggrad.utils.tensorboard`
    (tensorboardX): each epoch's logs as scalars (the tags are the logs' keys: loss,
    accuracy, val_loss, lr...; the step is the epoch), a histogram of every parameter each
    `histogram_freq` epochs (0: none; one read of each parameter), and, with
    `example_input`, the model's graph once at the start (`SummaryWriter.add_graph`).
    `log_dir=None` writes under ``runs/<date>_<host>`` as torch's SummaryWriter; `writer`
    logs into a SummaryWriter of your own instead (left open). Under a process group,
    rank 0 writes (the logs are the same)."""

    def __init__(self, log_dir: str | None = None, histogram_freq: int = 1, write_graph: bool = True,
                 example_input=None, writer=None) -> None:
        if histogram_freq < 0:
            raise ValueError(f"histogram_freq must be >= 0, got {histogram_freq}")
        if writer is not None and log_dir is not None:
            raise ValueError("pass log_dir or writer, not both")
        self.log_dir, self.histogram_freq, self.write_graph = log_dir, int(histogram_freq), bool(write_graph)
        self.example_input = example_input
        self.writer, self._own = writer, writer is None

    def on_train_begin(self, model, optimizer) -> None:
        if dist.is_initialized() and dist.get_rank() != 0:
            return
        if self._own:
            from .utils.tensorboard import SummaryWriter
            self.writer = SummaryWriter(self.log_dir)
        if self.write_graph and self.example_input is not None:
            self.writer.add_graph(model, self.example_input)

    def on_epoch_end(self, epoch, logs, model, optimizer) -> bool:
        if self.writer is None:
            return False
        for key, value in logs.items():
            self.writer.add_scalar(key, value, epoch)
        if self.histogram_freq and epoch % self.histogram_freq == 0:
            for name, p in model.named_parameters():
                self.writer.add_histogram(name, p, epoch)
        self.writer.flush()
        return False

    def on_train_end(self, model, optimizer) -> None:
        if self.writer is not None and self._own:
            self.writer.close()
            self.writer = None


def _as_loader(data, batch_size: int, shuffle: bool) -> DataLoader | None:
    if data is None or isinstance(data, DataLoader):
        return data
    if isinstance(data, (tuple, list)):
        return DataLoader(*data, batch_size=batch_size, shuffle=shuffle)
    raise TypeError(f"data must be a DataLoader or a tuple of arrays, got {type(data).__name__}")


def _correct(output: Tensor, target: Tensor) -> Tensor:
    """How many rows' argmax equals the class target (a float on the device)."""
    if not target.dtype.is_floating_point:
        return (F.one_hot(target, output.shape[-1]) * F.one_hot_argmax(output.detach())).sum()
    return (F.one_hot_argmax(target.detach()) * F.one_hot_argmax(output.detach())).sum()


def _device_zeros(like: Tensor, shape: tuple = ()) -> Tensor:
    """Zeros made on the device (nothing uploaded), kept in the persistent pool."""
    z = F.broadcast_to(F.reshape(zeros_like(like), (1,) * len(shape)), shape) if shape else zeros_like(like)
    z.node.scope = "persistent"
    return z


class _Totals:
    """Batch-size-weighted loss and correct predictions, summed in place on the device
    (the same buffers every batch, so a captured step adds into them); read once.

    `watch`: count the steps before the loss sum turned non-finite (which step went bad:
    read only when it did). `skip`: steps whose `ok` flag is false add nothing; the skipped
    rows and steps are counted."""

    def __init__(self, accuracy: bool, watch: bool = False, skip: bool = False) -> None:
        self.accuracy = accuracy
        self.loss = Tensor(np.zeros((), np.float32))
        self.correct = Tensor(np.zeros((), np.float32)) if accuracy else None
        self.finite_steps = _device_zeros(self.loss) if watch else None
        self.skipped = _device_zeros(self.loss, (2,)) if skip else None  # rows, steps
        self.count = 0

    def add(self, output: Tensor, target: Tensor, loss: Tensor, ok: Tensor | None = None) -> None:
        rows = float(output.shape[0])
        loss = loss.detach().reshape(()) * rows
        correct = _correct(output, target) if self.accuracy else None
        if ok is not None:
            loss = F.where(ok, loss, 0.0)
            correct = None if correct is None else F.where(ok, correct, 0.0)
            bad = F.cat([F.reshape(F.where(ok, 0.0, rows), (1,)), F.reshape(F.where(ok, 0.0, 1.0), (1,))])
            self.skipped += bad
        self.loss += loss
        if correct is not None:
            self.correct += correct
        if self.finite_steps is not None:
            self.finite_steps += F.isfinite(self.loss)

    def reset(self) -> None:
        for t in self.tensors():
            t.zero_()
        self.count = 0

    def tensors(self) -> list[Tensor]:
        return [t for t in (self.loss, self.correct, self.finite_steps, self.skipped) if t is not None]

    def all_reduce(self) -> None:
        """Sum the totals over the ranks in place, so that every rank logs the means over
        all ranks' rows. Skipped steps are the most any rank skipped (DDP averages a
        non-finite gradient into every rank: all skip the same steps); `finite_steps`
        stays this rank's, as it names one of its steps."""
        count = Tensor(np.array(self.count, np.int32))
        dist.all_reduce_coalesced([t for t in (self.loss, self.correct, count) if t is not None])
        self.count = int(count.item())
        if self.skipped is not None:
            rows, steps = (Tensor(np.array(v, np.float32)) for v in self.skipped.numpy())
            dist.all_reduce(rows)
            dist.all_reduce(steps, "max")
            self.skipped.assign_(np.array([rows.item(), steps.item()], np.float32))

    def mean_loss(self) -> float:
        return self.loss.item() / self.count

    def logs(self, where: str) -> dict:
        if self.count == 0:
            raise ValueError(f"{where}: the data has no batch (drop_last with fewer rows than a batch?)")
        count, skipped = self.count, None
        if self.skipped is not None:
            rows, skipped = (int(v) for v in self.skipped.numpy())
            count -= rows
            if count == 0:
                raise RuntimeError(f"{where}: every step of the epoch had a non-finite loss or gradients and "
                                   "was skipped; run a step under ggrad.detect_anomaly() to find the "
                                   "operation that makes them")
        logs = {"loss": self.loss.item() / count}
        if self.accuracy:
            logs["accuracy"] = self.correct.item() / count
        if skipped is not None:
            logs["skipped"] = skipped
        return logs

    def check_finite(self, loss: float, label: str) -> None:
        """Raise (on_nonfinite="raise") if the running loss `loss`, just read, is not finite."""
        if self.finite_steps is None or math.isfinite(loss):
            return
        step = int(self.finite_steps.item()) + 1
        raise RuntimeError(
            f"fit: the loss of step {step} of {label} was not finite ({loss}); training stopped "
            "(on_nonfinite='raise'). The steps after it ran on non-finite values: the weights are "
            "probably not finite now, so reload a checkpoint. To find the operation that made the "
            "first NaN, run a step under `with ggrad.detect_anomaly():`; check the data for NaN and "
            "inf, try a lower learning rate, or pass on_nonfinite='skip' to skip such steps.")


def evaluate(model, loss_fn: Callable, data, metrics: Iterable[str] = ("loss",), batch_size: int = 256) -> dict:
    """Mean loss (and accuracy) over `data`, read from the device once.

    Under a process group of more than one rank it is collective (call it on every rank):
    a loader that shards itself (arrays, or a DataLoader made under the group) is read as
    each rank's rows r, r + N, ... without DistributedSampler's padding, and the sums are
    all-reduced, so every rank gets the mean over every row once, as one process would."""
    loader = _as_loader(data, batch_size, False)
    ranks = dist.group.size_or_one()
    if ranks > 1:
        loader = loader._rank_share()
    model.eval()
    totals = _Totals("accuracy" in metrics)
    with no_grad():
        for x, y in loader:
            out = model(x)
            totals.add(out, y, loss_fn(out, y))
            totals.count += x.shape[0]
            realize(*totals.tensors())  # one batch a graph
    if ranks > 1:
        totals.all_reduce()
    return totals.logs("evaluate")


def fit(model, loss_fn: Callable, optimizer, train_data, epochs: int, val_data=None, scheduler=None,
        callbacks: Iterable[Callback] = (), metrics: Iterable[str] = ("loss",), batch_size: int = 32,
        scheduler_interval: str = "epoch", verbose: int = 1, on_nonfinite: str = "raise") -> History:
    """Train `model` for `epochs` epochs; returns the per-epoch metrics as a History.

    `train_data` / `val_data`: DataLoaders or tuples of arrays (then batched by
    `batch_size`, shuffled for training). `metrics` may add "accuracy". The scheduler
    steps per "epoch" (ReduceLROnPlateau with the monitored loss) or per "step".

    `on_nonfinite`: what a step whose loss is NaN or inf does.
      "raise" (default): fit stops with a RuntimeError naming the epoch and step. It is
        seen where fit reads the running loss anyway (each progress-bar refresh and the
        end of each epoch: no extra crossing per step), so the steps after it in that
        epoch have run. A step with a finite loss but non-finite gradients is caught one
        step later, through the loss its non-finite weights give.
      "skip": a step whose loss or gradients are not finite changes nothing: a select on
        the device keeps every parameter and every optimizer state tensor as it was (a
        state tensor the step made, e.g. Adam's moments on the first step, starts at
        zeros; the optimizer's own step count still counts it), and its rows leave the
        epoch's mean loss and accuracy. `history["skipped"]` counts the skipped steps of
        each epoch (one extra 8-byte read per epoch); an epoch with every step skipped
        raises. Guarding a step costs a copy of the parameters and optimizer state.

    Under a process group of more than one rank, call it on every rank with the same
    arguments (the model wrapped in `DistributedDataParallel`): a DataLoader that fit makes
    from arrays gives each rank its shard (see `DataLoader`), the epoch's loss and accuracy
    are summed over the ranks and validation is shared out (see `evaluate`), so every rank
    logs and returns the same History and callbacks decide alike; the progress bar and the
    per-epoch line are rank 0's, and `ggrad.save` (so `ModelCheckpoint`) writes on rank 0.
    """
    metrics = tuple(metrics)
    if on_nonfinite not in ("raise", "skip"):
        raise ValueError(f"on_nonfinite must be 'raise' or 'skip', got {on_nonfinite!r}")
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    if scheduler_interval not in ("epoch", "step"):
        raise ValueError(f"scheduler_interval must be 'epoch' or 'step', got {scheduler_interval!r}")
    unknown = set(metrics) - {"loss", "accuracy"}
    if unknown:
        raise ValueError(f"unknown metrics {sorted(unknown)}; ggrad.fit knows 'loss' and 'accuracy'")
    train_loader = _as_loader(train_data, batch_size, True)
    val_loader = _as_loader(val_data, batch_size, False)
    callbacks = list(callbacks)
    history = History()
    for cb in callbacks:
        cb.on_train_begin(model, optimizer)
    ranks = dist.group.size_or_one()
    first = ranks == 1 or dist.get_rank() == 0
    show = verbose > 0 and first and sys.stderr.isatty()
    skip = on_nonfinite == "skip"
    totals = _Totals("accuracy" in metrics, watch=not skip, skip=skip)
    step = _train_step(model, loss_fn, optimizer, totals, skip)
    for epoch in range(1, epochs + 1):
        logs = _train_epoch(model, step, totals, train_loader, scheduler, scheduler_interval, show,
                            f"epoch {epoch}/{epochs}", ranks > 1)
        if val_loader is not None:
            logs.update({f"val_{k}": v for k, v in evaluate(model, loss_fn, val_loader, metrics).items()})
        logs["lr"] = optimizer.lr
        history.append(epoch, logs)
        if verbose > 0 and first:
            print(f"epoch {epoch}/{epochs}: " + ", ".join(f"{k} {v:.4g}" for k, v in logs.items()), flush=True)
        if scheduler is not None and scheduler_interval == "epoch":
            if isinstance(scheduler, ReduceLROnPlateau):
                scheduler.step(logs.get("val_loss", logs["loss"]))
            else:
                scheduler.step()
        stop = [cb.on_epoch_end(epoch, logs, model, optimizer) for cb in callbacks]
        if any(stop):
            break
    for cb in callbacks:
        cb.on_train_end(model, optimizer)
    return history


def _train_step(model, loss_fn, optimizer, totals: _Totals, skip: bool = False):
    """One batch: forward, backward, update, running sums; captured by `compile` and
    replayed (one dispatch, no Python per op) while the batch shape stays the same."""
    def train_step(x: Tensor, y: Tensor) -> None:
        with grad_tape():
            out = model(x)
            loss = loss_fn(out, y)
            loss.backward()
        ok = None
        if skip:
            with no_grad():
                ok = guard.finite_flag(optimizer, loss)
            guard.step_unless(ok, optimizer)
        else:
            optimizer.step()
        optimizer.zero_grad()
        totals.add(out, y, loss, ok)
    return compile(train_step)


def _train_epoch(model, step, totals: _Totals, loader, scheduler, interval, show, label, reduce: bool) -> dict:
    from tqdm import tqdm

    model.train()
    totals.reset()
    last_read = time.monotonic()
    bar = tqdm(total=len(loader), desc=label, disable=not show, leave=False)
    for x, y in loader:
        step(x, y)
        totals.count += x.shape[0]
        if scheduler is not None and interval == "step":
            scheduler.step()
        bar.update(1)
        if show and time.monotonic() - last_read > 0.5:  # one 4-byte read per refresh
            loss = totals.mean_loss()
            if not reduce:  # ranks raise together, at the epoch's end: none is left waiting for another
                totals.check_finite(loss, label)
            bar.set_postfix(loss=f"{loss:.4f}")
            last_read = time.monotonic()
    bar.close()
    if reduce:
        totals.all_reduce()
    logs = totals.logs("fit")
    totals.check_finite(logs["loss"], label)
    return logs
