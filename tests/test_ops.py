"""Every operation: forward against a float64 numpy reference, gradient against central
finite differences (ggrad.gradcheck), and the same values on cpu and Vulkan."""

import math

import numpy as np
import pytest

import ggrad
import ggrad.functional as F
from conftest import tf32

rng = np.random.default_rng(42)
erf = np.vectorize(math.erf)


def away_from_zero(*shape, margin=0.2):
    x = rng.standard_normal(shape)
    return np.sign(x) * (np.abs(x) + margin)


def distinct(*shape):
    """Values at least 0.1 apart, so a max never has a near tie within the FD step."""
    n = int(np.prod(shape))
    return (rng.permutation(n) * 0.1 - n * 0.05).reshape(shape)


def positive(*shape):
    return rng.uniform(0.5, 2.0, shape)


def softmax_ref(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax_ref(x, axis=-1):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def gelu_tanh_ref(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


TARGETS = np.array([1, 0, 3, 2, 3])
PROBS = softmax_ref(rng.standard_normal((5, 4)))
BINARY = (rng.random((3, 4)) > 0.5).astype(np.float64)
MASK = (rng.random((3, 4)) > 0.5).astype(np.float64)
DROPOUT_MASK = (np.random.default_rng(7).random((3, 4)) >= 0.25) / 0.75
IDS = np.array([[2, 0], [1, 2], [4, 2]])

# name: (ggrad fn, numpy float64 reference, inputs)
CASES = {
    "matmul": (lambda a, b: a @ b, lambda a, b: a @ b, [rng.standard_normal((3, 4)), rng.standard_normal((4, 5))]),
    "matmul_x_wT": (lambda x, w: x @ w.T, lambda x, w: x @ w.T, [rng.standard_normal((3, 4)), rng.standard_normal((5, 4))]),
    "matmul_batched": (lambda a, b: a @ b, lambda a, b: a @ b, [rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 4, 2))]),
    "matmul_batch_broadcast": (lambda a, b: a @ b, lambda a, b: a @ b, [rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 2))]),
    "matmul_vector": (lambda a, b: a @ b, lambda a, b: a @ b, [rng.standard_normal((3, 4)), rng.standard_normal(4)]),
    "add": (lambda a, b: a + b, lambda a, b: a + b, [rng.standard_normal((3, 4)), rng.standard_normal((3, 4))]),
    "add_bias_row": (lambda a, b: a + b, lambda a, b: a + b, [rng.standard_normal((3, 4)), rng.standard_normal(4)]),
    "add_bias_col": (lambda a, b: b + a, lambda a, b: b + a, [rng.standard_normal((3, 4)), rng.standard_normal((3, 1))]),
    "sub_broadcast_left": (lambda a, b: a - b, lambda a, b: a - b, [rng.standard_normal(4), rng.standard_normal((3, 4))]),
    "mul_broadcast": (lambda a, b: a * b, lambda a, b: a * b, [rng.standard_normal((3, 1)), rng.standard_normal((1, 4))]),
    "div": (lambda a, b: a / b, lambda a, b: a / b, [rng.standard_normal((3, 4)), positive(4)]),
    "scalar_ops": (lambda a: (2.0 - a) * 3.0 / 4.0 + 1.0, lambda a: (2.0 - a) * 3.0 / 4.0 + 1.0, [rng.standard_normal((3, 4))]),
    "rdiv": (lambda a: 2.0 / a, lambda a: 2.0 / a, [positive(3, 4)]),
    "neg": (lambda a: -a, lambda a: -a, [rng.standard_normal((3, 4))]),
    "scale": (lambda a: F.scale(a, 0.3), lambda a: 0.3 * a, [rng.standard_normal((3, 4))]),
    "pow2": (lambda a: a ** 2, lambda a: a ** 2, [rng.standard_normal((3, 4))]),
    "pow3": (lambda a: a ** 3, lambda a: a ** 3, [rng.standard_normal((3, 4))]),
    "pow_half": (lambda a: a ** 0.5, lambda a: a ** 0.5, [positive(3, 4)]),
    "pow_minus1": (lambda a: a ** -1, lambda a: a ** -1.0, [positive(3, 4)]),
    "pow_1.5": (lambda a: a ** 1.5, lambda a: a ** 1.5, [positive(3, 4)]),
    "sqrt": (F.sqrt, np.sqrt, [positive(3, 4)]),
    "exp": (F.exp, np.exp, [rng.standard_normal((3, 4))]),
    "log": (F.log, np.log, [positive(3, 4)]),
    "abs": (F.abs, np.abs, [away_from_zero(3, 4)]),
    "relu": (F.relu, lambda a: np.maximum(a, 0), [away_from_zero(3, 4)]),
    "leaky_relu": (lambda a: F.leaky_relu(a, 0.1), lambda a: np.where(a > 0, a, 0.1 * a), [away_from_zero(3, 4)]),
    "sigmoid": (F.sigmoid, lambda a: 1 / (1 + np.exp(-a)), [rng.standard_normal((3, 4))]),
    "tanh": (F.tanh, np.tanh, [rng.standard_normal((3, 4))]),
    "gelu": (F.gelu, lambda a: 0.5 * a * (1 + erf(a / math.sqrt(2))), [rng.standard_normal((3, 4))]),
    "gelu_near_zero": (F.gelu, lambda a: 0.5 * a * (1 + erf(a / math.sqrt(2))), [np.array([[-5e-4, 0.0, 3e-4, 2e-3]])]),
    "gelu_tanh": (lambda a: F.gelu(a, approximate="tanh"), gelu_tanh_ref, [rng.standard_normal((3, 4))]),
    "silu": (F.silu, lambda a: a / (1 + np.exp(-a)), [rng.standard_normal((3, 4))]),
    "softmax": (F.softmax, softmax_ref, [rng.standard_normal((3, 4))]),
    "softmax_axis0": (lambda a: F.softmax(a, axis=0), lambda a: softmax_ref(a, 0), [rng.standard_normal((3, 4))]),
    "log_softmax": (F.log_softmax, log_softmax_ref, [rng.standard_normal((3, 4))]),
    "sum_all": (lambda a: a.sum(), np.sum, [rng.standard_normal((3, 4))]),
    "sum_axis0": (lambda a: a.sum(axis=0), lambda a: a.sum(axis=0), [rng.standard_normal((3, 4))]),
    "sum_axis1_keepdims": (lambda a: a.sum(axis=1, keepdims=True), lambda a: a.sum(axis=1, keepdims=True), [rng.standard_normal((3, 4))]),
    "sum_3d_middle": (lambda a: a.sum(axis=1), lambda a: a.sum(axis=1), [rng.standard_normal((2, 3, 4))]),
    "mean_all": (lambda a: a.mean(), np.mean, [rng.standard_normal((3, 4))]),
    "mean_axis1": (lambda a: a.mean(axis=1), lambda a: a.mean(axis=1), [rng.standard_normal((3, 4))]),
    "max_axis1": (lambda a: a.max(axis=1), lambda a: a.max(axis=1), [distinct(3, 4)]),
    "max_axis0_keepdims": (lambda a: a.max(axis=0, keepdims=True), lambda a: a.max(axis=0, keepdims=True), [distinct(3, 4)]),
    "max_all": (lambda a: a.max(), np.max, [distinct(3, 4)]),
    "reshape": (lambda a: a.reshape(4, 3) * 1.0, lambda a: a.reshape(4, 3), [rng.standard_normal((3, 4))]),
    "transpose": (lambda a: a.T, lambda a: a.T, [rng.standard_normal((3, 4))]),
    "permute_3d": (lambda a: a.permute(2, 0, 1), lambda a: a.transpose(2, 0, 1), [rng.standard_normal((2, 3, 4))]),
    "concat_axis0": (lambda a, b: F.concat([a, b], axis=0), lambda a, b: np.concatenate([a, b], 0), [rng.standard_normal((2, 4)), rng.standard_normal((3, 4))]),
    "concat_axis1": (lambda a, b: F.concat([a, b], axis=1), lambda a, b: np.concatenate([a, b], 1), [rng.standard_normal((3, 2)), rng.standard_normal((3, 4))]),
    "slice_rows": (lambda a: a[1:3], lambda a: a[1:3], [rng.standard_normal((4, 3))]),
    "slice_cols": (lambda a: a[:, 1:3], lambda a: a[:, 1:3], [rng.standard_normal((3, 4))]),
    "index_row": (lambda a: a[2], lambda a: a[2], [rng.standard_normal((4, 3))]),
    "gather_rows": (lambda t: F.embedding(ggrad.tensor(IDS), t), lambda t: t[IDS], [rng.standard_normal((5, 3))]),
    "clamp": (lambda a: a.clamp(-0.5, 0.5), lambda a: np.clip(a, -0.5, 0.5), [distinct(3, 4) + 0.05]),
    "where": (lambda a, b: F.where(ggrad.tensor(MASK), a, b), lambda a, b: np.where(MASK > 0, a, b), [rng.standard_normal((3, 4)), rng.standard_normal((3, 4))]),
    "dropout": (lambda a: F.dropout(a, 0.25, rng=np.random.default_rng(7)), lambda a: a * DROPOUT_MASK, [rng.standard_normal((3, 4))]),
    "mse_loss": (F.mse_loss, lambda a, b: np.mean((a - b) ** 2), [rng.standard_normal((3, 4)), rng.standard_normal((3, 4))]),
    "l1_loss": (F.l1_loss, lambda a, b: np.mean(np.abs(a - b)), [rng.standard_normal((3, 4)), rng.standard_normal((3, 4)) + 3]),
    "cross_entropy": (lambda z: F.cross_entropy(z, ggrad.tensor(TARGETS)),
                      lambda z: -np.mean(log_softmax_ref(z)[np.arange(5), TARGETS]), [rng.standard_normal((5, 4))]),
    "cross_entropy_large_logits": (lambda z: F.cross_entropy(z, ggrad.tensor(TARGETS)),
                                   lambda z: -np.mean(log_softmax_ref(z)[np.arange(5), TARGETS]),
                                   [40 * rng.standard_normal((5, 4))]),
    "cross_entropy_probs": (lambda z: F.cross_entropy(z, ggrad.tensor(PROBS)),
                            lambda z: -np.mean((PROBS * log_softmax_ref(z)).sum(-1)), [rng.standard_normal((5, 4))]),
    "bce_with_logits": (lambda z: F.binary_cross_entropy_with_logits(z, ggrad.tensor(BINARY)),
                        lambda z: np.mean(np.maximum(z, 0) - z * BINARY + np.log1p(np.exp(-np.abs(z)))), [3 * rng.standard_normal((3, 4))]),
}


