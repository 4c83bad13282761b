"""`python -m ggrad info`: versions and every usable device.
`python -m ggrad finetune MODEL.gguf DATA.txt`: LoRA adapters for a llama.cpp model."""

from __future__ import annotations

import argparse
import sys
from importlib import metadata


def info() -> None:
    import logging

    import ggrad
    from ggrad import runtime
    from ggrad.runtime import backend, kernels

    logging.basicConfig(level=logging.DEBUG, format="%(name)s: %(message)s")  # ggml's banner too

    print(f"ggrad {ggrad.__version__}")
    print(f"ggml-python {metadata.version('ggml-python')} (ggml 0.15.3)")
    print(f"python {sys.version.split()[0]}")
    print(f"ggrad's kernel set: {kernels.version() or 'none (an unpatched ggml: ggml ops only)'}")
    print("devices:")
    for d in ggrad.devices():
        kind = "GPU" if d.is_gpu else ("CPU" if d.kind == "cpu" else "software")
        print(f"  {d.name:10s} {kind:8s} {d.memory_total / 2**30:7.1f} GiB  {d.description}")
        traits = backend.vulkan_traits(d.name)
        if traits:
            cores = traits.get("matrix cores", "?")
            used = "" if cores == "none" else " (ggrad uses them at matmul precision 'medium': docs/precision.md)"
            print(f"             matrix cores: {cores}{used}; fp16: {traits.get('fp16', '?')}; "
                  f"bf16: {traits.get('bf16', '?')}; int dot: {traits.get('int dot', '?')}")
        with ggrad.device(d.name):
            usable = [name for number, name in sorted(kernels.names().items())
                      if kernels.supported(runtime.current().backend, number)]
        print(f"             ggrad's kernels: {', '.join(usable) or 'none'}")
    features = backend.vulkan_shader_features()
    if features is not None:
        print(f"Vulkan shaders built with: {', '.join(features) or 'no optional features'} "
              f"(of {', '.join(backend.SHADER_FEATURES)})")
    print(f"default device: {ggrad.get_device()}; gpu available: {ggrad.gpu_available()}")


def finetune(args: argparse.Namespace) -> None:
    import ggrad
    from ggrad.finetune import describe_memory, finetune as run

    ggrad.set_device(args.device)
    ggrad.manual_seed(args.seed)
    targets = tuple(args.targets.split(",")) if args.targets else None
    result = run(args.model, args.data, args.out, rank=args.rank, alpha=args.alpha, steps=args.steps, lr=args.lr,
                 batch=args.batch, context=args.context, targets=targets, seed=args.seed,
                 checkpoint_every=args.checkpoint_every)
    first, last = result.losses[0] if result.losses else float("nan"), result.losses[-1] if result.losses else float("nan")
    print(f"{result.tokens} tokens of {args.data}; loss {first:.3f} at the first step, {last:.3f} at the last")
    print(f"wrote {result.adapter} (llama.cpp LoRA adapter, rank {args.rank}, alpha {args.alpha:g})")
    print(f"held on {ggrad.get_device()}: {describe_memory(result.memory)}")
    if result.plot:
        print(f"loss curve: {result.plot}")
    print(f"run it in llama.cpp:\n  {result.command}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ggrad")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="versions and every usable device")
    tune = commands.add_parser("finetune", help="LoRA adapters over a llama.cpp model (GGUF), trained on a text file",
                               description="Train LoRA adapters over MODEL (llama, qwen2, gemma or phi3 GGUF; "
                               "quantized matrices stay in their blocks) on DATA read through the model's vocabulary, "
                               "and write a llama.cpp LoRA adapter. Run again to resume from the checkpoint.")
    tune.add_argument("model", help="the base model, a GGUF file")
    tune.add_argument("data", help="a UTF-8 text file")
    tune.add_argument("--out", default="adapter.gguf", help="the adapter to write (default: adapter.gguf)")
    tune.add_argument("--rank", type=int, default=8)
    tune.add_argument("--alpha", type=float, default=16.0)
    tune.add_argument("--steps", type=int, default=200)
    tune.add_argument("--lr", type=float, default=1e-3)
    tune.add_argument("--batch", type=int, default=8)
    tune.add_argument("--context", type=int, default=128, help="tokens per window (at most the model's context)")
    tune.add_argument("--targets", default="", help="comma-separated matrices to adapt (default: every projection)")
    tune.add_argument("--checkpoint-every", type=int, default=50)
    tune.add_argument("--seed", type=int, default=0)
    tune.add_argument("--device", default=None, help="cpu, vulkan:0, cuda:0... (default: ggrad's default device)")
    args = parser.parse_args(argv)
    if args.command == "info":
        info()
    else:
        if args.device is None:
            import ggrad
            args.device = ggrad.get_device()
        finetune(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
