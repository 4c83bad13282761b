"""Matmul precision, autocast and GradScaler: products computed as asked (operands rounded
to the low dtype, float32 sums), training that tracks float32, and a scaler that skips
and recovers on the device, as torch's does."""

import os

import ml_dtypes
import numpy as np
import pytest

import ggrad
import ggrad.functional as F
from ggrad import nn
from ggrad.amp import GradScaler, autocast
from ggrad.optim import SGD, Adam
from ggrad.runtime import backend

from conftest import compiled_nodes, run_in_child, set_variant

LOW = {"bfloat16": (ggrad.bfloat16, ml_dtypes.bfloat16), "float16": (ggrad.float16, np.float16)}
rng = np.random.default_rng(13)


@pytest.fixture
def precision():
    """Restore the process-wide matmul precision after the test."""
    before = ggrad.get_float32_matmul_precision()
    yield
    ggrad.set_float32_matmul_precision(before)


def rounded(a, low):
    return np.asarray(a, np.float32).astype(low).astype(np.float64)


def rel(a, b):
    return float(np.abs(np.asarray(a, np.float64) - b).max() / np.abs(b).max())


# ---- matmul precision -------------------------------------------------------------------
def test_precision_setting_is_torchs(precision):
    assert ggrad.get_float32_matmul_precision() == "highest"  # torch's default
    for p in ("high", "medium", "highest"):
        ggrad.set_float32_matmul_precision(p)
        assert ggrad.get_float32_matmul_precision() == p
    with pytest.raises(ValueError, match="precision must be one of"):
        ggrad.set_float32_matmul_precision("fast")


def test_compiled_step_retraces_when_the_precision_changes(dev, precision):
    w = ggrad.tensor(rng.standard_normal((8, 8)).astype(np.float32))
    step = ggrad.compile(lambda x: x @ w)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    for _ in range(3):
        step(x)
    assert step.traces == 1
    ggrad.set_float32_matmul_precision("high")
    step(x)
    step(x)
    assert step.traces == 2  # the products of the first trace were marked "highest"
    with autocast(dtype=ggrad.bfloat16):
        got = step(x).numpy()
    assert step.traces == 3
    np.testing.assert_allclose(got, rounded(x, ml_dtypes.bfloat16) @ rounded(w.numpy(), ml_dtypes.bfloat16),
                               rtol=1e-5, atol=1e-5)


def test_cuda_highest_is_float32_and_high_allows_tf32(precision):
    if "cuda:0" not in [d.name for d in ggrad.devices()]:
        pytest.skip("no cuda:0 device in this ggml build")
    assert backend.cuda_honours_precision(), "this ggml-cuda was not built by `make cuda`"
    a, b = rng.standard_normal((256, 512)).astype(np.float32), rng.standard_normal((512, 384)).astype(np.float32)
    expected = a.astype(np.float64) @ b
    errors = {}
    with ggrad.device("cuda:0"):
        for p in ("highest", "high"):
            ggrad.set_float32_matmul_precision(p)
            x, y = ggrad.tensor(a, requires_grad=True), ggrad.tensor(b, requires_grad=True)
            with ggrad.grad_tape():
                out = x @ y
                out.sum().backward()
            errors[p] = (rel(out.numpy(), expected), rel(y.grad.numpy(), a.sum(0, dtype=np.float64)[:, None]
                                                        * np.ones((1, 384))))
    assert errors["highest"][0] < 1e-5 and errors["highest"][1] < 1e-5, errors
    assert errors["high"][0] > 1e-4, errors  # TF32 keeps 10 mantissa bits


def test_vulkan_float16_paths_follow_the_precision_at_start(monkeypatch, precision):
    """Its float16 shaders and its matrix cores (which round float32 operands to float16
    too) are off unless the precision is "medium" when a device starts."""
    switches = ("GGML_VK_DISABLE_F16", "GGML_VK_DISABLE_COOPMAT", "GGML_VK_DISABLE_COOPMAT2")
    monkeypatch.setattr(backend, "_USER_VK_FLOAT16", dict.fromkeys(switches))
    monkeypatch.setattr(ggrad.runtime.precision, "_vulkan_started", {})
    for switch in switches:
        monkeypatch.delenv(switch, raising=False)
    backend._set_vulkan_float16("vulkan:9")
    assert all(os.environ[switch] == "1" for switch in switches)
    with pytest.warns(RuntimeWarning, match="fixed when the device starts"):
        ggrad.set_float32_matmul_precision("medium")
    backend._set_vulkan_float16("vulkan:9")
    assert not any(switch in os.environ for switch in switches)
    monkeypatch.setitem(backend._USER_VK_FLOAT16, "GGML_VK_DISABLE_COOPMAT2", "1")  # the user's own setting wins
    monkeypatch.setenv("GGML_VK_DISABLE_COOPMAT2", "1")
    backend._set_vulkan_float16("vulkan:9")
    assert os.environ["GGML_VK_DISABLE_COOPMAT2"] == "1" and "GGML_VK_DISABLE_COOPMAT" not in os.environ


