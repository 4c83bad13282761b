"""llama.cpp itself as the oracle (llama-cpp-python, scripts/build_llama_cpp.sh): the GGUF
files ggrad writes load there, and llama.cpp's logits, greedy tokens, tokenizer and LoRA
adapter application equal ggrad's.

llama.cpp runs in a child process: ggml-python loads its libggml with RTLD_GLOBAL, and a
llama_cpp imported after it would bind part of its ggml to ggml-python's (docs/llama_cpp.md).
ggrad runs on the cpu device here: llama.cpp's CPU products round activations to Q8_0
blocks for Q8_0 weights, and so do ggml-python's, so both compute the same thing."""

import importlib.util
import json

import numpy as np
import pytest

import ggrad
import ggrad.functional as F
from ggrad import gguf as gg
from ggrad.models import Llama, LlamaConfig
from ggrad.nn import lora
from conftest import run_in_child

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                reason="llama-cpp-python (the oracle) is not installed: scripts/build_llama_cpp.sh")

CONFIG = LlamaConfig(vocab_size=259, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, max_seq_len=64)
TEXT = "def f(x):\n    return x ** 2  # é€"
TOKENS = gg.ByteTokenizer().encode(TEXT)[:24]
GREEDY = 8

LLAMA_CPP = """
import itertools, json, sys
import numpy as np, llama_cpp
jobs, text, out = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
results = {}
for i, (model, adapter, tokens) in enumerate(jobs):
    kw = dict(logits_all=True, n_ctx=128, n_batch=128, n_ubatch=128, n_threads=1, verbose=False,
              type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, flash_attn=False)
    if adapter:
        kw.update(lora_path=adapter, lora_scale=1.0)
    llm = llama_cpp.Llama(model, **kw)
    llm.eval(tokens)
    results[f"logits{i}"] = np.array(llm.scores[:len(tokens)], dtype=np.float32)
    results[f"greedy{i}"] = np.array(list(itertools.islice(
        llm.generate(tokens, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, reset=True), %d)))
    if i == 0:
        results["tokenized"] = np.array(llm.tokenize(text.encode(), add_bos=False, special=False))
        results["detokenized"] = np.frombuffer(llm.detokenize(llm.tokenize(text.encode(), add_bos=False)), np.uint8)
    del llm
np.savez(out, **results)
""" % GREEDY


def llama_cpp(tmp_path, jobs: list[tuple[str, str, list[int]]]) -> dict:
    out = str(tmp_path / "llama_cpp.npz")
    run_in_child(LLAMA_CPP, json.dumps(jobs), TEXT, out)
    return dict(np.load(out))


