"""The llama architecture as llama.cpp runs it (LLM_ARCH_LLAMA), built from ggrad.nn parts.

Pre-norm blocks: x + attention(rms_norm(x)), then x + swiglu(rms_norm(x)); a final
RMSNorm and the output projection (or the token embedding, tied). Attention is causal
with grouped-query heads: query head i reads key/value head i // (n_heads / n_kv_heads),
as ggml's broadcasting matrix product does in llama.cpp. RoPE is llama.cpp's rope type
NORM (ggml mode 0) for llama models: it turns adjacent pairs (2j, 2j + 1) of each head
by position * rope_theta^(-2j / head_dim), which is `F.rotary_embedding(interleaved=True)`.
(Hugging Face checkpoints rotate halves instead; llama.cpp's converter permutes their q
and k rows to pairs, so a model trained here needs no permutation.)

Submodule names are Meta's original llama ones; `GGUF_NAMES` maps each state-dict key
pattern ("{n}" is the block index) to llama.cpp's tensor name. A Linear weight is
(out, in) row-major, the same bytes as a GGUF tensor of ne = (in, out).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import autograd, dtypes
from .. import functional as F
from ..functional import quantized
from ..functional._core import _as_tensor
from ..nn import Embedding, Linear, Module, ModuleList, RMSNorm
from ..tensor import Tensor

GGUF_NAMES: dict[str, str] = {
    "tok_embeddings.weight": "token_embd.weight",
    "layers.{n}.attention_norm.weight": "blk.{n}.attn_norm.weight",
    "layers.{n}.attention.wq.weight": "blk.{n}.attn_q.weight",
    "layers.{n}.attention.wk.weight": "blk.{n}.attn_k.weight",
    "layers.{n}.attention.wv.weight": "blk.{n}.attn_v.weight",
    "layers.{n}.attention.wo.weight": "blk.{n}.attn_output.weight",
    "layers.{n}.ffn_norm.weight": "blk.{n}.ffn_norm.weight",
    "layers.{n}.feed_forward.w1.weight": "blk.{n}.ffn_gate.weight",
    "layers.{n}.feed_forward.w3.weight": "blk.{n}.ffn_up.weight",
    "layers.{n}.feed_forward.w2.weight": "blk.{n}.ffn_down.weight",
    "norm.weight": "output_norm.weight",
    "output.weight": "output.weight",
}


def gguf_name(key: str) -> str:
    """llama.cpp's tensor name for a Llama state-dict key (KeyError for any other key)."""
    parts = key.split(".")
    if parts[0] == "layers" and len(parts) > 2 and parts[1].isdigit():
        return GGUF_NAMES[".".join(["layers", "{n}"] + parts[2:])].format(n=int(parts[1]))
    return GGUF_NAMES[key]


