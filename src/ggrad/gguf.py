"""GGUF language models that llama.cpp loads: `save_model` writes a `ggrad.models.Llama` as
llama.cpp's architecture of its config ("llama", "qwen2", "gemma" or "phi3": its
hyperparameter keys, tensor names and types, and a byte-level tokenizer); `load_model`
reads one back; `save_lora` writes the LoRA adapters of a model (`ggrad.nn.lora`) as a
llama.cpp LoRA adapter.

`ggrad.export_gguf` (io.py) writes any module's state dict under ggrad's own names; this
module writes what llama.cpp's model loader requires of a llama model.
"""

from __future__ import annotations

import os

import numpy as np

from . import dtypes
from .functional import quantized
from .gguf_file import Layout, walk
from .io import _host, write_gguf
from .models.llama import ARCHITECTURES, GGUF_NAMES, Llama, LlamaConfig, gguf_name, state_shapes, tensor_count
from .nn import Embedding, QuantizedEmbedding, QuantizedLinear
from .nn.lora import lora_layers
from .runtime import quants
from .tokenizer import BYTE_CHARACTERS

_TYPES = ("f32", "f16", "bf16", *dtypes.QUANTIZED)
# the file type llama.cpp's quantize tool names for a model mostly of one quantized type
# (its Q4_K_S and Q5_K_S keep a few tensors in larger K-quants; ggrad writes every matrix in
# the one type, which llama.cpp loads the same way)
_FILE_TYPES = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q4_0": "MOSTLY_Q4_0",
               "q4_1": "MOSTLY_Q4_1", "q5_0": "MOSTLY_Q5_0", "q5_1": "MOSTLY_Q5_1", "q8_0": "MOSTLY_Q8_0",
               "q4_k": "MOSTLY_Q4_K_S", "q5_k": "MOSTLY_Q5_K_S", "q6_k": "MOSTLY_Q6_K"}


class ByteTokenizer:
    """A byte-level vocabulary: <unk>, <s>, </s>, then the 256 bytes (byte b is id 3 + b),
    so any text round-trips through its UTF-8 bytes. Written as llama.cpp's "gpt2" (BPE)
    form with no merge that applies: llama.cpp then tokenizes a text to exactly these ids
    and detokenizes them back (its SentencePiece form would turn spaces into "▁" bytes)."""

    UNK, BOS, EOS = 0, 1, 2
    OFFSET = 3  # the id of byte 0

    def __len__(self) -> int:
        return self.OFFSET + 256

    def encode(self, text: str) -> list[int]:
        return [self.OFFSET + b for b in text.encode("utf-8")]

    def decode(self, ids) -> str:
        return bytes(int(i) - self.OFFSET for i in ids if self.OFFSET <= int(i) < len(self)).decode(
            "utf-8", errors="replace")

    def write(self, writer, vocab_size: int) -> None:
        """The tokenizer keys, the vocabulary padded with unused tokens to `vocab_size`
        (llama.cpp takes the vocabulary's size from the token list)."""
        import gguf

        tokens = ["<unk>", "<s>", "</s>", *BYTE_CHARACTERS]
        types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + \
            [gguf.TokenType.NORMAL] * 256
        padding = vocab_size - len(tokens)
        tokens += [f"<pad{i}>" for i in range(padding)]
        types += [gguf.TokenType.UNUSED] * padding
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_types([int(t) for t in types])
        # llama.cpp's BPE loader needs a merges key and GGUFWriter drops an empty list: one
        # merge that never applies ("<s>" is no byte's character and no merge makes it)
        writer.add_token_merges(["<s> </s>"])
        writer.add_unk_token_id(self.UNK)
        writer.add_bos_token_id(self.BOS)
        writer.add_eos_token_id(self.EOS)
        writer.add_add_bos_token(False)


def _encoded(array: np.ndarray, kind: str, name: str):
    """(data, raw_dtype) for GGUFWriter.add_tensor: norms (1-d) stay float32, as llama.cpp's
    converter keeps them; matrices take `kind`."""
    import gguf

    if array.ndim == 1 or kind == "f32":
        return array.astype(np.float32), None
    if kind == "f16":
        return array.astype(np.float16), None
    if kind == "bf16":
        return gguf.quants.quantize(array.astype(np.float32), gguf.GGMLQuantizationType.BF16), \
            gguf.GGMLQuantizationType.BF16
    block = quants.BLOCK_TYPES[kind]
    if array.shape[-1] % block.block:
        raise ValueError(f"save_model: {name} has rows of {array.shape[-1]} values; {kind} stores rows in blocks "
                         f"of {block.block}: make the model's sizes multiples of {block.block}, or save in "
                         "f32/f16/bf16")
    blocks = quants.quantize(array.reshape(-1, array.shape[-1]), block)
    return blocks.view(np.uint8).reshape(*array.shape[:-1], -1), gguf.GGMLQuantizationType(block.ggml_type)


