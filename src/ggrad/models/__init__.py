"""Whole models built from ggrad.nn parts, laid out as the programs that run them expect."""

from .llama import ARCHITECTURES, GGUF_NAMES, KVCache, Llama, LlamaConfig

__all__ = ["ARCHITECTURES", "GGUF_NAMES", "KVCache", "Llama", "LlamaConfig"]
