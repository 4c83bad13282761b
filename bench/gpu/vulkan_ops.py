"""Where a Vulkan training step's time goes, op by op, as ggml-vulkan's own perf logger times
it (a timestamp around each node, the nodes serialized: times add up to more than a step):

    GGML_VK_PERF_LOGGER=1 GGML_VK_PERF_LOGGER_FREQUENCY=10 python3 bench/gpu/vulkan_ops.py --model resnet

The logger sums every 10 graph computes and prints to stderr; a compiled step is one compute,
so after the warm-up each print is 10 steps. Prints the last complete print, per step.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import train_step as T  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet", choices=list(T.MODELS))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--amp", default="none", choices=["none", "bf16", "f16"])
    ap.add_argument("--precision", default="highest", choices=["highest", "high", "medium"],
                    help="ggrad.set_float32_matmul_precision before the device starts ('medium': matrix cores)")
    args = ap.parse_args()
    if os.environ.get("GGML_VK_PERF_LOGGER") is None:
        raise SystemExit("set GGML_VK_PERF_LOGGER=1 (and GGML_VK_PERF_LOGGER_FREQUENCY=10)")
    every = int(os.environ.get("GGML_VK_PERF_LOGGER_FREQUENCY", "1"))
    import ggrad
    ggrad.set_float32_matmul_precision(args.precision)
    sample, classes, batch = T.MODELS[args.model][1:]
    step, sync = T.ggrad_step_fn(args.model, T.batches(sample, classes, batch), "vulkan", True, amp=args.amp)
    with tempfile.TemporaryFile("w+") as log:
        kept = os.dup(2)
        os.dup2(log.fileno(), 2)  # ggml-vulkan writes its timings to stderr
        try:
            for i in range(args.steps):
                step(i)
            sync()
        finally:
            os.dup2(kept, 2)
        log.seek(0)
        prints = log.read().split("Vulkan Timings:")
    last = prints[-2] if len(prints) > 2 else prints[-1]  # the last complete sum
    rows = []
    for line in last.splitlines():
        m = re.match(r"(.+): (\d+) x ([\d.]+) us = ([\d.]+) us", line)
        if m:
            rows.append((float(m[4]) / every, int(m[2]) / every, m[1]))
    total = sum(r[0] for r in rows)
    print(f"{args.model} on Vulkan: {total / 1e3:.3f} ms of serialized node time a step")
    print("| op | nodes a step | ms a step | share |\n| --- | --- | --- | --- |")
    for us, count, name in sorted(rows, reverse=True)[:40]:
        print(f"| {name[:80]} | {count:g} | {us / 1e3:.3f} | {us / total:.0%} |")


if __name__ == "__main__":
    main()
