"""ggrad.models.Llama against a float64 torch llama written here from the definitions
(Meta's reference: RoPE on adjacent pairs via complex numbers, which is llama.cpp's rope
type NORM for LLM_ARCH_LLAMA; GQA by repeat_interleave; SwiGLU; RMSNorm with weight), on
the same weights: logits and every parameter's gradient, untied and tied; a short
training run and a compiled step that stays on the device; bad input raising in Python, never reaching a ggml abort."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch (the test oracle) is not installed: pip install -e .[test]")

import ggrad  # noqa: E402
import ggrad.functional as F  # noqa: E402
from ggrad.models import GGUF_NAMES, KVCache, Llama, LlamaConfig  # noqa: E402
from ggrad.models.llama import gguf_name, tensor_count  # noqa: E402
from ggrad.optim import Adam  # noqa: E402
from conftest import assert_resident_training, run_in_child  # noqa: E402

TINY = dict(vocab_size=37, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48, max_seq_len=16)


ARCHS = {"llama": {}, "qwen2": {}, "gemma": {"tie_embeddings": True, "key_length": 12}, "phi3": {}}


def tiny(tie: bool = False, seed: int = 0, arch: str = "llama") -> Llama:
    """The tiny model with random weights everywhere (norm weights and biases too: ones
    and zeros would hide a dropped one), scaled so that attention is far from uniform."""
    rng = np.random.default_rng(seed)
    model = Llama(LlamaConfig(**{**TINY, "tie_embeddings": tie, "arch": arch, **ARCHS[arch]}))
    state = {}
    for key, p in model.state_dict().items():
        if key.endswith("norm.weight"):
            state[key] = rng.uniform(0.5, 1.5, p.shape)
        else:
            state[key] = rng.standard_normal(p.shape) * (1.0 if key.startswith("tok_") else 0.3)
    model.load_state_dict({k: v.astype(np.float32) for k, v in state.items()})
    return model


def rope(x, theta: float, interleaved: bool):
    """The rotary embedding: pairs (2j, 2j + 1) (Meta's llama, llama.cpp's NORM) or (j,
    j + head_dim / 2) (NEOX) as complex numbers, turned by position * theta^(-2j / head_dim)."""
    b, t, h, d = x.shape
    freqs = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.outer(torch.arange(t, dtype=torch.float64), freqs)
    turn = torch.polar(torch.ones_like(angles), angles)[None, :, None, :]
    if interleaved:
        pairs = torch.view_as_complex(x.reshape(b, t, h, d // 2, 2).contiguous())
        return torch.view_as_real(pairs * turn).reshape(b, t, h, d)
    pairs = torch.complex(x[..., :d // 2], x[..., d // 2:]) * turn
    return torch.cat([pairs.real, pairs.imag], -1)


def reference(w: dict, tokens: np.ndarray, cfg: LlamaConfig):
    """The forward pass of cfg.arch in float64 torch, from the weights `w` (state-dict
    keys), as llama.cpp's graph for it computes (gemma's gelu exact, not its fp16 table)."""
    def rms_norm(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.norm_eps) * weight

    b, t = tokens.shape
    hd, groups = cfg.head_dim, cfg.n_heads // cfg.n_kv_heads
    q_rows, kv_rows = cfg.n_heads * hd, cfg.n_kv_heads * hd
    causal = torch.triu(torch.full((t, t), float("-inf"), dtype=torch.float64), 1)
    x = w["tok_embeddings.weight"][torch.from_numpy(tokens)]
    if cfg.arch == "gemma":
        x = x * cfg.dim ** 0.5
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        h = rms_norm(x, w[p + "attention_norm.weight"])
        if cfg.arch == "phi3":
            q, k, v = torch.split(h @ w[p + "attention.wqkv.weight"].T, [q_rows, kv_rows, kv_rows], -1)
        else:
            q, k, v = (h @ w[p + f"attention.w{n}.weight"].T for n in "qkv")
        if cfg.arch == "qwen2":
            q, k, v = q + w[p + "attention.wq.bias"], k + w[p + "attention.wk.bias"], v + w[p + "attention.wv.bias"]
        q = rope(q.reshape(b, t, cfg.n_heads, hd), cfg.rope_theta, cfg.arch == "llama")
        k = rope(k.reshape(b, t, cfg.n_kv_heads, hd), cfg.rope_theta, cfg.arch == "llama")
        v = v.reshape(b, t, cfg.n_kv_heads, hd)
        q, k, v = (z.transpose(1, 2) for z in (q, k.repeat_interleave(groups, 2), v.repeat_interleave(groups, 2)))
        scores = torch.softmax(q @ k.transpose(-1, -2) / hd ** 0.5 + causal, -1)
        x = x + (scores @ v).transpose(1, 2).reshape(b, t, q_rows) @ w[p + "attention.wo.weight"].T
        h = rms_norm(x, w[p + "ffn_norm.weight"])
        if cfg.arch == "phi3":
            gate, up = torch.chunk(h @ w[p + "feed_forward.w13.weight"].T, 2, -1)
        else:
            gate, up = h @ w[p + "feed_forward.w1.weight"].T, h @ w[p + "feed_forward.w3.weight"].T
        act = torch.nn.functional.gelu(gate, approximate="tanh") if cfg.arch == "gemma" else \
            torch.nn.functional.silu(gate)
        x = x + (act * up) @ w[p + "feed_forward.w2.weight"].T
    x = rms_norm(x, w["norm.weight"])
    return x @ w["tok_embeddings.weight" if cfg.tie_embeddings else "output.weight"].T


def torch_weights(model: Llama) -> dict:
    return {k: torch.tensor(v.numpy().astype(np.float64), requires_grad=True) for k, v in model.state_dict().items()}


def assert_close_to_max(actual, desired, tol: float, what: str) -> None:
    """|actual - desired| within tol of the largest |desired|."""
    scale = float(np.abs(desired).max())
    err = float(np.abs(np.asarray(actual, np.float64) - desired).max())
    assert err <= tol * scale, f"{what}: max error {err:.3g} is over {tol} x {scale:.3g}"


def tokens(batch: int = 2, seq: int = 11, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, TINY["vocab_size"], (batch, seq))


@pytest.mark.parametrize("arch", list(ARCHS))
def test_logits_equal_the_reference(dev, arch):
    model, ids = tiny(arch=arch), tokens()
    logits = model(ids).numpy()
    assert logits.shape == (2, 11, TINY["vocab_size"])
    expected = reference(torch_weights(model), ids, model.config).detach().numpy()
    assert_close_to_max(logits, expected, 1e-5, "logits")


@pytest.mark.parametrize("tie,arch", [(False, "llama"), (True, "llama"), (True, "qwen2"), (True, "gemma"),
                                      (False, "phi3")], ids=["untied", "tied", "qwen2", "gemma", "phi3"])
def test_gradients_equal_the_reference(dev, tie, arch):
    model, ids = tiny(tie, arch=arch), tokens(seed=2)
    targets = np.roll(ids, -1, axis=1)
    with ggrad.grad_tape():
        loss = F.cross_entropy(F.reshape(model(ids), (-1, TINY["vocab_size"])), targets.reshape(-1))
        loss.backward()
    w = torch_weights(model)
    t_loss = torch.nn.functional.cross_entropy(reference(w, ids, model.config).reshape(-1, TINY["vocab_size"]),
                                               torch.from_numpy(targets.reshape(-1)))
    t_loss.backward()
    assert abs(loss.item() - t_loss.item()) <= 1e-5 * abs(t_loss.item())
    named = dict(model.named_parameters())
    assert set(named) == set(w)
    for key, p in named.items():
        assert_close_to_max(p.grad.numpy(), w[key].grad.numpy(), 1e-4, f"gradient of {key}")


def test_tied_embeddings_are_one_parameter():
    model = tiny(tie=True)
    keys = list(model.state_dict())
    assert "output.weight" not in keys and model.output is None
    assert len(list(model.parameters())) == len(keys) == len(list(tiny().state_dict())) - 1
    # the gradient reaching the table is the sum of its two uses: zero either and it changes
    ids = tokens(seed=3)
    with ggrad.grad_tape():
        model(ids).sum().backward()
    both = model.tok_embeddings.weight.grad.numpy()
    w = torch_weights(model)
    reference(w, ids, model.config).sum().backward()
    assert_close_to_max(both, w["tok_embeddings.weight"].grad.numpy(), 1e-4, "tied gradient")
    unused = sorted(set(range(TINY["vocab_size"])) - set(ids.ravel().tolist()))
    assert unused and np.abs(both[unused]).max() > 0  # rows never looked up still learn as outputs


def test_state_dict_maps_one_to_one_onto_llama_cpp_names():
    for tie in (False, True):
        names = [gguf_name(k) for k in tiny(tie).state_dict()]
        assert len(set(names)) == len(names)
        assert ("output.weight" in names) is not tie
    names = set(gguf_name(k) for k in tiny().state_dict())
    assert {"token_embd.weight", "output_norm.weight", "blk.1.attn_q.weight", "blk.1.ffn_gate.weight",
            "blk.0.ffn_up.weight", "blk.0.ffn_down.weight", "blk.1.attn_output.weight"} <= names
    assert len(names) == 2 + 9 * TINY["n_layers"] + 1 and len(GGUF_NAMES) == 17
    # the other architectures: qwen2's biases, phi3's fused projections, each name once
    for arch, extra in (("qwen2", {"blk.1.attn_q.bias", "blk.0.attn_v.bias"}),
                        ("phi3", {"blk.1.attn_qkv.weight", "blk.0.ffn_up.weight"}), ("gemma", set())):
        config = LlamaConfig(**{**TINY, "arch": arch, "tie_embeddings": True})
        names = [gguf_name(k) for k in Llama(config).state_dict()]
        assert len(set(names)) == len(names) == tensor_count(config) and extra <= set(names), arch
        assert ("blk.0.ffn_gate.weight" in names) is (arch != "phi3")


def test_training_drops_the_loss():
    """A repeated random sequence is learnable: next-token loss falls by more than half."""
    ggrad.manual_seed(0)
    model = Llama(LlamaConfig(**TINY))
    pattern = np.random.default_rng(4).integers(0, TINY["vocab_size"], 5)
    seq = np.tile(pattern, 4)[None, :TINY["max_seq_len"] + 1]
    x, y = seq[:, :-1], seq[:, 1:].reshape(-1)
    opt = Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        with ggrad.grad_tape():
            loss = F.cross_entropy(F.reshape(model(x), (-1, TINY["vocab_size"])), y)
            loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_compiled_training_step_stays_on_the_device():
    """The whole model's Adam step captures: one dispatch, no crossing, once warm."""
    model, ids = tiny(), tokens(seed=5)
    x, y = ggrad.tensor(ids), ggrad.tensor(np.roll(ids, -1, axis=1).reshape(-1))
    assert_resident_training(lambda x: F.reshape(model(x), (-1, TINY["vocab_size"])), model.parameters(), x, y)


