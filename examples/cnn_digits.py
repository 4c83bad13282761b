"""A LeNet-style CNN on scikit-learn's digits (8x8 images): two convolutions with batch
norm, max pooling, global average pooling and a linear head, trained by `ggrad.fit`
(one compiled graph per step) on the default device; prints the test accuracy.

    .venv/bin/python examples/cnn_digits.py [--epochs N] [--device NAME]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import ggrad
import ggrad.functional as F
from ggrad import nn
from ggrad.optim import Adam
from ggrad.optim.lr_scheduler import CosineAnnealingLR


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),   # 16 x 8 x 8
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),  # 32 x 8 x 8
        nn.MaxPool2d(2),                                                 # 32 x 4 x 4
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),                      # 64 x 4 x 4
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(64, 10))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--device", default="gpu" if ggrad.gpu_available() else "cpu")
    args = ap.parse_args()

    ggrad.set_device(args.device)
    ggrad.manual_seed(0)
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]  # (N, 1, 8, 8)
    x_train, x_test, y_train, y_test = train_test_split(images, digits.target, test_size=0.2, random_state=0,
                                                        stratify=digits.target)
    mean, std = x_train.mean(), x_train.std()
    x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    print(f"digits: {len(x_train)} train, {len(x_test)} test images of 1x8x8; device {ggrad.get_device()}")

    model = make_model()
    opt = Adam(model.parameters(), lr=3e-3)
    train = ggrad.DataLoader(x_train, y_train, batch_size=32, shuffle=True, seed=0)
    start = time.perf_counter()
    ggrad.fit(model, F.cross_entropy, opt, train, epochs=args.epochs, metrics=("loss", "accuracy"),
              scheduler=CosineAnnealingLR(opt, T_max=args.epochs), verbose=1)
    seconds = time.perf_counter() - start
    accuracy = ggrad.evaluate(model, F.cross_entropy, (x_test, y_test), metrics=("accuracy",))["accuracy"]
    print(f"test accuracy {accuracy:.4f}; {args.epochs * len(train) / seconds:.0f} steps/s")


if __name__ == "__main__":
    main()
