"""Where the transformer block's compiled step spends its time on one device (issue 13):
each piece of bench/train_step.py's block (torch's TransformerEncoderLayer, norm first)
as its own compiled forward+backward, on data already on the device.

    python bench/gpu/block_probe.py --device cuda [--batch 4]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import ggrad  # noqa: E402
import ggrad.functional as F  # noqa: E402
from ggrad import nn  # noqa: E402
from step_probe import timed  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    args = ap.parse_args()
    ggrad.set_device(args.device)
    ggrad.set_float32_matmul_precision("high")
    b, s, d, h = args.batch, args.seq, 512, 8
    rng = np.random.default_rng(0)

    def leaf(*shape):
        t = ggrad.tensor(rng.standard_normal(shape).astype(np.float32) * 0.1, requires_grad=True)
        ggrad.realize(t)
        return t

    x = leaf(b, s, d)
    q, k, v = leaf(b, h, s, d // h), leaf(b, h, s, d // h), leaf(b, h, s, d // h)
    scores = leaf(b, h, s, s)
    layer = nn.TransformerEncoderLayer(d, h, 2048, dropout=0.0, batch_first=True, norm_first=True)
    attn = nn.MultiheadAttention(d, h, batch_first=True)
    lin, norm = nn.Linear(d, 2048), nn.LayerNorm(d)

    def grad_step(f):
        def run(*inputs):  # returns every gradient (what is not returned is not computed)
            with ggrad.grad_tape():
                f(*inputs).sum().backward()
            params = [p for m in (layer, attn, lin, norm) for p in m.parameters() if p.grad is not None]
            grads = [t.grad for t in inputs] + [p.grad for p in params]
            for t in [*inputs, *params]:
                t.grad = None
            return grads
        return ggrad.compile(run)

    pieces = {
        "whole layer": (lambda x: layer(x), (x,)),
        "self-attention (nn.MultiheadAttention)": (lambda x: attn(x, x, x, need_weights=False)[0], (x,)),
        "scaled_dot_product_attention": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v), (q, k, v)),
        "q @ k^T (4-d matmul)": (lambda q, k: q @ k.transpose(-2, -1), (q, k)),
        "softmax over (b, h, s, s)": (lambda t: F.softmax(t, -1), (scores,)),
        "linear 512 -> 2048": (lambda x: lin(x), (x,)),
        "relu over (b, s, 2048)": (lambda x: F.relu(lin(x)), (x,)),
        "layer_norm": (lambda x: norm(x), (x,)),
    }
    print(f"block_probe: ggrad {args.device}, batch {b}, seq {s}, dim {d}, heads {h}; forward + backward, compiled\n")
    print("| piece | ms |")
    print("| --- | --- |")
    for label, (f, inputs) in pieces.items():
        step = grad_step(f)
        print(f"| {label} | {timed(lambda i: step(*inputs), ggrad.realize, 20, 5):.3f} |", flush=True)


if __name__ == "__main__":
    main()
