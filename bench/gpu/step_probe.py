"""A/B probe of compiled ggrad training steps on one device (issue 13): which setting costs
what, timed in one process with train_step.py's models, and whether ggml-cuda replayed
its CUDA graphs (ggml's debug log, counted).

    python bench/gpu/step_probe.py --device cuda
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import train_step as T  # noqa: E402

import ggrad  # noqa: E402
from ggrad.runtime import backend  # noqa: E402


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: Counter = Counter()

    def emit(self, record) -> None:
        text = record.getMessage()
        for key in ("warmup complete", "warmup reset", "reused", "update failed", "disabling"):
            if key in text:
                self.seen[key] += 1


def timed(step, sync, steps: int, blocks: int) -> float:
    """Median milliseconds a step, timed as train_step.py times."""
    return T.time_interleaved({"step": (step, sync)}, steps, blocks, warmup=5)["step"] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--blocks", type=int, default=5)
    args = ap.parse_args()
    counter = _Count()
    log = logging.getLogger("ggrad.ggml")
    log.setLevel(logging.DEBUG)
    log.addHandler(counter)
    log.propagate = False
    rows = []

    def probe(label, name, precision="high", fused=True, amp="none", legacy=False, resident=False, batch=None):
        ggrad.set_float32_matmul_precision(precision)
        backend._adamw_exact[0] = False if legacy else None  # None: ask the library again
        _, sample, classes, default_batch = T.MODELS[name]
        data = T.batches(sample, classes, batch or default_batch, n=4)
        step, sync = T.ggrad_step_fn(name, data, args.device, fused, True, amp, resident)
        counter.seen.clear()
        ms = timed(step, sync, args.steps, args.blocks)
        rows.append((label, ms, dict(counter.seen)))
        print(f"| {label} | {ms:.3f} | {dict(counter.seen)} |", flush=True)

    print(f"step_probe: ggrad {args.device}; exact AdamW kernel: {backend.adamw_exact()}\n")
    print("| variant | ms per compiled step | ggml-cuda graph log |")
    print("| --- | --- | --- |")
    probe("mlp-small high, Adam fused (exact kernel)", "mlp-small")
    probe("mlp-small high, Adam fused (ggml's 7-element kernel)", "mlp-small", legacy=True)
    probe("mlp-small high, Adam composed", "mlp-small", fused=False)
    probe("mlp-small highest, Adam fused", "mlp-small", precision="highest")
    probe("mlp-small high, data on the device", "mlp-small", resident=True)
    probe("mlp-mnist high, Adam fused", "mlp-mnist")
    probe("mlp-mnist highest, Adam fused", "mlp-mnist", precision="highest")
    probe("mlp-mnist high bf16, Adam fused", "mlp-mnist", amp="bf16")
    probe("block 4x256x512 high float32", "block", resident=True, batch=4)
    probe("block 4x256x512 high bf16", "block", amp="bf16", resident=True, batch=4)


if __name__ == "__main__":
    main()
