"""Soak: a small MLP trained for many steps, eager and compiled, watching memory.

    . scripts/env.sh && .venv/bin/python bench/soak.py [--steps 10000] [--device cpu]

A training loop that runs for days must not grow: after its first steps every buffer
(parameters, Adam's state, gradients, the pass pool, the kept graphs) is reused. This
trains a 64-64-64-10 MLP with Adam on batches of 64 fed from host arrays, first eagerly
(`grad_tape`, `backward`, `opt.step()`, `opt.zero_grad()`), then as one `ggrad.compile`d
step, and records at checkpoints the process's resident memory (RSS, /proc/self/statm)
and `ggrad.runtime.memory()` (bytes held by the device's persistent pool, pass pool and
graph scratch). tests/test_soak.py runs it shorter and asserts the numbers stay flat.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from datetime import date

import numpy as np

SIZES = (64, 64, 64, 10)
BATCH = 64
CHECKPOINTS = (100, 1000, 5000, 10000)


def rss_bytes() -> int:
    """Resident memory of this process now (not the peak)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def soak(mode: str, steps: int, device: str = "cpu", checkpoints=CHECKPOINTS, sizes=SIZES, batch: int = BATCH,
         seed: int = 0) -> list[dict]:
    """Train `steps` steps ("eager" or "compiled"); one row per checkpoint reached."""
    import ggrad
    import ggrad.functional as F
    from ggrad import nn
    from ggrad.optim import Adam

    ggrad.set_device(device)
    ggrad.manual_seed(seed)
    layers = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers += [nn.Linear(n_in, n_out)] + ([nn.ReLU()] if i < len(sizes) - 2 else [])
    model = nn.Sequential(*layers)
    opt = Adam(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(seed)
    data = [(rng.standard_normal((batch, sizes[0])).astype(np.float32),
             rng.integers(0, sizes[-1], batch).astype(np.int64)) for _ in range(8)]

    def step(x, y):
        with ggrad.grad_tape():
            loss = F.cross_entropy(model(x), y)
            loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    run = ggrad.compile(step) if mode == "compiled" else step
    rows, marks = [], sorted(c for c in set(checkpoints) if c <= steps)
    start = last = time.perf_counter()
    done = 0
    for target in marks:
        for i in range(done, target):
            x, y = data[i % len(data)]
            loss = run(x, y) if mode == "compiled" else run(ggrad.tensor(x), ggrad.tensor(y))
        done = target
        value = loss.item()  # runs what is pending: the memory read next is settled
        now = time.perf_counter()
        mem = ggrad.runtime.memory()
        rows.append({"mode": mode, "step": target, "rss": rss_bytes(), "persistent": mem["persistent_bytes"],
                     "pass": mem["pass_bytes"], "scratch": mem["scratch_bytes"], "loss": value,
                     "steps_per_s": (target - (rows[-1]["step"] if rows else 0)) / (now - last)})
        last = now
    if mode == "compiled":
        rows[-1]["traces"] = run.traces
        rows[-1]["reason"] = run.reason
    rows[-1]["seconds"] = time.perf_counter() - start
    return rows


def table(rows: list[dict]) -> str:
    head = "| mode | step | RSS (MiB) | persistent (KiB) | pass (KiB) | scratch (KiB) | steps/s | loss |"
    lines = [head, "| " + " | ".join("---" for _ in head.split("|")[1:-1]) + " |"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['step']:,} | {r['rss'] / 2**20:.1f} | {r['persistent'] / 1024:.1f} | "
                     f"{r['pass'] / 1024:.1f} | {r['scratch'] / 1024:.1f} | {r['steps_per_s']:.0f} | "
                     f"{r['loss']:.4f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--modes", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"])
    args = parser.parse_args()
    checkpoints = sorted({c for c in CHECKPOINTS if c < args.steps} | {args.steps})
    rows = []
    for mode in args.modes:
        rows += soak(mode, args.steps, args.device, checkpoints)
        last = rows[-1]
        note = f", traces {last['traces']}" + (f", not captured: {last['reason']}" if last["reason"] else "") \
            if mode == "compiled" else ""
        print(f"{mode}: {args.steps:,} steps in {last['seconds']:.1f} s{note}", flush=True)
    print(f"\nMLP {'-'.join(map(str, SIZES))}, batch {BATCH}, Adam; device {args.device}; "
          f"{os.cpu_count()} cores ({platform.machine()}); {date.today()}")
    print(f"command: .venv/bin/python bench/soak.py --steps {args.steps} --device {args.device}\n")
    print(table(rows))


if __name__ == "__main__":
    main()