def test_vulkan_multiplies_autocast_operands_on_matrix_cores_only_where_they_keep_them(monkeypatch):
    """Under autocast a Vulkan product takes the matrix cores only where they are on (the
    device started at "medium") and know the type (bfloat16: the driver's type and the
    build's shaders); elsewhere the rounded operands are multiplied in float32."""
    from ggrad import ops
    from ggrad.runtime import precision
    traits = {"matrix cores": "NV_coopmat2", "fp16": "1", "bf16": "1"}
    monkeypatch.setattr(backend, "vulkan_traits", lambda name: dict(traits))
    monkeypatch.setattr(backend, "vulkan_shader_features", lambda: ["NV_coopmat2", "bf16 coopmat"])
    monkeypatch.setattr(precision, "vulkan_float16_on", lambda name: True)
    bf16, f16 = ops.G.GGML_TYPE_BF16, ops.G.GGML_TYPE_F16
    assert ops._vulkan_matrix_cores_take(bf16) and ops._vulkan_matrix_cores_take(f16)
    monkeypatch.setattr(backend, "vulkan_shader_features", lambda: ["NV_coopmat2"])
    assert not ops._vulkan_matrix_cores_take(bf16) and ops._vulkan_matrix_cores_take(f16)
    monkeypatch.setattr(precision, "vulkan_float16_on", lambda name: False)  # "high": cores off
    assert not ops._vulkan_matrix_cores_take(bf16) and not ops._vulkan_matrix_cores_take(f16)
    monkeypatch.setattr(precision, "vulkan_float16_on", lambda name: True)
    traits["fp16"] = "dot2"  # float16 with mixed-precision dot products (ggml's banner)
    assert ops._vulkan_matrix_cores_take(f16)
    traits["matrix cores"] = "none"
    assert not ops._vulkan_matrix_cores_take(f16)


MATRIX_CORES = [name for name in ("vulkan:0",) if backend.vulkan_traits(name).get("matrix cores", "none") != "none"]


@pytest.mark.skipif(not MATRIX_CORES, reason="no Vulkan device with matrix cores (lavapipe has none)")
@pytest.mark.parametrize("low", LOW)
def test_autocast_products_on_vulkan_matrix_cores_round_both_operands(low):
    """At "medium" a Vulkan GPU's matrix cores multiply autocast operands (ggrad hands them
    a low-type src0 and a float32 src1, which ggml-vulkan rounds): the products are still
    those of the rounded operands with float32 sums. A child process: the precision is
    fixed when a Vulkan device starts."""
    out = run_in_child("""
        import sys
        import ml_dtypes, numpy as np
        import ggrad
        from ggrad.amp import autocast
        ggrad.set_float32_matmul_precision("medium")
        ggrad.set_device(sys.argv[1])
        dtype, host = (ggrad.bfloat16, ml_dtypes.bfloat16) if sys.argv[2] == "bfloat16" else (ggrad.float16, np.float16)
        rng = np.random.default_rng(3)
        x_np, w_np = rng.standard_normal((64, 96)).astype(np.float32), rng.standard_normal((32, 96)).astype(np.float32)
        c_np = rng.standard_normal((64, 32)).astype(np.float32)
        x, w = ggrad.tensor(x_np, requires_grad=True), ggrad.tensor(w_np, requires_grad=True)
        with autocast(dtype=dtype):
            with ggrad.grad_tape():
                y = x @ w.T
                (y * ggrad.tensor(c_np)).sum().backward()
        r = lambda a: a.astype(host).astype(np.float64)
        rel = lambda a, b: float(np.abs(a - b).max() / np.abs(b).max())
        print(rel(y.numpy(), r(x_np) @ r(w_np).T), rel(x.grad.numpy(), r(c_np) @ r(w_np)),
              rel(w.grad.numpy(), r(c_np).T @ r(x_np)))
    """, MATRIX_CORES[0], low)
    assert all(float(e) < 1e-5 for e in out.split()), out


