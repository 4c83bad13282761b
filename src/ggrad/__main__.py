"""`python -m ggrad info`: versions and every usable device."""

from __future__ import annotations

import argparse
import sys
from importlib import metadata


def info() -> None:
    import logging

    import ggrad
    from ggrad.runtime import backend

    logging.basicConfig(level=logging.DEBUG, format="%(name)s: %(message)s")  # ggml's banner too

    print(f"ggrad {ggrad.__version__}")
    print(f"ggml-python {metadata.version('ggml-python')} (ggml 0.15.3)")
    print(f"python {sys.version.split()[0]}")
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
    features = backend.vulkan_shader_features()
    if features is not None:
        print(f"Vulkan shaders built with: {', '.join(features) or 'no optional features'} "
              f"(of {', '.join(backend.SHADER_FEATURES)})")
    print(f"default device: {ggrad.get_device()}; gpu available: {ggrad.gpu_available()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ggrad")
    parser.add_argument("command", choices=["info"])
    parser.parse_args(argv)
    info()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
