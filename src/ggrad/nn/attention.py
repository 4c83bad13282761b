"""Attention modules, torch.nn's: MultiheadAttention, TransformerEncoderLayer,
TransformerDecoderLayer, TransformerEncoder/Decoder stacks (same arguments, parameter
names and defaults); and ggrad's pre-norm TransformerBlock, a thin composition of them."""

from __future__ import annotations

import math

import numpy as np

from .. import functional as F
from . import init
from ..functional.attention import additive_mask, attention_weights, causal_mask, self_attention
from ..random import generator
from ..tensor import Tensor, full, param
from .layers import GELU, Dropout, Linear
from .module import Module, ModuleList, Sequential
from .normalization import LayerNorm


class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention: inputs (L, N, E), or (N, L, E) with batch_first, or
    unbatched (L, E); query, key and value projected by `in_proj_weight` (or
    `q_proj_weight`/`k_proj_weight`/`v_proj_weight` where kdim or vdim differ from
    embed_dim). Masks as torch's: a bool attn_mask (L, S) or (N * heads, L, S) and a bool
    key_padding_mask (N, S) mark with True what is masked out; float ones are added.
    `is_causal` masks later keys (ggrad builds the mask: torch requires it as attn_mask)."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = False) -> None:
        super().__init__()
        if not all(isinstance(n, int) and n > 0 for n in (embed_dim, num_heads)):
            raise ValueError(f"MultiheadAttention needs positive integer sizes, got embed_dim={embed_dim!r}, "
                             f"num_heads={num_heads!r}")
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        if add_bias_kv or add_zero_attn:
            raise NotImplementedError("MultiheadAttention(add_bias_kv=True / add_zero_attn=True) is not supported")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        self.batch_first, self.dropout = bool(batch_first), float(dropout)
        self._packed = self.kdim == embed_dim and self.vdim == embed_dim
        if self._packed:  # xavier_uniform_ of the packed (3E, E) weight, as torch's
            bound = math.sqrt(6.0 / (4 * embed_dim))
            self.in_proj_weight = param(generator().uniform(-bound, bound, (3 * embed_dim, embed_dim))
                                        .astype(np.float32))
        else:
            for name, dim in (("q_proj_weight", embed_dim), ("k_proj_weight", self.kdim), ("v_proj_weight", self.vdim)):
                bound = math.sqrt(6.0 / (embed_dim + dim))
                setattr(self, name, param(generator().uniform(-bound, bound, (embed_dim, dim)).astype(np.float32)))
        self.in_proj_bias = param(np.zeros(3 * embed_dim, np.float32)) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias)
        if bias:
            self.out_proj.bias = param(np.zeros(embed_dim, np.float32))

    def _project(self, x: Tensor, i: int, weight: Tensor | None) -> Tensor:
        e = self.embed_dim
        w = self.in_proj_weight[i * e:(i + 1) * e] if weight is None else weight
        return F.linear(x, w, self.in_proj_bias[i * e:(i + 1) * e] if self.in_proj_bias is not None else None)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask=None, need_weights: bool = True,
                attn_mask=None, average_attn_weights: bool = True, is_causal: bool = False):
        unbatched = query.ndim == 2
        if unbatched:
            query, key, value = (F.unsqueeze(t, 0 if self.batch_first else 1) for t in (query, key, value))
            if key_padding_mask is not None:
                key_padding_mask = F.unsqueeze(key_padding_mask, 0)
        if not self.batch_first:
            query, key, value = (F.transpose(t, 0, 1) for t in (query, key, value))
        n, length, e = query.shape
        if e != self.embed_dim or key.ndim != 3 or key.shape[0] != n or key.shape[2] != self.kdim \
                or value.shape[:2] != key.shape[:2] or value.shape[2] != self.vdim:
            raise ValueError(f"MultiheadAttention({self.embed_dim}, kdim={self.kdim}, vdim={self.vdim}) got query "
                             f"{query.shape}, key {key.shape}, value {value.shape} (batch first)")
        source = key.shape[1]
        h, d = self.num_heads, self.head_dim
        dropped = self.dropout > 0.0 and self.training
        fused = None
        if self._packed and query is key and key is value:  # self-attention: one product
            qkv = F.linear(query, self.in_proj_weight, self.in_proj_bias)
            if attn_mask is None and key_padding_mask is None and not (need_weights or dropped):
                fused = self_attention(qkv, h, 1.0 / math.sqrt(d), is_causal)  # one kernel each way, or None
            projected = F.chunk(qkv, 3, -1) if fused is None else ()
        else:
            projected = [self._project(t, i, None if self._packed else getattr(self, f"{c}_proj_weight"))
                         for i, (t, c) in enumerate(((query, "q"), (key, "k"), (value, "v")))]
        if fused is not None:
            out = fused
        else:
            q, k, v = (F.permute(F.reshape(t, (n, t.shape[1], h, d)), (0, 2, 1, 3)) for t in projected)
            scores = F.matmul_nt(q, k)  # (n, h, L, S)
            mask = self._mask(attn_mask, key_padding_mask, is_causal, n, length, source, scores.dtype)
            weights = attention_weights(scores, 1.0 / math.sqrt(d), mask, for_product=not (need_weights or dropped))
            if dropped:
                weights = F.dropout(weights, self.dropout)
            out = F.reshape(F.permute(weights @ v, (0, 2, 1, 3)), (n, length, e))
        out = self.out_proj(out)
        if not self.batch_first:
            out = F.transpose(out, 0, 1)
        if unbatched:
            out = F.squeeze(out, 0 if self.batch_first else 1)
        if not need_weights:
            return out, None
        if average_attn_weights:
            weights = F.mean(weights, 1)
        return out, (F.squeeze(weights, 0) if unbatched else weights)

    def _mask(self, attn_mask, key_padding_mask, is_causal: bool, n: int, length: int, source: int, dtype):
        """One additive mask broadcasting to (n, heads, L, S), or None."""
        parts = []
        if attn_mask is not None:
            mask = additive_mask(attn_mask, dtype, keep_true=False)
            if mask.shape == (n * self.num_heads, length, source):
                mask = F.reshape(mask, (n, self.num_heads, length, source))
            elif mask.shape != (length, source):
                raise ValueError(f"attn_mask must be ({length}, {source}) or ({n * self.num_heads}, {length}, "
                                 f"{source}), got {mask.shape}")
            parts.append(mask)
        elif is_causal:
            parts.append(causal_mask(length, source, dtype))
        if key_padding_mask is not None:
            mask = additive_mask(key_padding_mask, dtype, keep_true=False)
            if mask.shape != (n, source):
                raise ValueError(f"key_padding_mask must be ({n}, {source}), got {mask.shape}")
            parts.append(F.reshape(mask, (n, 1, 1, source)))
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else parts[0] + parts[1]

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, batch_first={self.batch_first}"