_PATTERNS = list(GGUF_NAMES.values())


def _file_order(name: str) -> tuple:
    """llama.cpp's converter's order: the embedding, the blocks in turn, the output."""
    parts = name.split(".")
    if parts[0] == "blk":
        return (1, int(parts[1]), _PATTERNS.index(".".join(["blk", "{n}", *parts[2:]])))
    return (0 if name == "token_embd.weight" else 2, 0, _PATTERNS.index(name))


def save_model(model: Llama, path: str, tokenizer: ByteTokenizer | None = None, dtype: str = "f32") -> str:
    """Write `model` as a llama.cpp model of its config's architecture: hyperparameters
    under "<arch>.*", tensors under llama.cpp's names in `dtype` (f32, f16, bf16, or a quantized type: q4_0, q4_1,
    q5_0, q5_1, q8_0, q4_k, q5_k, q6_k; norms stay f32; weights a model holds
    quantized stay in their blocks, as they are), and the tokenizer (a `ByteTokenizer` by
    default)."""
    import gguf

    if not isinstance(model, Llama):
        raise TypeError(f"save_model writes a ggrad.models.Llama, got {type(model).__name__}")
    if dtype not in _TYPES:
        raise ValueError(f"dtype must be one of {_TYPES}, got {dtype!r}")
    if lora_layers(model):
        raise ValueError("save_model: the model has LoRA adapters; write them with save_lora, or merge them into "
                         "the weights first (ggrad.nn.lora.merge_lora)")
    tokenizer = ByteTokenizer() if tokenizer is None else tokenizer
    c = model.config
    if len(tokenizer) > c.vocab_size:
        raise ValueError(f"save_model: the tokenizer has {len(tokenizer)} tokens, the model's vocab_size is "
                         f"{c.vocab_size}")
    tensors = {gguf_name(k): _encoded(_host(v).astype(np.float32), dtype, k) for k, v in model.state_dict().items()}
    for name, module in model.named_modules():  # weights kept quantized are written as they are
        if isinstance(module, (QuantizedLinear, QuantizedEmbedding)):
            kind = quants.BLOCK_TYPES[module.weight.dtype.name]
            tensors[gguf_name(name + ".weight")] = (quantized.block_bytes(module.weight),
                                                    gguf.GGMLQuantizationType(kind.ggml_type))
    tensors = dict(sorted(tensors.items(), key=lambda item: _file_order(item[0])))
    file_type = getattr(gguf.LlamaFileType, _FILE_TYPES[dtype])

    def keys(writer) -> None:
        # not "ggrad phi3": llama.cpp's vocabulary loader gives a model named phi3 Phi-3's
        # special tokens and fails where the vocabulary lacks them
        writer.add_name("ggrad")
        writer.add_file_type(int(file_type))
        writer.add_context_length(c.max_seq_len)
        writer.add_embedding_length(c.dim)
        writer.add_block_count(c.n_layers)
        writer.add_feed_forward_length(c.ffn_dim)
        writer.add_head_count(c.n_heads)
        writer.add_head_count_kv(c.n_kv_heads)
        writer.add_key_length(c.head_dim)
        writer.add_value_length(c.head_dim)
        writer.add_rope_dimension_count(c.head_dim)
        writer.add_rope_freq_base(c.rope_theta)
        writer.add_layer_norm_rms_eps(c.norm_eps)
        writer.add_vocab_size(c.vocab_size)
        tokenizer.write(writer, c.vocab_size)

    return write_gguf(path, c.arch, keys, tensors)


def _reader(path: str):
    """gguf's reader over `path`, once its layout is checked; a ValueError naming the file
    when it is no readable GGUF."""
    import gguf

    walk(path, "load_model", Layout.check)
    try:
        return gguf.GGUFReader(path)
    except (ValueError, IndexError, KeyError, TypeError, OverflowError) as e:  # the checks above should leave none
        raise ValueError(f"load_model: {path} is not a readable GGUF file ({type(e).__name__}: {e})") from None


