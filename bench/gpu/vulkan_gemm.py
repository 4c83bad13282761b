"""Vulkan's float32 products one by one, each way ggrad can make it: ggml's mul_mat, ggrad's
GEMM shader on 64x64 tiles, on set 48's wide tiles, and summed in parts. The shapes are the
ResNet-18 step's (batch 128, 32x32: forward, input and weight gradients of a stage's 3x3
layer) and mlp-large's:

    python3 bench/gpu/vulkan_gemm.py [--device vulkan] [--reps 20] [--medium]

--medium starts the device at matmul precision "medium" (ggml's matrix cores take float32
products, rounded to float16) and times those against autocast's float16 and bfloat16
operands (cast once in the graph, ggml's mul_mat on the matrix cores).

Prints a row a shape: the median of `reps` replays of a compiled product, ms and TFLOP/s,
and the ggml ops each way made (ggml's MUL_MAT where ggrad's shader refuses the shape).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

# (label, m, n, k, A read transposed, B read transposed): C (m x n) = op(A) @ op(B)
SHAPES = [
    ("resnet l1 forward", 131072, 64, 576, False, True),
    ("resnet l1 input grad", 131072, 576, 64, False, False),
    ("resnet l1 weight grad", 64, 576, 131072, True, False),
    ("resnet l2 forward", 32768, 128, 1152, False, True),
    ("resnet l2 input grad", 32768, 1152, 128, False, False),
    ("resnet l2 weight grad", 128, 1152, 32768, True, False),
    ("resnet l3 forward", 8192, 256, 2304, False, True),
    ("resnet l3 input grad", 8192, 2304, 256, False, False),
    ("resnet l3 weight grad", 256, 2304, 8192, True, False),
    ("resnet l4 forward", 2048, 512, 4608, False, True),
    ("resnet l4 input grad", 2048, 4608, 512, False, False),
    ("resnet l4 weight grad", 512, 4608, 2048, True, False),
    ("mlp-large 4096 forward", 512, 4096, 4096, False, True),
    ("mlp-large 4096 input grad", 512, 4096, 4096, False, False),
    ("mlp-large 4096 weight grad", 4096, 4096, 512, True, False),
]


def medium_ways():
    """name -> (settings, autocast's type) at "medium"."""
    import ggrad
    return {"float32 on matrix cores": ([], None), "autocast float16": ([], ggrad.float16),
            "autocast bfloat16": ([], ggrad.bfloat16)}


def ways():
    """name -> (the settings (module, attribute, value) that make a product that way, None)."""
    import math

    from ggrad import ops
    from ggrad.runtime import kernels
    never, always = math.inf, 0
    refuse_gemm = (kernels, "supported", lambda backend, kernel, s=kernels.supported: kernel != kernels.GEMM and s(backend, kernel))
    wide_on = (kernels, "variant", lambda backend, name, v=kernels.variant: name == "gemm_wide" or v(backend, name))
    parts = [(ops, "VULKAN_GEMM_MIN_TILES", never), (ops, "VULKAN_GEMM_SPLIT_TILES", never)]
    return {name: (settings, None) for name, settings in {
        "ggml mul_mat": [refuse_gemm],
        "tile 64": [(ops, "VULKAN_GEMM_WIDE_MIN_TILES", never), (ops, "VULKAN_GEMM_MIN_TILES", 0)],
        "wide": [wide_on, (ops, "VULKAN_GEMM_WIDE_MIN_TILES", always), (ops, "VULKAN_GEMM_MIN_TILES", 0)],
        "parts, tile 64": parts + [(ops, "VULKAN_GEMM_WIDE_MIN_TILES", never)],
        "parts, wide": parts + [wide_on, (ops, "VULKAN_GEMM_WIDE_MIN_TILES", always)],
        "parts, 512 wg, tile 64": parts + [(ops, "VULKAN_GEMM_SPLIT_WORKGROUPS", 512), (ops, "VULKAN_GEMM_WIDE_MIN_TILES", never)],
        "as ggrad chooses": [wide_on],
    }.items()}


def timed(a, b, ta: bool, tb: bool, settings, low, tag: str, reps: int) -> tuple[float, dict]:
    """(median ms, the compiled product's ops) of a product under `settings` (and autocast to
    `low` where given)."""
    import ggrad
    from ggrad import lazy
    settings = settings + [(lazy, "BUILD_TAG", tag)]
    kept = [(module, name, getattr(module, name)) for module, name, _ in settings]
    for module, name, value in settings:
        setattr(module, name, value)
    try:
        # a row of the product comes back (the compiled step copies its results out)
        def rows(a, b):
            with ggrad.autocast(dtype=low or ggrad.bfloat16, enabled=low is not None):
                return ((a.T if ta else a) @ (b.T if tb else b))[:1]
        product = ggrad.compile(rows)
        for _ in range(3):
            product(a, b)
        ggrad.cuda.synchronize()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            product(a, b)
            ggrad.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e3, product.op_counts()
    finally:
        for module, name, value in kept:
            setattr(module, name, value)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="vulkan")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--shapes", nargs="*", help="labels' prefixes (default: all)")
    ap.add_argument("--medium", action="store_true", help="matmul precision 'medium': ggml's matrix cores")
    args = ap.parse_args()
    import ggrad
    if args.medium:
        ggrad.set_float32_matmul_precision("medium")
    ggrad.set_device(args.device)
    rng = np.random.default_rng(0)
    every = medium_ways() if args.medium else ways()
    names = list(every)
    print("| product | m x n x k | " + " | ".join(names) + " |")
    print("| --- | --- |" + " --- |" * len(names))
    for label, m, n, k, ta, tb in SHAPES:
        if args.shapes and not any(label.startswith(s) for s in args.shapes):
            continue
        a = ggrad.tensor(rng.standard_normal((k, m) if ta else (m, k), dtype=np.float32))
        b = ggrad.tensor(rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32))
        cells = []
        for name, (settings, low) in every.items():
            ms, ops = timed(a, b, ta, tb, settings, low, f"{label} {name}", args.reps)
            tflops = 2 * m * n * k / ms / 1e9
            cells.append(f"{ms:.3f} ms {tflops:.1f} TF ({', '.join(f'{op} {c}' for op, c in sorted(ops.items()))})")
        print(f"| {label} | {m} x {n} x {k} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