def _activation(activation):
    if callable(activation):
        return activation
    if activation == "relu":
        return F.relu
    if activation == "gelu":
        return F.gelu
    raise ValueError(f"activation must be 'relu', 'gelu' or a callable, got {activation!r}")


class _TransformerLayer(Module):
    """What the encoder and decoder layers share, registered in torch's order: attention
    (over the memory too, for a decoder), the feed-forward block, the norms, dropouts."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int, dropout: float, activation,
                 layer_norm_eps: float, batch_first: bool, norm_first: bool, bias: bool, blocks: int) -> None:
        super().__init__()
        self._config = dict(d_model=d_model, nhead=nhead, dim_feedforward=dim_feedforward, dropout=dropout,
                            activation=activation, layer_norm_eps=layer_norm_eps, batch_first=batch_first,
                            norm_first=norm_first, bias=bias)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout, bias=bias, batch_first=batch_first)
        if blocks == 3:
            self.multihead_attn = MultiheadAttention(d_model, nhead, dropout, bias=bias, batch_first=batch_first)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias)
        self.norm_first = bool(norm_first)
        for i in range(1, blocks + 1):
            setattr(self, f"norm{i}", LayerNorm(d_model, eps=layer_norm_eps, bias=bias))
        for i in range(1, blocks + 1):
            setattr(self, f"dropout{i}", Dropout(dropout))
        self.activation = _activation(activation)

    def _attend(self, attention: Module, x: Tensor, source: Tensor, mask, padding, is_causal: bool) -> Tensor:
        out, _ = attention(x, source, source, attn_mask=mask, key_padding_mask=padding, need_weights=False,
                           is_causal=is_causal and mask is None)
        return out

    def _feed_forward(self, x: Tensor, dropout: Module) -> Tensor:
        return dropout(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerEncoderLayer(_TransformerLayer):
    """torch.nn.TransformerEncoderLayer: self-attention and a feed-forward block, each with
    a residual and LayerNorm after (or, with norm_first, before)."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation="relu", layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True) -> None:
        super().__init__(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first,
                         norm_first, bias, blocks=2)

    def forward(self, src: Tensor, src_mask=None, src_key_padding_mask=None, is_causal: bool = False) -> Tensor:
        def attend(x):
            return self.dropout1(self._attend(self.self_attn, x, x, src_mask, src_key_padding_mask, is_causal))
        x = src
        if self.norm_first:
            x = x + attend(self.norm1(x))
            return x + self._feed_forward(self.norm2(x), self.dropout2)
        x = self.norm1(x + attend(x))
        return self.norm2(x + self._feed_forward(x, self.dropout2))