def test_bad_input_raises_in_python():
    """Each case in a child: one that reached a ggml assert would kill it."""
    out = run_in_child(r"""
        import numpy as np, ggrad
        from ggrad.models import Llama, LlamaConfig
        tiny = dict(vocab_size=37, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=48, max_seq_len=16)
        model = Llama(LlamaConfig(**tiny))
        cases = {
            "id = vocab": (lambda: model(np.array([[1, 37]])), IndexError, "out of range for 37"),
            "negative id": (lambda: model(np.array([[-1, 2]])), IndexError, "out of range"),
            "too long": (lambda: model(np.zeros((1, 17), np.int64)), ValueError, "max_seq_len 16"),
            "float ids": (lambda: model(np.zeros((1, 4), np.float32)), ValueError, "integer token ids"),
            "1-d ids": (lambda: model(np.zeros(4, np.int64)), ValueError, "(batch, seq)"),
            "heads % kv heads": (lambda: LlamaConfig(**{**tiny, "n_kv_heads": 3}), ValueError,
                                 "not divisible by n_kv_heads"),
            "dim % heads": (lambda: LlamaConfig(**{**tiny, "dim": 30}), ValueError, "not divisible by n_heads"),
            "odd head_dim": (lambda: LlamaConfig(**{**tiny, "dim": 12}), ValueError, "must be even"),
            "zero layers": (lambda: LlamaConfig(**{**tiny, "n_layers": 0}), ValueError, "positive int"),
        }
        for name, (fn, kind, text) in cases.items():
            try:
                fn()
            except kind as e:
                assert text in str(e), (name, str(e))
                print("ok", name)
            else:
                print("no error", name)
        print("logits", model(np.array([[1, 36]])).shape)
    """)
    assert out.count("ok ") == 9 and "no error" not in out, out
    assert "logits (1, 2, 37)" in out, out


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_llama_trains(dev, dtype):
    """After .half() / .bfloat16() the causal model runs in that dtype (its float32 mask
    made the attention raise), its logits are the float32 model's within the dtype's
    rounding, and a compiled Adam step trains it (the loss falls by more than half in 30
    steps) in one dispatch with no crossing. In a child: ggml's AdamW kernel aborted the
    process on float16 parameters on the CPU. float16 uses eps=1e-4: its second moments
    underflow to zero (as torch's float16 state does), and eps=1e-8 then divides a
    moment by almost nothing."""
    out = run_in_child(r"""
        import sys
        import numpy as np, ggrad
        import ggrad.functional as F
        from ggrad.models import Llama, LlamaConfig
        from ggrad.optim import Adam

        device, dtype = sys.argv[1:3]
        ggrad.set_device(device)
        ggrad.manual_seed(0)
        vocab = 37
        model = Llama(LlamaConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48,
                                  max_seq_len=16))
        ids = np.random.default_rng(1).integers(0, vocab, (2, 11))
        full = model(ids).numpy()
        model.half() if dtype == "float16" else model.bfloat16()
        logits = model(ids)
        print("dtype", logits.dtype.name)
        print("logit error", np.abs(logits.numpy().astype(np.float32) - full).max() / np.abs(full).max())
        opt = Adam(model.parameters(), lr=1e-2, eps=1e-4 if dtype == "float16" else 1e-8)

        @ggrad.compile
        def step(x, y):
            with ggrad.grad_tape():
                loss = F.cross_entropy(F.reshape(model(x), (-1, vocab)), y)
                loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        seq = np.tile(np.random.default_rng(4).integers(0, vocab, 5), 4)[None, :17]
        x, y = ggrad.tensor(seq[:, :-1]), ggrad.tensor(seq[:, 1:].reshape(-1))
        losses = [step(x, y).item() for _ in range(30)]
        ggrad.realize()
        with ggrad.count_transfers() as t:
            step(x, y)
            ggrad.realize()
        print("step", t.dispatches, t.crossings)
        print("losses", losses[0], losses[-1])
    """, dev, dtype)
    lines = dict(line.split(" ", 1) for line in out.strip().splitlines())
    assert lines["dtype"] == dtype, out
    assert float(lines["logit"].split()[-1]) < {"float16": 4e-3, "bfloat16": 3e-2}[dtype], out
    assert lines["step"] == "1 0", out
    first, last = map(float, lines["losses"].split())
    assert last < 0.5 * first, out


