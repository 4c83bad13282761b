"""Where a compiled training step's time goes, node by node: each compute node of the
captured ggml graph is run alone (a one-node view of the graph, over the buffers the step
allocated), in the step's order, and the times are summed per op. This is a profile of ggml's
kernels, not of ggrad's Python; the sum is close to a replay's time where launches are
cheap (CPU) and larger where each launch costs (GPU: one node per dispatch here).

    .venv/bin/python bench/profile_step.py --device cpu --model mlp-mnist
    python3 bench/profile_step.py --device cuda --model block --block-batch 8     (GPU host)

Prints the compute-node count, the replay's time beside its graphs' time run alone (the
difference is ggrad's replay: uploads, checks, Python), the count per op, and the ops by
total time. `--kernels` (CUDA) also lists the GPU kernels of 20 whole replays as CUPTI
sees them (torch.profiler): their count and device time per step beside the step's time
says whether the step waits on the GPU or on the host; `--torch` lists PyTorch's kernels of the
same step (its CUDA graph) after them, and `--nodes all` prints every node with its shapes. Running
nodes alone rewrites weights and optimizer state (AdamW runs too): the step's results
after a profile are not meant to be read.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import train_step as T  # noqa: E402

if "--kernels" in sys.argv:
    import torch  # noqa: F401,E402  (before ggml's CUDA: importing torch after it aborted)
from ggml import ggml as G  # noqa: E402

def captured_graphs(compiled) -> list:
    """The ggml graphs of a ggrad.compile'd function's one capture."""
    captures = [c for kept in compiled._captures.values() for c in kept]
    if len(captures) != 1:
        raise SystemExit(f"expected one capture, found {len(captures)}")
    return captures[0].graphs


def profile(graphs, backend, repeats: int, listed: frozenset = frozenset()) -> dict[str, list[float]]:
    """Seconds per op name. The step's nodes run in their order, each as a dispatch of its
    own (so each reads what the nodes before it wrote, as in the whole graph); the whole
    sequence runs `repeats` times and each node's median is kept. Nodes of the ops in
    `listed` are printed one by one with their shapes."""
    nodes = [(graph, i, node) for graph in graphs for i, node in graph.compute_nodes()]
    views = [G.ggml_graph_view(graph.graph, i, i + 1) for graph, i, _ in nodes]
    runs: list[list[float]] = [[] for _ in nodes]
    for _ in range(repeats):
        for view, seen in zip(views, runs):
            t0 = time.perf_counter()
            backend.compute(ctypes.pointer(view))
            G.ggml_backend_synchronize(backend.handle)
            seen.append(time.perf_counter() - t0)
    times: dict[str, list[float]] = collections.defaultdict(list)
    for (_, _, node), seen in zip(nodes, runs):
        times[op_label(node)].append(sorted(seen)[len(seen) // 2])
        if op_label(node) in listed or "all" in listed:
            c = node.contents
            sources = ", ".join(f"{tuple(c.src[k].contents.ne)}/{tuple(c.src[k].contents.nb)}" for k in range(2) if c.src[k])
            print(f"{op_label(node)}: {times[op_label(node)][-1] * 1e6:.1f} us, {sources} -> {tuple(c.ne)}")
    return times


def cuda_kernels(step, sync, steps: int = 20, top: int = 15) -> None:
    """The `top` GPU kernels by time of `steps` replays, per step (CUPTI through torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile as torch_profile
    t0 = time.perf_counter()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            step(i)
        sync()
    wall = (time.perf_counter() - t0) / steps
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    busy = sum(e.device_time_total for e in events) / steps / 1e3
    print(f"GPU kernels per step: {sum(e.count for e in events) / steps:.0f}, {busy:.3f} ms of device time; "
          f"step {wall * 1e3:.3f} ms under the profiler")
    print("| kernel | per step | ms per step |\n| --- | --- | --- |")
    for e in sorted(events, key=lambda e: -e.device_time_total)[:top]:
        print(f"| {e.key[:90]} | {e.count / steps:.0f} | {e.device_time_total / steps / 1e3:.4f} |")


def op_label(node) -> str:
    """The op's name; a GGRAD node's names its kernel too (the kernel set is one ggml op)."""
    name = G.ggml_op_desc(node).decode()
    if name != "GGRAD":
        return name
    from ggrad.runtime import kernels
    kernel = node.contents.op_params[0]
    names = {v: k for k, v in vars(kernels).items() if k.isupper() and isinstance(v, int)}
    return f"GGRAD {names.get(kernel, kernel)}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default="mlp-small", choices=list(T.MODELS))
    ap.add_argument("--block-batch", type=int, default=2)
    ap.add_argument("--block-seq", type=int, default=T.MODELS["block"][1][0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--amp", default="none", choices=["none", "bf16", "f16"])
    ap.add_argument("--precision", default="highest", choices=["highest", "high", "medium"],
                    help="ggrad.set_float32_matmul_precision (CUDA: high allows TF32)")
    ap.add_argument("--kernels", action="store_true", help="also list the GPU kernels of whole replays (CUDA)")
    ap.add_argument("--top", type=int, default=15, help="how many of --kernels' kernels to list")
    ap.add_argument("--nodes", nargs="+", default=[], metavar="OP",
                    help="list each node of these ops (names as in the table; all: every node) with its shapes and time")
    ap.add_argument("--torch", action="store_true",
                    help="also list PyTorch's GPU kernels of the same step as a CUDA graph (with --kernels)")
    args = ap.parse_args()
    if args.kernels and not args.device.startswith("cuda"):
        ap.error("--kernels lists CUDA kernels (CUPTI): use it with --device cuda")
    import ggrad
    from ggrad import runtime

    ggrad.set_float32_matmul_precision(args.precision)
    sample, classes, batch = T.MODELS[args.model][1:]
    if args.model == "block":
        sample, batch = (args.block_seq, sample[1]), args.block_batch
    data = T.batches(sample, classes, batch)
    step, sync = T.ggrad_step_fn(args.model, data, args.device, True, amp=args.amp)
    for i in range(3):
        step(i)
    sync()
    compiled = dict(zip(step.__code__.co_freevars, (c.cell_contents for c in step.__closure__)))["run"]
    graphs = captured_graphs(compiled)
    counts = compiled.op_counts()
    t0 = time.perf_counter()
    for i in range(20):
        step(i)
    sync()
    replay = (time.perf_counter() - t0) / 20
    if args.kernels:
        cuda_kernels(step, sync, top=args.top)
    if args.kernels and args.torch:
        import torch
        torch.set_float32_matmul_precision(args.precision)
        print("PyTorch's CUDA graph of the same step:")
        cuda_kernels(*T.torch_step_fn(args.model, data, "cuda", True, cuda_graph=True, amp=args.amp), top=args.top)
    backend = runtime.current().backend
    t0 = time.perf_counter()
    for _ in range(20):  # ggml alone: the step's graphs with none of ggrad's replay around them
        for graph in graphs:
            backend.compute(graph.graph)
    G.ggml_backend_synchronize(backend.handle)
    whole = (time.perf_counter() - t0) / 20
    times = profile(graphs, backend, args.repeats, frozenset(args.nodes))
    total = sum(sum(v) for v in times.values())
    print(f"{args.model} on {args.device}: "
          f"{len(graphs)} graph(s), {sum(counts.values())} compute nodes; replay {replay * 1e3:.3f} ms, "
          f"its graphs alone {whole * 1e3:.3f} ms, nodes alone {total * 1e3:.3f} ms")
    print("| op | nodes | ms | share |\n| --- | --- | --- | --- |")
    for op, ts in sorted(times.items(), key=lambda kv: -sum(kv[1])):
        print(f"| {op} | {len(ts)} | {sum(ts) * 1e3:.3f} | {sum(ts) / total:.0%} |")


if __name__ == "__main__":
    main()