def relative(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def ggrad_run(model: Llama) -> tuple[np.ndarray, list[int]]:
    """All positions' logits for TOKENS, and GREEDY greedy tokens after them (the whole
    window each token; Llama.generate, through its KV cache, must pick the same)."""
    with ggrad.no_grad():
        logits = model(np.array([TOKENS])).numpy()[0]
        ids = list(TOKENS)
        for _ in range(GREEDY):
            ids.append(int(np.argmax(model(np.array([ids])).numpy()[0, -1])))
    assert model.generate(TOKENS, GREEDY) == ids[len(TOKENS):]
    return logits, ids[len(TOKENS):]


def with_adapters(model: Llama, seed: int) -> Llama:
    lora.add_lora(model, ("wq", "wv", "w3"), rank=4, alpha=8.0)
    rng = np.random.default_rng(seed)
    with ggrad.no_grad():
        for layer in lora.lora_layers(model).values():
            layer.lora_B.assign_(rng.standard_normal(layer.lora_B.shape).astype(np.float32) * 0.2)
    return model


def test_llama_cpp_computes_what_ggrad_does(tmp_path):
    """F32 (untied and tied), Q8_0 kept in its blocks, and a LoRA adapter over F32 and over
    Q8_0: logits of every position at 1e-4 of the largest, the same greedy tokens; and
    llama.cpp tokenizes the text to the byte tokenizer's ids."""
    ggrad.set_device("cpu")
    ggrad.manual_seed(0)
    untied = Llama(CONFIG)
    ggrad.manual_seed(1)
    tied = Llama(LlamaConfig(**{**CONFIG.__dict__, "tie_embeddings": True}))
    files = {"f32": gg.save_model(untied, str(tmp_path / "f32.gguf")),
             "tied": gg.save_model(tied, str(tmp_path / "tied.gguf")),
             "q8_0": gg.save_model(untied, str(tmp_path / "q8_0.gguf"), dtype="q8_0")}
    q8 = gg.load_model(files["q8_0"])
    models = {"f32": untied, "tied": tied, "q8_0": q8}
    adapted = {"f32+lora": with_adapters(gg.load_model(files["f32"]), 2),
               "q8_0+lora": with_adapters(gg.load_model(files["q8_0"]), 3)}
    adapters = {name: gg.save_lora(m, str(tmp_path / f"{name}.gguf")) for name, m in adapted.items()}
    jobs = [(files[n], "", TOKENS) for n in models] + [(files[n.removesuffix("+lora")], adapters[n], TOKENS)
                                                      for n in adapted]
    theirs = llama_cpp(tmp_path, jobs)
    for i, (name, model) in enumerate([*models.items(), *adapted.items()]):
        logits, greedy = ggrad_run(model)
        assert relative(logits, theirs[f"logits{i}"]) < 1e-4, (name, relative(logits, theirs[f"logits{i}"]))
        assert greedy == theirs[f"greedy{i}"].tolist(), name
    # the adapters move the logits: an adapter llama.cpp ignored would fail the check above
    base, _ = ggrad_run(untied)
    assert relative(base, theirs["logits3"]) > 1e-2
    assert theirs["tokenized"].tolist() == gg.ByteTokenizer().encode(TEXT)
    assert theirs["detokenized"].tobytes().decode() == TEXT


def test_llama_cpp_runs_quantized_bases_and_their_adapters_as_ggrad_does(tmp_path):
    """Legacy and K-quant bases (rows of 256 for the K-quants) kept in their blocks, with and
    without a LoRA adapter: llama.cpp's logits at 1e-4 of the largest (Q5_1: 1e-3), the same
    greedy tokens. Not Q4_0 and Q4_1: llama.cpp's CPU logits for them were 5.3e-3 and 3.9e-3
    of the largest off ggrad's (greedy tokens equal), each as far from the float model of the
    dequantized weights as ggrad's (5.2e-3..5.9e-3: the activations' 8-bit rounding), so the
    two round differently, not one wrongly (docs/llama_cpp.md). Q5_1 the same, less so: on
    an AVX2-only machine (2026-12-06) 3.6e-4 apart, both 5.75e-3 from the float model (the
    K-quants 2.7e-7 apart)."""
    ggrad.set_device("cpu")
    ggrad.manual_seed(2)
    float_model = Llama(LlamaConfig(**{**CONFIG.__dict__, "dim": 256, "ffn_dim": 256, "n_layers": 1}))
    kinds = ("q5_1", "q4_k", "q5_k", "q6_k")
    files = {kind: gg.save_model(float_model, str(tmp_path / f"{kind}.gguf"), dtype=kind) for kind in kinds}
    models = {kind: gg.load_model(path) for kind, path in files.items()}
    adapted = with_adapters(gg.load_model(files["q4_k"]), 4)
    adapter = gg.save_lora(adapted, str(tmp_path / "q4_k_lora.gguf"))
    theirs = llama_cpp(tmp_path, [(files[kind], "", TOKENS) for kind in kinds] + [(files["q4_k"], adapter, TOKENS)])
    for i, (name, model) in enumerate([*models.items(), ("q4_k+lora", adapted)]):
        logits, greedy = ggrad_run(model)
        tolerance = 1e-3 if name == "q5_1" else 1e-4
        assert relative(logits, theirs[f"logits{i}"]) < tolerance, (name, relative(logits, theirs[f"logits{i}"]))
        assert greedy == theirs[f"greedy{i}"].tolist(), name
    assert relative(ggrad_run(models["q4_k"])[0], theirs[f"logits{len(kinds)}"]) > 1e-2  # the adapter moved them


ARCH_CONFIGS = {  # small models of each architecture, as llama.cpp's converter lays them out
    "qwen2": dict(arch="qwen2", tie_embeddings=True),
    "gemma": dict(arch="gemma", tie_embeddings=True, key_length=24),  # heads * head size != dim, as gemma-7b's
    "phi3": dict(arch="phi3"),
}
ARCH_TARGETS = {"qwen2": ("wq", "wv", "w3"), "gemma": ("wq", "wv", "w3"), "phi3": ("wqkv", "w13")}


def fp16_table_gelu(monkeypatch) -> None:
    """ggrad's gelu as llama.cpp's CPU computes it (ggml's GGML_GELU_FP16: the input
    rounded to fp16, the float32 tanh formula, the result rounded to fp16), for the
    activations of these small models (|x| < 10, where ggml leaves the table)."""
    exact = F.gelu

    def table(x, approximate="none"):
        rounded = exact(x.to(ggrad.float16).to(ggrad.float32), approximate=approximate)
        return rounded.to(ggrad.float16).to(ggrad.float32)
    monkeypatch.setattr(F, "gelu", table)


@pytest.mark.parametrize("arch", list(ARCH_CONFIGS))
def test_llama_cpp_runs_each_architecture_as_ggrad_does(tmp_path, arch, monkeypatch):
    """qwen2 (NEOX RoPE, q/k/v biases, tied output), gemma (scaled embeddings and queries,
    gelu gating, head_dim apart from dim / heads) and phi3 (fused qkv and gate/up): the file
    ggrad writes, alone, in Q8_0 and with a LoRA adapter, gives llama.cpp's logits at 1e-4
    of the largest and its greedy tokens; and load_model reads back the same model.
    llama.cpp's CPU gelu reads an fp16 table: gemma's float32 logits are 3.9e-6 off with
    ggrad's exact gelu, its Q8_0 ones 1e-3 (an activation rounded to 8 bits the other
    way); with the table's rounding copied, all three equal llama.cpp's to 3e-7."""
    ggrad.set_device("cpu")
    ggrad.manual_seed(5)
    config = LlamaConfig(**{**CONFIG.__dict__, **ARCH_CONFIGS[arch]})
    model = Llama(config)
    with ggrad.no_grad():  # biases and norms away from their initial zeros and ones
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(ggrad.tensor(np.random.default_rng(6).standard_normal(p.shape).astype(np.float32) * 0.1))
    files = {"f32": gg.save_model(model, str(tmp_path / "f32.gguf")),
             "q8_0": gg.save_model(model, str(tmp_path / "q8_0.gguf"), dtype="q8_0")}
    loaded = gg.load_model(files["f32"])
    assert loaded.config == config
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(loaded.state_dict()[key].numpy(), value.numpy(), err_msg=key)
    adapted = gg.load_model(files["f32"])
    lora.add_lora(adapted, ARCH_TARGETS[arch], rank=4, alpha=8.0)
    rng = np.random.default_rng(7)
    with ggrad.no_grad():
        for layer in lora.lora_layers(adapted).values():
            layer.lora_B.assign_(rng.standard_normal(layer.lora_B.shape).astype(np.float32) * 0.2)
    adapter = gg.save_lora(adapted, str(tmp_path / "lora.gguf"))
    models = {"f32": model, "q8_0": gg.load_model(files["q8_0"]), "f32+lora": adapted}
    theirs = llama_cpp(tmp_path, [(files["f32"], "", TOKENS), (files["q8_0"], "", TOKENS),
                                  (files["f32"], adapter, TOKENS)])
    if arch == "gemma":
        assert relative(ggrad_run(model)[0], theirs["logits0"]) < 1e-4  # the exact gelu, float32 weights
        fp16_table_gelu(monkeypatch)
    for i, (name, m) in enumerate(models.items()):
        logits, greedy = ggrad_run(m)
        assert relative(logits, theirs[f"logits{i}"]) < 1e-4, (name, relative(logits, theirs[f"logits{i}"]))
        assert greedy == theirs[f"greedy{i}"].tolist(), name
    assert relative(ggrad_run(model)[0], theirs["logits2"]) > 1e-2  # the adapter moved them
