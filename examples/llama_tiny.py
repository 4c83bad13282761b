"""Train a small llama (ggrad.models.Llama, ~3M parameters, byte-level) on Python's own
standard library source, export it as a GGUF that llama.cpp loads, and let llama.cpp
(llama-cpp-python: scripts/build_llama_cpp.sh, run by `make setup`) generate from it beside ggrad's own greedy decoding.

    .venv/bin/python examples/llama_tiny.py [--steps 300] [--out runs/llama_tiny]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import ggrad
from ggrad.finetune import next_token_step
from ggrad import gguf
from ggrad.models import Llama, LlamaConfig
from ggrad.optim import AdamW

from char_lm import corpus  # noqa: E402  (examples/ is on the path when this runs)
from llama_cpp_child import compare_with_llama_cpp

CONFIG = LlamaConfig(vocab_size=259, dim=256, n_layers=4, n_heads=8, n_kv_heads=4, ffn_dim=704, max_seq_len=128)


def batches(data: np.ndarray, batch: int, context: int, rng: np.random.Generator):
    while True:
        rows = rng.integers(0, len(data) - context - 1, batch)
        window = np.stack([data[r:r + context + 1] for r in rows])
        yield window[:, :-1], window[:, 1:].reshape(-1)


def train(model: Llama, data: np.ndarray, steps: int, lr: float, context: int = 64, batch: int = 16,
          seed: int = 0, params=None) -> float:
    """AdamW on `params` (default: all of the model's) over random windows; the last loss."""
    step = next_token_step(model, AdamW(list(params if params is not None else model.parameters()), lr=lr,
                                        weight_decay=0.0))

    start, loss = time.perf_counter(), None
    for i, (x, y) in zip(range(steps), batches(data, batch, context, np.random.default_rng(seed))):
        loss = step(x, y)
        if i % 100 == 0 or i == steps - 1:
            print(f"step {i:4d}  loss {loss.item():.3f}  ({(i + 1) / (time.perf_counter() - start):.1f} steps/s)",
                  flush=True)
    return loss.item()


def greedy(model: Llama, ids: list[int], n: int) -> list[int]:
    """ggrad's own greedy decoding (the whole window each token: no KV cache)."""
    ids = list(ids)
    with ggrad.no_grad():
        for _ in range(n):
            logits = model(np.array([ids[-model.config.max_seq_len:]])).numpy()[0, -1]
            ids.append(int(np.argmax(logits)))
    return ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--device", default="gpu" if ggrad.gpu_available() else "cpu")
    ap.add_argument("--out", default="runs/llama_tiny")
    args = ap.parse_args()
    ggrad.set_device(args.device)
    ggrad.manual_seed(0)

    tokenizer = gguf.ByteTokenizer()
    data = np.array(tokenizer.encode(corpus()), dtype=np.int32)
    model = Llama(CONFIG)
    count = sum(p.numel() for p in model.parameters())
    print(f"llama: {count / 1e6:.2f}M parameters; {len(data)} byte tokens of the standard library's source; "
          f"device {ggrad.get_device()}")
    train(model, data, args.steps, lr=2e-3)

    os.makedirs(args.out, exist_ok=True)
    path = gguf.save_model(model, os.path.join(args.out, "llama_tiny.gguf"), tokenizer)
    print(f"wrote {path} ({os.path.getsize(path) / 2**20:.1f} MiB, llama.cpp's llama architecture)")
    model.eval()
    prompt = tokenizer.encode("def ")
    ours = greedy(model, prompt, 64)
    print("ggrad, greedy:\n" + tokenizer.decode(ours))
    compare_with_llama_cpp(path, prompt, ours, tokenizer, "from the GGUF file")

if __name__ == "__main__":
    main()
