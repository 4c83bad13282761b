"""Tokens per second of a LoRA training step over a Q4_K llama of ~100M parameters (issue 31):
ggrad with the base kept in its Q4_K blocks, against PyTorch on the dequantized float32
weights with the same adapters, in the same process, interleaved blocks.

    .venv/bin/python bench/lora_tokens.py [--blocks 5] [--steps 3] [--device cpu] [--dtype q4_k]
    python3 bench/lora_tokens.py --device cuda:0 --torch-device cuda      (GPU host)

(On CUDA the input gradient through a quantized matrix is kernel set 22's CUDA kernel:
chunks of rows dequantized by ggml's own converters, then cuBLAS. It was only syntax-checked
(clang, CUDA 11.8 headers) when written: the first device run tests it.)

The model: llama layout, dim 768, 12 blocks, 12 heads (4 key/value heads), FFN 2048, a
32000-token vocabulary with tied embeddings (103M parameters); LoRA rank 8, alpha 16 on
every projection (84 matrices); AdamW lr 1e-4 on the adapters; batch 4 x 128 tokens.
PyTorch's side is a plain twin of the same module (peft's LoRA arithmetic: x W^T +
(x A^T) B^T * alpha / rank), float32 frozen weights, no quantization: what fine-tuning a
model of llama.cpp's needs without ggrad (the float weights, 4x the Q4_K bytes). Prints
the medians, the memory each side holds for the weights, and both first losses (they differ
by the activations' 8-bit rounding in ggml's Q4_K products, about 1e-3 of the loss).
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time

import numpy as np

CONFIG = dict(vocab_size=32000, dim=768, n_layers=12, n_heads=12, n_kv_heads=4, ffn_dim=2048, max_seq_len=256,
              tie_embeddings=True)
TARGETS = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")
RANK, ALPHA, LR = 8, 16.0, 1e-4


def ggrad_side(device: str, batch: int, context: int, seed: int, dtype: str = "q4_k"):
    import ggrad
    from ggrad import gguf
    from ggrad.finetune import memory_held, next_token_step
    from ggrad.functional import quantized
    from ggrad.models import Llama, LlamaConfig
    from ggrad.nn import lora
    from ggrad.optim import AdamW

    ggrad.set_device(device)
    ggrad.manual_seed(seed)
    base = Llama(LlamaConfig(**CONFIG))
    with ggrad.no_grad():  # a language model's scale (N(0, 1) embeddings give logits in the hundreds)
        base.tok_embeddings.weight.assign_(base.tok_embeddings.weight.numpy() * 0.02)
    with tempfile.TemporaryDirectory() as folder:
        path = gguf.save_model(base, f"{folder}/base.gguf", dtype=dtype)
        model = gguf.load_model(path)
    floats = {k: v.numpy() for k, v in model.state_dict().items()}  # norms
    for name, module in model.named_modules():  # the float weights PyTorch trains over
        weight = getattr(module, "weight", None)
        if weight is not None and weight.dtype.is_quantized:
            floats[name + ".weight"] = np.asarray(quantized.dequantize(weight))
    held = memory_held(model, [])["quantized blocks"]
    lora.add_lora(model, TARGETS, rank=RANK, alpha=ALPHA)
    adapters = {n: p for n, p in model.named_parameters() if p.requires_grad}
    step = next_token_step(model, AdamW(list(adapters.values()), lr=LR, weight_decay=0.0))

    def run(x, y) -> float:
        return step(x, y).item()
    return run, floats, {n: p.numpy() for n, p in adapters.items()}, held


def torch_side(floats: dict, adapters: dict, device: str):
    import torch

    torch.set_num_threads(max(1, len(__import__("os").sched_getaffinity(0))))
    dev = torch.device(device)
    c = CONFIG
    w = {k: torch.tensor(v, device=dev) for k, v in floats.items()}
    lo = {k: torch.tensor(v, device=dev, requires_grad=True) for k, v in adapters.items()}
    opt = torch.optim.AdamW(list(lo.values()), lr=LR, weight_decay=0.0)
    hd, groups, scale = c["dim"] // c["n_heads"], c["n_heads"] // c["n_kv_heads"], ALPHA / RANK

    def linear(x, name):
        y = x @ w[name + ".weight"].T
        if name + ".lora_A" in lo:
            y = y + (x @ lo[name + ".lora_A"].T) @ lo[name + ".lora_B"].T * scale
        return y

    def rms(x, name):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w[name]

    def rope(x):  # llama.cpp's NORM rope: adjacent pairs
        b, t, h, d = x.shape
        freqs = 10000.0 ** (-torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d)
        angles = torch.outer(torch.arange(t, device=dev, dtype=torch.float32), freqs)
        cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack([even * cos - odd * sin, even * sin + odd * cos], -1).reshape(b, t, h, d)

    def forward(ids):
        b, t = ids.shape
        x = w["tok_embeddings.weight"][ids]
        for i in range(c["n_layers"]):
            p = f"layers.{i}."
            h = rms(x, p + "attention_norm.weight")
            q = rope(linear(h, p + "attention.wq").reshape(b, t, c["n_heads"], hd))
            k = rope(linear(h, p + "attention.wk").reshape(b, t, c["n_kv_heads"], hd))
            v = linear(h, p + "attention.wv").reshape(b, t, c["n_kv_heads"], hd)
            q, k, v = (z.transpose(1, 2) for z in (q, k.repeat_interleave(groups, 2), v.repeat_interleave(groups, 2)))
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + linear(a.transpose(1, 2).reshape(b, t, c["dim"]), p + "attention.wo")
            h = rms(x, p + "ffn_norm.weight")
            f = torch.nn.functional.silu(linear(h, p + "feed_forward.w1")) * linear(h, p + "feed_forward.w3")
            x = x + linear(f, p + "feed_forward.w2")
        return rms(x, "norm.weight") @ w["tok_embeddings.weight"].T

    def run(x, y) -> float:
        loss = torch.nn.functional.cross_entropy(forward(torch.tensor(x, device=dev)).reshape(-1, c["vocab_size"]),
                                                 torch.tensor(y, device=dev))
        loss.backward()
        opt.step()
        opt.zero_grad()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return loss.item()
    return run, sum(t.numel() * 4 for k, t in w.items() if t.ndim == 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--torch-device", default="cpu")
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="steps per block")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--dtype", default="q4_k", help="the base's type (q4_k, q8_0...)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    batches = [(ids[:, :-1], ids[:, 1:].reshape(-1)) for ids in
               (rng.integers(0, CONFIG["vocab_size"], (args.batch, args.context + 1)) for _ in range(4))]
    ours, floats, adapters, held = ggrad_side(args.device, args.batch, args.context, 0, args.dtype)
    theirs, torch_bytes = torch_side(floats, adapters, args.torch_device)
    params = sum(v.size for v in floats.values())
    first = (ours(*batches[0]), theirs(*batches[0]))
    print(f"model: {params / 1e6:.0f}M parameters ({args.dtype.upper()} base {held / 2**20:.0f} MiB in ggrad; PyTorch's float32 "
          f"matrices {torch_bytes / 2**20:.0f} MiB); LoRA rank {RANK} on {len(adapters) // 2} matrices; "
          f"batch {args.batch} x {args.context} tokens")
    print(f"first loss: ggrad {first[0]:.6f}, PyTorch {first[1]:.6f} (relative {abs(first[0] - first[1]) / first[1]:.1e})")
    times = {"ggrad": [], "PyTorch": []}
    for block in range(args.blocks):
        for name, run in (("ggrad", ours), ("PyTorch", theirs)):
            t0 = time.perf_counter()
            for i in range(args.steps):
                run(*batches[(block + i) % len(batches)])
            times[name].append((time.perf_counter() - t0) / args.steps)
    tokens = args.batch * args.context
    g, t = statistics.median(times["ggrad"]), statistics.median(times["PyTorch"])
    print(f"| side | device | s/step (median of {args.blocks}) | tokens/s |\n| --- | --- | --- | --- |")
    print(f"| ggrad, {args.dtype.upper()} base | {args.device} | {g:.3f} | {tokens / g:.0f} |")
    print(f"| PyTorch, float32 base | {args.torch_device} | {t:.3f} | {tokens / t:.0f} |")
    print(f"ratio (ggrad time / PyTorch time): {g / t:.2f}; all blocks: ggrad "
          f"{', '.join(f'{v:.3f}' for v in times['ggrad'])}; PyTorch {', '.join(f'{v:.3f}' for v in times['PyTorch'])}")
    assert math.isfinite(first[0]) and math.isfinite(first[1])


if __name__ == "__main__":
    main()
