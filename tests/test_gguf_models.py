"""GGUF language models: `ggrad.gguf.save_model` writes what llama.cpp's llama loader
reads (keys, names, types, tokenizer) and `load_model` reads it back exactly."""

import gguf
import ml_dtypes
import numpy as np
import pytest

import ggrad
from ggrad import gguf as gg
from ggrad.functional import quantized
from ggrad.models import Llama, LlamaConfig
from ggrad.runtime import quants
from conftest import rounds_quantized_activations

CONFIG = LlamaConfig(vocab_size=260, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, max_seq_len=32)


def model(tied: bool = False) -> Llama:
    ggrad.manual_seed(0)
    return Llama(LlamaConfig(**{**CONFIG.__dict__, "tie_embeddings": tied}))


@pytest.mark.parametrize("kind, rounded", [("f32", np.float32), ("f16", np.float16), ("bf16", ml_dtypes.bfloat16)])
@pytest.mark.parametrize("tied", [False, True])
def test_load_of_save_is_the_model_with_its_matrices_rounded(tmp_path, kind, rounded, tied):
    m = model(tied)
    back = gg.load_model(gg.save_model(m, str(tmp_path / "m.gguf"), dtype=kind))
    assert back.config == m.config
    original, loaded = m.state_dict(), back.state_dict()
    assert list(original) == list(loaded)
    for key, value in original.items():
        want = value.numpy()
        if want.ndim == 2:  # matrices in the chosen type; norms stay float32
            want = want.astype(rounded).astype(np.float32)
        np.testing.assert_array_equal(loaded[key].numpy(), want, err_msg=key)
    tokens = np.array([[5, 17, 200, 3, 99, 1]])
    if kind == "f32":
        np.testing.assert_array_equal(back(tokens).numpy(), m(tokens).numpy())