@dataclass(frozen=True)
class LlamaConfig:
    """llama.cpp's llama hyperparameters: dim is n_embd, ffn_dim n_ff, max_seq_len
    n_ctx_train, norm_eps f_norm_rms_eps, rope_theta rope.freq_base."""

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    max_seq_len: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        sizes = ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "max_seq_len")
        for name in sizes:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"LlamaConfig.{name} must be a positive int, got {value!r}")
        if self.dim % self.n_heads:
            raise ValueError(f"LlamaConfig: dim {self.dim} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"LlamaConfig: n_heads {self.n_heads} is not divisible by n_kv_heads "
                             f"{self.n_kv_heads} (each key/value head serves a whole group of query heads)")
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig: head_dim {self.head_dim} (dim / n_heads) must be even for RoPE")
        if not self.norm_eps > 0 or not self.rope_theta > 0:
            raise ValueError(f"LlamaConfig: norm_eps and rope_theta must be positive, got {self.norm_eps}, "
                             f"{self.rope_theta}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


def state_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """The state-dict keys and shapes of `Llama(config)`, in its order, without building it:
    a loader checks a file's tensors against them before it allocates anything."""
    d, ff, vocab = config.dim, config.ffn_dim, config.vocab_size
    q, kv = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
    block = {"attention_norm.weight": (d,), "attention.wq.weight": (q, d), "attention.wk.weight": (kv, d),
             "attention.wv.weight": (kv, d), "attention.wo.weight": (d, q), "ffn_norm.weight": (d,),
             "feed_forward.w1.weight": (ff, d), "feed_forward.w2.weight": (d, ff), "feed_forward.w3.weight": (ff, d)}
    shapes = {"tok_embeddings.weight": (vocab, d)}
    for n in range(config.n_layers):
        shapes.update({f"layers.{n}.{key}": shape for key, shape in block.items()})
    shapes["norm.weight"] = (d,)
    if not config.tie_embeddings:
        shapes["output.weight"] = (vocab, d)
    return shapes


def _repeat_kv(x: Tensor, groups: int) -> Tensor:
    """(b, t, kv, d) -> (b, t, kv * groups, d), each head repeated `groups` times in a row
    (head i is kv head i // groups): one broadcast node, no loop over heads."""
    if groups == 1:
        return x
    b, t, kv, d = x.shape
    spread = F.broadcast_to(F.reshape(x, (b * t, kv, 1, d)), (b * t, kv, groups, d))
    return F.reshape(spread, (b, t, kv * groups, d))


class KVCache:
    """The keys (after RoPE) and values of the tokens a Llama has read, per layer: with it,
    generation runs each new token alone through the model instead of the whole window,
    as llama.cpp's KV cache does. Pass the same cache to every call of one sequence."""

    def __init__(self) -> None:
        self.keys: list[Tensor] = []  # per layer: (batch, tokens so far, kv heads, head_dim)
        self.values: list[Tensor] = []

    def __len__(self) -> int:
        """The tokens read so far (the next token's position)."""
        return self.keys[0].shape[1] if self.keys else 0

    def extend(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """The layer's keys and values with `k` and `v` (the new tokens') after them; kept."""
        if layer < len(self.keys):
            k, v = F.cat([self.keys[layer], k], dim=1), F.cat([self.values[layer], v], dim=1)
            self.keys[layer], self.values[layer] = k, v
        else:
            self.keys.append(k)
            self.values.append(v)
        return k, v


class Attention(Module):
    """Causal grouped-query self-attention with RoPE on queries and keys, no biases."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, config.head_dim
        self.rope_theta = config.rope_theta
        self.wq = Linear(config.dim, config.n_heads * config.head_dim, bias=False)
        self.wk = Linear(config.dim, config.n_kv_heads * config.head_dim, bias=False)
        self.wv = Linear(config.dim, config.n_kv_heads * config.head_dim, bias=False)
        self.wo = Linear(config.n_heads * config.head_dim, config.dim, bias=False)

    def forward(self, x: Tensor, cache: KVCache | None = None, layer: int = 0, start: int = 0) -> Tensor:
        """`start`: the position of x's first token (the tokens `cache` held before this call)."""
        b, t, _ = x.shape
        d, groups = self.head_dim, self.n_heads // self.n_kv_heads
        positions = None if start == 0 else np.arange(start, start + t, dtype=np.int32)
        q = F.reshape(self.wq(x), (b, t, self.n_heads, d))
        k = F.reshape(self.wk(x), (b, t, self.n_kv_heads, d))
        v = F.reshape(self.wv(x), (b, t, self.n_kv_heads, d))
        q = F.rotary_embedding(q, positions, base=self.rope_theta, interleaved=True)
        k = F.rotary_embedding(k, positions, base=self.rope_theta, interleaved=True)  # before the repeat
        if cache is not None:
            k, v = cache.extend(layer, k, v)
        q, k, v = (F.permute(h, (0, 2, 1, 3)) for h in (q, _repeat_kv(k, groups), _repeat_kv(v, groups)))
        # query i (position start + i) reads keys 0 .. start + i: is_causal where nothing is
        # cached, every key for one new token, else the mask aligned to the last key
        mask = None if start == 0 or t == 1 else np.arange(start + t)[None, :] <= start + np.arange(t)[:, None]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=start == 0)  # scale 1/sqrt(d)
        return self.wo(F.reshape(F.permute(out, (0, 2, 1, 3)), (b, t, self.n_heads * d)))


class FeedForward(Module):
    """SwiGLU: w2(silu(w1 x) * w3 x); w1 is llama.cpp's ffn_gate, w3 ffn_up, w2 ffn_down."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.w1 = Linear(config.dim, config.ffn_dim, bias=False)
        self.w2 = Linear(config.ffn_dim, config.dim, bias=False)
        self.w3 = Linear(config.dim, config.ffn_dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(Module):
    """One llama block: x + attention(attention_norm(x)), then x + feed_forward(ffn_norm(x))."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(config.dim, eps=config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.dim, eps=config.norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x: Tensor, cache: KVCache | None = None, layer: int = 0, start: int = 0) -> Tensor:
        x = x + self.attention(self.attention_norm(x), cache, layer, start)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(Module):
    """Token ids (batch, seq) -> logits (batch, seq, vocab_size). With tie_embeddings the
    output projection is the embedding table itself: one parameter, no `output.weight`."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings = Embedding(config.vocab_size, config.dim)
        self.layers = ModuleList(TransformerBlock(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.dim, eps=config.norm_eps)
        self.output = None if config.tie_embeddings else Linear(config.dim, config.vocab_size, bias=False)

    def forward(self, tokens, cache: KVCache | None = None) -> Tensor:
        """Logits of every position of `tokens`; with a `cache`, `tokens` continue what the
        cache has read (their positions follow it) and their keys and values join it."""
        tokens = _as_tensor(tokens, "Llama tokens")
        if tokens.ndim != 2 or tokens.dtype.is_floating_point or tokens.dtype is dtypes.bool_:
            raise ValueError(f"Llama needs integer token ids of shape (batch, seq), got {tokens.dtype} of shape "
                             f"{tokens.shape}")
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"Llama: cache must be a KVCache, got {type(cache).__name__}")
        seen = 0 if cache is None else len(cache)
        if seen + tokens.shape[1] > self.config.max_seq_len:
            raise ValueError(f"Llama: sequence of {seen + tokens.shape[1]} tokens is longer than max_seq_len "
                             f"{self.config.max_seq_len}")
        if cache is not None and cache.keys and cache.keys[0].shape[0] != tokens.shape[0]:
            raise ValueError(f"Llama: the cache holds {cache.keys[0].shape[0]} sequences, got a batch of "
                             f"{tokens.shape[0]}")
        h = self.tok_embeddings(tokens)  # ids outside [0, vocab_size) raise IndexError here
        for i, layer in enumerate(self.layers):
            h = layer(h, cache, i, seen)
        h = self.norm(h)
        if self.output is not None:
            return self.output(h)
        table = self.tok_embeddings.weight
        return quantized.linear(h, table) if table.dtype.is_quantized else h @ table.T

    def generate(self, tokens, max_new_tokens: int) -> list[int]:
        """Greedy continuation of one sequence of token ids (a list or 1-d array): the prompt
        runs once, then each new token alone against the KV cache (no gradient)."""
        ids = [int(i) for i in np.asarray(tokens).reshape(-1)]
        if not ids or isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"generate needs a non-empty prompt and max_new_tokens >= 0, got {len(ids)} tokens "
                             f"and {max_new_tokens!r}")
        cache, out, step = KVCache(), [], np.array([ids], dtype=np.int64)
        with autograd.no_grad():
            for _ in range(max_new_tokens):
                logits = self(step, cache)
                out.append(int(F.argmax(logits[0, -1]).item()))
                step = np.array([[out[-1]]], dtype=np.int64)
        return out

    def extra_repr(self) -> str:
        return repr(self.config)
