"""Where the first step of a block goes after PyTorch's eager step (issue 25: mlp-small's
first step after PyTorch's block takes ~234 us of host time on an H100's host, the others
~40): the host time of the whole step, of its batch uploads (transfers.upload_from) and of
its graph's launch (streams.queue), by place in a block, medians over blocks.

    python bench/gpu/first_step.py --device cuda --blocks 30
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import train_step as T  # noqa: E402

import ggrad  # noqa: E402
from ggrad.runtime import streams  # noqa: E402

transfers = sys.modules["ggrad.runtime.transfers"]  # ggrad.runtime.transfers is also a function's name
PHASES = {"uploads": (transfers, "upload_from"), "launch": (streams, "queue")}


def timed(spent: dict, name: str, fn):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - t0
    return wrapper


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="mlp-small", choices=list(T.MODELS))
    ap.add_argument("--precision", default="high")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--blocks", type=int, default=30)
    args = ap.parse_args()
    import torch
    ggrad.set_float32_matmul_precision(args.precision)
    torch.set_float32_matmul_precision(args.precision)
    _, sample, classes, batch = T.MODELS[args.model]
    data = T.batches(sample, classes, batch)
    step, sync = T.ggrad_step_fn(args.model, data, args.device, fused=None)
    on_gpu = args.device != "cpu"
    theirs, their_sync = T.torch_step_fn(args.model, data, "cuda" if on_gpu else "cpu", True)
    for i in range(50):
        step(i)
        theirs(i)
    sync()
    their_sync()
    spent = {name: 0.0 for name in PHASES}
    for name, (module, attr) in PHASES.items():
        setattr(module, attr, timed(spent, name, getattr(module, attr)))
    for before in ("ggrad's own block", "PyTorch's eager block"):
        rows: dict = {}
        for b in range(args.blocks):
            if before.startswith("PyTorch"):
                for i in range(args.steps):
                    theirs(i)
                their_sync()
            for i in range(args.steps):
                for name in spent:
                    spent[name] = 0.0
                t0 = time.perf_counter()
                step(b * args.steps + i)
                total = time.perf_counter() - t0
                place = "first" if i == 0 else "second" if i == 1 else "others"
                rows.setdefault(place, []).append({"step": total, **spent})
            sync()
        for place, samples in rows.items():
            cells = ", ".join(f"{k} {statistics.median(s[k] for s in samples) * 1e6:.0f}" for k in samples[0])
            print(f"{args.model} on {args.device}, after {before}, {place} step: host us {cells}")


if __name__ == "__main__":
    main()
