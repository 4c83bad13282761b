"""Convolution and pooling (functional) against torch on every device: values, and the
gradients of input, weight and bias; bad arguments raise before anything runs."""

import ctypes

import numpy as np
import pytest
from ggml import ggml as G

torch = pytest.importorskip("torch", reason="torch (the test oracle) is not installed: pip install -e .[test]")

import ggrad  # noqa: E402
import ggrad.functional as F  # noqa: E402
from conftest import assert_close, assert_resident_training, compiled_nodes, set_variant  # noqa: E402

TF = torch.nn.functional
rng = np.random.default_rng(0)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


X4, X3 = f32(2, 4, 9, 10), f32(3, 4, 20)
CASES = {
    "conv2d": (lambda m, x, w, b: m.conv2d(x, w, b), [X4, f32(6, 4, 3, 3), f32(6)]),
    "conv2d_stride_padding": (lambda m, x, w: m.conv2d(x, w, stride=2, padding=1), [X4, f32(6, 4, 3, 3)]),
    "conv2d_uneven_stride_dilation": (lambda m, x, w: m.conv2d(x, w, stride=(2, 1), padding=(1, 2), dilation=2),
                                      [X4, f32(6, 4, 3, 3)]),
    "conv2d_same": (lambda m, x, w: m.conv2d(x, w, padding="same"), [X4, f32(6, 4, 3, 3)]),
    "conv2d_same_even_kernel": (lambda m, x, w: m.conv2d(x, w, padding="same", dilation=(1, 2)), [X4, f32(6, 4, 4, 2)]),
    "conv2d_valid": (lambda m, x, w: m.conv2d(x, w, padding="valid"), [X4, f32(6, 4, 2, 5)]),
    "conv2d_groups": (lambda m, x, w, b: m.conv2d(x, w, b, groups=2, padding=1), [X4, f32(6, 2, 3, 3), f32(6)]),
    "conv2d_depthwise": (lambda m, x, w: m.conv2d(x, w, groups=4, stride=2), [X4, f32(8, 1, 3, 3)]),
    "conv2d_unbatched": (lambda m, x, w: m.conv2d(x, w), [X4[0], f32(6, 4, 3, 3)]),
    "conv2d_1x1": (lambda m, x, w: m.conv2d(x, w), [X4, f32(5, 4, 1, 1)]),
    "conv1d": (lambda m, x, w, b: m.conv1d(x, w, b, stride=2, padding=1), [X3, f32(5, 4, 3), f32(5)]),
    "conv1d_same_dilated": (lambda m, x, w: m.conv1d(x, w, padding="same", dilation=3), [X3, f32(5, 4, 3)]),
    "conv1d_groups_unbatched": (lambda m, x, w: m.conv1d(x, w, groups=2), [X3[0], f32(6, 2, 5)]),
    "conv_transpose2d": (lambda m, x, w, b: m.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1),
                         [X4, f32(4, 3, 3, 3), f32(3)]),
    "conv_transpose2d_groups_dilated": (lambda m, x, w: m.conv_transpose2d(x, w, groups=2, dilation=2),
                                        [X4, f32(4, 3, 3, 2)]),
    "conv_transpose2d_uneven_stride": (lambda m, x, w: m.conv_transpose2d(x, w, stride=(1, 3)), [X4, f32(4, 2, 2, 3)]),
    "max_pool2d": (lambda m, x: m.max_pool2d(x, 2), [X4]),
    "max_pool2d_ceil_padding": (lambda m, x: m.max_pool2d(x, 3, 2, 1, ceil_mode=True), [X4]),
    "max_pool2d_dilation": (lambda m, x: m.max_pool2d(x, 3, 1, 0, dilation=2), [X4]),
    "max_pool2d_ties": (lambda m, x: m.max_pool2d(x.relu(), 2), [X4]),  # the first maximum takes the gradient
    "max_pool2d_unbatched": (lambda m, x: m.max_pool2d(x, (2, 3), (1, 2)), [X4[0]]),
    "avg_pool2d": (lambda m, x: m.avg_pool2d(x, 2), [X4]),
    "avg_pool2d_ceil_count_pad": (lambda m, x: m.avg_pool2d(x, 3, 2, 1, ceil_mode=True), [X4]),
    "avg_pool2d_ceil_no_pad": (lambda m, x: m.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False), [X4]),
    "avg_pool2d_divisor": (lambda m, x: m.avg_pool2d(x, 3, divisor_override=2), [X4]),
    "adaptive_avg_pool2d_global": (lambda m, x: m.adaptive_avg_pool2d(x, 1), [X4]),
    "adaptive_avg_pool2d_even": (lambda m, x: m.adaptive_avg_pool2d(x, (3, 5)), [X4]),
    "adaptive_avg_pool2d_uneven": (lambda m, x: m.adaptive_avg_pool2d(x, (4, 3)), [X4]),
    "max_pool1d": (lambda m, x: m.max_pool1d(x, 3, 2, 1), [X3]),
    "unfold": (lambda m, x: m.unfold(x, (2, 3), dilation=(2, 1), padding=1, stride=(1, 2)), [X4]),
    # CUDA's im2col a block per output row (kernel set 44): channels in uneven chunks (13 of
    # 45 fit its shared memory), and rows too wide for it (ggml's kernel then)
    "unfold_channel_chunks": (lambda m, x: m.unfold(x, 3, padding=1), [f32(2, 45, 3, 300)]),
    "unfold_rows_past_shared_memory": (lambda m, x: m.unfold(x, 3, padding=(0, 1), stride=(1, 2)), [f32(1, 2, 4, 5000)]),
    "fold": (lambda m, c: m.fold(c, (7, 8), (2, 3), dilation=(1, 2), padding=(1, 0), stride=2), [f32(2, 18, 8)]),
    "avg_pool1d": (lambda m, x: m.avg_pool1d(x, 4, 3, ceil_mode=True), [X3]),
}


