"""examples/char_lm.py's training step (2 pre-norm transformer blocks, dim 64, 4 heads,
context 32, batch 32, AdamW), ggrad against its PyTorch twin in the same process: same
weights, same batches, interleaved blocks of steps, 2 threads each.

    .venv/bin/python bench/char_lm.py [--eager] [--blocks 9]

Both sides run the step as its user writes it: a batch of windows from the corpus made on
the host, the forward, cross_entropy, backward, the optimizer's step and zero_grad, and
the loss read with .item() at every step. ggrad's step is `ggrad.compile`d unless
`--eager`. Prints medians, their ratio and the first losses of both.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))


def torch_twin(torch, vocab: int, context: int, dim: int = 64, heads: int = 4, layers: int = 2):
    """char_lm's CharLM written with torch.nn, under ggrad's parameter names."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1 = nn.LayerNorm(dim)
            self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
            self.norm2 = nn.LayerNorm(dim)
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.Dropout(0.0))

        def forward(self, x):
            h = self.norm1(x)
            mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
            x = x + self.attn(h, h, h, need_weights=False, attn_mask=mask, is_causal=True)[0]
            return x + self.mlp(self.norm2(x))

    class CharLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = nn.Embedding(vocab, dim)
            self.positions = nn.Parameter(torch.randn(context, dim) * 0.02)
            self.blocks = nn.ModuleList([Block() for _ in range(layers)])
            self.norm = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, vocab)

        def forward(self, ids):
            x = self.tokens(ids) * 0.1 + self.positions[:ids.shape[1]]
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))
    return CharLM()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--context", type=int, default=32)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=10, help="steps per timed block")
    ap.add_argument("--blocks", type=int, default=9)
    ap.add_argument("--eager", action="store_true", help="ggrad's step as a plain loop (not ggrad.compile)")
    args = ap.parse_args()

    import torch

    import ggrad
    import ggrad.functional as F
    from char_lm import CharLM, corpus
    from ggrad.optim import AdamW

    torch.set_num_threads(2)
    torch.manual_seed(0)
    text = corpus()
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    data = np.array([index[c] for c in text], dtype=np.int64)
    vocab = len(chars)

    theirs = torch_twin(torch, vocab, args.context)
    ours = CharLM(vocab, args.context)
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    opt_t = torch.optim.AdamW(theirs.parameters(), lr=3e-3, weight_decay=1e-2)
    opt_g = AdamW(ours.parameters(), lr=3e-3, weight_decay=1e-2)
    rng = np.random.default_rng(0)
    windows = [np.stack([data[r:r + args.context + 1] for r in rng.integers(0, len(data) - args.context - 1, args.batch)])
               for _ in range(args.steps)]

    def torch_step(i):
        w = torch.from_numpy(windows[i % len(windows)])
        loss = torch.nn.functional.cross_entropy(theirs(w[:, :-1]).reshape(-1, vocab), w[:, 1:].reshape(-1))
        loss.backward()
        opt_t.step()
        opt_t.zero_grad()
        return loss.item()

    def train(x, y):
        with ggrad.grad_tape():
            loss = F.cross_entropy(ours(x).reshape(-1, vocab), y)
            loss.backward()
        opt_g.step()
        opt_g.zero_grad()
        return loss

    run = train if args.eager else ggrad.compile(train)

    def ggrad_step(i):
        w = windows[i % len(windows)]
        return run(ggrad.tensor(w[:, :-1]), ggrad.tensor(w[:, 1:].reshape(-1))).item()

    first_t = [torch_step(i) for i in range(3)]
    first_g = [ggrad_step(i) for i in range(3)]
    times = {"ggrad": [], "torch": []}
    for _ in range(args.blocks):
        for name, step in (("ggrad", ggrad_step), ("torch", torch_step)):
            start = time.perf_counter()
            for i in range(args.steps):
                step(i)
            times[name].append((time.perf_counter() - start) / args.steps * 1e3)
    g, t = statistics.median(times["ggrad"]), statistics.median(times["torch"])
    how = "eager" if args.eager else f"compiled ({sum(run.op_counts().values())} nodes)"
    print(f"char_lm (dim 64, 2 blocks, context {args.context}, batch {args.batch}, vocab {vocab}): ggrad {how} "
          f"on {ggrad.get_device()} {g:.2f} ms, PyTorch eager {t:.2f} ms, ratio {g / t:.2f}")
    print(f"losses of steps 1-3: ggrad {[round(v, 6) for v in first_g]}, PyTorch {[round(v, 6) for v in first_t]}")


if __name__ == "__main__":
    main()
