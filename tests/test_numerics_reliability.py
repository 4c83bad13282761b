"""Numerics that must not corrupt training, against torch on every device: a batch of
only ignored targets gives torch's zero gradients, half precision reductions accumulate
in float32, and losses given values outside their domain raise or give NaN as torch's."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch (the test oracle) is not installed: pip install -e .[test]")

import ggrad  # noqa: E402
import ggrad.functional as F  # noqa: E402
from ggrad import nn  # noqa: E402
from ggrad.optim import SGD  # noqa: E402
from conftest import assert_close  # noqa: E402

TF = torch.nn.functional
rng = np.random.default_rng(24)
W5 = np.array([0.5, 2.0, 1.0, 0.25, 3.0], np.float32)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


# ---- a mean over only ignored targets --------------------------------------------------------
ALL_IGNORED = {
    "ce": (lambda m, x, y, w: m.cross_entropy(x, y), (6, 5)),
    "ce_smoothing": (lambda m, x, y, w: m.cross_entropy(x, y, label_smoothing=0.1), (6, 5)),
    "ce_weight": (lambda m, x, y, w: m.cross_entropy(x, y, weight=w), (6, 5)),
    "ce_weight_smoothing": (lambda m, x, y, w: m.cross_entropy(x, y, weight=w, label_smoothing=0.2), (6, 5)),
    "ce_spatial_ignore_index_3": (lambda m, x, y, w: m.cross_entropy(x, y + 103, ignore_index=3), (2, 5, 4)),
    "nll": (lambda m, x, y, w: m.nll_loss(m.log_softmax(x, 1), y), (6, 5)),
    "nll_weight": (lambda m, x, y, w: m.nll_loss(m.log_softmax(x, 1), y, weight=w), (6, 5)),
}


@pytest.mark.parametrize("name", sorted(ALL_IGNORED))
def test_mean_over_only_ignored_targets_is_nan_with_torchs_zero_gradient(dev, name):
    fn, shape = ALL_IGNORED[name]
    x = f32(*shape)
    y = np.full((shape[0],) + shape[2:], -100, np.int64)
    g_x = ggrad.tensor(x, requires_grad=True)
    t_x = torch.tensor(x, requires_grad=True)
    with ggrad.grad_tape():
        g_out = fn(F, g_x, ggrad.tensor(y), ggrad.tensor(W5))
        g_out.backward()
    t_out = fn(TF, t_x, torch.tensor(y), torch.tensor(W5))
    t_out.backward()
    assert np.isnan(g_out.item()) and np.isnan(t_out.item())
    assert_close(dev, g_x.grad.numpy(), t_x.grad.numpy(), rtol=0, atol=0)  # zeros, not NaN


def test_a_padding_only_batch_leaves_the_weights_as_torchs_in_a_compiled_step(dev):
    """One compiled SGD step on a real batch, then on a batch of padding only: the weights
    stay finite and equal to torch's, with no crossing in the replay."""
    w0, b0 = f32(5, 3), f32(5)
    model, t_model = nn.Linear(3, 5), torch.nn.Linear(3, 5)
    model.load_state_dict({"weight": w0, "bias": b0})
    t_model.load_state_dict({"weight": torch.tensor(w0), "bias": torch.tensor(b0)})
    opt, t_opt = SGD(model.parameters(), lr=0.5), torch.optim.SGD(t_model.parameters(), lr=0.5)

    @ggrad.compile
    def step(x, y):
        with ggrad.grad_tape():
            loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
            loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    x = f32(4, 3)
    labels, padding = np.array([0, 4, -100, 2]), np.full(4, -100)
    batches = [ggrad.tensor(x), ggrad.tensor(labels), ggrad.tensor(padding)]
    ggrad.realize(*batches)
    step(batches[0], batches[1])
    step(batches[0], batches[1])
    ggrad.realize()
    with ggrad.count_transfers() as t:
        step(batches[0], batches[2])
        ggrad.realize()
    assert t.crossings == 0 and t.dispatches == 1, t
    for y in (labels, labels, padding):
        TF.cross_entropy(t_model(torch.tensor(x)), torch.tensor(y), label_smoothing=0.1).backward()
        t_opt.step()
        t_opt.zero_grad()
    for name, value in t_model.state_dict().items():
        assert np.isfinite(model.state_dict()[name].numpy()).all(), name
        assert_close(dev, model.state_dict()[name].numpy(), value.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


# ---- half precision reductions ---------------------------------------------------------------
HALF = {"float16": (ggrad.float16, torch.float16), "bfloat16": (ggrad.bfloat16, torch.bfloat16)}
CONSTANT = np.full((256, 512), 3.0, np.float32)
REDUCTIONS = {
    "mean_of_100000_ones": (lambda x: x.mean(), np.ones(100_000, np.float32)),
    "mean_dim_of_ones": (lambda x: x.mean(0), np.ones((70_000, 2), np.float32)),
    "mean_keepdim": (lambda x: x.mean(1, keepdim=True), np.full((3, 80_000), 2.0, np.float32)),
    "sum_of_4096_ones": (lambda x: x.sum(), np.ones(4096, np.float32)),
    "var_of_a_constant": (lambda x: x.var(), CONSTANT),
    "var_dim_of_a_constant": (lambda x: x.var(1), CONSTANT),
    "std_of_a_constant": (lambda x: x.std(), CONSTANT),
    "var_whose_squares_overflow_float16": (lambda x: x.var(), np.array([0, 0, 400, 400], np.float32)),
    "std_whose_squares_overflow_float16": (lambda x: x.std(correction=0), np.array([0, 0, 400, 400], np.float32)),
    "mean_of_a_random_matrix": (lambda x: x.mean(), f32(300, 400) + 2.0),
}


@pytest.mark.parametrize("low", sorted(HALF))
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_half_precision_reductions_accumulate_in_float32_as_torch(dev, name, low):
    fn, a = REDUCTIONS[name]
    g_dtype, t_dtype = HALF[low]
    got = fn(ggrad.tensor(a).to(g_dtype))
    want = fn(torch.tensor(a).to(t_dtype))
    assert got.dtype is g_dtype
    # both sum in float32 and round once: at most the last bit of the half result apart
    np.testing.assert_allclose(got.float().numpy(), want.float().numpy(), rtol=2.0 ** -7 if low == "bfloat16"
                               else 2.0 ** -10, atol=0)


@pytest.mark.parametrize("low", sorted(HALF))
def test_half_precision_mean_var_std_gradients_are_float64s_rounded_once(dev, low):
    g_dtype, t_dtype = HALF[low]
    a = f32(16, 24)
    for fn in (lambda x: x.mean(0).sum(), lambda x: x.var(1).sum(), lambda x: x.std().sum()):
        g_x = ggrad.tensor(a).to(g_dtype).detach().requires_grad_()
        t_x = torch.tensor(a).to(t_dtype).double().requires_grad_()  # the same inputs, in float64
        with ggrad.grad_tape():
            fn(g_x).backward()
        fn(t_x).backward()
        assert g_x.grad.dtype is g_dtype
        np.testing.assert_allclose(g_x.grad.float().numpy(), t_x.grad.numpy(),
                                   rtol=2.0 ** -8 if low == "bfloat16" else 2.0 ** -11, atol=1e-7)


# ---- values outside a loss's domain ----------------------------------------------------------
OUTSIDE = {
    "input_below_0": (np.array([0.2, -0.5, 0.7]), np.array([0.0, 1.0, 1.0]), "input"),
    "input_above_1": (np.array([0.2, 1.5, 0.7]), np.array([0.0, 1.0, 1.0]), "input"),
    "input_nan": (np.array([0.2, np.nan, 0.7]), np.array([0.0, 1.0, 1.0]), "input"),
    "target_below_0": (np.array([0.2, 0.5, 0.7]), np.array([0.0, -1.0, 1.0]), "target"),
    "target_above_1": (np.array([0.2, 0.5, 0.7]), np.array([0.0, 2.0, 1.0]), "target"),
}


@pytest.mark.parametrize("name", sorted(OUTSIDE))
def test_binary_cross_entropy_outside_0_1_on_the_host_raises_as_torch(dev, name):
    p, y, which = OUTSIDE[name]
    p, y = p.astype(np.float32), y.astype(np.float32)
    with pytest.raises(RuntimeError, match=f"all elements of {which} should be between 0 and 1"):
        TF.binary_cross_entropy(torch.tensor(p), torch.tensor(y))
    with pytest.raises(RuntimeError, match=f"all elements of {which} should be between 0 and 1"):
        F.binary_cross_entropy(ggrad.tensor(p), ggrad.tensor(y))
    with pytest.raises(RuntimeError, match=f"all elements of {which} should be between 0 and 1"):
        nn.BCELoss()(ggrad.tensor(p), ggrad.tensor(y))


def test_binary_cross_entropy_checks_every_new_batch_of_a_compiled_step(dev):
    step = ggrad.compile(lambda p, y: F.binary_cross_entropy(p, y))
    p, y = np.array([0.25, 0.5, 0.75], np.float32), np.array([0.0, 1.0, 1.0], np.float32)
    for _ in range(3):
        got = step(p, y).item()
    assert got == pytest.approx(TF.binary_cross_entropy(torch.tensor(p), torch.tensor(y)).item(), rel=1e-5)
    with pytest.raises(RuntimeError, match="all elements of target should be between 0 and 1"):
        step(p, np.array([0.0, 3.0, 1.0], np.float32))
    assert step.traces == 1
    # the boundary values are allowed, as torch's
    assert np.isfinite(F.binary_cross_entropy(ggrad.tensor(np.array([0.0, 1.0], np.float32)),
                                              ggrad.tensor(np.array([0.0, 1.0], np.float32))).item())


@pytest.mark.filterwarnings("ignore:reduction. 'mean' divides:UserWarning")  # torch's note on "mean"
@pytest.mark.parametrize("reduction", ["none", "sum", "mean", "batchmean"])
def test_kl_div_with_a_negative_target_is_nan_as_torchs(dev, reduction):
    x = f32(3, 4)
    t = np.abs(f32(3, 4)) / 4
    t[1, 2], t[2, 0] = -0.25, 0.0
    g_x, t_x = ggrad.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    with ggrad.grad_tape():
        g_out = F.kl_div(g_x, ggrad.tensor(t), reduction=reduction)
        g_out.sum().backward()
    t_out = TF.kl_div(t_x, torch.tensor(t), reduction=reduction)
    t_out.sum().backward()
    assert np.isnan(g_out.numpy()).any()
    assert_close(dev, g_out.numpy(), t_out.detach().numpy(), atol=1e-6)  # NaN where torch's is
    assert_close(dev, g_x.grad.numpy(), t_x.grad.numpy(), atol=1e-6)  # -target, finite, as torch's