def _run(fn, module, inputs, make):
    tensors = [make(a) for a in inputs]
    return tensors, fn(module, *tensors)


@pytest.mark.filterwarnings("ignore:Using padding='same'")  # torch's note on its own padded copy
@pytest.mark.parametrize("name", sorted(CASES))
def test_equals_torch(dev, name):
    fn, inputs = CASES[name]
    weights = None
    with ggrad.grad_tape():
        g_in, g_out = _run(fn, F, inputs, lambda a: ggrad.tensor(a, requires_grad=True))
        weights = rng.standard_normal(g_out.shape).astype(np.float32)
        (g_out * ggrad.tensor(weights)).sum().backward()
    t_in, t_out = _run(fn, TF, inputs, lambda a: torch.tensor(a, requires_grad=True))
    (t_out * torch.tensor(weights)).sum().backward()
    assert g_out.shape == tuple(t_out.shape)
    assert_close(dev, g_out.numpy(), t_out.detach().numpy())
    for k, (g, t) in enumerate(zip(g_in, t_in)):
        assert_close(dev, g.grad.numpy(), t.grad.numpy(), err_msg=f"input {k}")


def test_a_conv_net_step_is_one_dispatch_and_crosses_nothing(dev):
    """Conv, pool and linear layers trained by a compiled step: after the warm-up, a step
    with the batch already on the device is one graph and moves nothing."""
    from ggrad import nn
    ggrad.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 8, 3),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3))
    assert_resident_training(model, model.parameters(), ggrad.tensor(f32(8, 1, 10, 10)),
                             ggrad.tensor(rng.integers(0, 3, 8)))