# ---- autocast -----------------------------------------------------------------------------
@pytest.mark.parametrize("low", LOW)
def test_autocast_products_round_both_operands_and_sum_in_float32(dev, low):
    dtype, host = LOW[low]
    x_np = rng.standard_normal((64, 96)).astype(np.float32)
    w_np = rng.standard_normal((32, 96)).astype(np.float32)
    c_np = rng.standard_normal((64, 32)).astype(np.float32)  # the output's gradient, exactly
    x, w = ggrad.tensor(x_np, requires_grad=True), ggrad.tensor(w_np, requires_grad=True)
    with autocast(dtype=dtype):
        with ggrad.grad_tape():
            y = x @ w.T
            (y * ggrad.tensor(c_np)).sum().backward()
    assert y.dtype is ggrad.float32  # ggml's products write float32 (torch's would be low)
    expected = rounded(x_np, host) @ rounded(w_np, host).T
    assert rel(y.numpy(), expected) < 1e-5
    assert rel(x.grad.numpy(), rounded(c_np, host) @ rounded(w_np, host)) < 1e-5
    assert rel(w.grad.numpy(), rounded(c_np, host).T @ rounded(x_np, host)) < 1e-5
    assert rel(x_np.astype(np.float64) @ w_np.T, expected) > 1e-4  # float32 products would fail the above


@pytest.mark.parametrize("low", LOW)
def test_autocast_products_of_views_round_what_the_views_read(dev, low):
    """Attention's products under autocast read views (heads of a fused projection's thirds,
    a transposed key, a transposed input with a bias): each equals float64 over the rounded
    values the view holds, gradients too. On CUDA (set 46) the GEMM kernel reads views of
    one cast of each storage: the compiled step then copies nothing."""
    from ggrad.runtime import kernels
    dtype, host = LOW[low]
    batch, seq, heads, dim = 2, 8, 2, 16
    def inputs():
        arrays = [rng.standard_normal(shape).astype(np.float32) for shape in (
            (batch, seq, 3 * heads * dim), (batch, heads, seq, seq), (24, seq), (20, 24), (20,),  # qkv, p, x^T, w, b
            (batch, heads, seq, seq), (batch, heads, seq, dim), (seq, 20))]  # the outputs' gradients
        return arrays, [ggrad.tensor(a, requires_grad=True) for a in arrays[:5]] + [ggrad.tensor(a) for a in arrays[5:]]

    def heads_of(t):  # (batch, seq, heads*dim) -> (batch, heads, seq, dim), a permuted view
        return t.reshape(batch, seq, heads, dim).permute(0, 2, 1, 3)

    def compiled(low_dtype):
        @ggrad.compile
        def step(qkv, p, xt, w, b, g_s, g_o, g_y):
            for t in (qkv, p, xt, w, b):
                t.grad = None
            with autocast(dtype=low_dtype or dtype, enabled=low_dtype is not None):
                with ggrad.grad_tape():
                    q, k, v = (heads_of(t) for t in qkv.chunk(3, -1))
                    s = q @ k.transpose(-1, -2)
                    o = p @ v
                    y = F.linear(xt.T, w, b)
                    ((s * g_s).sum() + (o * g_o).sum() + (y * g_y).sum()).backward()
            return (s, o, y) + tuple(t.grad for t in (qkv, p, xt, w, b))
        return step

    step = compiled(dtype)
    step(*inputs()[1])  # captured; then replayed on other values
    arrays, tensors = inputs()
    s, o, y, *got = step(*tensors)
    qkv_np, p_np, xt_np, w_np, b_np, c_s, c_o, c_y = arrays
    r = lambda a: rounded(a, host)  # noqa: E731
    q, k, v = (a.reshape(batch, seq, heads, dim).transpose(0, 2, 1, 3) for a in np.split(qkv_np, 3, -1))
    t = lambda a: a.swapaxes(-1, -2)  # noqa: E731
    assert rel(s.numpy(), r(q) @ t(r(k))) < 1e-5
    assert rel(o.numpy(), r(p_np) @ r(v)) < 1e-5
    assert rel(y.numpy(), t(r(xt_np)) @ t(r(w_np)) + b_np) < 1e-5
    merged = lambda a: a.transpose(0, 2, 1, 3).reshape(batch, seq, heads * dim)  # noqa: E731
    expected = np.concatenate([merged(r(c_s) @ r(k)), merged(t(r(c_s)) @ r(q)), merged(t(r(p_np)) @ r(c_o))], -1)
    assert rel(got[0].numpy(), expected) < 1e-5
    assert rel(got[1].numpy(), r(c_o) @ t(r(v))) < 1e-5
    assert rel(got[2].numpy(), t(r(c_y) @ r(w_np))) < 1e-5
    assert rel(got[3].numpy(), t(r(c_y)) @ t(r(xt_np))) < 1e-5
    assert rel(got[4].numpy(), c_y.sum(0)) < 1e-5
    assert rel(s.numpy(), q @ t(k)) > 1e-4  # float32 products would fail the above
    if kernels.variant(ggrad.runtime.current().backend, "gemm_low"):  # no more copies than float32's, a cast a storage
        f32 = compiled(None)
        for _ in range(2):
            f32(*tensors)
        counts, f32_counts = step.op_counts(), f32.op_counts()
        assert counts.get("CONT", 0) <= f32_counts.get("CONT", 0) and counts.get("MUL_MAT", 0) == 0, (counts, f32_counts)
        assert counts.get("CPY", 0) - f32_counts.get("CPY", 0) <= 8, (counts, f32_counts)  # 5 leaves' and 3 gradients' casts


