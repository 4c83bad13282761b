"""The main job: train an MLP on scikit-learn's digits on the default device (the GPU
when there is one, else the CPU), report test accuracy, crossings per step and speed,
write runs/digits/ (learning curve and checkpoint), reload it and check the accuracy.

    make demo            (or: .venv/bin/python examples/digits.py [--epochs N] [--device NAME])

With `--ranks N` it starts itself N times under mpiexec (`python -m ggrad.distributed.run`;
`mpiexec -n N python examples/digits.py` works too) and trains data-parallel: the model in
DistributedDataParallel, each rank its shard of every batch, rank 0 printing and writing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import matplotlib
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import ggrad
import ggrad.functional as F
from ggrad import distributed as dist
from ggrad import nn
from ggrad.optim import Adam
from ggrad.optim.lr_scheduler import CosineAnnealingLR

matplotlib.use("Agg")
import matplotlib.pyplot  # noqa: E402,F401  before ggml starts CUDA: importing it after failed on the H200 host


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.1),
                         nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))


def under_mpiexec() -> bool:
    """Started by mpiexec with others (MPICH's and Open MPI's launchers say so in the environment)."""
    return int(os.environ.get("PMI_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))) > 1


def relaunch(ranks: int) -> None:
    """This script again, `ranks` times under mpiexec (where --ranks starts nothing more),
    the cores shared out between the ranks' ggml threads."""
    os.environ.setdefault("GGRAD_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // ranks)))
    os.execv(sys.executable, [sys.executable, "-m", "ggrad.distributed.run", "-n", str(ranks), __file__,
                              *sys.argv[1:]])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=int(os.environ.get("GGRAD_DEMO_EPOCHS", 30)))
    ap.add_argument("--device", help="default: the GPU when there is one (under mpiexec: the local rank's), else cpu")
    ap.add_argument("--out", default="runs/digits")
    ap.add_argument("--ranks", type=int, default=1, help="processes to train data-parallel (mpiexec)")
    args = ap.parse_args()
    if args.ranks > 1 and not under_mpiexec():
        relaunch(args.ranks)

    ranks, rank = 1, 0
    if under_mpiexec():
        dist.init_process_group()  # takes the local rank's GPU, if any
        ranks, rank = dist.get_world_size(), dist.get_rank()
    if args.device or ranks == 1:
        ggrad.set_device(args.device or ("gpu" if ggrad.gpu_available() else "cpu"))
    ggrad.manual_seed(rank)  # dropout's masks differ between ranks; the weights are rank 0's (DDP)
    say = print if rank == 0 else (lambda *a, **k: None)
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.2, random_state=0,
                                                        stratify=digits.target)
    mean, std = x_train.mean(0), x_train.std(0)
    std[std < 1e-3] = 1.0  # pixels that are blank in every training image stay as they are
    x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    say(f"digits: {len(x_train)} train, {len(x_test)} test; device {ggrad.get_device()}"
        + (f"; {ranks} ranks" if ranks > 1 else ""))

    model = make_model()
    opt = Adam(model.parameters(), lr=2e-3)
    if ranks > 1:
        model = dist.DistributedDataParallel(model)
    # Each rank takes 32 // N rows a step and DDP averages their gradients: the steps are
    # those of one process with batch 32 (as many per epoch, with the same gradient scale,
    # so the same learning rate and schedule), and only the order of the rows differs.
    # 32 rows per rank would halve the steps per epoch and need the learning rate retuned.
    # Built under the process group, the loader gives each rank its shard.
    train = ggrad.DataLoader(x_train, y_train, batch_size=32 // ranks, shuffle=True, seed=0)
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
    checkpoint = os.path.join(args.out, "model.safetensors")
    with ggrad.count_transfers() as t:
        start = time.perf_counter()
        history = ggrad.fit(model, F.cross_entropy, opt, train, epochs=args.epochs,
                            val_data=(x_test, y_test), metrics=("loss", "accuracy"),
                            scheduler=CosineAnnealingLR(opt, T_max=args.epochs),
                            callbacks=[ggrad.ModelCheckpoint(checkpoint, monitor="val_accuracy", mode="max")],
                            verbose=1)
        seconds = time.perf_counter() - start
    steps = args.epochs * len(train)
    accuracy = ggrad.evaluate(model, F.cross_entropy, (x_test, y_test), metrics=("accuracy",))["accuracy"]
    say(f"test accuracy {accuracy:.4f}")
    say(f"{steps / seconds:.0f} steps/s; {t.crossings} host<->device crossings in {steps} steps "
        f"({t.crossings / steps:.2f} per step: each fresh batch's upload and the metric reads once per "
        f"epoch; the CPU device's memory is the host's, so there it is 0)")
    if rank == 0:
        curve = history.plot(os.path.join(args.out, "curve.png"))
        print(f"wrote {curve} and {checkpoint}")

    reloaded = make_model()  # on every rank: evaluate is collective under a process group
    # a DDP model's state dict has its keys under "module.", as torch's
    reloaded.load_state_dict({k.removeprefix("module."): v for k, v in ggrad.load(checkpoint).items()})
    again = ggrad.evaluate(reloaded, F.cross_entropy, (x_test, y_test), metrics=("accuracy",))["accuracy"]
    best = max(history["val_accuracy"])
    say(f"reloaded checkpoint: test accuracy {again:.4f} (best epoch {best:.4f})")
    if abs(again - best) > 1e-6:
        raise SystemExit("the reloaded checkpoint does not reproduce the saved accuracy")


if __name__ == "__main__":
    main()