@pytest.mark.parametrize("call, message", [
    (lambda: F.conv2d(np.zeros((2, 3, 8, 8), np.float32), np.zeros((4, 2, 3, 3), np.float32)), "channels"),
    (lambda: F.conv2d(np.zeros((2, 4, 8, 8), np.float32), np.zeros((6, 2, 3, 3), np.float32), groups=4), "groups"),
    (lambda: F.conv2d(np.zeros((2, 3, 2, 2), np.float32), np.zeros((4, 3, 3, 3), np.float32)), "larger"),
    (lambda: F.conv2d(np.zeros((2, 3, 8, 8), np.float32), np.zeros((4, 3, 3, 3), np.float32), stride=2,
                      padding="same"), "strided"),
    (lambda: F.conv2d(np.zeros((8, 8), np.float32), np.zeros((4, 3, 3, 3), np.float32)), "3-d or 4-d"),
    (lambda: F.conv2d(np.zeros((2, 3, 8, 8), np.float32), np.zeros((4, 3, 3, 3), np.float32), stride=0), "positive"),
    (lambda: F.max_pool2d(np.zeros((2, 3, 8, 8), np.float32), 2, padding=2), "half"),
    (lambda: F.max_pool2d(np.zeros((2, 3, 1, 1), np.float32), 2), "larger"),
    (lambda: F.conv_transpose2d(np.zeros((2, 3, 4, 4), np.float32), np.zeros((3, 2, 3, 3), np.float32), stride=2,
                                output_padding=2), "output_padding"),
    (lambda: F.adaptive_avg_pool2d(np.zeros((2, 3, 4, 4), np.float32), 0), "positive"),
])
def test_bad_arguments_raise(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


def test_max_pool_keeps_nan_and_minus_inf(dev):
    """ggml's pooled max skips NaN and starts at -FLT_MAX: torch's is NaN for a window
    holding one and -inf for a window of -inf."""
    x = np.arange(32, dtype=np.float32).reshape(1, 2, 4, 4)
    x[0, 0, 0, 1] = np.nan
    x[0, 1, 2:, 2:] = -np.inf
    got = F.max_pool2d(ggrad.tensor(x), 2).numpy()
    np.testing.assert_array_equal(got, TF.max_pool2d(torch.tensor(x), 2).numpy())
    assert np.isnan(got[0, 0, 0, 0]) and got[0, 1, 1, 1] == -np.inf


def test_folding_without_im2col_back_equals_torch(monkeypatch):
    """The fold Vulkan and CUDA use (IM2COL_BACK missing), forced on the CPU: strides,
    padding and dilation in both directions."""
    from ggrad.functional import conv
    monkeypatch.setattr(conv, "_supported", lambda node: None)
    x, w = f32(2, 3, 11, 9), f32(4, 3, 3, 2)
    with ggrad.grad_tape():
        g_x = ggrad.tensor(x, requires_grad=True)
        out = F.conv2d(g_x, ggrad.tensor(w), stride=(3, 2), padding=(2, 1), dilation=(2, 3))
        weights = f32(*out.shape)
        (out * ggrad.tensor(weights)).sum().backward()
    t_x = torch.tensor(x, requires_grad=True)
    (TF.conv2d(t_x, torch.tensor(w), stride=(3, 2), padding=(2, 1), dilation=(2, 3)) * torch.tensor(weights)).sum().backward()
    np.testing.assert_allclose(g_x.grad.numpy(), t_x.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_conv_transpose2d_output_padding_past_the_stride_trains_as_torch(dev):
    """output_padding >= stride is allowed below the dilation (issue 24, item 18): the
    extra rows read no column, and backward gave an internal shape error."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(18)
    x, w = rng.standard_normal((2, 3, 4, 5), np.float32), rng.standard_normal((3, 2, 3, 3), np.float32)
    kwargs = dict(stride=1, output_padding=(1, 2), dilation=3, padding=1)
    gx, gw = ggrad.tensor(x, requires_grad=True), ggrad.tensor(w, requires_grad=True)
    with ggrad.grad_tape():
        y = F.conv_transpose2d(gx, gw, **kwargs)
        (y * y).sum().backward()
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ty = torch.nn.functional.conv_transpose2d(tx, tw, **kwargs)
    (ty * ty).sum().backward()
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gx.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gw.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_bool_strides_and_zero_scale_factors_are_refused():
    """conv2d(stride=True) is a TypeError as torch's; interpolate(scale_factor=0) a
    ValueError (was ZeroDivisionError)."""
    x, w = ggrad.tensor(np.ones((1, 2, 5, 5), np.float32)), ggrad.tensor(np.ones((2, 2, 3, 3), np.float32))
    for bad in (True, (1, False)):
        with pytest.raises(TypeError, match="stride"):
            F.conv2d(x, w, stride=bad)
    with pytest.raises(TypeError, match="stride"):
        F.conv1d(ggrad.tensor(np.ones((1, 2, 5), np.float32)), ggrad.tensor(np.ones((2, 2, 3), np.float32)),
                 stride=True)
    for factor in (0, -1.0, float("nan"), float("inf"), (2, 0)):
        with pytest.raises(ValueError, match="scale factor"):
            F.interpolate(x, scale_factor=factor)


def test_unfold_nodes_ask_for_the_row_kernels_where_the_backend_trusts_them(dev):
    """CUDA's im2col and fold a block per row (kernel set 44) are asked for by a flag ggml's
    own ops leave 0 (IM2COL's op_params[7], ggrad's FOLD's op_params[12]): set exactly where
    kernels.variant says the backend has and trusts them (CUDA), never elsewhere."""
    from ggrad.runtime import kernels
    backend = ggrad.runtime.current().backend
    x = ggrad.tensor(f32(2, 3, 8, 9), requires_grad=True)

    @ggrad.compile
    def step(x):
        with ggrad.grad_tape():
            loss = (F.unfold(x, 3, padding=1) ** 2).sum()
            loss.backward()
        return loss, x.grad

    step(x)
    step(x)
    nodes = compiled_nodes(step)
    im2col = [n for n in nodes if n.op == G.GGML_OP_IM2COL]
    folds = [n for n in nodes if G.ggml_op_desc(ctypes.pointer(n)).decode() == "GGRAD" and n.op_params[0] == kernels.FOLD]
    assert im2col and (folds or backend.info.kind == "cpu"), "no IM2COL or FOLD node"
    assert all(n.op_params[7] == int(kernels.variant(backend, "im2col_rows")) for n in im2col)
    assert all(n.op_params[8] == int(kernels.variant(backend, "im2col_x4")) for n in im2col)
    assert all(n.op_params[12] == int(kernels.variant(backend, "fold_rows")) for n in folds)
    if backend.info.kind == "cuda":
        assert folds and kernels.variant(backend, "im2col_rows") == (kernels.version() >= 44)


@pytest.mark.parametrize("channels, kernel", [(8, 3), (64, 3), (3, 2), (128, 1), (380, 3), (6, 3), (3, 3), (375, 3)])
def test_columns_written_four_at_a_time_are_the_same_bits(dev, monkeypatch, channels, kernel):
    """CUDA's im2col_x4 (four values of a column a store where every chunk's entries come in
    fours: 8 and 64 channels of 3x3, 3 of 2x2, 128 of 1x1, 380 of 3x3 in two chunks of 372 and 8
    on CUDA's shared memory; 6 and 3 of 3x3 and 375 (a last chunk of 3) keep a value a store),
    forced off and on: the float32 columns and an autocast convolution's bfloat16 columns (its
    output) are the same bits."""
    from ggrad.amp import autocast
    x = ggrad.tensor(f32(2, channels, 7, 9))
    w = ggrad.tensor(f32(4, channels, kernel, kernel))

    def step(x, w):
        with autocast(dtype=ggrad.bfloat16):
            y = F.conv2d(x, w, padding=1)
        return F.unfold(x, kernel, padding=1), y
    results = []
    for on in (False, True):
        set_variant(monkeypatch, "im2col_x4", on)
        monkeypatch.setattr(ggrad.lazy, "BUILD_TAG", f"im2col_x4 {on}")
        compiled = ggrad.compile(step)
        results.append([[t.numpy() for t in compiled(x, w)] for _ in range(2)][-1])
    for off, on in zip(*results):
        np.testing.assert_array_equal(on, off)


# stride-1 convolutions whose input gradient may be a convolution (columns no larger: out
# channels x input pixels <= in channels x output pixels)
STRIDE_ONE = {
    "3x3": (lambda m, x, w, b: m.conv2d(x, w, b, padding=1), [X4, f32(4, 4, 3, 3), f32(4)]),
    "fewer outputs, valid": (lambda m, x, w: m.conv2d(x, w), [X4, f32(2, 4, 2, 3)]),
    "same, even kernel, dilated": (lambda m, x, w: m.conv2d(x, w, padding="same", dilation=(1, 2)), [X4, f32(4, 4, 4, 2)]),
    "dilated, padded less": (lambda m, x, w: m.conv2d(x, w, padding=(1, 2), dilation=2), [X4, f32(2, 4, 3, 3)]),
    "unbatched": (lambda m, x, w: m.conv2d(x, w, padding=1), [X4[0], f32(4, 4, 3, 3)]),
    "1x1": (lambda m, x, w: m.conv2d(x, w), [X4, f32(4, 4, 1, 1)]),
    "conv1d same, dilated": (lambda m, x, w: m.conv1d(x, w, padding="same", dilation=3), [X3, f32(4, 4, 3)]),
}


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("name", list(STRIDE_ONE))
def test_stride_one_input_gradients_as_convolutions_equal_torchs(dev, name, monkeypatch):
    """conv.INPUT_GRADIENT_CONV_KINDS (CUDA's way): a stride-1 convolution's input gradient
    is the convolution of the output's gradient by the reversed kernel, padded by
    d*(k-1) minus each side's padding (uneven for "same" with an even kernel), forced on
    every device, and the weight's gradient is the product's as before."""
    from ggrad.functional import conv
    kind = ggrad.runtime.current().backend.info.kind
    monkeypatch.setattr(conv, "INPUT_GRADIENT_CONV_KINDS", frozenset({kind}))
    monkeypatch.setattr(ggrad.lazy, "BUILD_TAG", "input gradients as convolutions")
    reversed_kernels = []
    reverse = conv._reversed_kernel
    monkeypatch.setattr(conv, "_reversed_kernel", lambda w: reversed_kernels.append(w.shape) or reverse(w))
    monkeypatch.setitem(CASES, name, STRIDE_ONE[name])
    test_equals_torch(dev, name)
    assert reversed_kernels or kind == "cpu", "no input gradient was made as a convolution"


def test_an_input_gradient_convolution_then_its_layout_undone_equals_torchs(dev, monkeypatch):
    """A bias-free stride-1 convolution over one image (the rows layout: its output a pending
    permute) with its input gradient recorded as a convolution, then moved to channels-last
    as cross_entropy does for a segmentation head: permute's shortcut (undo a pending permute
    by returning its recorded source) must not take the convolution's rule for the permute's
    (it handed back the NCHW output: a loss of 5.64 for torch's 8.30)."""
    from ggrad.functional import conv
    monkeypatch.setattr(conv, "INPUT_GRADIENT_CONV_KINDS", frozenset({ggrad.runtime.current().backend.info.kind}))
    monkeypatch.setattr(ggrad.lazy, "BUILD_TAG", "input gradients as convolutions")
    x, w = f32(1, 8, 5, 5), f32(3, 8, 3, 3)
    target = rng.integers(0, 3, (1, 5, 5))
    g_x, g_w = ggrad.tensor(x, requires_grad=True), ggrad.tensor(w, requires_grad=True)
    with ggrad.grad_tape():
        loss = F.cross_entropy(F.conv2d(g_x, g_w, padding=1), ggrad.tensor(target))
        loss.backward()
    t_x, t_w = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    t_loss = TF.cross_entropy(TF.conv2d(t_x, t_w, padding=1), torch.tensor(target))
    t_loss.backward()
    np.testing.assert_allclose(loss.item(), t_loss.item(), rtol=1e-5)
    assert_close(dev, g_x.grad.numpy(), t_x.grad.numpy())
    assert_close(dev, g_w.grad.numpy(), t_w.grad.numpy())


def test_wider_gradients_keep_the_fold(dev, monkeypatch):
    """More output channels than input ones over fewer output pixels: the gradient's columns
    would be larger than the input's, so the product's columns are folded as before."""
    from ggrad.functional import conv
    monkeypatch.setattr(conv, "INPUT_GRADIENT_CONV_KINDS", frozenset({ggrad.runtime.current().backend.info.kind}))
    monkeypatch.setattr(conv, "_reversed_kernel", lambda w: pytest.fail("a wider gradient was made as a convolution"))
    test_equals_torch(dev, "conv2d")


def test_reversed_kernel_turns_each_kernel_half_a_turn_and_swaps_the_channel_axes(dev):
    w = f32(3, 2, 3, 4)
    got = F.conv._reversed_kernel(ggrad.tensor(w)).numpy()
    np.testing.assert_array_equal(got, w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3))


def test_an_input_gradient_convolution_made_after_autocast_multiplies_as_the_forward_did(dev, monkeypatch):
    """The gradient convolution is made by backward(), outside the autocast block: its
    products still round their operands as the forward's did (the arg saved with it), so
    its values equal the fold's (which reuses the forward's product arg) to float32 sums,
    where float32 operands would differ by bfloat16's rounding (~1e-3)."""
    from ggrad.amp import autocast
    from ggrad.functional import conv
    from ggrad.runtime import kernels
    supported = kernels.supported
    monkeypatch.setattr(kernels, "supported", lambda backend, k: k not in (kernels.CONV, kernels.COLUMNS) and supported(backend, k))
    x, w, seed = f32(2, 3, 9, 8), f32(3, 3, 3, 3), f32(2, 3, 9, 8)
    reversed_kernels, reverse = [], conv._reversed_kernel
    monkeypatch.setattr(conv, "_reversed_kernel", lambda w: reversed_kernels.append(w.shape) or reverse(w))
    grads = []
    for kinds in (frozenset(), frozenset({ggrad.runtime.current().backend.info.kind})):
        monkeypatch.setattr(conv, "INPUT_GRADIENT_CONV_KINDS", kinds)
        g_x = ggrad.tensor(x, requires_grad=True)
        with ggrad.grad_tape():
            with autocast(dtype=ggrad.bfloat16):
                y = F.conv2d(g_x, ggrad.tensor(w), padding=1)
            (y * ggrad.tensor(seed)).sum().backward()
        grads.append(g_x.grad.numpy())
    exact = TF.conv_transpose2d(torch.tensor(seed, dtype=torch.float64),
                                torch.tensor(w, dtype=torch.float64), padding=1).numpy()
    scale = np.abs(exact).max()
    assert reversed_kernels == [(3, 3, 3, 3)]
    assert np.abs(grads[0] - exact).max() > 1e-4 * scale, "the operands were not rounded"
    np.testing.assert_allclose(grads[1], grads[0], rtol=0, atol=2e-6 * scale)
