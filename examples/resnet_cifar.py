"""A ResNet-18-style network (BasicBlocks, batch norm, stride-2 downsampling) trained by
`ggrad.fit` on a synthetic CIFAR-shaped set (3x32x32 images, 10 classes) on the default
device; prints the test accuracy. `resnet(nn)` takes torch.nn as well (bench/train_step.py
times both).

    .venv/bin/python examples/resnet_cifar.py [--width 64] [--train 2048] [--epochs 4] [--device NAME]
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def resnet(nn, width: int = 64, stages: tuple = (2, 2, 2, 2), classes: int = 10):
    """ResNet-18's layout for 32x32 images (CIFAR's stem: one 3x3 convolution, no pooling),
    built from `nn` (ggrad.nn or torch.nn): `width` channels in the first stage, doubled
    and the image halved at each next one."""
    relu = nn.functional.relu

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.shortcut = nn.Sequential() if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            out = relu(self.bn1(self.conv1(x)))
            return relu(self.bn2(self.conv2(out)) + self.shortcut(x))

    layers = [nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
    cin = width
    for i, blocks in enumerate(stages):
        cout = width << i
        for j in range(blocks):
            layers.append(BasicBlock(cin, cout, 2 if i and not j else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def synthetic_cifar(n: int, seed: int = 0, classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """n images (N, 3, 32, 32) float32 and their labels: each class a smooth random pattern
    (a coarse 4x4 grid per channel, upsampled), shifted by up to 4 pixels and noised, so
    that a convolutional network has something to learn and cannot just memorise pixels."""
    rng = np.random.default_rng(seed)
    patterns = np.kron(rng.standard_normal((classes, 3, 4, 4)), np.ones((1, 1, 8, 8)))
    labels = rng.integers(0, classes, n)
    shifts = rng.integers(-4, 5, (n, 2))
    images = np.stack([np.roll(patterns[c], tuple(s), axis=(1, 2)) for c, s in zip(labels, shifts)])
    images += 1.5 * rng.standard_normal(images.shape)
    return images.astype(np.float32), labels


def main() -> None:
    import ggrad
    import ggrad.functional as F
    from ggrad import nn
    from ggrad.optim import SGD
    from ggrad.optim.lr_scheduler import OneCycleLR

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--train", type=int, default=2048)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--device", default="gpu" if ggrad.gpu_available() else "cpu")
    args = ap.parse_args()

    ggrad.set_device(args.device)
    ggrad.manual_seed(0)
    x, y = synthetic_cifar(args.train + 512)
    x_train, y_train, x_test, y_test = x[:args.train], y[:args.train], x[args.train:], y[args.train:]
    model = resnet(nn, args.width)
    opt = SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4, nesterov=True)
    steps = args.epochs * -(-args.train // args.batch)
    sched = OneCycleLR(opt, max_lr=0.1, total_steps=steps)
    start = time.perf_counter()
    history = ggrad.fit(model, F.cross_entropy, opt, ggrad.DataLoader(x_train, y_train, batch_size=args.batch,
                                                                       shuffle=True, seed=0),
                        epochs=args.epochs, val_data=(x_test, y_test), metrics=("loss", "accuracy"),
                        scheduler=sched, scheduler_interval="step", batch_size=args.batch)
    print(f"{sum(p.numel() for p in model.parameters()):,} parameters, {time.perf_counter() - start:.1f} s on "
          f"{ggrad.get_device()}: test accuracy {history['val_accuracy'][-1]:.3f}")


if __name__ == "__main__":
    main()
