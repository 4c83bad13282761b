"""The llama family as llama.cpp runs it: its "llama" architecture (LLM_ARCH_LLAMA, which
Mistral's models are in GGUF too), "qwen2", "gemma" and "phi3", built from ggrad.nn parts.

Pre-norm blocks: x + attention(rms_norm(x)), then x + gated_ffn(rms_norm(x)); a final
RMSNorm and the output projection (or the token embedding, tied). Attention is causal
with grouped-query heads: query head i reads key/value head i // (n_heads / n_kv_heads),
as ggml's broadcasting matrix product does in llama.cpp. RoPE is llama.cpp's rope type
NORM (ggml mode 0) for llama models: it turns adjacent pairs (2j, 2j + 1) of each head
by position * rope_theta^(-2j / head_dim), which is `F.rotary_embedding(interleaved=True)`.
(Hugging Face checkpoints rotate halves instead; llama.cpp's converter permutes their q
and k rows to pairs, so a model trained here needs no permutation.) The others, as
llama.cpp's graphs for them (src/models/<arch>.cpp) compute:
- qwen2: RoPE type NEOX (halves: pairs (j, j + head_dim / 2), no permutation in the
  converter), biases on the query, key and value projections.
- gemma: NEOX; the embeddings times sqrt(dim); queries times 1 / sqrt(head_dim) after
  RoPE (and the softmax's scale 1); gelu (tanh form) gating the FFN; the output always
  the embedding table. Its norms' weights are stored as 1 + w of the Hugging Face model
  (the converter adds the 1), so here they are plain RMSNorm weights, ones at the start.
  llama.cpp's CPU gelu reads an fp16 table (input and output rounded to fp16): ggrad's is
  the float32 formula, so gemma's logits differ from llama.cpp's by that rounding.
- phi3: NEOX; one fused projection for q, k, v (rows in that order) and one for the
  FFN's gate and up halves (gate first); queries scaled as gemma's.

Submodule names are Meta's original llama ones (wqkv and w13 for phi3's fused ones);
`GGUF_NAMES` maps each state-dict key pattern ("{n}" is the block index) to llama.cpp's
tensor name. A Linear weight is (out, in) row-major, the same bytes as a GGUF tensor of
ne = (in, out).
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
    "layers.{n}.attention.wq.bias": "blk.{n}.attn_q.bias",
    "layers.{n}.attention.wk.bias": "blk.{n}.attn_k.bias",
    "layers.{n}.attention.wv.bias": "blk.{n}.attn_v.bias",
    "layers.{n}.attention.wqkv.weight": "blk.{n}.attn_qkv.weight",
    "layers.{n}.attention.wo.weight": "blk.{n}.attn_output.weight",
    "layers.{n}.ffn_norm.weight": "blk.{n}.ffn_norm.weight",
    "layers.{n}.feed_forward.w1.weight": "blk.{n}.ffn_gate.weight",
    "layers.{n}.feed_forward.w3.weight": "blk.{n}.ffn_up.weight",
    "layers.{n}.feed_forward.w13.weight": "blk.{n}.ffn_up.weight",
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


ARCHITECTURES = ("llama", "qwen2", "gemma", "phi3")


@dataclass(frozen=True)
class LlamaConfig:
    """llama.cpp's hyperparameters of the llama family: dim is n_embd, ffn_dim n_ff,
    max_seq_len n_ctx_train, norm_eps f_norm_rms_eps, rope_theta rope.freq_base, arch
    general.architecture, key_length attention.key_length, the size of a head (0: dim /
    n_heads, `head_dim`; gemma-7b's differs)."""

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
    arch: str = "llama"
    key_length: int = 0

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"LlamaConfig.arch must be one of {ARCHITECTURES}, got {self.arch!r}")
        sizes = ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "max_seq_len")
        for name in sizes + ("key_length",):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "key_length" else 1):
                raise ValueError(f"LlamaConfig.{name} must be a positive int, got {value!r}")
        if self.key_length == 0 and self.dim % self.n_heads:
            raise ValueError(f"LlamaConfig: dim {self.dim} is not divisible by n_heads {self.n_heads} "
                             "(give key_length, the size of a head)")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"LlamaConfig: n_heads {self.n_heads} is not divisible by n_kv_heads "
                             f"{self.n_kv_heads} (each key/value head serves a whole group of query heads)")
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig: head_dim {self.head_dim} must be even for RoPE")
        if not self.norm_eps > 0 or not self.rope_theta > 0:
            raise ValueError(f"LlamaConfig: norm_eps and rope_theta must be positive, got {self.norm_eps}, "
                             f"{self.rope_theta}")
        if self.arch == "gemma" and not self.tie_embeddings:
            raise ValueError("LlamaConfig: gemma's output is its embedding table (llama.cpp refuses a gemma file "
                             "with an output.weight): give tie_embeddings=True")

    @property
    def head_dim(self) -> int:
        return self.key_length or self.dim // self.n_heads


def _block_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """One block's state-dict keys (without "layers.{n}.") and shapes, in its order."""
    d, ff = config.dim, config.ffn_dim
    q, kv = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
    block: dict[str, tuple[int, ...]] = {"attention_norm.weight": (d,)}
    if config.arch == "phi3":
        block["attention.wqkv.weight"] = (q + 2 * kv, d)
    else:
        block.update({"attention.wq.weight": (q, d), "attention.wk.weight": (kv, d), "attention.wv.weight": (kv, d)})
        if config.arch == "qwen2":
            block.update({"attention.wq.bias": (q,), "attention.wk.bias": (kv,), "attention.wv.bias": (kv,)})
    block.update({"attention.wo.weight": (d, q), "ffn_norm.weight": (d,)})
    if config.arch == "phi3":
        block.update({"feed_forward.w13.weight": (2 * ff, d), "feed_forward.w2.weight": (d, ff)})
    else:
        block.update({"feed_forward.w1.weight": (ff, d), "feed_forward.w2.weight": (d, ff),
                      "feed_forward.w3.weight": (ff, d)})
    return block


