"""ggml's CPU backend alone: how a product's input gradient g @ W is best formed, and what
a transposed copy costs (the measurements behind issue 25's CPU choices; docs/performance.md).

    .venv/bin/python bench/cpu_products.py

For W of ggml shape (I, O) and g of (O, N): a transposed copy of W then mul_mat, against
OUT_PROD(W, g^T) reading g^T as a view; and ggml's CONT of a transposed view against
ggrad's tiled transpose kernel (GGML_OP_GGRAD 5, where the loaded ggml has it); ggml's
mul_mat against ggrad's GEMM kernel (GGML_OP_GGRAD 6, OpenBLAS). Medians of 30 runs on two
threads.
"""

from __future__ import annotations

import time

import numpy as np
from ggml import ggml as G

from ggrad.runtime import kernels

BACKEND = G.ggml_backend_cpu_init()
G.ggml_backend_cpu_set_n_threads(BACKEND, 2)


def median_ms(build, shapes) -> float:
    """Median time of a one-node graph `build(ctx, *inputs)` over random inputs of ggml `shapes`."""
    ctx = G.ggml_init(G.ggml_init_params(mem_size=64 * 1024 * 1024, mem_buffer=None, no_alloc=True))
    inputs = [G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, *shape) for shape in shapes]
    graph = G.ggml_new_graph(ctx)
    G.ggml_build_forward_expand(graph, build(ctx, *inputs))
    buffer = G.ggml_backend_alloc_ctx_tensors(ctx, BACKEND)
    for t in inputs:
        values = np.random.default_rng(0).standard_normal((t.contents.ne[1], t.contents.ne[0])).astype(np.float32)
        G.ggml_backend_tensor_set(t, values.ctypes.data, 0, values.nbytes)
    times = []
    for _ in range(30):
        start = time.perf_counter()
        G.ggml_backend_graph_compute(BACKEND, graph)
        times.append(time.perf_counter() - start)
    G.ggml_backend_buffer_free(buffer)
    G.ggml_free(ctx)
    return sorted(times)[len(times) // 2] * 1e3


def gemm_table() -> None:
    """mlp-mnist's products (784-512-512-10, batch 128) as ggml's mul_mat (over transposed
    copies where an operand is transposed) and as ggrad's GEMM kernel (OpenBLAS, reading
    transposed operands in place)."""
    if not kernels.blas_sgemm():
        print("\n(no GEMM kernel: a ggml without kernel set 7, or no scipy-openblas32)")
        return
    print("\n| product | ggml mul_mat ms | GEMM kernel ms | ratio |\n| --- | --- | --- | --- |")
    for name, (m, k, n) in {"forward 128x784 @ 784x512": (128, 784, 512),
                            "weight gradient 512x128 @ 128x784": (512, 128, 784),
                            "input gradient 128x10 @ 10x512": (128, 10, 512),
                            "forward 128x512 @ 512x512": (128, 512, 512)}.items():
        # C (m, n) = A (m, k) @ B (k, n); ggml's mul_mat takes A and B^T with K innermost
        ggml_ms = median_ms(lambda c, bt, a: G.ggml_mul_mat(c, bt, a), [(k, n), (k, m)])
        gemm_ms = median_ms(lambda c, a, b: kernels.op(c, kernels.GEMM, (n, m), [a, b], [0, 0]), [(k, m), (n, k)])
        print(f"| {name} | {ggml_ms:.3f} | {gemm_ms:.3f} | {gemm_ms / ggml_ms:.2f} |")


def main() -> None:
    print("| N | I | O | W^T copy + mul_mat ms | OUT_PROD(W, g^T) ms | ratio |\n| --- | --- | --- | --- | --- | --- |")
    for n in (64, 256):
        for i in (64, 256, 1024):
            for o in (64, 256, 1024):
                copied = median_ms(lambda c, w, g: G.ggml_mul_mat(c, G.ggml_cont(c, G.ggml_transpose(c, w)), g),
                                   [(i, o), (o, n)])
                viewed = median_ms(lambda c, w, g: G.ggml_out_prod(c, w, G.ggml_transpose(c, g)), [(i, o), (o, n)])
                print(f"| {n} | {i} | {o} | {copied:.3f} | {viewed:.3f} | {viewed / copied:.2f} |")
    tiled = kernels.version() >= kernels.SINCE[kernels.TRANSPOSE]
    print("\n| matrix | CONT of a transposed view ms | ggrad's transpose ms |\n| --- | --- | --- |")
    for a, b in ((512, 2048), (2048, 512), (784, 128), (512, 512)):
        cont = median_ms(lambda c, w: G.ggml_cont(c, G.ggml_transpose(c, w)), [(a, b)])
        mine = median_ms(lambda c, w: kernels.op(c, kernels.TRANSPOSE, (b, a), [w], []), [(a, b)]) if tiled else None
        print(f"| {a}x{b} | {cont:.3f} | {'-' if mine is None else f'{mine:.3f}'} |")
    gemm_table()


if __name__ == "__main__":
    main()
