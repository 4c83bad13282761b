"""Where a small compiled step's time goes on a GPU (issue 25's mlp-small at "high"): the
step as timed by train_step.py (graphs left running), the same waiting for the device after
each step, and the host's share alone (the graph computes replaced by nothing: ggrad's
Python replay path, its uploads and bookkeeping).

    python bench/gpu/host_path.py --device cuda --precision high --model mlp-small
    python bench/gpu/host_path.py --device cpu --hold-loss --stable   # the host path alone, this machine
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import train_step as T  # noqa: E402

import ggrad  # noqa: E402
from ggrad import runtime  # noqa: E402
from ggrad.runtime import backend, streams  # noqa: E402

transfers = sys.modules["ggrad.runtime.transfers"]  # ggrad.runtime.transfers is also a function's name
# a step's phases that --phases times: its batch uploads and its graph's launch
PHASES = {"uploads": (transfers, "upload_from"), "launch": (streams, "queue")}


def per_step(step, sync, steps: int, blocks: int) -> float:
    """Median microseconds a step, timed as train_step.py times (already warmed up)."""
    return T.time_interleaved({"step": (step, sync)}, steps, blocks, warmup=0)["step"] * 1e6


@contextlib.contextmanager
def graph_computes_stubbed(stubbed: bool = True):
    """ggrad's graph computes replaced by nothing inside (the host path alone)."""
    compute = backend.Backend.compute
    if stubbed:
        backend.Backend.compute = lambda self, graph: None
    try:
        yield
    finally:
        backend.Backend.compute = compute


@contextlib.contextmanager
def phases_timed(on: bool):
    """The PHASES' functions wrapped to add their seconds into the yielded dict (None and
    nothing wrapped when not `on`)."""
    if not on:
        yield None
        return
    spent = {name: 0.0 for name in PHASES}
    originals = {name: getattr(module, attr) for name, (module, attr) in PHASES.items()}

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t0
        return wrapper
    for name, (module, attr) in PHASES.items():
        setattr(module, attr, timed(name, originals[name]))
    try:
        yield spent
    finally:
        for name, (module, attr) in PHASES.items():
            setattr(module, attr, originals[name])


def torch_runner(args, sample, classes, batch, graph: bool | None = None):
    """PyTorch's step of the same model as a warmed-up (step, sync) runner (CUDA graph on a
    GPU unless `graph` is False, eager on the CPU), and whether it is on a GPU."""
    import torch
    torch.set_float32_matmul_precision(args.precision)
    on_gpu = args.device != "cpu"
    theirs = T.torch_step_fn(args.model, T.batches(sample, classes, batch), "cuda" if on_gpu else "cpu", True,
                             cuda_graph=on_gpu if graph is None else graph and on_gpu)
    for i in range(50):
        theirs[0](i)
    theirs[1]()
    return theirs, on_gpu


def beside_torch(args, step, sync, sample, classes, batch) -> None:
    """ggrad's step timed alone and in turn with PyTorch's (CUDA graph on a GPU, eager on the
    CPU), graph computes real, stubbed, real again."""
    theirs, on_gpu = torch_runner(args, sample, classes, batch)
    for stubbed in (False, True, False):
        with graph_computes_stubbed(stubbed):
            alone = per_step(step, sync, args.steps, args.blocks)
            both = T.time_interleaved({"ggrad": (step, sync), "torch": theirs}, args.steps, args.blocks, 0)
        print(f"{args.model} on {args.device}, blocks of {args.steps}{', host path alone' if stubbed else ''}: "
              f"ggrad alone {alone:.1f} us a step; in turn with PyTorch's "
              f"{'CUDA graph' if on_gpu else 'eager step'}: ggrad {both['ggrad'] * 1e6:.1f} us, "
              f"PyTorch {both['torch'] * 1e6:.1f} us")


