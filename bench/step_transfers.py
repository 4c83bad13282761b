"""Crossings and dispatches per training step of a 3-layer MLP, a small CNN and a 2-layer
LSTM, on every device.

    GGML_VK_VISIBLE_DEVICES=0 .venv/bin/python bench/step_transfers.py

Counts come from ggrad's transfer and dispatch counters (runtime/transfers.py), after
two warm-up steps that upload the weights and build the optimizer state.
"""

from __future__ import annotations

import functools

import numpy as np

import ggrad
import ggrad.functional as F
from ggrad.optim import Adam


def mlp(params, x):
    w1, b1, w2, b2, w3, b3 = params
    h = F.relu(x @ w1.T + b1)
    h = F.relu(h @ w2.T + b2)
    return h @ w3.T + b3


def measure(device: str) -> list[tuple[str, int, int]]:
    ggrad.set_device(device)
    rng = np.random.default_rng(0)
    sizes = [(64, 32), (64, 64), (10, 64)]
    params = []
    for out_f, in_f in sizes:
        params += [ggrad.param(rng.standard_normal((out_f, in_f)) / np.sqrt(in_f)), ggrad.param(np.zeros(out_f))]
    opt = Adam(params, lr=1e-3)
    x = ggrad.tensor(rng.standard_normal((128, 32)))  # uploaded once, reused every step
    y = ggrad.tensor(rng.integers(0, 10, 128))

    def step(read_loss: bool, do_step: bool = True, do_backward: bool = True):
        with ggrad.grad_tape():
            loss = F.cross_entropy(mlp(params, x), y)
            if do_backward:
                loss.backward()
        if do_step:
            opt.step()
            opt.zero_grad()
        if read_loss:
            loss.item()
        ggrad.realize()

    @ggrad.compile
    def compiled(x, y):
        with ggrad.grad_tape():
            loss = F.cross_entropy(mlp(params, x), y)
            loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    def replay(read_loss: bool):
        loss = compiled(x, y)
        if read_loss:
            loss.item()

    for _ in range(2):
        step(read_loss=True)
        replay(read_loss=True)
    rows = []
    cases = [
        ("forward, loss read", dict(read_loss=True, do_step=False, do_backward=False)),
        ("forward+backward, loss read", dict(read_loss=True, do_step=False)),
        ("forward+backward+step, loss not read", dict(read_loss=False)),
        ("forward+backward+step, loss read", dict(read_loss=True)),
    ]
    runs = [(name, functools.partial(step, **kwargs)) for name, kwargs in cases] + [
        ("ggrad.compile'd step, loss not read", functools.partial(replay, False)),
        ("ggrad.compile'd step, loss read", functools.partial(replay, True)),
    ]
    for name, run in runs:
        counts = []
        for _ in range(5):
            with ggrad.count_transfers() as t:
                run()
            counts.append((t.crossings, t.dispatches))
        rows.append((name, *max(counts)))
    for p in params:
        p.grad = None
    ggrad.set_device("cpu")
    return rows


def cnn():
    from ggrad import nn
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def lstm():
    from ggrad import nn

    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm, self.head = nn.LSTM(12, 16, num_layers=2, batch_first=True), nn.Linear(16, 10)

        def forward(self, x):
            return self.head(self.lstm(x)[0][:, -1])
    return Tagger()


def measure_model(device: str, name: str, make, sample: tuple) -> list[tuple[str, int, int]]:
    """A module trained by a compiled step and by an eager one, the batch already on the device."""
    ggrad.set_device(device)
    ggrad.manual_seed(0)
    rng = np.random.default_rng(0)
    model = make()
    opt = Adam(model.parameters(), lr=1e-3)
    x = ggrad.tensor(rng.standard_normal((32,) + sample).astype(np.float32))
    y = ggrad.tensor(rng.integers(0, 10, 32))

    def train(x, y):
        with ggrad.grad_tape():
            loss = F.cross_entropy(model(x), y)
            loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    compiled = ggrad.compile(train)
    rows = []
    for label, run in ((f"{name}: eager step, loss not read", train),
                       (f"{name}: ggrad.compile'd step, loss not read", compiled)):
        for _ in range(3):
            run(x, y)
        ggrad.realize()
        with ggrad.count_transfers() as t:
            run(x, y)
            ggrad.realize()
        rows.append((label, t.crossings, t.dispatches))
    ggrad.set_device("cpu")
    return rows


def main() -> None:
    names = ["cpu"] + [d.name for d in ggrad.devices() if d.kind != "cpu"]
    print("| device | step | crossings | dispatches |")
    print("| --- | --- | --- | --- |")
    for name in names:
        for case, crossings, dispatches in (measure(name) + measure_model(name, "CNN", cnn, (1, 12, 12))
                                          + measure_model(name, "2-layer LSTM", lstm, (8, 12))):
            print(f"| {name} | {case} | {crossings} | {dispatches} |")


if __name__ == "__main__":
    main()
