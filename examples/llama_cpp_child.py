"""llama.cpp's greedy generation from a GGUF file, in a child process: llama-cpp-python
and ggml-python each bundle a libggml, so the two stay in separate processes."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r"""
import json, sys
from llama_cpp import Llama
path, prompt, n, lora = json.loads(sys.argv[1])
import llama_cpp
llm = Llama(model_path=path, n_ctx=max(128, len(prompt) + n), n_threads=2, verbose=False, lora_path=lora,
            type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, flash_attn=False)  # as ggrad: float32
out = []
for token in llm.generate(prompt, top_k=1, temp=0.0, repeat_penalty=1.0):
    out.append(token)
    if len(out) == n:
        break
print(json.dumps(prompt + out))
"""


def llama_cpp_generate(path: str, prompt: list[int], n: int, lora: str | None = None) -> list[int] | None:
    """The prompt and `n` greedy tokens as llama.cpp generates them (with the LoRA adapter
    at `lora`), or None where llama-cpp-python is not installed."""
    try:
        import importlib.util
        if importlib.util.find_spec("llama_cpp") is None:
            return None
    except ImportError:
        return None
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps([path, prompt, n, lora])],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"llama.cpp failed on {path}:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compare_with_llama_cpp(path: str, prompt: list[int], ours: list[int], tokenizer, what: str,
                           lora: str | None = None) -> None:
    """Print llama.cpp's greedy continuation of `prompt` from the file at `path` and how
    many of its tokens equal ggrad's (`ours`, prompt included)."""
    n = len(ours) - len(prompt)
    theirs = llama_cpp_generate(path, prompt, n, lora)
    if theirs is None:
        print("llama.cpp: llama-cpp-python is not installed (scripts/build_llama_cpp.sh builds it)")
        return
    print(f"llama.cpp, {what}, greedy:\n" + tokenizer.decode(theirs))
    same = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), len(ours))
    print(f"the first {same - len(prompt)} of {n} generated tokens are the same")