def block_start(args, step, sync, sample, classes, batch) -> None:
    """Where a short block's time goes: each step's host time by its place in a block of
    --steps (medians over --blocks), alone and right after a block of PyTorch's step (its
    CUDA graph and its eager step on a GPU, eager on the CPU), and the block's wait for the
    device at its end; with --phases also the host time of each step's batch uploads and
    graph launch by place."""
    before = {"alone": None, "after PyTorch": torch_runner(args, sample, classes, batch)[0]}
    if args.device != "cpu":
        before["after PyTorch eager"] = torch_runner(args, sample, classes, batch, graph=False)[0]
    for where, theirs in before.items():
        places, waits, blocks = [[] for _ in range(args.steps)], [], []
        phases = {name: [[] for _ in range(args.steps)] for name in PHASES}
        profile = cProfile.Profile() if args.profile else None
        for b in range(args.blocks):
            if theirs is not None:
                for i in range(args.steps):
                    theirs[0](i)
                theirs[1]()
            if profile is not None:
                profile.enable()
            with phases_timed(args.phases) as spent:
                start = last = time.perf_counter()
                for i in range(args.steps):
                    for name in spent or ():
                        spent[name] = 0.0
                    step(b * args.steps + i)
                    now = time.perf_counter()
                    places[i].append(now - last)
                    last = now
                    for name, seconds in (spent or {}).items():
                        phases[name][i].append(seconds)
            sync()
            end = time.perf_counter()
            if profile is not None:
                profile.disable()
            waits.append(end - last)
            blocks.append(end - start)
        firsts = " ".join(f"{statistics.median(p) * 1e6:.0f}" for p in places)
        print(f"{args.model} on {args.device}, blocks of {args.steps} {where}: "
              f"{statistics.median(blocks) / args.steps * 1e6:.1f} us a step; host us by place: {firsts}; "
              f"wait at the end {statistics.median(waits) * 1e6:.0f} us")
        for name, by_place in phases.items() if args.phases else ():
            print(f"  of which {name}, us by place: {' '.join(f'{statistics.median(p) * 1e6:.0f}' for p in by_place)}")
        if profile is not None:
            print(f"\nggrad's blocks {where} under cProfile ({args.blocks} blocks of {args.steps}; its own cost inflates "
                  f"small functions):")
            pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="mlp-small", choices=list(T.MODELS))
    ap.add_argument("--precision", default="high")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--blocks", type=int, default=7)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also the N largest Python functions (cProfile's own time) of the running step (with "
                         "--block-start: of ggrad's blocks alone and after each of PyTorch's runners)")
    ap.add_argument("--hold-loss", action="store_true",
                    help="also each row with every loss held until the next step returns (train_step.py's)")
    ap.add_argument("--stable", action="store_true",
                    help="a replay's stable addresses (capture.STABLE_ADDRESS_KINDS) on this device too")
    ap.add_argument("--beside-torch", action="store_true",
                    help="also ggrad's step timed in turn with PyTorch's (CUDA graph on a GPU, eager on the "
                         "CPU) in blocks of --steps, as train_step.py times them, beside ggrad's alone")
    ap.add_argument("--phases", action="store_true",
                    help="with --block-start: also each step's batch uploads and graph launch by place")
    ap.add_argument("--block-start", action="store_true",
                    help="also each step's host time by its place in a block of --steps, alone and after "
                         "a block of PyTorch's step, and the wait at the block's end")
    args = ap.parse_args()
    ggrad.set_float32_matmul_precision(args.precision)
    _, sample, classes, batch = T.MODELS[args.model]
    step, sync = T.ggrad_step_fn(args.model, T.batches(sample, classes, batch), args.device, fused=None)
    if args.stable:
        ggrad.capture.STABLE_ADDRESS_KINDS = frozenset({runtime.current().backend.info.kind})
    for i in range(50):
        step(i)
    sync()
    if args.beside_torch:
        beside_torch(args, step, sync, sample, classes, batch)
    if args.block_start:
        block_start(args, step, sync, sample, classes, batch)
    runs = [("each loss dropped", step)]
    if args.hold_loss:
        runs.append(("each loss held", T.holding_the_loss((step, sync))[0]))
    for label, run in runs:
        queued = per_step(run, sync, args.steps, args.blocks)
        waited = per_step(lambda i: (run(i), sync()), sync, args.steps, args.blocks)
        with graph_computes_stubbed():
            host = per_step(run, sync, args.steps, args.blocks)
        print(f"{args.model} on {args.device} at {args.precision!r}, {label}, us per step (medians of {args.blocks} "
              f"blocks of {args.steps}): graphs left running {queued:.1f}; waiting after each step {waited:.1f}; "
              f"host path alone {host:.1f}")
    if args.profile:
        profile = cProfile.Profile()
        profile.runcall(lambda: all(step(i) is not None for i in range(args.steps)))  # each loss dropped
        sync()
        print(f"\n{args.steps} steps, graphs left running, under cProfile (its own cost inflates small functions):")
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
