"""One training step, ggrad against PyTorch in the same process: same model, same data,
Adam, fp32 or mixed precision. Prints a table of median step times and the ratio ggrad /
PyTorch.

    .venv/bin/python bench/train_step.py --device cpu --models mlp-small mlp-mnist
    .venv/bin/python bench/train_step.py --device cpu --models block --block-batch 2 --block-seq 16 --amp bf16
    python3 bench/train_step.py --device cuda --torch-device cuda --cuda-graph --precision high   (GPU host)

Each step feeds a batch, runs forward, backward and Adam (fused on both sides), and does
not read the loss. The MLPs and the CNN take a fresh batch from host memory each step (a
data loader); the transformer block's activations (batch x seq x 512 float32: 16 MiB at
the default size) are put on the device once (`--data` chooses). ggrad's step is
`ggrad.compile`d (captured once, replayed); `--eager` also times it without. Times are
medians of blocks of steps after a warm-up, ggrad's and PyTorch's blocks alternating (a
noisy machine slows both alike); GPU work is synchronised at the end of each block.

`--amp bf16|f16` runs the forward and the loss under autocast on both sides
(`ggrad.autocast` and `torch.autocast`) with float32 weights and Adam; f16 adds a
GradScaler on both sides (a step the scaler may undo runs ggrad's Adam kernel formula
from elementwise ops; torch's fused Adam takes the scaler's inf check). `--precision` sets
`set_float32_matmul_precision` on both sides (CUDA: "high" allows TF32) and PyTorch's
`cudnn.allow_tf32` to match (cuDNN's default is TF32 at any matmul precision). Each row says
which amp and precision it ran with. After the table, the ggml nodes a compiled step computes
(per op), and the losses of the first three steps (same weights, same batches) of each ggrad runner and of PyTorch eager, and their largest
relative difference: torch's autocast rounds each product to the low dtype where ggrad keeps it
float32, so they agree to about 1e-2 under amp, about 1e-5 without (CPU, "highest").
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

def mlp(nn, sizes):
    layers = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers += [nn.Linear(n_in, n_out)] + ([nn.ReLU()] if i < len(sizes) - 2 else [])
    return nn.Sequential(*layers)


def cnn(nn):
    """PyTorch's MNIST example without dropout: conv-conv-pool-linear on 1x28x28."""
    return nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64 * 12 * 12, 10))


def block(nn, dim=512, heads=8):
    """One pre-norm transformer encoder layer, torch.nn's (ggrad's has its parameter names):
    self-attention and a ReLU MLP of 4x width, no dropout, (batch, seq, dim) in and out."""
    return nn.TransformerEncoderLayer(dim, heads, dim_feedforward=4 * dim, dropout=0.0, batch_first=True,
                                      norm_first=True)


def resnet(nn):
    """ResNet-18's layout for 32x32 RGB images (examples/resnet_cifar.py's builder)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    from resnet_cifar import resnet as build
    return build(nn)


# name: (model of a torch.nn-like namespace, input shape of one sample, classes (None: the
# loss is the mean square of the output, no labels), batch)
MODELS = {
    "mlp-small": (lambda nn: mlp(nn, [64, 64, 64, 10]), (64,), 10, 64),
    "mlp-mnist": (lambda nn: mlp(nn, [784, 512, 512, 10]), (784,), 10, 128),
    "mlp-large": (lambda nn: mlp(nn, [1024, 4096, 4096, 1024]), (1024,), 1024, 512),
    "cnn": (cnn, (1, 28, 28), 10, 128),
    "block": (block, (256, 512), None, 32),
    "resnet": (resnet, (3, 32, 32), 10, 128),
}
HEAVY = ("mlp-large", "cnn", "block", "resnet")  # half the steps per block
# Models whose losses after Adam's first updates move by this much in PyTorch itself (Adam's
# first updates are about lr * sign(g) for every weight, so float32 rounding flips some of
# them). Measured for resnet (2026-12-05, 2 cores, PyTorch CPU, the bench's weights and
# batches): float32 against float64 1.1e-4 at step 2 and 3.5e-3 at step 3; float32 with its
# input moved by one part in 1e7 against float32 6.8e-5 and 2.1e-3. One step's gradients of
# ggrad and of PyTorch float32 are both 3e-6 (relative) from float64's. The first loss,
# before any update, is checked at the usual tolerance, the later ones at this one.
CHAOTIC = {"resnet": 5e-3}
AMP = {"none": None, "bf16": "bfloat16", "f16": "float16"}
CHECKED = 3  # steps whose losses are compared (forward, gradients and Adam) before the timing


def batches(sample, classes, batch, n=8, seed=0):
    """n batches: (x, labels) for a classifier, (x,) for the block."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((batch,) + sample).astype(np.float32),)
            + (() if classes is None else (rng.integers(0, classes, batch).astype(np.int64),)) for _ in range(n)]