@pytest.mark.parametrize("arch", list(ARCHS))
def test_the_kv_cache_computes_what_the_whole_window_does(dev, arch):
    """A prompt read in two pieces through a KVCache gives the whole window's logits, and
    generate (the prompt once, then one token at a time) picks the whole window's greedy
    tokens."""
    model = tiny(arch=arch)
    ids = list(np.random.default_rng(3).integers(0, model.config.vocab_size, 11))
    cache = KVCache()
    with ggrad.no_grad():
        pieces = [model(np.array([ids[:4]]), cache).numpy(), model(np.array([ids[4:]]), cache).numpy()]
        whole = model(np.array([ids])).numpy()
        assert len(cache) == len(ids)
        np.testing.assert_allclose(np.concatenate(pieces, axis=1), whole, rtol=0, atol=1e-5 * np.abs(whole).max())
        window = list(ids)
        for _ in range(6):
            window.append(int(np.argmax(model(np.array([window])).numpy()[0, -1])))
    assert model.generate(ids, 6) == window[len(ids):]
    with pytest.raises(TypeError, match="KVCache"):
        model(np.array([ids]), cache=[])
    with pytest.raises(ValueError, match="holds 1 sequences"):
        model(np.array([ids[:2], ids[:2]]), cache)
    with pytest.raises(ValueError, match="longer than max_seq_len"):
        model(np.zeros((1, model.config.max_seq_len), dtype=np.int64), cache)
    with pytest.raises(ValueError, match="non-empty prompt"):
        model.generate([], 3)
