"""One Adam step over N parameters: ggrad (fused, in place) against PyTorch's fused Adam,
and the device's copy bandwidth, in the same process.

    python3 bench/adam_only.py --device cuda --torch-device cuda --sizes 1e6 1e7 1e8

Bytes moved per step: p, g, m, v read and p, m, v written = 28 bytes per parameter.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def median_time(fn, sync, reps: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def ggrad_adam(n: int, device: str, reps: int) -> float:
    import ggrad
    from ggrad.optim import Adam

    ggrad.set_device(device)
    p = ggrad.param(np.zeros(n, np.float32))
    p.grad = np.full(n, 1e-3, np.float32)
    opt = Adam([p], lr=1e-3, fused=True)

    def step():
        opt.step()
        ggrad.realize()

    t = median_time(step, ggrad.cuda.synchronize, reps)
    ggrad.set_device("cpu")
    return t


def torch_adam(n: int, device: str, reps: int) -> tuple[float, float]:
    import torch

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    p = torch.zeros(n, device=device, requires_grad=True)
    p.grad = torch.full((n,), 1e-3, device=device)
    opt = torch.optim.Adam([p], lr=1e-3, fused=True)
    t_adam = median_time(opt.step, sync, reps)
    src = torch.empty(n * 7 // 2, device=device)  # 14 B/param read + 14 written = 28 B/param
    dst = torch.empty_like(src)
    t_copy = median_time(lambda: dst.copy_(src), sync, reps)
    return t_adam, t_copy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--torch-device", default="cpu")
    ap.add_argument("--sizes", nargs="+", type=float, default=[1e6, 1e7])
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    import torch  # noqa: F401  before ggml's CUDA: importing torch after it aborted (seen on the H200)
    print(f"| params | ggrad {args.device} ms | GB/s | % of copy | PyTorch fused {args.torch_device} ms | GB/s | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for size in args.sizes:
        n = int(size)
        g = ggrad_adam(n, args.device, args.reps)
        t, copy = torch_adam(n, args.torch_device, args.reps)
        moved = 28 * n
        copy_bw = moved / copy
        print(f"| {n:.0e} | {g * 1e3:.3f} | {moved / g / 1e9:.0f} | {100 * moved / g / copy_bw:.0f}% "
              f"| {t * 1e3:.3f} | {moved / t / 1e9:.0f} | {g / t:.2f} |", flush=True)


if __name__ == "__main__":
    main()