def loss_of(F, out, batch):
    """Cross-entropy against the labels, or the mean square of the output (same on both
    sides: `F` is ggrad.functional or torch.nn.functional)."""
    return F.cross_entropy(out, batch[1]) if len(batch) > 1 else (out * out).mean()


def torch_model(name, seed=0):
    """The model with torch's default initialisation from a fixed seed (ggrad loads it)."""
    import torch
    torch.manual_seed(seed)
    return MODELS[name][0](torch.nn)


def balanced_orders(n: int) -> list[list[int]]:
    """Orders of n runners in which each follows every other equally often (a Williams
    design: n orders for even n, 2n for odd). A runner's time depends on which runner
    came before it (after PyTorch's, ggrad's host path starts cold), so a shuffled order
    handed each runner the places of its position in the dict: the same mlp-small graph
    read 0.064 and 0.072 ms side by side on an H100 (set68)."""
    first, low, high = [0], 1, n - 1
    for k in range(1, n):
        if k % 2:
            first, low = first + [low], low + 1
        else:
            first, high = first + [high], high - 1
    rows = [[(i + r) % n for i in first] for r in range(n)]
    return rows if n % 2 == 0 else rows + [row[::-1] for row in rows]


def time_interleaved(runners: dict, steps: int, blocks: int, warmup: int, after: dict | None = None) -> dict:
    """Median seconds per step of each (step, sync) runner, timed in alternating blocks so
    that a noisy machine slows every runner alike, the blocks' orders cycling through
    `balanced_orders` (blocks a multiple of its length balance them exactly). `after`, if
    given, receives each (runner, the runner timed just before it)'s seconds per step."""
    for step, sync in runners.values():
        for i in range(warmup):
            step(i)
        sync()
    times: dict = {label: [] for label in runners}
    items, orders = list(runners.items()), balanced_orders(len(runners))
    previous = None
    for b in range(blocks):
        for label, (step, sync) in [items[i] for i in orders[b % len(orders)]]:
            t0 = time.perf_counter()
            for i in range(steps):
                step(b * steps + i)
            sync()
            times[label].append((time.perf_counter() - t0) / steps)
            if after is not None and previous is not None:
                after.setdefault((label, previous), []).append(times[label][-1])
            previous = label
    return {label: statistics.median(t) for label, t in times.items()}