@pytest.mark.parametrize("low", LOW)
def test_low_views_read_the_elements_of_their_float32_views(low, ggml_host):
    """ops._low_view (the CUDA GEMM's autocast operands): the low-type view over a cast of a
    float32 view's storage holds that view's elements, rounded; checked through ggml's own
    copy on the CPU for the views attention and linear layers hand the GEMM (a transpose, a
    third of a fused projection as heads, a key transposed, a slice at an offset)."""
    import ctypes

    from ggml import ggml as G

    from ggrad import ops
    from ggrad.runtime.handle import DTYPES
    dtype, host = LOW[low]
    kind = DTYPES[dtype.storage]
    stored = rng.standard_normal((2, 8, 96)).astype(np.float32)  # (batch, seq, 3 * heads * dim)
    ctx, put = ggml_host
    root = put(stored)
    f32 = 4
    key = G.ggml_view_4d(ctx, root, 16, 8, 2, 2, 96 * f32, 16 * f32, 96 * 8 * f32, 32 * f32)  # (dim, seq, heads, batch)
    views = {
        "transpose": (G.ggml_transpose(ctx, G.ggml_reshape_2d(ctx, root, 96, 16)), stored.reshape(16, 96).T),
        "key heads": (key, stored[..., 32:64].reshape(2, 8, 2, 16).transpose(0, 2, 1, 3)),
        "key heads transposed": (G.ggml_permute(ctx, key, 1, 0, 2, 3),
                                 stored[..., 32:64].reshape(2, 8, 2, 16).transpose(0, 2, 3, 1)),
        "rows at an offset": (G.ggml_view_2d(ctx, root, 96, 5, 96 * f32, 3 * 96 * f32), stored.reshape(16, 96)[3:8]),
    }
    graph = G.ggml_new_graph(ctx)
    copies = {}
    for name, (view, _) in views.items():
        low_view = ops._low_view(ctx, view, kind)
        assert low_view.contents.type == kind and low_view.contents.view_src, name  # a view, no copy of its own
        copies[name] = G.ggml_cont(ctx, low_view)
        G.ggml_build_forward_expand(graph, copies[name])
    G.ggml_graph_compute_with_ctx(ctx, graph, 1)
    for name, (_, expected) in views.items():
        c = copies[name].contents
        got = np.empty(G.ggml_nelements(copies[name]), np.float32)
        if kind == G.GGML_TYPE_BF16:
            G.ggml_bf16_to_fp32_row(ctypes.cast(c.data, ctypes.POINTER(G.ggml_bf16_t)),
                                    got.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), got.size)
        else:
            got = np.frombuffer(ctypes.string_at(c.data, got.size * 2), np.float16).astype(np.float32)
        np.testing.assert_array_equal(got.reshape(expected.shape), rounded(expected, host), err_msg=name)