def _field(path: str, reader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        if default is not None:
            return default
        raise ValueError(f"load_model: {path} has no {key!r}; it is not a llama model llama.cpp would load")
    return field.contents()


def _size(path: str, reader, key: str) -> int:
    value = _field(path, reader, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"load_model: {path}: {key!r} must be a positive integer, got {value!r}")
    return value


def _float32(path: str, reader, key: str, default: float | None) -> float:
    """A float32 key as the decimal it was written from (1e-5, not 9.99999975e-06)."""
    value = _field(path, reader, key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"load_model: {path}: {key!r} must be a number, got {value!r}")
    return float(str(np.float32(value)))


def _config(path: str, reader, tensors: dict, arch: str) -> LlamaConfig:
    """The model's hyperparameters: the header's keys, the vocabulary from the embedding."""
    embed = tensors.get("token_embd.weight")
    if embed is None or len(embed.shape) != 2:
        raise ValueError(f"load_model: {path} has no 2-d tensor 'token_embd.weight'")
    sizes = dict(dim="embedding_length", n_layers="block_count", n_heads="attention.head_count",
                 n_kv_heads="attention.head_count_kv", ffn_dim="feed_forward_length", max_seq_len="context_length")
    values = {name: _size(path, reader, f"{arch}.{key}") for name, key in sizes.items()}
    # llama.cpp's defaults: key and value length dim / heads, rotated dimensions the key length
    head_dim = values["dim"] // values["n_heads"]
    key_length, value_length = (_field(path, reader, f"{arch}.attention.{kind}_length", head_dim)
                                for kind in ("key", "value"))
    rotated = _field(path, reader, f"{arch}.rope.dimension_count", key_length)
    if not key_length == value_length == rotated:
        raise ValueError(f"load_model: {path}: key length {key_length}, value length {value_length} and rotated "
                         f"dimensions {rotated} differ; ggrad's {arch} rotates whole heads of one size")
    scaling = _field(path, reader, f"{arch}.rope.scaling.type", "none")
    factor = _field(path, reader, f"{arch}.rope.scaling.factor", _field(path, reader, f"{arch}.rope.scale_linear", 1.0))
    if scaling not in ("none", "linear") or factor != 1.0 or "rope_freqs.weight" in tensors:
        raise ValueError(f"load_model: {path} scales its RoPE ({scaling}, factor {factor}"
                         f"{', rope_freqs' if 'rope_freqs.weight' in tensors else ''}); ggrad's models have plain RoPE")
    if arch == "phi3" and ({"rope_factors_long.weight", "rope_factors_short.weight"} & set(tensors) or
                           _field(path, reader, "phi3.rope.scaling.attn_factor", 1.0) != 1.0):
        raise ValueError(f"load_model: {path} is a long-context phi3 (rope factors, LongRoPE): ggrad's phi3 has "
                         "plain RoPE")
    norm_eps = _float32(path, reader, f"{arch}.attention.layer_norm_rms_epsilon", None)
    rope_theta = _float32(path, reader, f"{arch}.rope.freq_base", 10000.0)
    try:
        return LlamaConfig(vocab_size=int(embed.shape[1]), **values, norm_eps=norm_eps, rope_theta=rope_theta,
                           tie_embeddings="output.weight" not in tensors, arch=arch,
                           key_length=0 if key_length == head_dim else key_length)
    except ValueError as e:  # sizes that do not make the model (dim not divisible by the heads...)
        raise ValueError(f"load_model: {path}: {e}") from None


def _check_tensors(path: str, config: LlamaConfig, tensors: dict) -> None:
    """Refuse a file whose tensors are not those of a model of its header's architecture and
    sizes, as llama.cpp's loader does (wrong number of tensors; check_tensor_dims): first by
    count, so a header claiming a million blocks is refused before any per-block work."""
    import gguf

    expected = tensor_count(config)
    if len(tensors) != expected:
        raise ValueError(f"load_model: {path} holds {len(tensors)} tensors; a {config.arch} model of its header's "
                         f"sizes ({config.n_layers} blocks{', tied embeddings' if config.tie_embeddings else ''}) "
                         f"has {expected}")
    floats = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16)
    for key, shape in state_shapes(config).items():
        name = gguf_name(key)
        t = tensors.get(name)
        if t is None:
            raise ValueError(f"load_model: {path} has no tensor {name!r}")
        ne, want = tuple(int(n) for n in t.shape), tuple(reversed(shape))  # ggml lists the row length first
        if ne != want:
            raise ValueError(f"load_model: {path}: tensor {name!r} has shape {list(ne)}, expected {list(want)} "
                             "from the header's sizes (ggml order, as llama.cpp's check_tensor_dims reads it)")
        if t.tensor_type not in floats and int(t.tensor_type) not in quants.BY_GGML_TYPE:
            raise ValueError(f"load_model: {path}: {name} is {t.tensor_type.name}; load_model reads f32, f16, bf16 "
                             f"and {', '.join(dtypes.QUANTIZED)} tensors")
        if t.tensor_type not in floats and len(ne) == 1:
            raise ValueError(f"load_model: {path}: {name} is {t.tensor_type.name.lower()}; load_model reads quantized "
                             "matrices only (norms and biases are float, as llama.cpp's converter writes them)")


