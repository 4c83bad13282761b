"""A small character-level language model (a transformer, or with --arch lstm a 2-layer
LSTM), trained on Python's own standard library source (it ships with every Python),
then sampled.

    .venv/bin/python examples/char_lm.py [--steps 600] [--device cpu] [--arch lstm]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import ggrad
import ggrad.functional as F
from ggrad import nn
from ggrad.optim import AdamW


def corpus(limit: int = 400_000) -> str:
    import json
    import textwrap
    files = [json.__file__.replace("__init__.py", "decoder.py"), textwrap.__file__,
             os.path.join(os.path.dirname(os.__file__), "functools.py")]
    text = "".join(open(f, encoding="utf-8").read() for f in files)
    return text[:limit]


class CharLM(nn.Module):
    def __init__(self, vocab: int, context: int, dim: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.context = context
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = ggrad.param(np.random.default_rng(0).standard_normal((context, dim)) * 0.02)
        self.blocks = nn.ModuleList([nn.TransformerBlock(dim, heads, causal=True) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids):
        b, t = ids.shape
        x = self.tokens(ids) * 0.1 + self.positions[:t]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class CharLSTM(nn.Module):
    def __init__(self, vocab: int, dim: int = 64, hidden: int = 128, layers: int = 2) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ids):
        out, _ = self.lstm(self.tokens(ids))
        return self.head(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=600)  # ~45 s on 2 CPU cores
    ap.add_argument("--device", default="gpu" if ggrad.gpu_available() else "cpu")
    ap.add_argument("--context", type=int, default=32)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--arch", choices=["transformer", "lstm"], default="transformer")
    args = ap.parse_args()
    ggrad.set_device(args.device)
    ggrad.manual_seed(0)

    text = corpus()
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    data = np.array([index[c] for c in text], dtype=np.int32)
    print(f"{len(text)} characters of the standard library's source, {len(chars)} distinct; device {ggrad.get_device()}")

    model = CharLSTM(len(chars)) if args.arch == "lstm" else CharLM(len(chars), args.context)
    opt = AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
    rng = np.random.default_rng(0)

    @ggrad.compile  # traced on the first calls, then one kept graph per step
    def train_step(x, y):
        with ggrad.grad_tape():
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, len(chars)), y)
            loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    start = time.perf_counter()
    for step in range(args.steps):
        rows = rng.integers(0, len(data) - args.context - 1, args.batch)
        window = np.stack([data[r:r + args.context + 1] for r in rows])
        loss = train_step(window[:, :-1], window[:, 1:].reshape(-1))
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.3f}  ({(step + 1) / (time.perf_counter() - start):.1f} steps/s)")

    model.eval()
    prompt = "def "
    ids = [index[c] for c in prompt]
    with ggrad.no_grad():
        for _ in range(200):
            window = np.array([ids[-args.context:]], dtype=np.int32)
            logits = model(ggrad.tensor(window)).numpy()[0, -1].astype(np.float64)
            p = np.exp((logits - logits.max()) / 0.8)
            ids.append(int(rng.choice(len(chars), p=p / p.sum())))
    print("sample:\n" + "".join(chars[i] for i in ids))


if __name__ == "__main__":
    main()