def test_autocast_convolution_matches_torch_on_rounded_operands(dev):
    torch = pytest.importorskip("torch")
    x_np = rng.standard_normal((2, 3, 9, 9)).astype(np.float32)
    conv = nn.Conv2d(3, 5, 3, padding=1)
    with autocast(dtype=ggrad.bfloat16):
        got = conv(ggrad.tensor(x_np)).numpy()
    w, b = conv.weight.numpy(), conv.bias.numpy()
    expected = torch.nn.functional.conv2d(torch.tensor(rounded(x_np, ml_dtypes.bfloat16)),
                                          torch.tensor(rounded(w, ml_dtypes.bfloat16)),
                                          torch.tensor(b.astype(np.float64)), padding=1).numpy()
    assert rel(got, expected) < 1e-5


def test_columns_written_in_the_low_type_equal_the_cast_columns(dev, monkeypatch):
    """ops._columns_as (CUDA's im2col_low): IM2COL asked for float16 columns (which ggml's
    CPU and Vulkan have too) gives the products the values a cast of float32 columns gave,
    and the cast leaves the graph. Forced on and off on every device (the CPU's own
    convolution kernels refused: they make no columns)."""
    from ggrad.runtime import kernels
    supported = kernels.supported
    monkeypatch.setattr(kernels, "supported", lambda backend, k: k not in (kernels.CONV, kernels.COLUMNS) and supported(backend, k))
    x_np = rng.standard_normal((2, 3, 9, 11)).astype(np.float32)
    conv = nn.Conv2d(3, 5, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2))  # every pair of sizes unequal
    conv1d = nn.Conv1d(3, 4, 3, stride=2, padding=1)

    def step(x):
        with autocast(dtype=ggrad.float16):
            return conv(x), conv1d(x[:, :, 0])
    set_variant(monkeypatch, "im2col_low", False)
    plain = ggrad.compile(step)
    expected = [[y.numpy() for y in plain(ggrad.tensor(x_np))] for _ in range(2)][-1]
    set_variant(monkeypatch, "im2col_low", True)
    monkeypatch.setattr(ggrad.lazy, "BUILD_TAG", "columns in float16")
    direct = ggrad.compile(step)
    got = [[y.numpy() for y in direct(ggrad.tensor(x_np))] for _ in range(2)][-1]
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)
    assert direct.op_counts().get("CPY", 0) < plain.op_counts().get("CPY", 0), (direct.op_counts(), plain.op_counts())


def test_autocast_scope_and_arguments():
    a_np, b_np = rng.standard_normal((16, 16)).astype(np.float32), rng.standard_normal((16, 16)).astype(np.float32)
    a, b = ggrad.tensor(a_np), ggrad.tensor(b_np)
    exact = a_np.astype(np.float64) @ b_np
    low = rounded(a_np, ml_dtypes.bfloat16) @ rounded(b_np, ml_dtypes.bfloat16)
    assert not ggrad.amp.is_autocast_enabled()
    with autocast("cpu"):  # torch's default for the CPU: bfloat16
        assert ggrad.amp.get_autocast_dtype() is ggrad.bfloat16
        inside = (a @ b).numpy()
        with autocast("cpu", enabled=False):
            off = (a @ b).numpy()
            assert not ggrad.amp.is_autocast_enabled()
    assert rel(inside, low) < 1e-5 and rel(off, exact) < 1e-5 and rel((a @ b).numpy(), exact) < 1e-5
    assert autocast("cuda").fast_dtype is ggrad.float16  # torch's default for CUDA

    @autocast(dtype=ggrad.bfloat16)
    def product(p, q):
        return p @ q
    assert rel(product(a, b).numpy(), low) < 1e-5
    # float operands of two dtypes meet under autocast (torch casts both)
    with autocast(dtype=ggrad.bfloat16):
        mixed = (a.to(ggrad.float16) @ b).numpy()
    assert rel(mixed, rounded(a_np.astype(np.float16), ml_dtypes.bfloat16) @ rounded(b_np, ml_dtypes.bfloat16)) < 1e-5
    with pytest.raises(ValueError, match="bfloat16 or ggrad.float16"):
        autocast(dtype=ggrad.float32)
    with pytest.raises(ValueError, match="device_type"):
        autocast("tpu")


def _digits():
    from sklearn.datasets import load_digits
    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    return x[:512], data.target[:512].astype(np.int64)


