"""`python -m ggrad finetune MODEL.gguf DATA.txt`: LoRA adapters trained over a llama.cpp
model where it lives (its quantized matrices stay in their blocks, frozen), on a text read
through the model's own vocabulary, written as a llama.cpp LoRA adapter.

A run keeps a checkpoint (the adapters, AdamW's state, the step and the losses) beside its
output every `checkpoint_every` steps; run the same command again and it carries on from
there. Each step's windows are drawn from the step's own seed, so a resumed run trains on
what the uninterrupted run would have.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass, field

import numpy as np

# the matrices adapted by default: every projection of attention and the FFN
TARGETS = {"phi3": ("wqkv", "wo", "w13", "w2")}
DEFAULT_TARGETS = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")


@dataclass
class FinetuneResult:
    adapter: str  # the llama.cpp adapter written
    losses: list[float] = field(default_factory=list)  # every step's training loss
    tokens: int = 0  # the text's tokens
    plot: str | None = None  # the loss curve (PNG), where matplotlib is installed
    command: str = ""  # llama.cpp's command that runs the model with the adapter
    memory: dict = field(default_factory=dict)  # bytes held on the device: blocks, float parameters, AdamW state


def next_token_step(model, optimizer):
    """A language model's compiled training step, (inputs, next-token targets) -> loss:
    cross-entropy over every position, backward, the optimizer's step, gradients zeroed."""
    import ggrad
    import ggrad.functional as F

    vocab = model.config.vocab_size

    @ggrad.compile
    def step(x, y):
        with ggrad.grad_tape():
            loss = F.cross_entropy(F.reshape(model(x), (-1, vocab)), y)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss
    return step


def memory_held(model, trained) -> dict[str, int]:
    """Bytes a fine-tuning holds on the device: the quantized matrices' blocks, every float
    parameter (norms, adapters...), and AdamW's two moments of each `trained` parameter."""
    blocks = [m.weight for m in model.modules() if getattr(m, "weight", None) is not None and m.weight.dtype.is_quantized]
    return {"quantized blocks": sum(w.handle.nbytes for w in blocks),
            "float parameters": sum(p.handle.nbytes for p in model.parameters()),
            "AdamW moments": 2 * sum(p.handle.nbytes for p in trained)}


def describe_memory(memory: dict[str, int]) -> str:
    """memory_held's parts and their sum, in MiB."""
    parts = " + ".join(f"{name} {size / 2**20:.2f} MiB" for name, size in memory.items())
    return f"{parts} = {sum(memory.values()) / 2**20:.2f} MiB"


def windows(data: np.ndarray, step: int, batch: int, context: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Step `step`'s batch: `batch` windows of context + 1 tokens at offsets drawn from
    (seed, step) alone (the same after a resume); inputs and next-token targets."""
    rows = np.random.default_rng([seed, step]).integers(0, len(data) - context, batch)
    window = np.stack([data[r:r + context + 1] for r in rows])
    return window[:, :-1], window[:, 1:].reshape(-1)


def finetune(model_path: str, data_path: str, out: str = "adapter.gguf", rank: int = 8, alpha: float = 16.0,
             steps: int = 200, lr: float = 1e-3, batch: int = 8, context: int = 128, targets=None, seed: int = 0,
             checkpoint_every: int = 50, progress: bool = True) -> FinetuneResult:
    """Train LoRA adapters of `rank` over the model at `model_path` on the text at
    `data_path` and write them to `out`; resumes from `out`'s checkpoint when one exists."""
    from ggrad import gguf, io
    from ggrad.nn import lora
    from ggrad.optim import AdamW
    from ggrad.tokenizer import GGUFTokenizer
    from tqdm import tqdm

    for name, value in (("rank", rank), ("steps", steps), ("batch", batch), ("context", context),
                        ("checkpoint_every", checkpoint_every)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"finetune: {name} must be a positive int, got {value!r}")
    model = gguf.load_model(model_path)
    context = min(context, model.config.max_seq_len)
    text = open(data_path, encoding="utf-8").read()
    data = np.array(GGUFTokenizer.from_file(model_path).encode(text), dtype=np.int32)
    if len(data) < context + 1:
        raise ValueError(f"finetune: {data_path} is {len(data)} tokens, fewer than a window of {context + 1}")
    names = lora.add_lora(model, targets or TARGETS.get(model.config.arch, DEFAULT_TARGETS), rank=rank, alpha=alpha)
    adapters = {name: p for name, p in model.named_parameters() if p.requires_grad}
    opt = AdamW(list(adapters.values()), lr=lr, weight_decay=0.0)
    checkpoint = out + ".checkpoint"
    # what makes a run: a checkpoint of another is refused, not mixed in
    run = {"model": os.path.abspath(model_path), "data": hashlib.sha256(text.encode()).hexdigest(), "rank": rank,
           "alpha": float(alpha), "lr": float(lr), "batch": batch, "context": context, "seed": seed,
           "targets": sorted(adapters), "steps": steps}
    losses: list[float] = []
    start = 0
    if os.path.exists(checkpoint):
        saved = io.load(checkpoint)
        changed = [key for key, value in run.items() if key != "steps" and saved.get("run", {}).get(key) != value]
        if changed:
            raise ValueError(f"finetune: {checkpoint} is a run with another {', '.join(changed)}; run the same "
                             "command to resume it, or remove it to start over")
        model.load_state_dict(saved["adapters"], strict=False)
        opt.load_state_dict(saved["optimizer"])
        start, losses = int(saved["step"]), [float(v) for v in saved["losses"]]

    train_step = next_token_step(model, opt)

    def save_checkpoint(step: int) -> None:
        io.save({"run": run, "step": step, "losses": losses, "adapters": {k: v.detach() for k, v in adapters.items()},
                 "optimizer": opt.state_dict()}, checkpoint)

    bar = tqdm(range(start, steps), initial=start, total=steps, disable=not progress, unit="step",
               desc=f"LoRA rank {rank} on {len(names)} matrices")
    for step in bar:
        x, y = windows(data, step, batch, context, seed)
        loss = train_step(x, y).item()
        if not math.isfinite(loss):
            raise FloatingPointError(f"finetune: the loss is {loss} at step {step}; try a lower lr")
        losses.append(loss)
        bar.set_postfix(loss=f"{loss:.3f}")
        if (step + 1) % checkpoint_every == 0 and step + 1 < steps:
            save_checkpoint(step + 1)
    bar.close()
    result = FinetuneResult(gguf.save_lora(model, out), losses, len(data))
    result.memory = memory_held(model, adapters.values())
    if os.path.exists(checkpoint):
        os.remove(checkpoint)  # the run is done: a new command starts a new run
    result.plot = _plot(losses, os.path.splitext(out)[0] + "_loss.png")
    result.command = f"llama-cli -m {model_path} --lora {out} -p \"...\""
    return result


def _plot(losses: list[float], path: str) -> str | None:
    """The loss curve as a PNG, or None without matplotlib (ggrad's `plot` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(losses) + 1), losses, linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title("LoRA fine-tuning")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
