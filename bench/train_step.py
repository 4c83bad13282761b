"""One training step, ggrad against PyTorch in the same process: same model, same data,
Adam, fp32. Prints a table of median step times and the ratio ggrad / PyTorch.

    .venv/bin/python bench/train_step.py --device cpu --models mlp-small mlp-mnist
    python3 bench/train_step.py --device cuda --torch-device cuda      (GPU host)

Each step feeds a fresh batch from host memory (a data loader), runs forward, backward
and Adam (fused on both sides), and does not read the loss. ggrad's step is
`ggrad.compile`d (captured once, replayed); `--eager` also times it without. Times are
medians of blocks of steps after a warm-up, ggrad's and PyTorch's blocks alternating (a
noisy machine slows both alike); GPU work is synchronised at the end of each block.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

def mlp(nn, sizes):
    layers = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers += [nn.Linear(n_in, n_out)] + ([nn.ReLU()] if i < len(sizes) - 2 else [])
    return nn.Sequential(*layers)


def cnn(nn):
    """PyTorch's MNIST example without dropout: conv-conv-pool-linear on 1x28x28."""
    return nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64 * 12 * 12, 10))


# name: (model of a torch.nn-like namespace, input shape of one sample, classes, batch)
MODELS = {
    "mlp-small": (lambda nn: mlp(nn, [64, 64, 64, 10]), (64,), 10, 64),
    "mlp-mnist": (lambda nn: mlp(nn, [784, 512, 512, 10]), (784,), 10, 128),
    "mlp-large": (lambda nn: mlp(nn, [1024, 4096, 4096, 1024]), (1024,), 1024, 512),
    "cnn": (cnn, (1, 28, 28), 10, 128),
}


def batches(sample, classes, batch, n=8, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((batch,) + sample).astype(np.float32),
             rng.integers(0, classes, batch).astype(np.int64)) for _ in range(n)]


def torch_model(name, seed=0):
    """The model with torch's default initialisation from a fixed seed (ggrad loads it)."""
    import torch
    torch.manual_seed(seed)
    return MODELS[name][0](torch.nn)


def time_interleaved(runners: dict, steps: int, blocks: int, warmup: int) -> dict:
    """Median seconds per step of each (step, sync) runner, timed in alternating blocks so
    that a noisy machine slows every runner alike."""
    for step, sync in runners.values():
        for i in range(warmup):
            step(i)
        sync()
    times: dict = {label: [] for label in runners}
    for b in range(blocks):
        for label, (step, sync) in runners.items():
            t0 = time.perf_counter()
            for i in range(steps):
                step(b * steps + i)
            sync()
            times[label].append((time.perf_counter() - t0) / steps)
    return {label: statistics.median(t) for label, t in times.items()}


def ggrad_step_fn(name, data, device, fused, compiled=True):
    import ggrad
    import ggrad.functional as F
    from ggrad import nn
    from ggrad.optim import Adam

    ggrad.set_device(device)
    model = MODELS[name][0](nn)
    model.load_state_dict(torch_model(name).state_dict())
    opt = Adam(model.parameters(), lr=1e-3, fused=fused)

    def train(x, y):
        with ggrad.grad_tape():
            F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    run = ggrad.compile(train) if compiled else train

    def step(i):
        x_np, y_np = data[i % len(data)]
        run(x_np, y_np) if compiled else run(ggrad.tensor(x_np), ggrad.tensor(y_np))

    return step, ggrad.realize


def torch_step_fn(name, data, device, fused, cuda_graph=False):
    import torch

    model = torch_model(name).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=fused or None, capturable=cuda_graph)
    loss_fn = torch.nn.CrossEntropyLoss()
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def eager(i):
        x_np, y_np = data[i % len(data)]
        x = torch.from_numpy(x_np).to(device, non_blocking=True)
        y = torch.from_numpy(y_np).to(device, non_blocking=True)
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=False if cuda_graph else True)

    if not cuda_graph:
        return eager, sync
    static_x = torch.from_numpy(data[0][0]).to(device)
    static_y = torch.from_numpy(data[0][1]).to(device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss_fn(model(static_x), static_y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        loss_fn(model(static_x), static_y).backward()
        opt.step()

    def replay(i):
        x_np, y_np = data[i % len(data)]
        static_x.copy_(torch.from_numpy(x_np), non_blocking=True)
        static_y.copy_(torch.from_numpy(y_np), non_blocking=True)
        graph.replay()

    return replay, sync


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", help="ggrad device (cpu, vulkan, cuda, gpu)")
    ap.add_argument("--torch-device", default="cpu")
    ap.add_argument("--models", nargs="+", default=["mlp-small", "mlp-mnist"], choices=list(MODELS))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--blocks", type=int, default=15)
    ap.add_argument("--cuda-graph", action="store_true", help="also time PyTorch with a CUDA graph")
    ap.add_argument("--eager", action="store_true", help="also time ggrad without ggrad.compile")
    args = ap.parse_args()

    import torch  # before ggml's CUDA: importing torch after it aborted (seen on the H200)
    if args.torch_device == "cpu":
        import os
        torch.set_num_threads(len(os.sched_getaffinity(0)))
    print(f"| model | ggrad {args.device} | ms | PyTorch {args.torch_device} | ms | ratio |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in args.models:
        _, sample, classes, batch = MODELS[name]
        data = batches(sample, classes, batch)
        steps = max(3, args.steps if name not in ("mlp-large", "cnn") else args.steps // 2)
        ours = [("compiled", True)] + ([("eager", False)] if args.eager else [])
        theirs = [("eager", False)] + ([("CUDA graph", True)] if args.cuda_graph else [])
        runners = {("ggrad", label): ggrad_step_fn(name, data, args.device, True, compiled)
                   for label, compiled in ours}
        runners.update({("torch", label): torch_step_fn(name, data, args.torch_device, True, graph)
                        for label, graph in theirs})
        ms = time_interleaved(runners, steps, args.blocks, 5)
        for their_label, _ in theirs:
            t = ms[("torch", their_label)]
            for label, _ in ours:
                g = ms[("ggrad", label)]
                print(f"| {name} | {label} | {g * 1e3:.3f} | {their_label} | {t * 1e3:.3f} | {g / t:.2f} |",
                      flush=True)

if __name__ == "__main__":
    main()