def _loss_curve(make_model, batches, low, steps: int, lr: float):
    """Losses of a compiled Adam training run, under autocast when `low` is given, with a
    GradScaler for float16; the last step is checked to cross nothing."""
    ggrad.manual_seed(0)
    batches = [(ggrad.tensor(x), ggrad.tensor(y)) for x, y in batches]  # on the device: a step crosses nothing
    ggrad.realize(*[t for pair in batches for t in pair])
    model = make_model()
    opt = Adam(model.parameters(), lr=lr)
    scaler = GradScaler(enabled=low is ggrad.float16)

    @ggrad.compile
    def step(x, y):
        with autocast(dtype=low or ggrad.bfloat16, enabled=low is not None):
            with ggrad.grad_tape():
                out = model(x)
                loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
                scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        return loss

    losses = [step(*batches[i % len(batches)]) for i in range(steps - 1)]
    ggrad.realize()
    with ggrad.count_transfers() as t:
        losses.append(step(*batches[(steps - 1) % len(batches)]))
        ggrad.realize()
    assert t.crossings == 0 and t.dispatches == 1, t
    return np.array([loss.item() for loss in losses]), scaler


@pytest.mark.parametrize("low", LOW)
def test_autocast_mlp_training_tracks_float32(dev, low):
    pytest.importorskip("sklearn")
    x, y = _digits()
    batches = [(x[i:i + 64], y[i:i + 64]) for i in range(0, 512, 64)]

    def make():
        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    reference, _ = _loss_curve(make, batches, None, 60, 1e-2)
    curve, scaler = _loss_curve(make, batches, LOW[low][0], 60, 1e-2)
    assert reference[-1] < 0.3 * reference[0]
    # within 1% of the largest float32 loss at every step (measured on cpu and lavapipe:
    # 0.07% bf16, 0.01% f16); not equal, so the low-precision products did run
    deviation = np.abs(curve - reference).max()
    assert 0 < deviation <= 0.01 * reference.max(), deviation
    assert scaler.skipped_steps == 0


@pytest.mark.parametrize("low", LOW)
def test_autocast_char_lm_training_tracks_float32(dev, low):
    text = open(os.__file__, encoding="utf-8").read()[:20000]
    vocab = sorted(set(text))
    ids = np.array([vocab.index(c) for c in text], dtype=np.int64)
    starts = np.random.default_rng(0).integers(0, len(ids) - 17, size=(6, 8))
    batches = [(ids[s[:, None] + np.arange(16)], ids[s[:, None] + np.arange(1, 17)]) for s in starts]

    class TinyLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = nn.Embedding(len(vocab), 32)
            self.block = nn.TransformerBlock(32, 4, causal=True)
            self.head = nn.Linear(32, len(vocab))

        def forward(self, x):
            return self.head(self.block(self.tokens(x)))
    reference, _ = _loss_curve(TinyLM, batches, None, 30, 3e-3)
    curve, _ = _loss_curve(TinyLM, batches, LOW[low][0], 30, 3e-3)
    assert reference[-1] < 0.8 * reference[0]
    # within 0.5% (measured on cpu and lavapipe: 0.01% bf16, under 0.005% f16), not equal
    deviation = np.abs(curve - reference).max()
    assert 0 < deviation <= 0.005 * reference.max(), deviation


# ---- GradScaler ------------------------------------------------------------------------
def _scaled_run(framework, grads, init_scale=8.0, growth_interval=2, growth_factor=2.0):
    """SGD over one (3,) weight whose gradient is `grads[i]` at step i, through a scaler;
    returns the scale and the weight after each step."""
    if framework == "torch":
        import torch
        w = torch.zeros(3, requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.5)
        scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval,
                                      growth_factor=growth_factor)
    else:
        w = ggrad.param(np.zeros(3, np.float32))
        opt = SGD([w], lr=0.5)
        scaler = GradScaler(init_scale=init_scale, growth_interval=growth_interval, growth_factor=growth_factor)
    scales, weights = [], []
    for g in grads:
        if framework == "torch":
            import torch
            scaler.scale((w * torch.tensor(g)).sum()).backward()
        else:
            with ggrad.grad_tape():
                scaler.scale((w * ggrad.tensor(g)).sum()).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        scales.append(scaler.get_scale())
        weights.append(np.array(w.detach().numpy(), dtype=np.float64))
    return scales, weights, scaler


