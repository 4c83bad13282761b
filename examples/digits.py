"""The main job: train an MLP on scikit-learn's digits on the default device (the GPU
when there is one, else the CPU), report test accuracy, crossings per step and speed,
write runs/digits/ (learning curve and checkpoint), reload it and check the accuracy.

    make demo            (or: .venv/bin/python examples/digits.py [--epochs N] [--device NAME])
"""

from __future__ import annotations

import argparse
import os
import time

import matplotlib
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import ggrad
import ggrad.functional as F
from ggrad import nn
from ggrad.optim import Adam
from ggrad.optim.lr_scheduler import CosineAnnealingLR

matplotlib.use("Agg")
import matplotlib.pyplot  # noqa: E402,F401  before ggml starts CUDA: importing it after failed on the H200 host


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.1),
                         nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=int(os.environ.get("GGRAD_DEMO_EPOCHS", 30)))
    ap.add_argument("--device", default="gpu" if ggrad.gpu_available() else "cpu")
    ap.add_argument("--out", default="runs/digits")
    args = ap.parse_args()

    ggrad.set_device(args.device)
    ggrad.manual_seed(0)
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.2, random_state=0,
                                                        stratify=digits.target)
    mean, std = x_train.mean(0), x_train.std(0)
    std[std < 1e-3] = 1.0  # pixels that are blank in every training image stay as they are
    x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    print(f"digits: {len(x_train)} train, {len(x_test)} test; device {ggrad.get_device()}")

    model = make_model()
    opt = Adam(model.parameters(), lr=2e-3)
    train = ggrad.DataLoader(x_train, y_train, batch_size=32, shuffle=True, seed=0)
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
    print(f"test accuracy {accuracy:.4f}")
    print(f"{steps / seconds:.0f} steps/s; {t.crossings} host<->device crossings in {steps} steps "
          f"({t.crossings / steps:.2f} per step: each fresh batch's upload and the metric reads once per "
          f"epoch; the CPU device's memory is the host's, so there it is 0)")
    curve = history.plot(os.path.join(args.out, "curve.png"))
    print(f"wrote {curve} and {checkpoint}")

    reloaded = make_model()
    reloaded.load_state_dict(ggrad.load(checkpoint))
    again = ggrad.evaluate(reloaded, F.cross_entropy, (x_test, y_test), metrics=("accuracy",))["accuracy"]
    best = max(history["val_accuracy"])
    print(f"reloaded checkpoint: test accuracy {again:.4f} (best epoch {best:.4f})")
    if abs(again - best) > 1e-6:
        raise SystemExit("the reloaded checkpoint does not reproduce the saved accuracy")


if __name__ == "__main__":
    main()