def ggrad_step_fn(name, data, device, fused, compiled=True, amp="none", resident=False):
    """(step, sync): step(i) trains on batch i and returns the loss (not read)."""
    import ggrad
    import ggrad.functional as F
    from ggrad import nn
    from ggrad.amp import GradScaler
    from ggrad.optim import Adam

    ggrad.set_device(device)
    model = MODELS[name][0](nn)
    model.load_state_dict(torch_model(name).state_dict())
    low = getattr(ggrad, AMP[amp]) if AMP[amp] else None
    scaler = GradScaler(enabled=amp == "f16")
    opt = Adam(model.parameters(), lr=1e-3, fused=fused)
    if resident:
        data = [tuple(ggrad.tensor(a) for a in batch) for batch in data]
        ggrad.realize(*[t for batch in data for t in batch])

    def train(*batch):
        with ggrad.grad_tape():
            with ggrad.autocast(dtype=low or ggrad.bfloat16, enabled=low is not None):
                loss = loss_of(F, model(batch[0]), batch)
            scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        return loss

    run = ggrad.compile(train) if compiled else train

    def step(i):
        batch = data[i % len(data)]
        return run(*batch) if compiled or resident else run(*(ggrad.tensor(a) for a in batch))

    step.compiled = run if compiled else None
    return step, ggrad.cuda.synchronize  # runs what is recorded, then waits for the device


def _with_setting(runner, module, name: str, value):
    """`runner` (step, sync) whose every call runs with `module.name` set to `value`, for an
    A/B in one process."""
    step, sync = runner

    def setting(i):
        kept = getattr(module, name)
        setattr(module, name, value)
        try:
            return step(i)
        finally:
            setattr(module, name, kept)

    setting.compiled = step.compiled
    return setting, sync


# choices of ggrad's own (module attributes) that --without can undo: the value without it
PYTHON_CHOICES = {
    "batched_transposes": ("ggrad.ops", "_batched_transpose", lambda x: None),  # ops.cont's copies as three axes
    "gemm_parts": ("ggrad.ops", "VULKAN_GEMM_SPLIT_TILES", 0),  # Vulkan's few-tile products summed in parts
    "gemm_parts_many": ("ggrad.ops", "VULKAN_GEMM_SPLIT_TILES", 4),  # ... of up to 63 tiles, not 4 (set 47)
    # stride-1 convolutions' input gradients as convolutions (CUDA), not folded columns
    "input_gradient_conv": ("ggrad.functional.conv", "INPUT_GRADIENT_CONV_KINDS", frozenset()),
    # sums over many rows (bias gradients) as products with a row of ones (CUDA), not REPEAT_BACK
    "row_sum_product": ("ggrad.ops", "ROW_SUM_PRODUCT_KINDS", frozenset()),
    # the rows layout for deep convolution layers (few pixels per channel): every layer per image
    "rows_layout": ("ggrad.functional.conv", "PER_IMAGE_PIXELS_PER_CHANNEL", 0),
    # the cross-entropy gradient reading the loss's gradient through a stride of 0, not REPEATed
    "stride_zero": ("ggrad.ops", "STRIDE_ZERO_KINDS", frozenset()),
    # a replay's buffers kept in place (CUDA: device batches copied in, results copied out), not rebound
    "stable_addresses": ("ggrad.capture", "STABLE_ADDRESS_KINDS", frozenset()),
    # Vulkan's NV_coopmat2 products over operands cast to float16 once per graph, not by ggml in each
    "half_operands": ("ggrad.ops", "_half_operands", lambda *args: False),
    # Vulkan's float16 products at "medium" marked to sum in float32 (ggml-vulkan: float16 sums otherwise)
    "float32_sums": ("ggrad.ops", "VULKAN_FLOAT32_SUMS", False),
}


def without_kernels(names: list[str], runner):
    """`runner` whose every call builds with ggrad's kernels `names` refused (the composed
    forms instead), or ggml's op variants of those names (kernels.OP_VARIANTS, e.g.
    cast_x4) left unasked, or ggrad's choices in PYTHON_CHOICES undone; a compiled step's
    replays never ask again."""
    import importlib
    from ggrad import lazy
    from ggrad.runtime import kernels
    for name in [name for name in names if name in PYTHON_CHOICES]:
        module, attribute, value = PYTHON_CHOICES[name]
        runner = _with_setting(_with_setting(runner, importlib.import_module(module), attribute, value), lazy,
                               "BUILD_TAG", f"without {name}")
    names = [name for name in names if name not in PYTHON_CHOICES]
    refused = {getattr(kernels, name) for name in names if name not in kernels.OP_VARIANTS}
    unasked = {name for name in names if name in kernels.OP_VARIANTS}
    supported, variant = kernels.supported, kernels.variant
    runner = _with_setting(runner, kernels, "variant", lambda backend, name: name not in unasked and variant(backend, name))
    return _with_setting(runner, kernels, "supported",
                         lambda backend, kernel: kernel not in refused and supported(backend, kernel))


