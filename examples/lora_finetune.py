"""Fine-tune LoRA adapters over a quantized llama: the model examples/llama_tiny.py wrote is
quantized (Q8_0 by default; --dtype q4_0, q4_1, q5_0, q5_1) and loaded with its matrices
kept in their blocks (frozen), adapters train on a different text (difflib's source), and
the adapter is exported as a GGUF LoRA adapter that llama.cpp applies to the quantized
model. Prints the memory held: the blocks, the float parameters and Adam's state.

    .venv/bin/python examples/llama_tiny.py          # first: writes runs/llama_tiny/llama_tiny.gguf
    .venv/bin/python examples/lora_finetune.py [--steps 200] [--dtype q4_0]
"""

from __future__ import annotations

import argparse
import difflib
import os

import numpy as np

import ggrad
import ggrad.functional as F
from ggrad import gguf, nn
from ggrad.finetune import describe_memory, memory_held
from ggrad.nn import lora

from llama_cpp_child import compare_with_llama_cpp
from llama_tiny import batches, greedy, train

TARGETS = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")


def mean_loss(model, data: np.ndarray, windows: int = 16, context: int = 64) -> float:
    """Cross-entropy on fixed windows of `data` (the same ones before and after)."""
    x, y = next(batches(data, windows, context, np.random.default_rng(123)))
    with ggrad.no_grad():
        return F.cross_entropy(F.reshape(model(x), (-1, model.config.vocab_size)), ggrad.tensor(y)).item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--device", default="gpu" if ggrad.gpu_available() else "cpu")
    ap.add_argument("--base", default="runs/llama_tiny/llama_tiny.gguf")
    ap.add_argument("--out", default="runs/lora_finetune")
    # the K-quants need rows of 256 weights: llama_tiny's feed-forward rows are 704
    ap.add_argument("--dtype", default="q8_0", choices=["q4_0", "q4_1", "q5_0", "q5_1", "q8_0"])
    args = ap.parse_args()
    if not os.path.exists(args.base):
        raise SystemExit(f"{args.base} is missing: run examples/llama_tiny.py first")
    ggrad.set_device(args.device)
    ggrad.manual_seed(0)
    os.makedirs(args.out, exist_ok=True)

    base = gguf.load_model(args.base)
    quantized_path = gguf.save_model(base, os.path.join(args.out, f"base_{args.dtype}.gguf"), dtype=args.dtype)
    model = gguf.load_model(quantized_path)
    bases = [m.weight for m in model.modules() if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))]
    held = memory_held(model, [])["quantized blocks"]
    print(f"{quantized_path}: matrices held in {args.dtype.upper()} on {ggrad.get_device()}, {held / 2**20:.2f} MiB "
          f"(float32 would be {sum(w.numel() for w in bases) * 4 / 2**20:.2f} MiB)")

    tokenizer = gguf.ByteTokenizer()
    text = open(difflib.__file__, encoding="utf-8").read()[:200_000]
    data = np.array(tokenizer.encode(text), dtype=np.int32)
    names = lora.add_lora(model, TARGETS, rank=8, alpha=16.0)
    adapters = [p for p in model.parameters() if p.requires_grad]
    print(f"LoRA rank 8 on {len(names)} matrices: {sum(p.numel() for p in adapters)} trainable parameters")
    before = mean_loss(model, data)
    train(model, data, args.steps, lr=1e-3, params=adapters, seed=1)
    after = mean_loss(model, data)
    print(f"loss on difflib's source: {before:.3f} before, {after:.3f} after fine-tuning")
    print(f"held for fine-tuning: {describe_memory(memory_held(model, adapters))}")
    adapter = gguf.save_lora(model, os.path.join(args.out, "adapter.gguf"))
    print(f"wrote {adapter} (llama.cpp LoRA adapter, alpha 16)")
    model.eval()
    prompt = tokenizer.encode("    def ")
    ours = greedy(model, prompt, 48)
    print(f"ggrad, {args.dtype.upper()} + adapters, greedy:\n" + tokenizer.decode(ours))
    compare_with_llama_cpp(quantized_path, prompt, ours, tokenizer, f"{args.dtype.upper()} model + adapter file",
                           lora=adapter)

if __name__ == "__main__":
    main()