def load_model(path: str) -> Llama:
    """Build a `Llama` from a GGUF of the llama family, "llama" (Mistral's too), "qwen2",
    "gemma" or "phi3" (what `save_model` or llama.cpp's converter writes):
    f32, f16 and bf16 tensors become float32 parameters (exact); quantized matrices (q4_0 ...
    q8_0, q4_k, q5_k, q6_k) stay in their blocks on the device, frozen
    (QuantizedLinear, QuantizedEmbedding): the model
    holds them at their quantized size. The header and every tensor's name, shape and type
    are checked before the model is built: a file that does not fit raises a ValueError
    naming it and what is wrong."""
    import gguf

    path = os.fspath(path)
    reader = _reader(path)
    arch = _field(path, reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"load_model: {path} holds a {arch!r} model; it reads {', '.join(ARCHITECTURES)} models")
    tensors = {t.name: t for t in reader.tensors}
    config = _config(path, reader, tensors, arch)
    _check_tensors(path, config, tensors)
    model = Llama(config)
    state = {}
    for key, param in model.state_dict().items():
        t = tensors[gguf_name(key)]
        kind = quants.BY_GGML_TYPE.get(int(t.tensor_type))
        if kind is not None:  # kept in its blocks, frozen
            name = key.removesuffix(".weight")
            weight = quantized.from_blocks(np.asarray(t.data), param.shape, dtypes.QUANTIZED[kind.name])
            module = model.get_submodule(name)
            layer = QuantizedEmbedding(weight) if isinstance(module, Embedding) else \
                QuantizedLinear(weight, module.bias)  # its bias is loaded with the state below
            model.set_submodule(name, layer)
        else:
            values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(param.shape)
            state[key] = np.ascontiguousarray(values, dtype=np.float32)
    model.load_state_dict(state)
    return model


def save_lora(model: Llama, path: str) -> str:
    """Write `model`'s LoRA adapters as a llama.cpp adapter: general.type "adapter",
    adapter.type "lora", adapter.lora.alpha, and per adapted matrix W (llama.cpp's name)
    "W.lora_a" = A (ne: in, rank) and "W.lora_b" = B (ne: rank, out), float32. llama.cpp
    adds scale * alpha / rank * B @ A to W (scale: the user's, 1 by default)."""
    if not isinstance(model, Llama):
        raise TypeError(f"save_lora writes the adapters of a ggrad.models.Llama, got {type(model).__name__}")
    layers = lora_layers(model)
    if not layers:
        raise ValueError("save_lora: the model has no LoRA adapters (ggrad.nn.lora.add_lora adds them)")
    alphas = {layer.alpha for layer in layers.values()}
    if len(alphas) > 1:
        raise ValueError(f"save_lora: llama.cpp's adapter has one alpha, these adapters have {sorted(alphas)}")
    alpha = alphas.pop()
    tensors = {}
    for name, layer in layers.items():
        target = gguf_name(name + ".weight")
        tensors[target + ".lora_a"] = _host(layer.lora_A).astype(np.float32)
        tensors[target + ".lora_b"] = _host(layer.lora_B).astype(np.float32)

    def keys(writer) -> None:
        writer.add_string("general.type", "adapter")
        writer.add_string("adapter.type", "lora")
        writer.add_float32("adapter.lora.alpha", alpha)

    return write_gguf(path, model.config.arch, keys, tensors)  # llama.cpp refuses an adapter of another arch