def state_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """The state-dict keys and shapes of `Llama(config)`, in its order, without building it:
    a loader checks a file's tensors against them before it allocates anything."""
    shapes = {"tok_embeddings.weight": (config.vocab_size, config.dim)}
    block = _block_shapes(config)
    for n in range(config.n_layers):
        shapes.update({f"layers.{n}.{key}": shape for key, shape in block.items()})
    shapes["norm.weight"] = (config.dim,)
    if not config.tie_embeddings:
        shapes["output.weight"] = (config.vocab_size, config.dim)
    return shapes


def tensor_count(config: LlamaConfig) -> int:
    """The tensors of a model of `config` in a GGUF file (counted without building the list)."""
    return 2 + len(_block_shapes(config)) * config.n_layers + (not config.tie_embeddings)


def _float32_inverse_sqrt(n: int) -> float:
    """1.0f / sqrtf(n), llama.cpp's query scale for gemma and phi3, as a float32 value."""
    return float(np.float32(1.0) / np.sqrt(np.float32(n)))


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
    """Causal grouped-query self-attention with RoPE on queries and keys; the projections
    as the architecture has them (qwen2's biases, phi3's fused one)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, config.head_dim
        self.rope_theta = config.rope_theta
        self.interleaved = config.arch == "llama"  # rope type NORM; NEOX for the others
        # gemma and phi3 scale the queries after RoPE (the softmax's scale is then 1)
        self.query_scale = _float32_inverse_sqrt(config.head_dim) if config.arch in ("gemma", "phi3") else None
        q, kv = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
        self.fused = config.arch == "phi3"
        if self.fused:
            self.wqkv = Linear(config.dim, q + 2 * kv, bias=False)
        else:
            bias = config.arch == "qwen2"
            self.wq = Linear(config.dim, q, bias=bias)
            self.wk = Linear(config.dim, kv, bias=bias)
            self.wv = Linear(config.dim, kv, bias=bias)
        self.wo = Linear(q, config.dim, bias=False)

    def _projections(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if self.fused:
            q, kv = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
            return F.split(self.wqkv(x), [q, kv, kv], dim=-1)
        return self.wq(x), self.wk(x), self.wv(x)

    def forward(self, x: Tensor, cache: KVCache | None = None, layer: int = 0, start: int = 0) -> Tensor:
        """`start`: the position of x's first token (the tokens `cache` held before this call)."""
        b, t, _ = x.shape
        d, groups = self.head_dim, self.n_heads // self.n_kv_heads
        positions = None if start == 0 else np.arange(start, start + t, dtype=np.int32)
        q, k, v = self._projections(x)
        q = F.reshape(q, (b, t, self.n_heads, d))
        k = F.reshape(k, (b, t, self.n_kv_heads, d))
        v = F.reshape(v, (b, t, self.n_kv_heads, d))
        q = F.rotary_embedding(q, positions, base=self.rope_theta, interleaved=self.interleaved)
        k = F.rotary_embedding(k, positions, base=self.rope_theta, interleaved=self.interleaved)  # before the repeat
        if self.query_scale is not None:
            q = q * self.query_scale
        if cache is not None:
            k, v = cache.extend(layer, k, v)
        q, k, v = (F.permute(h, (0, 2, 1, 3)) for h in (q, _repeat_kv(k, groups), _repeat_kv(v, groups)))
        # query i (position start + i) reads keys 0 .. start + i: is_causal where nothing is
        # cached, every key for one new token, else the mask aligned to the last key
        mask = None if start == 0 or t == 1 else np.arange(start + t)[None, :] <= start + np.arange(t)[:, None]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=start == 0,
                                             scale=None if self.query_scale is None else 1.0)  # else 1/sqrt(d)
        return self.wo(F.reshape(F.permute(out, (0, 2, 1, 3)), (b, t, self.n_heads * d)))


class FeedForward(Module):
    """A gated FFN: w2(act(w1 x) * w3 x), act silu (gelu's tanh form for gemma); w1 is
    llama.cpp's ffn_gate, w3 ffn_up, w2 ffn_down; phi3's w13 holds w1 and w3 (ffn_up, gate
    rows first)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gelu, self.fused = config.arch == "gemma", config.arch == "phi3"
        if self.fused:
            self.w13 = Linear(config.dim, 2 * config.ffn_dim, bias=False)
        else:
            self.w1 = Linear(config.dim, config.ffn_dim, bias=False)
        self.w2 = Linear(config.ffn_dim, config.dim, bias=False)  # (made in this order: a seed's llama is as before)
        if not self.fused:
            self.w3 = Linear(config.dim, config.ffn_dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = F.chunk(self.w13(x), 2, dim=-1) if self.fused else (self.w1(x), self.w3(x))
        return self.w2((F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)) * up)


class TransformerBlock(Module):
    """One block: x + attention(attention_norm(x)), then x + feed_forward(ffn_norm(x))."""

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
        if self.config.arch == "gemma":  # sqrtf(n_embd), a float32 value
            h = h * float(np.sqrt(np.float32(self.config.dim)))
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