def test_grad_scaler_matches_torch_through_an_inf_step(dev):
    pytest.importorskip("torch")
    grads = [np.array([1.0, -2.0, 0.5], np.float32)] * 3 + [np.array([np.inf, 1.0, 1.0], np.float32)] \
        + [np.array([0.25, 0.25, -1.0], np.float32)] * 4 + [np.array([np.nan, 0, 0], np.float32)]
    want_scales, want_weights, torch_scaler = _scaled_run("torch", grads)
    scales, weights, scaler = _scaled_run("ggrad", grads)
    assert scales == want_scales  # 8 8 16 8 8 16 16 32 16: backoff on inf and NaN, growth every 2
    np.testing.assert_allclose(weights, want_weights, rtol=1e-6)  # the inf and NaN steps change nothing
    assert scaler.skipped_steps == 2
    assert scaler.state_dict() == torch_scaler.state_dict()


def test_grad_scaler_never_grows_the_scale_to_inf_as_torchs(dev):
    """A growth past float32's range keeps the scale (torch's isfinite check): from 2**126
    the scale stops at 2**127 and no step is skipped; with growth_factor 8 from 2**120 it
    stops at 2**126, and the weights move as torch's."""
    pytest.importorskip("torch")
    grads = [np.array([0.5, -0.25, 1.0], np.float32)] * 4
    scales, weights, scaler = _scaled_run("ggrad", grads, init_scale=2.0 ** 126, growth_interval=1)
    assert scales == [2.0 ** 127] * 4 and scaler.skipped_steps == 0
    want_scales, want_weights, _ = _scaled_run("torch", grads, init_scale=2.0 ** 120, growth_interval=1,
                                               growth_factor=8.0)
    scales, weights, scaler = _scaled_run("ggrad", grads, init_scale=2.0 ** 120, growth_interval=1,
                                          growth_factor=8.0)
    assert scales == want_scales == [2.0 ** 123, 2.0 ** 126, 2.0 ** 126, 2.0 ** 126]
    np.testing.assert_allclose(weights, want_weights, rtol=1e-6)
    assert scaler.skipped_steps == 0


@pytest.mark.parametrize("fused", [False, True])
def test_grad_scaler_undoes_adam_whole_and_recovers(dev, fused):
    w = ggrad.param(np.ones(4, np.float32))
    opt = Adam([w], lr=0.1, fused=fused)  # True: ggml's kernel, which writes in place
    scaler = GradScaler(init_scale=4.0)

    def step(g):
        with ggrad.grad_tape():
            scaler.scale((w * ggrad.tensor(np.asarray(g, np.float32))).sum()).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    step([1, 2, 3, 4])
    state = {k: v.numpy().copy() for k, v in opt.state[w].items() if isinstance(v, ggrad.Tensor)}
    before = w.numpy().copy()
    step([np.inf, 0, 0, 0])
    np.testing.assert_array_equal(w.numpy(), before)
    for k, v in state.items():  # moments and bias corrections as they were
        np.testing.assert_array_equal(opt.state[w][k].numpy(), v, err_msg=k)
    assert scaler.get_scale() == 2.0 and scaler.skipped_steps == 1
    step([1, 2, 3, 4])
    # the recovered step is Adam's second step, not a third: the same as two good steps
    twin = ggrad.param(np.ones(4, np.float32))
    twin_opt = Adam([twin], lr=0.1, fused=fused)
    for _ in range(2):
        with ggrad.grad_tape():
            (twin * ggrad.tensor(np.array([1, 2, 3, 4], np.float32))).sum().backward()
        twin_opt.step()
        twin_opt.zero_grad()
    np.testing.assert_allclose(w.numpy(), twin.numpy(), rtol=1e-6)


def test_grad_scaler_in_a_compiled_step_crosses_nothing(dev):
    w = ggrad.param(np.zeros(8, np.float32))
    opt = SGD([w], lr=0.1)
    scaler = GradScaler(init_scale=2.0 ** 10, growth_interval=3)

    @ggrad.compile
    def step(g):
        with ggrad.grad_tape():
            scaler.scale((w * g).sum()).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    good, bad = ggrad.tensor(np.ones(8, np.float32)), ggrad.tensor(np.full(8, np.inf, np.float32))
    ggrad.realize(good, bad)
    step(good)
    step(good)
    ggrad.realize()
    with ggrad.count_transfers() as t:
        step(bad)  # a replay: the skip and the backoff happen on the device
        ggrad.realize()
    assert t.crossings == 0 and t.dispatches == 1, t
    assert step.traces == 1
    assert scaler.get_scale() == 2.0 ** 9 and scaler.skipped_steps == 1
    np.testing.assert_allclose(w.numpy(), np.full(8, -0.2), rtol=1e-6)  # two good steps, the bad one undone
    for _ in range(3):
        step(good)
    assert scaler.get_scale() == 2.0 ** 10  # grown after growth_interval good steps


