"""A word-level LSTM language model's training step (PyTorch's examples/word_language_model
at issue 25's size: 2 layers, 64 wide, bptt 20, batch 10, a 10,000-word vocabulary),
ggrad compiled against PyTorch eager in the same process, interleaved blocks.

    .venv/bin/python bench/word_lm.py [--arch lstm|gru|transformer] [--blocks 9] [--eager] [--composed]
    python3 bench/word_lm.py --device cuda --torch-device cuda      (GPU host)

Both sides: embedding, the recurrent layers (or a 2-layer TransformerEncoder), a linear
decoder, cross_entropy, clip_grad_norm_ and SGD as the example has them, on the same
initial weights and batches. Prints medians and the first losses of both.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def build(nn, arch: str, vocab: int, dim: int, layers: int):
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Embedding(vocab, dim)
            if arch == "transformer":
                layer = nn.TransformerEncoderLayer(dim, 2, dim_feedforward=dim * 2, dropout=0.0)
                self.rnn = nn.TransformerEncoder(layer, layers)
            else:
                self.rnn = (nn.LSTM if arch == "lstm" else nn.GRU)(dim, dim, layers)
            self.decoder = nn.Linear(dim, vocab)

        def forward(self, ids):
            x = self.encoder(ids)
            out = self.rnn(x) if arch == "transformer" else self.rnn(x)[0]
            return self.decoder(out)
    return Model()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", choices=["lstm", "gru", "transformer"], default="lstm")
    ap.add_argument("--vocab", type=int, default=10000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--bptt", type=int, default=20)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--blocks", type=int, default=9)
    ap.add_argument("--device", default="cpu", help="ggrad's device")
    ap.add_argument("--torch-device", default="cpu")
    ap.add_argument("--eager", action="store_true", help="ggrad's step as a plain loop (not ggrad.compile)")
    ap.add_argument("--composed", action="store_true",
                    help="compose the cell per step (a backend without ggrad's recurrent kernels)")
    args = ap.parse_args()

    import torch
    import ggrad
    import ggrad.functional as F
    from ggrad import nn

    torch.set_num_threads(2)
    torch.manual_seed(0)
    if args.composed:
        from ggrad.nn import recurrent
        recurrent.recurrent_layer = lambda *a: None
    ggrad.set_device(args.device)
    theirs = build(torch.nn, args.arch, args.vocab, args.dim, args.layers)
    ours = build(nn, args.arch, args.vocab, args.dim, args.layers)
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    theirs.to(args.torch_device)
    rng = np.random.default_rng(0)
    batches = [(rng.integers(0, args.vocab, (args.bptt, args.batch)), rng.integers(0, args.vocab, args.bptt * args.batch))
               for _ in range(args.steps)]
    on_torch = [(torch.from_numpy(x).to(args.torch_device), torch.from_numpy(y).to(args.torch_device)) for x, y in batches]
    opt_t = torch.optim.SGD(theirs.parameters(), lr=20.0)
    opt_g = ggrad.optim.SGD(ours.parameters(), lr=20.0)

    def torch_step(i):
        x, y = on_torch[i % len(on_torch)]
        opt_t.zero_grad()
        loss = torch.nn.functional.cross_entropy(theirs(x).reshape(-1, args.vocab), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(theirs.parameters(), 0.25)
        opt_t.step()
        return loss

    def ggrad_step(x, y):
        with ggrad.grad_tape():
            loss = F.cross_entropy(ours(x).reshape(-1, args.vocab), y)
            loss.backward()
        ggrad.optim.clip_grad_norm_(ours.parameters(), 0.25)  # torch.nn.utils.clip_grad_norm_
        opt_g.step()
        opt_g.zero_grad()
        return loss

    if not args.eager:
        ggrad_step = ggrad.compile(ggrad_step)
    inputs = [(ggrad.tensor(x.astype(np.int32)), ggrad.tensor(y.astype(np.int32))) for x, y in batches]
    first_t = [torch_step(i).item() for i in range(3)]
    first_g = [ggrad_step(*inputs[i]).item() for i in range(3)]
    times = {"ggrad": [], "torch": []}
    for _ in range(args.blocks):
        for name in ("ggrad", "torch"):
            start = time.perf_counter()
            for i in range(args.steps):
                loss = ggrad_step(*inputs[i]) if name == "ggrad" else torch_step(i)
            float(loss.item())
            times[name].append((time.perf_counter() - start) / args.steps * 1e3)
    g, t = statistics.median(times["ggrad"]), statistics.median(times["torch"])
    how = "eager" if args.eager else f"compiled ({sum(ggrad_step.op_counts().values())} nodes)"
    print(f"{args.arch} LM, vocab {args.vocab}, dim {args.dim}, {args.layers} layers, bptt {args.bptt}, batch "
          f"{args.batch}: ggrad {how} on {ggrad.get_device()} {g:.2f} ms, PyTorch eager on "
          f"{args.torch_device} {t:.2f} ms, ratio {g / t:.2f}")
    print(f"losses of steps 1-3: ggrad {first_g}, PyTorch {first_t}")


if __name__ == "__main__":
    main()