def holding_the_loss(runner):
    """`runner` that keeps each step's loss until the next step has returned, as a training
    loop's `loss = step(x, y)` does (a step cannot write its result where the last one is)."""
    step, sync = runner
    kept = [None]

    def hold(i):
        kept[0] = step(i)
        return kept[0]

    hold.compiled = getattr(step, "compiled", None)
    return hold, sync


def waiting_for_each_graph(runner):
    """`runner` whose graph computes wait for the device before returning (as before
    runtime/streams.py)."""
    from ggrad.runtime import streams
    return _with_setting(runner, streams, "enabled", False)


def node_note(label: str, step) -> str:
    """The ggml ops one replay of a compiled step computes (views left out)."""
    counts = step.compiled.op_counts()
    top = ", ".join(f"{op} {n}" for op, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    return f"{label}: the compiled step computes {sum(counts.values())} ggml nodes ({top})"


def torch_step_fn(name, data, device, fused, cuda_graph=False, amp="none", resident=False):
    """(step, sync) as ggrad_step_fn's; with cuda_graph the whole step (autocast, scaler
    and Adam included) is captured once and replayed (its loss is the latest replay's)."""
    import torch

    model = torch_model(name).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=fused or None, capturable=cuda_graph)
    kind = "cuda" if device.startswith("cuda") else "cpu"
    low = getattr(torch, AMP[amp]) if AMP[amp] else None
    scaler = torch.amp.GradScaler(kind, enabled=amp == "f16")
    sync = torch.cuda.synchronize if kind == "cuda" else (lambda: None)
    if resident:
        data = [tuple(torch.from_numpy(a).to(device) for a in batch) for batch in data]

    def upload(batch):
        return batch if resident else tuple(torch.from_numpy(a).to(device, non_blocking=True) for a in batch)

    def train(batch):  # no zero_grad: a captured step writes fresh gradients at each replay
        with torch.autocast(kind, dtype=low or torch.bfloat16, enabled=low is not None,
                            cache_enabled=False if cuda_graph else None):
            loss = loss_of(torch.nn.functional, model(batch[0]), batch)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    def eager(i):
        loss = train(upload(data[i % len(data)]))
        opt.zero_grad(set_to_none=True)
        return loss

    if not cuda_graph:
        return eager, sync
    static = tuple(torch.as_tensor(a).to(device).clone() for a in data[0])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            train(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = train(static)

    def replay(i):
        for dst, src in zip(static, data[i % len(data)]):
            dst.copy_(src if resident else torch.from_numpy(src), non_blocking=True)
        graph.replay()
        return static_loss

    return replay, sync


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", help="ggrad device (cpu, vulkan, cuda, gpu)")
    ap.add_argument("--torch-device", default="cpu")
    ap.add_argument("--models", nargs="+", default=["mlp-small", "mlp-mnist"], choices=list(MODELS))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--blocks", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps of each runner first")
    ap.add_argument("--cuda-graph", action="store_true", help="also time PyTorch with a CUDA graph")
    ap.add_argument("--eager", action="store_true", help="also time ggrad without ggrad.compile")
    ap.add_argument("--amp", default="none", choices=list(AMP),
                    help="autocast dtype of the forward on both sides (f16 adds a GradScaler on both)")
    ap.add_argument("--precision", default="highest", choices=["highest", "high", "medium"],
                    help="set_float32_matmul_precision on both sides (CUDA: high allows TF32)")
    ap.add_argument("--data", default="auto", choices=["auto", "host", "device"],
                    help="batches uploaded at each step (host) or put on the device once; auto: the block's "
                         "on the device, the others' from the host")
    ap.add_argument("--without", nargs="+", default=[], metavar="KERNEL",
                    help="also time ggrad compiled with these kernels refused (runtime/kernels.py names, "
                         "e.g. GEMM ADAMW_GROUP), ggml op variants unasked (cast_x4), or ggrad's choices in "
                         "PYTHON_CHOICES undone (batched_transposes, gemm_parts, gemm_parts_many, input_gradient_conv, row_sum_product, rows_layout, stride_zero, stable_addresses, half_operands, float32_sums): an A/B in one process")
    ap.add_argument("--again", action="store_true",
                    help="also time a second copy of ggrad's compiled step: an A/B/A that shows how far "
                         "two runners of the same graph differ (up to 12%% on an H100 and the CPU while "
                         "the blocks' order was a seeded shuffle; the order is balanced now)")
    ap.add_argument("--synchronous", action="store_true",
                    help="also time ggrad compiled with each graph compute waiting for the device (CUDA and Vulkan "
                         "return once queued): an A/B in one process")
    ap.add_argument("--hold-loss", action="store_true",
                    help="every runner keeps each step's loss until the next step returns, as `loss = step(x, y)` "
                         "in a training loop does")
    ap.add_argument("--by-predecessor", action="store_true",
                    help="also each runner's median by the runner timed just before it (a block after "
                         "PyTorch's can start with ggrad's host path cold)")
    ap.add_argument("--block-batch", type=int, default=MODELS["block"][3])
    ap.add_argument("--block-seq", type=int, default=MODELS["block"][1][0])
    args = ap.parse_args()

    import torch  # before ggml's CUDA: importing torch after it aborted (seen on the H200)
    if args.torch_device == "cpu":
        import os
        torch.set_num_threads(len(os.sched_getaffinity(0)))
    import ggrad
    torch.set_float32_matmul_precision(args.precision)
    # cuDNN's convolutions take TF32 by default whatever the matmul precision says; ggrad's
    # convolutions are products and follow it: both sides at the same precision
    torch.backends.cudnn.allow_tf32 = args.precision != "highest"
    ggrad.set_float32_matmul_precision(args.precision)  # before a device starts (Vulkan fixes it then)
    amp_note = {"none": "float32", "bf16": "autocast bfloat16",
                "f16": "autocast float16 + GradScaler"}
    print(f"train_step: ggrad {args.device} vs PyTorch {torch.__version__} {args.torch_device}; amp: "
          f"{amp_note[args.amp]}; float32 matmul precision: ggrad {ggrad.get_float32_matmul_precision()}, "
          f"PyTorch {torch.get_float32_matmul_precision()} (cudnn.allow_tf32 {torch.backends.cudnn.allow_tf32}); "
          f"Adam lr 1e-3\n")
    print(f"| model | amp | precision | ggrad {args.device} | ms | PyTorch {args.torch_device} | ms | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    amp_column = "f16 + GradScaler" if args.amp == "f16" else args.amp
    notes = []
    for name in args.models:
        _, sample, classes, batch = MODELS[name]
        label = name
        if name == "block":
            sample, batch = (args.block_seq, sample[1]), args.block_batch
            label = f"block {batch}x{sample[0]}x{sample[1]}"
        resident = args.data == "device" or (args.data == "auto" and name == "block")
        if resident:
            label += " (data on device)"
        data = batches(sample, classes, batch, n=4 if name == "block" else 8)
        steps = max(3, args.steps if name not in HEAVY else args.steps // 2)
        ours = [("compiled", True)] + ([("eager", False)] if args.eager else [])
        theirs = [("eager", False)] + ([("CUDA graph", True)] if args.cuda_graph else [])
        runners = {("ggrad", tag): ggrad_step_fn(name, data, args.device, True, compiled, args.amp, resident)
                   for tag, compiled in ours}
        if args.without:
            tag = f"compiled without {', '.join(args.without)}"
            ours.append((tag, True))
            runners[("ggrad", tag)] = without_kernels(args.without, ggrad_step_fn(
                name, data, args.device, True, True, args.amp, resident))
        if args.synchronous:
            ours.append(("compiled, synchronous", True))
            runners[("ggrad", "compiled, synchronous")] = waiting_for_each_graph(ggrad_step_fn(
                name, data, args.device, True, True, args.amp, resident))
        if args.again:
            ours.append(("compiled, again", True))
            runners[("ggrad", "compiled, again")] = ggrad_step_fn(name, data, args.device, True, True, args.amp,
                                                                  resident)
        # the losses of each runner's first steps (same weights, same batches), before any timing
        first = {key: [float(step(i).item()) for i in range(CHECKED)] for key, (step, _) in runners.items()}
        notes += [node_note(f"{label} ({tag})" if tag != "compiled" else label, runners[("ggrad", tag)][0])
                  for tag, compiled in ours if compiled]
        for tag, graph in theirs:
            try:
                runners[("torch", tag)] = torch_step_fn(name, data, args.torch_device, True, graph, args.amp, resident)
            except Exception as e:  # noqa: BLE001 (a step torch cannot capture: said in the table)
                if not graph:
                    raise
                notes.append(f"{label}, {args.amp}: PyTorch's CUDA graph capture failed ({type(e).__name__}: "
                             f"{str(e).splitlines()[0][:160]}); that row is PyTorch eager")
                runners[("torch", "eager (graph capture failed)")] = torch_step_fn(
                    name, data, args.torch_device, True, False, args.amp, resident)
            if not graph:
                first[("torch", tag)] = [float(runners[("torch", tag)][0](i).item()) for i in range(CHECKED)]
        reference = np.array(first[("torch", "eager")])
        tol = 2e-2 if args.amp != "none" else 1e-4 if args.precision == "highest" else 1e-2
        later = max(tol, CHAOTIC.get(name, tol))  # the losses after the first update
        for tag, _ in ours:
            rels = np.abs(np.array(first[("ggrad", tag)]) - reference) / np.abs(reference)
            ok = rels[0] <= tol and rels.max() <= later
            bound = f"tolerance {tol:g}" + (f", {later:g} after the first update (CHAOTIC)" if later > tol else "")
            notes.append(f"{label}, amp {args.amp}, precision {args.precision}: losses of steps 1-{CHECKED} "
                         f"ggrad {tag} {', '.join(f'{v:.7g}' for v in first[('ggrad', tag)])}; PyTorch eager "
                         f"{', '.join(f'{v:.7g}' for v in reference)}; largest relative difference {rels.max():.1e} "
                         f"({'ok' if ok else 'MISMATCH'}: {bound})")
        if args.hold_loss:
            runners = {key: holding_the_loss(runner) for key, runner in runners.items()}
            notes.append(f"{label}: every runner held each step's loss until the next step returned (--hold-loss)")
        after: dict | None = {} if args.by_predecessor else None
        ms = time_interleaved(runners, steps, args.blocks, args.warmup, after)
        for (runner, before), t in sorted((after or {}).items()):
            notes.append(f"{label}: {' '.join(runner)} after {' '.join(before)}: {statistics.median(t) * 1e3:.3f} ms "
                         f"a step (median of {len(t)} blocks)")
        for (side, their_tag) in runners:
            if side != "torch":
                continue
            t = ms[("torch", their_tag)]
            for tag, _ in ours:
                g = ms[("ggrad", tag)]
                print(f"| {label} | {amp_column} | {args.precision} | {tag} | {g * 1e3:.3f} | {their_tag} | "
                      f"{t * 1e3:.3f} | {g / t:.2f} |", flush=True)
    print()
    for note in notes:
        print(f"- {note}")

if __name__ == "__main__":
    main()