def forward(fn, inputs):
    return fn(*[ggrad.tensor(x) for x in inputs]).numpy()


def tolerance(dev):
    """TF32 products (CUDA at precision "high") are about 1e-3 relative."""
    return dict(rtol=3e-3, atol=3e-3) if tf32(dev) else dict(rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("name", CASES)
def test_forward_matches_float64_reference(name, dev):
    fn, ref, inputs = CASES[name]
    expected = ref(*inputs)
    got = forward(fn, inputs)
    assert got.shape == np.shape(expected), (got.shape, np.shape(expected))
    np.testing.assert_allclose(got, expected, **tolerance(dev))


@pytest.mark.parametrize("name", CASES)
def test_gradient_matches_finite_differences(name, dev):
    fn, _, inputs = CASES[name]
    assert ggrad.gradcheck(fn, inputs)


def test_cpu_and_vulkan_agree():
    if "vulkan:0" not in [d.name for d in ggrad.devices()]:
        pytest.skip("no Vulkan device")
    for name, (fn, _, inputs) in CASES.items():
        with ggrad.device("cpu"):
            on_cpu = forward(fn, inputs)
        with ggrad.device("vulkan"):
            on_vulkan = forward(fn, inputs)
        np.testing.assert_allclose(on_vulkan, on_cpu, rtol=1e-5, atol=1e-6, err_msg=name)


def test_gradcheck_catches_a_wrong_rule(dev, monkeypatch):
    wrong = lambda ctx, g: (g,)  # noqa: E731  d exp(x)/dx is exp(x), not 1
    from ggrad.functional import elementwise
    real_unary = elementwise._unary
    monkeypatch.setattr(elementwise, "_unary",
                        lambda op, x, rule, arg=None: real_unary(op, x, wrong if op == "exp" else rule, arg))
    with pytest.raises(AssertionError, match="gradcheck"):
        ggrad.gradcheck(F.exp, [rng.standard_normal((2, 3))])


@pytest.mark.parametrize("out_prod_up_to", [0, 10**9])
def test_both_weight_gradient_paths_match_finite_differences(monkeypatch, out_prod_up_to):
    """Weight gradients come from OUT_PROD (CUDA; small products on the CPU) or from two
    transposes into mul_mat (Vulkan; large products on the CPU): both wirings, on the CPU."""
    from ggrad import ops

    monkeypatch.setattr(ops, "CPU_OUT_PROD_MAX_ELEMENTS", out_prod_up_to)
    for name in ("matmul", "matmul_x_wT", "matmul_batched", "matmul_batch_broadcast", "matmul_vector"):
        fn, _, inputs = CASES[name]
        assert ggrad.gradcheck(fn, inputs)


@pytest.mark.parametrize("classes", [5, 1500])  # a kept identity's rows / a range compare
def test_one_hot_is_exact_on_both_paths(dev, classes):
    index = np.array([[0, classes - 1, 3], [2, 1, classes // 2]])
    expected = np.eye(classes, dtype=np.float32)[index]
    np.testing.assert_array_equal(F.one_hot(ggrad.tensor(index), classes).numpy(), expected)


def test_broadcast_shape_is_numpys():
    """ggrad's own broadcast of shapes (every binary op asks it) against numpy's, on
    random shapes of up to 4 axes that broadcast or do not."""
    from ggrad.functional._core import broadcast_shape
    pick = np.random.default_rng(7)
    for _ in range(2000):
        shapes = [tuple(int(n) for n in pick.choice([1, 2, 3], size=pick.integers(0, 5))) for _ in range(pick.integers(1, 4))]
        try:
            want = np.broadcast_shapes(*shapes)
        except ValueError:
            want = None
        assert broadcast_shape(*shapes) == want, shapes


def test_views_through_a_copy_read_the_copied_elements(ggml_host):
    """ops._through_copy (the GEMM kernel's operands: a fused projection's third, copied,
    then split into heads and permuted): where it re-views the copied tensor's storage, the
    view holds the elements of the view of the copy; where an axis would run across two of
    the source's, it keeps the view of the copy. Checked by ggml's own copies on the CPU
    over random splits and permutes (of the whole copy and of its later rows) of a third, a
    transpose and a slice at an offset."""
    import ctypes
    import itertools

    from ggml import ggml as G

    from ggrad import ops
    rng = np.random.default_rng(3)
    stored = rng.standard_normal((2, 6, 24)).astype(np.float32)  # (batch, seq, 3 * heads * dim)
    ctx, put = ggml_host
    root = put(stored)
    f32 = 4
    sources = [G.ggml_view_3d(ctx, root, 8, 6, 2, 24 * f32, 144 * f32, 8 * f32),  # the second third
               G.ggml_transpose(ctx, G.ggml_reshape_2d(ctx, root, 24, 12)),
               G.ggml_view_2d(ctx, root, 24, 5, 24 * f32, 4 * 24 * f32)]
    graph = G.ggml_new_graph_custom(ctx, 4096, False)
    pairs, rewritten = [], 0
    for source in sources:
        copy = G.ggml_cont(ctx, source)
        n = G.ggml_nelements(copy)
        shapes = [s for s in itertools.product((1, 2, 3, 4, 6, 8, 12), repeat=3) if n % np.prod(s) == 0]
        for k in rng.choice(len(shapes), 12, replace=False):
            a, b, c = shapes[k]
            split = G.ggml_reshape_4d(ctx, copy, a, b, c, n // (a * b * c))
            d = split.contents
            # the copy's rows from the second on (an offset into it), its split kept
            later = G.ggml_view_4d(ctx, copy, a, b, c, d.ne[3] - 1, d.nb[1], d.nb[2], d.nb[3], d.nb[3]) \
                if d.ne[3] > 1 else split
            for base, order in itertools.product((split, later), ((0, 1, 2, 3), (0, 2, 1, 3), (1, 0, 2, 3), (2, 1, 0, 3))):
                t = G.ggml_permute(ctx, base, *order)
                through = ops._through_copy(ctx, t)
                if ctypes.addressof(through.contents) != ctypes.addressof(t.contents):
                    rewritten += 1
                    assert through.contents.view_src and ctypes.addressof(through.contents.view_src.contents) \
                        == ctypes.addressof(root.contents)
                pair = (G.ggml_cont(ctx, t), G.ggml_cont(ctx, through))
                for x in pair:
                    G.ggml_build_forward_expand(graph, x)
                pairs.append(pair)
    G.ggml_graph_compute_with_ctx(ctx, graph, 1)
    for expected, got in pairs:
        size = G.ggml_nbytes(expected)
        assert ctypes.string_at(got.contents.data, size) == ctypes.string_at(expected.contents.data, size)
    assert rewritten >= 60, (rewritten, len(pairs))  # about a quarter of these views keep to the source's axes