class TransformerDecoderLayer(_TransformerLayer):
    """torch.nn.TransformerDecoderLayer: self-attention, attention over the encoder's
    memory, and a feed-forward block, each with a residual and LayerNorm."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation="relu", layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True) -> None:
        super().__init__(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first,
                         norm_first, bias, blocks=3)

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal: bool = False, memory_is_causal: bool = False) -> Tensor:
        def attend(x):
            return self.dropout1(self._attend(self.self_attn, x, x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))

        def recall(x):
            return self.dropout2(self._attend(self.multihead_attn, x, memory, memory_mask, memory_key_padding_mask,
                                              memory_is_causal))
        x = tgt
        if self.norm_first:
            x = x + attend(self.norm1(x))
            x = x + recall(self.norm2(x))
            return x + self._feed_forward(self.norm3(x), self.dropout3)
        x = self.norm1(x + attend(x))
        x = self.norm2(x + recall(x))
        return self.norm3(x + self._feed_forward(x, self.dropout3))


def _clones(layer: Module, n: int) -> ModuleList:
    """n copies of `layer` with its weights (torch deep-copies the layer it is given)."""
    copies = ModuleList()
    for _ in range(n):
        copy = type(layer)(**layer._config)
        copy.load_state_dict(layer.state_dict())
        copies.append(copy)
    return copies


class TransformerEncoder(Module):
    """num_layers copies of encoder_layer, then an optional norm."""

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int, norm: Module | None = None) -> None:
        super().__init__()
        self.layers = _clones(encoder_layer, num_layers)
        self.num_layers, self.norm = num_layers, norm

    def forward(self, src: Tensor, mask=None, src_key_padding_mask=None, is_causal: bool = False) -> Tensor:
        for layer in self.layers:
            src = layer(src, mask, src_key_padding_mask, is_causal)
        return self.norm(src) if self.norm is not None else src


class TransformerDecoder(Module):
    """num_layers copies of decoder_layer, then an optional norm."""

    def __init__(self, decoder_layer: TransformerDecoderLayer, num_layers: int, norm: Module | None = None) -> None:
        super().__init__()
        self.layers = _clones(decoder_layer, num_layers)
        self.num_layers, self.norm = num_layers, norm

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal: bool = False, memory_is_causal: bool = False) -> Tensor:
        for layer in self.layers:
            tgt = layer(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask,
                        tgt_is_causal, memory_is_causal)
        return self.norm(tgt) if self.norm is not None else tgt


class Transformer(Module):
    """torch.nn.Transformer: an encoder and a decoder stack, each ending in a LayerNorm
    (same arguments, parameter names and defaults; the matrices drawn as torch's,
    xavier_uniform_)."""

    def __init__(self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6, num_decoder_layers: int = 6,
                 dim_feedforward: int = 2048, dropout: float = 0.1, activation="relu", custom_encoder=None,
                 custom_decoder=None, layer_norm_eps: float = 1e-5, batch_first: bool = False, norm_first: bool = False,
                 bias: bool = True) -> None:
        super().__init__()
        layer = dict(d_model=d_model, nhead=nhead, dim_feedforward=dim_feedforward, dropout=dropout,
                     activation=activation, layer_norm_eps=layer_norm_eps, batch_first=batch_first,
                     norm_first=norm_first, bias=bias)
        self.encoder = custom_encoder if custom_encoder is not None else TransformerEncoder(
            TransformerEncoderLayer(**layer), num_encoder_layers, LayerNorm(d_model, eps=layer_norm_eps, bias=bias))
        self.decoder = custom_decoder if custom_decoder is not None else TransformerDecoder(
            TransformerDecoderLayer(**layer), num_decoder_layers, LayerNorm(d_model, eps=layer_norm_eps, bias=bias))
        for p in self.parameters():
            if p.ndim > 1:
                init.xavier_uniform_(p)
        self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first

    def forward(self, src: Tensor, tgt: Tensor, src_mask=None, tgt_mask=None, memory_mask=None,
                src_key_padding_mask=None, tgt_key_padding_mask=None, memory_key_padding_mask=None,
                src_is_causal: bool | None = None, tgt_is_causal: bool | None = None,
                memory_is_causal: bool = False) -> Tensor:
        batch = 0 if self.batch_first else 1
        if src.ndim == 3 and tgt.ndim == 3 and src.shape[batch] != tgt.shape[batch]:
            raise RuntimeError("the batch number of src and tgt must be equal")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise RuntimeError("the feature number of src and tgt must be equal to d_model")
        memory = self.encoder(src, src_mask, src_key_padding_mask, bool(src_is_causal))
        return self.decoder(tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask,
                            bool(tgt_is_causal), memory_is_causal)

    @staticmethod
    def generate_square_subsequent_mask(sz: int, device=None, dtype=None) -> Tensor:
        """0 on and below the diagonal, -inf above: a position sees itself and the past."""
        return F.triu(full((sz, sz), -math.inf, dtype=dtype), diagonal=1)


class TransformerBlock(Module):
    """ggrad's pre-norm block over (batch, time, embed): x + attn(norm(x)), then
    x + mlp(norm(x)) (GELU MLP of 4x width); `causal` masks later positions."""

    def __init__(self, embed_dim: int, num_heads: int, causal: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        self.causal = bool(causal)
        self.norm1 = LayerNorm(embed_dim)
        self.attn = MultiheadAttention(embed_dim, num_heads, dropout, batch_first=True)
        self.norm2 = LayerNorm(embed_dim)
        self.mlp = Sequential(Linear(embed_dim, 4 * embed_dim), GELU(), Linear(4 * embed_dim, embed_dim),
                              Dropout(dropout))

    def forward(self, x: Tensor) -> Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False, is_causal=self.causal)[0]
        return x + self.mlp(self.norm2(x))
