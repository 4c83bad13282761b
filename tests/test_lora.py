"""LoRA (ggrad.nn.lora): a fresh adapter changes nothing, an adapted layer computes
base + alpha/rank * B A (torch float64 reference, values and gradients), merging gives
the same model, training moves only the adapters (resident, one dispatch), and the
GGUF adapter has llama.cpp's keys and shapes."""

import gguf
import numpy as np
import pytest
import torch

import ggrad
import ggrad.functional as F
from ggrad import gguf as gg
from ggrad import nn
from ggrad.functional import quantized
from ggrad.models import Llama, LlamaConfig
from ggrad.nn import lora
from conftest import assert_resident_training, rounds_quantized_activations, without_quantized_backward_kernel

CONFIG = LlamaConfig(vocab_size=260, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, max_seq_len=32)


def adapted(seed: int = 0, targets=("wq", "wv", "w2"), rank: int = 4, alpha: float = 8.0) -> Llama:
    """A Llama with adapters whose B is random too (a fresh B is zeros: it would hide a
    dropped or mis-scaled update)."""
    ggrad.manual_seed(seed)
    model = Llama(CONFIG)
    lora.add_lora(model, targets, rank=rank, alpha=alpha)
    rng = np.random.default_rng(seed)
    with ggrad.no_grad():
        for layer in lora.lora_layers(model).values():
            layer.lora_B.assign_(rng.standard_normal(layer.lora_B.shape).astype(np.float32) * 0.1)
    return model


TOKENS = np.array([[5, 17, 200, 3, 99, 1, 42, 7]])


def test_a_fresh_adapter_changes_nothing_and_only_adapters_train():
    ggrad.manual_seed(0)
    model = Llama(CONFIG)
    before = model(TOKENS).numpy()
    names = lora.add_lora(model, ("wq", "layers.1.feed_forward.w2"), rank=4, alpha=8)
    assert names == ["layers.0.attention.wq", "layers.1.attention.wq", "layers.1.feed_forward.w2"]
    np.testing.assert_array_equal(model(TOKENS).numpy(), before)
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    assert trainable == sorted(f"{n}.{ab}" for n in names for ab in ("lora_A", "lora_B"))