def test_grad_scaler_arguments_and_misuse():
    with pytest.raises(ValueError, match="growth_factor"):
        GradScaler(growth_factor=1.0)
    with pytest.raises(ValueError, match="backoff_factor"):
        GradScaler(backoff_factor=1.0)
    w = ggrad.param(np.zeros(2, np.float32))
    opt = SGD([w], lr=0.1)
    scaler = GradScaler()
    with ggrad.grad_tape():
        scaler.scale(w.sum()).backward()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(opt)
    off = GradScaler(enabled=False)
    loss = w.sum()
    assert off.scale(loss) is loss and off.state_dict() == {} and off.get_scale() == 1.0


def test_grad_scaler_after_eps_changes_and_with_a_float16_loss(dev):
    """State the step would make (new Adam constants after eps changed) is made before the
    guarded step, so an inf step keeps it; a float16 loss is scaled in float32 (torch's
    scale is float32: 2**16 in float16 is inf)."""
    torch = pytest.importorskip("torch")
    grads = [np.array([1.0, -2.0, 0.5], np.float32)] * 2 + [np.array([np.inf, 1, 1], np.float32),
                                                             np.array([0.5, 0.25, -1.0], np.float32)]
    w = ggrad.param(np.ones(3, np.float32))
    opt, scaler = Adam([w], lr=0.1), GradScaler()
    t_w = torch.ones(3, requires_grad=True)
    t_opt, t_scaler = torch.optim.Adam([t_w], lr=0.1), torch.amp.GradScaler("cpu")
    for i, g in enumerate(grads):
        if i == 2:
            opt.param_groups[0]["eps"] = t_opt.param_groups[0]["eps"] = 1e-6
        with ggrad.grad_tape():
            scaler.scale((w * ggrad.tensor(g)).sum()).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        t_scaler.scale((t_w * torch.tensor(g)).sum()).backward()
        t_scaler.step(t_opt)
        t_scaler.update()
        t_opt.zero_grad()
    np.testing.assert_allclose(w.numpy(), t_w.detach().numpy(), rtol=1e-6)
    assert scaler.get_scale() == t_scaler.get_scale()
    half = GradScaler().scale(ggrad.tensor(np.float16(3.0)))
    assert half.dtype is ggrad.float32 and half.item() == 3.0 * 2 ** 16


def test_a_tensor_read_through_two_reshapes_is_cast_once(dev):
    """A float32 tensor that two autocast products read through different reshapes (a
    LayerNorm's output as rows and as (batch, sequence, features)) is cast to bfloat16 once:
    the cast is of the reshaped tensor, shared, and each product reshapes it (ops.as_type)."""
    rng = np.random.default_rng(0)
    a, w1, w2 = (ggrad.tensor(rng.standard_normal(s).astype(np.float32)) for s in ((4, 6, 8), (8, 5), (48, 3)))

    @ggrad.compile
    def step(a, w1, w2):
        with autocast(dtype=ggrad.bfloat16):
            return (a.reshape(24, 8) @ w1).sum() + (a.reshape(4, 48) @ w2).sum()

    got = float(step(a, w1, w2))
    casts = [node for node in compiled_nodes(step) if node.op == ggrad.ops.G.GGML_OP_CPY
             and node.type == ggrad.ops.G.GGML_TYPE_BF16 and node.src[0].contents.type == ggrad.ops.F32]
    assert len(casts) == 3, len(casts)  # a, w1, w2
    low = [np.asarray(t.numpy(), np.float32).astype(ml_dtypes.bfloat16).astype(np.float64) for t in (a, w1, w2)]
    want = (low[0].reshape(24, 8) @ low[1]).sum() + (low[0].reshape(4, 48) @ low[2]).sum()
    assert got == pytest.approx(want, rel=1e-5, abs=1e-4)
