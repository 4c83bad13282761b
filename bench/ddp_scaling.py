"""Data-parallel scaling on this machine: steps/s and samples/s of an eager DDP training
step for 1 and N ranks, and the share of the step spent averaging gradients.

    python bench/ddp_scaling.py --ranks 1 2 --model mlp-mnist --device cpu

Each rank count runs under mpiexec (pip's mpich, beside this Python), the machine's cores
shared between the ranks' ggml threads; rank 0 prints one table row. The per-rank batch
stays fixed (weak scaling), as in data-parallel training. The allreduce share is the time
of the averaging itself (concat, download, MPI allreduce, upload) after the backward ran.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

WORKER = r"""
import statistics, sys, time
import numpy as np
sys.path.insert(0, "bench")
import ggrad, ggrad.functional as F
from ggrad import nn, distributed as dist
from ggrad.optim import Adam
import train_step as T
name, device, batch, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
dist.init_process_group()
ggrad.set_device(device)
make, sample, classes, _ = T.MODELS[name]
model = dist.DistributedDataParallel(make(nn))
opt = Adam(model.parameters(), lr=1e-3)
rng = np.random.default_rng(dist.get_rank())
x = ggrad.tensor(rng.standard_normal((batch,) + sample).astype(np.float32))
y = ggrad.tensor(rng.integers(0, classes, batch).astype(np.int64))
reduce_time = [0.0]
average = model.average_gradients
def timed_average():  # the backward is computed first: the time is the averaging's alone
    ggrad.realize(*[p.grad for p in model.parameters() if p.grad is not None])
    t0 = time.perf_counter(); average(); reduce_time[0] += time.perf_counter() - t0
model.average_gradients = timed_average
def step():
    with ggrad.grad_tape():
        F.cross_entropy(model(x), y).backward()
    opt.step(); opt.zero_grad(); ggrad.realize()
for _ in range(3):
    step()
dist.barrier()
times = []
for _ in range(5):
    reduce_time[0] = 0.0
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    dist.barrier()
    times.append(((time.perf_counter() - t0) / steps, reduce_time[0] / steps))
step_s, reduce_s = sorted(times)[len(times) // 2]
if dist.get_rank() == 0:
    size = dist.get_world_size()
    print(f"| {name} | {device} | {size} | {batch} | {step_s * 1e3:.2f} | {1 / step_s:.1f} | "
          f"{size * batch / step_s:.0f} | {100 * reduce_s / step_s:.0f}% |", flush=True)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--model", default="mlp-mnist")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=128, help="per rank")
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    print(f"ddp_scaling: {args.model}, Adam, eager step with the gradient averaging, {os.cpu_count()} CPUs\n")
    print("| model | device | ranks | batch per rank | ms per step | steps/s | samples/s | allreduce share |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for n in args.ranks:  # the cores shared between the ranks' ggml threads
        env = {**os.environ, "GGRAD_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // n))}
        subprocess.run([mpiexec, "-n", str(n), sys.executable, "-c", WORKER, args.model, args.device,
                        str(args.batch), str(args.steps)], check=True, timeout=600, env=env)


if __name__ == "__main__":
    main()