def test_an_adapted_layer_equals_torch_in_float64(dev):
    rng = np.random.default_rng(1)
    base = nn.Linear(12, 10)
    layer = lora.LoRALinear(base, rank=3, alpha=6.0)
    with ggrad.no_grad():
        layer.lora_B.assign_(rng.standard_normal((10, 3)).astype(np.float32))
    x = rng.standard_normal((5, 12)).astype(np.float32)
    r = rng.standard_normal((5, 10)).astype(np.float32)
    with ggrad.grad_tape():
        (layer(ggrad.tensor(x)) * ggrad.tensor(r)).sum().backward()
    W, b, A, B = (torch.tensor(t.numpy(), dtype=torch.float64, requires_grad=True)
                  for t in (base.weight, base.bias, layer.lora_A, layer.lora_B))
    xt = torch.tensor(x, dtype=torch.float64)
    y = xt @ W.T + b + (xt @ A.T @ B.T) * (6.0 / 3)
    (y * torch.tensor(r, dtype=torch.float64)).sum().backward()
    with ggrad.no_grad():
        np.testing.assert_allclose(layer(ggrad.tensor(x)).numpy(), y.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(layer.lora_A.grad.numpy(), A.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(layer.lora_B.grad.numpy(), B.grad.numpy(), rtol=1e-5, atol=1e-5)
    assert base.weight.grad is None and base.bias.grad is None  # frozen: no gradient made


def test_merging_gives_the_same_model(dev):
    model = adapted()
    with ggrad.no_grad():
        want = model(TOKENS).numpy()
        lora.merge_lora(model)
        got = model(TOKENS).numpy()
    assert not lora.lora_layers(model) and not any(p.requires_grad for p in model.parameters())
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert list(model.state_dict()) == list(Llama(CONFIG).state_dict())  # saveable as a llama again


def test_training_moves_only_the_adapters_and_stays_resident():
    model = adapted(seed=2)
    frozen = {k: v.numpy().copy() for k, v in model.state_dict().items() if "lora_" not in k}
    ids = np.random.default_rng(3).integers(3, 259, (2, 16))
    x, y = ggrad.tensor(ids), ggrad.tensor(np.roll(ids, -1, axis=1).reshape(-1))
    adapters = [p for p in model.parameters() if p.requires_grad]
    assert_resident_training(lambda x: F.reshape(model(x), (-1, CONFIG.vocab_size)), adapters, x, y)
    for key, value in model.state_dict().items():
        if key in frozen:
            np.testing.assert_array_equal(value.numpy(), frozen[key], err_msg=key)


def test_the_gguf_adapter_has_llama_cpps_keys_and_shapes(tmp_path):
    model = adapted(rank=4, alpha=8.0)
    reader = gguf.GGUFReader(gg.save_lora(model, str(tmp_path / "adapter.gguf")))
    fields = {k: f.contents() for k, f in reader.fields.items()}
    assert fields["general.architecture"] == "llama" and fields["general.type"] == "adapter"
    assert fields["adapter.type"] == "lora" and fields["adapter.lora.alpha"] == 8.0
    tensors = {t.name: t for t in reader.tensors}
    assert sorted(tensors) == sorted(f"blk.{n}.{w}.weight.lora_{ab}" for n in range(2)
                                     for w in ("attn_q", "attn_v", "ffn_down") for ab in "ab")
    c = CONFIG
    assert list(tensors["blk.0.attn_v.weight.lora_a"].shape) == [c.dim, 4]  # ne: (in, rank)
    assert list(tensors["blk.0.attn_v.weight.lora_b"].shape) == [4, c.n_kv_heads * c.head_dim]  # (rank, out)
    layer = lora.lora_layers(model)["layers.1.feed_forward.w2"]
    np.testing.assert_array_equal(tensors["blk.1.ffn_down.weight.lora_b"].data, layer.lora_B.numpy())


def test_bad_input_is_refused_clearly(tmp_path):
    with pytest.raises(ValueError, match="no Linear is named"):
        lora.add_lora(Llama(CONFIG), ("wq", "nonexistent"))
    with pytest.raises(ValueError, match="rank"):
        lora.LoRALinear(nn.Linear(4, 3), rank=4, alpha=1.0)
    with pytest.raises(ValueError, match="alpha"):
        lora.LoRALinear(nn.Linear(4, 3), rank=2, alpha=0.0)
    with pytest.raises(TypeError, match="Linear"):
        lora.LoRALinear(nn.Conv1d(2, 2, 1), rank=1, alpha=1.0)
    with pytest.raises(ValueError, match="save_lora"):
        gg.save_model(adapted(), str(tmp_path / "m.gguf"))
    with pytest.raises(ValueError, match="no LoRA adapters"):
        gg.save_lora(Llama(CONFIG), str(tmp_path / "a.gguf"))


# the K-quants store rows in blocks of 256
K_CONFIG = LlamaConfig(vocab_size=260, dim=256, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=256, max_seq_len=32)
BASES = ["q8_0", "q4_0", "q5_1", "q4_k", "q6_k"]


@pytest.mark.parametrize("path", ["kernel", "composed"])
@pytest.mark.parametrize("kind", BASES)
def test_adapters_over_quantized_weights_get_the_dequantized_models_gradients(tmp_path, dev, kind, path, monkeypatch):
    """Gradients flow through the quantized weights (read in their blocks by ggrad's kernel,
    or composed: chunks of rows read to float32) to the adapters as through the float32
    model that holds the dequantized values; the step is resident."""
    if path == "composed":
        if dev.startswith("cuda") and kind.endswith("_k"):
            pytest.skip("ggml-cuda's GET_ROWS reads no K-quant blocks: composed, the step is refused (test_quantized)")
        without_quantized_backward_kernel(monkeypatch)
    config = K_CONFIG if kind.endswith("_k") else CONFIG
    ggrad.manual_seed(4)
    q = gg.load_model(gg.save_model(Llama(config), str(tmp_path / "q.gguf"), dtype=kind))
    reference = Llama(config)
    with ggrad.no_grad():
        for name, mod in q.named_modules():
            if isinstance(mod, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
                reference.get_submodule(name).weight.assign_(quantized.dequantize(mod.weight))
        reference.load_state_dict(q.state_dict(), strict=False)
    rng = np.random.default_rng(5)
    for m in (q, reference):
        lora.add_lora(m, ("wq", "wv", "w2"), rank=4, alpha=8.0)
    for (name, a), b in zip(lora.lora_layers(q).items(), lora.lora_layers(reference).values()):
        with ggrad.no_grad():
            for t in (a.lora_A, b.lora_A):
                t.assign_(np.random.default_rng(len(name)).standard_normal(t.shape).astype(np.float32) * 0.1)
            B = rng.standard_normal(a.lora_B.shape).astype(np.float32) * 0.1
            a.lora_B.assign_(B)
            b.lora_B.assign_(B)
    ids = np.random.default_rng(6).integers(3, 259, (2, 16))
    x, y = ggrad.tensor(ids), ggrad.tensor(np.roll(ids, -1, axis=1).reshape(-1))
    for m in (q, reference):
        with ggrad.grad_tape():
            F.cross_entropy(F.reshape(m(x), (-1, config.vocab_size)), y).backward()
    # the CPU, CUDA and a Vulkan GPU with integer dot products round activations to 8-bit
    # blocks, as llama.cpp (CUDA: 2e-3 here, the H100's Vulkan device 7e-3)
    tolerance = 3e-2 if rounds_quantized_activations(dev) else 1e-4
    for (name, a), b in zip(lora.lora_layers(q).items(), lora.lora_layers(reference).values()):
        for got, want in ((a.lora_A.grad, b.lora_A.grad), (a.lora_B.grad, b.lora_B.grad)):
            want = want.numpy()
            error = np.abs(got.numpy() - want).max() / np.abs(want).max()
            assert error <= tolerance, f"{name}: {error:.1e} of the largest gradient, tolerance {tolerance:.0e}"
    adapters = [p for p in q.parameters() if p.requires_grad]
    assert_resident_training(lambda x: F.reshape(q(x), (-1, config.vocab_size)), adapters, x, y)


@pytest.mark.parametrize("kind", BASES)
def test_fine_tuning_over_quantized_weights_holds_them_once_at_their_quantized_size(tmp_path, kind):
    """runtime.memory() counts the live persistent bytes: loading a quantized model and
    training adapters over it adds the blocks (Q8_0: 34 bytes per 32 weights; Q4_K: 144 per
    256), the float norms, the adapters and their Adam state, and no float copy of the
    matrices."""
    import gc
    config = K_CONFIG if kind.endswith("_k") else CONFIG
    path = gg.save_model(Llama(config), str(tmp_path / "q.gguf"), dtype=kind)
    gc.collect()
    before = ggrad.runtime.memory()["persistent_used_bytes"]
    q = gg.load_model(path)
    lora.add_lora(q, ("wq", "wv"), rank=4, alpha=8.0)
    ids = np.random.default_rng(7).integers(3, 259, (2, 16))
    x, y = ggrad.tensor(ids), ggrad.tensor(np.roll(ids, -1, axis=1).reshape(-1))
    adapters = [p for p in q.parameters() if p.requires_grad]
    assert_resident_training(lambda x: F.reshape(q(x), (-1, config.vocab_size)), adapters, x, y)
    gc.collect()
    held = ggrad.runtime.memory()["persistent_used_bytes"] - before
    bases = [m.weight for m in q.modules() if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))]
    blocks = sum(w.handle.nbytes for w in bases)
    floats = sum(p.numel() * 4 for p in q.parameters())  # norms and adapters
    matrices_f32 = sum(w.numel() * 4 for w in bases)
    assert blocks <= held <= blocks + 4 * floats + 64 * 1024, (held, blocks, floats)  # Adam: 2 moments
    assert held < matrices_f32 / 3  # a float32 copy of the matrices alone is 3.8x Q8_0's blocks, 7.1x Q4_K's