def test_the_file_has_llama_cpps_keys_names_and_types(tmp_path):
    reader = gguf.GGUFReader(gg.save_model(model(), str(tmp_path / "m.gguf"), dtype="q8_0"))
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    c = CONFIG
    expected = {"general.architecture": "llama", "llama.context_length": c.max_seq_len,
                "llama.embedding_length": c.dim, "llama.block_count": c.n_layers,
                "llama.feed_forward_length": c.ffn_dim, "llama.attention.head_count": c.n_heads,
                "llama.attention.head_count_kv": c.n_kv_heads, "llama.rope.dimension_count": c.head_dim,
                "llama.vocab_size": c.vocab_size, "tokenizer.ggml.model": "gpt2",
                "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}
    for key, value in expected.items():
        assert fields[key] == value, key
    assert fields["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(c.norm_eps)
    tokens = fields["tokenizer.ggml.tokens"]
    assert len(tokens) == c.vocab_size and tokens[3 + ord("a")] == "a" and tokens[3 + ord(" ")] == "Ġ"
    assert len(set(tokens)) == len(tokens)
    types = {t.name: t for t in reader.tensors}
    names = ["token_embd.weight", "output_norm.weight", "output.weight"] + [
        f"blk.{n}.{part}.weight" for n in range(c.n_layers) for part in
        ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")]
    assert sorted(types) == sorted(names)
    for name, t in types.items():
        norm = name.endswith("norm.weight")
        assert t.tensor_type == (gguf.GGMLQuantizationType.F32 if norm else gguf.GGMLQuantizationType.Q8_0), name
    assert list(types["blk.0.attn_k.weight"].shape) == [c.dim, c.n_kv_heads * c.head_dim]  # ggml ne: (in, out)
    assert list(types["token_embd.weight"].shape) == [c.dim, c.vocab_size]


TOKENS = np.array([[5, 17, 200, 3, 99, 1, 42, 7]])


def test_byte_tokenizer_round_trips_text():
    tok = gg.ByteTokenizer()
    text = "def f(x):\n    return x ** 2  # é€"
    ids = tok.encode(text)
    assert len(tok) == 259 and min(ids) >= 3 and max(ids) < 259
    assert tok.decode(ids) == text


def test_bad_input_is_refused_clearly(tmp_path):
    path = str(tmp_path / "m.gguf")
    with pytest.raises(TypeError, match="Llama"):
        gg.save_model(ggrad.nn.Linear(2, 2), path)
    with pytest.raises(ValueError, match="dtype must be one of"):
        gg.save_model(model(), path, dtype="q3_k")
    odd = Llama(LlamaConfig(vocab_size=260, dim=48, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=40, max_seq_len=8))
    with pytest.raises(ValueError, match="blocks of 32"):
        gg.save_model(odd, path, dtype="q8_0")
    small = Llama(LlamaConfig(vocab_size=100, dim=32, n_layers=1, n_heads=2, n_kv_heads=2, ffn_dim=32, max_seq_len=8))
    with pytest.raises(ValueError, match="259 tokens"):
        gg.save_model(small, path)
    ggrad.export_gguf(ggrad.nn.Linear(2, 2), str(tmp_path / "other.gguf"))
    with pytest.raises(ValueError, match="'ggrad' model"):
        gg.load_model(str(tmp_path / "other.gguf"))


# the K-quants store rows in blocks of 256: a model whose rows are multiples of 256
K_CONFIG = LlamaConfig(vocab_size=260, dim=256, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=256, max_seq_len=32)


@pytest.mark.parametrize("kind", list(ggrad.dtypes.QUANTIZED))
def test_a_quantized_model_loads_in_its_blocks_and_saves_back_byte_for_byte(tmp_path, dev, kind):
    config = K_CONFIG if kind.endswith("_k") else CONFIG
    ggrad.manual_seed(0)
    m = Llama(config)
    path = gg.save_model(m, str(tmp_path / "q.gguf"), dtype=kind)
    q = gg.load_model(path)
    layers = [mod for mod in q.modules() if isinstance(mod, (ggrad.nn.QuantizedLinear, ggrad.nn.QuantizedEmbedding))]
    assert len(layers) == 2 + 7 * config.n_layers  # embedding, output, 7 matrices a block
    assert all(k.endswith("norm.weight") for k in q.state_dict())  # the norms are the only float tensors
    block = quants.BLOCK_TYPES[kind]
    for layer in layers:  # held once, at the type's size (Q8_0: 34 bytes per 32 weights; Q4_K: 144 per 256)
        rows, cols = layer.weight.shape
        assert layer.weight.dtype is ggrad.dtypes.QUANTIZED[kind]
        assert layer.weight.handle.nbytes == rows * cols // block.block * block.block_bytes
    assert open(gg.save_model(q, str(tmp_path / "again.gguf"), dtype=kind), "rb").read() == open(path, "rb").read()
    assert gguf.GGUFReader(path).fields["general.file_type"].parts[-1][0] == \
        getattr(gguf.LlamaFileType, gg._FILE_TYPES[kind])
    # the logits are those of the float model with the dequantized weights (the CPU, CUDA
    # and a Vulkan GPU with integer dot products round activations to 8-bit blocks for
    # their dot products, as llama.cpp does: 1.3e-2 / 6e-3 / 8.7e-3 of the largest logit
    # here; lavapipe multiplies by the dequantized values). On CUDA the K-quant rows of the
    # embedding come through ggrad's QROWS kernel (ggml-cuda's GET_ROWS lacks them)
    ggrad.manual_seed(0)
    reference = Llama(config)
    with ggrad.no_grad():
        for name, mod in reference.named_modules():
            if isinstance(mod, (ggrad.nn.Linear, ggrad.nn.Embedding)):
                mod.weight.assign_(quantized.dequantize(q.get_submodule(name).weight))
        want = reference(TOKENS).numpy()
        got = q(TOKENS).numpy()
    tolerance = 3e-2 if rounds_quantized_activations(dev) else 1e-5
    assert np.abs(got - want).max() <= tolerance * np.abs(want).max()
