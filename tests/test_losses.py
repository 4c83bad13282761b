"""Every loss and its options against torch's on every device: the value and the
gradients of the input and of float targets; loss modules hold the same state as
torch's."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch (the test oracle) is not installed: pip install -e .[test]")

import ggrad  # noqa: E402
import ggrad.functional as F  # noqa: E402
from ggrad import nn  # noqa: E402
from conftest import assert_close  # noqa: E402

TF = torch.nn.functional
rng = np.random.default_rng(2)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def classes(*shape, high=5):
    return rng.integers(0, high, shape).astype(np.int64)


def probs(*shape, axis=1):
    e = np.exp(f32(*shape))
    return (e / e.sum(axis, keepdims=True)).astype(np.float32)


def with_ignored(y):
    y = y.copy()
    y.flat[::3] = -100
    return y


W5 = np.array([0.5, 2.0, 1.0, 0.25, 3.0], np.float32)
LOGITS = f32(6, 5)
CASES = {
    "ce": (lambda m, x, y: m.cross_entropy(x, y), [LOGITS, classes(6)]),
    "ce_sum": (lambda m, x, y: m.cross_entropy(x, y, reduction="sum"), [LOGITS, classes(6)]),
    "ce_none": (lambda m, x, y: m.cross_entropy(x, y, reduction="none"), [LOGITS, classes(6)]),
    "ce_weight": (lambda m, x, y, w: m.cross_entropy(x, y, weight=w), [LOGITS, classes(6), W5]),
    "ce_ignore": (lambda m, x, y: m.cross_entropy(x, y), [LOGITS, with_ignored(classes(6))]),
    "ce_ignore_index_1_weight": (lambda m, x, y, w: m.cross_entropy(x, y, weight=w, ignore_index=1),
                                 [LOGITS, classes(6), W5]),
    "ce_smoothing": (lambda m, x, y: m.cross_entropy(x, y, label_smoothing=0.1), [LOGITS, classes(6)]),
    "ce_smoothing_weight_ignore": (lambda m, x, y, w: m.cross_entropy(x, y, weight=w, label_smoothing=0.2),
                                   [LOGITS, with_ignored(classes(6)), W5]),
    "ce_smoothing_none": (lambda m, x, y: m.cross_entropy(x, y, label_smoothing=0.3, reduction="none"),
                          [LOGITS, with_ignored(classes(6))]),
    "ce_spatial": (lambda m, x, y: m.cross_entropy(x, y), [f32(2, 5, 3, 4), classes(2, 3, 4)]),
    "ce_spatial_none_weight": (lambda m, x, y, w: m.cross_entropy(x, y, weight=w, reduction="none"),
                               [f32(2, 5, 7), classes(2, 7), W5]),
    "ce_unbatched": (lambda m, x, y: m.cross_entropy(x, y), [f32(5), np.array(3)]),
    "ce_probabilities": (lambda m, x, t: m.cross_entropy(x, t), [LOGITS, probs(6, 5)]),
    "ce_probabilities_weight_smoothing": (lambda m, x, t, w: m.cross_entropy(x, t, weight=w, label_smoothing=0.1),
                                          [LOGITS, probs(6, 5), W5]),
    "ce_probabilities_spatial": (lambda m, x, t: m.cross_entropy(x, t, reduction="none"),
                                 [f32(2, 5, 3), probs(2, 5, 3)]),
    "nll": (lambda m, x, y: m.nll_loss(m.log_softmax(x, 1), y), [LOGITS, classes(6)]),
    "nll_weight_ignore": (lambda m, x, y, w: m.nll_loss(m.log_softmax(x, 1), y, weight=w),
                          [LOGITS, with_ignored(classes(6)), W5]),
    "nll_spatial_sum": (lambda m, x, y: m.nll_loss(x, y, reduction="sum"), [f32(2, 5, 4), classes(2, 4)]),
    "mse": (lambda m, x, t: m.mse_loss(x, t), [f32(4, 3), f32(4, 3)]),
    "l1_sum": (lambda m, x, t: m.l1_loss(x, t, reduction="sum"), [f32(4, 3), f32(4, 3)]),
    "smooth_l1": (lambda m, x, t: m.smooth_l1_loss(x, t), [f32(20) * 2, f32(20)]),
    "smooth_l1_beta": (lambda m, x, t: m.smooth_l1_loss(x, t, beta=0.5, reduction="none"), [f32(20) * 2, f32(20)]),
    "smooth_l1_beta0": (lambda m, x, t: m.smooth_l1_loss(x, t, beta=0.0), [f32(20), f32(20)]),
    "huber": (lambda m, x, t: m.huber_loss(x, t, delta=0.7), [f32(20) * 2, f32(20)]),
    "bce": (lambda m, p, t: m.binary_cross_entropy(p, t), [1 / (1 + np.exp(-f32(4, 3))), probs(4, 3)]),
    "bce_weight_none": (lambda m, p, t, w: m.binary_cross_entropy(p, t, weight=w, reduction="none"),
                        [1 / (1 + np.exp(-f32(4, 3))), probs(4, 3), np.abs(f32(3))]),
    "bce_logits": (lambda m, x, t: m.binary_cross_entropy_with_logits(x, t), [f32(4, 3), probs(4, 3)]),
    "bce_logits_weights": (lambda m, x, t, w, pw: m.binary_cross_entropy_with_logits(x, t, weight=w, pos_weight=pw),
                           [f32(4, 3) * 3, probs(4, 3), np.abs(f32(3)), np.abs(f32(3)) + 0.5]),
    "kl_div_batchmean": (lambda m, x, t: m.kl_div(m.log_softmax(x, 1), t, reduction="batchmean"),
                         [f32(4, 5), np.where(probs(4, 5) > 0.3, 0.0, probs(4, 5)).astype(np.float32)]),
    "kl_div_log_target": (lambda m, x, t: m.kl_div(x, t, reduction="sum", log_target=True), [f32(4, 5), f32(4, 5)]),
    "kl_div_mean": (lambda m, x, t: m.kl_div(x, t), [f32(4, 5), probs(4, 5)]),
}


# torch's kl_div gives the target NaN gradients where it is 0 (d/dt t log t); ggrad's are 0
INPUT_GRAD_ONLY = {"kl_div_batchmean"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_loss_equals_torch(dev, name):
    fn, inputs = CASES[name]
    grads = [a.dtype.kind == "f" and (i == 0 or i == 1 and name not in INPUT_GRAD_ONLY)  # not weights
             for i, a in enumerate(inputs)]
    g_in = [ggrad.tensor(a, requires_grad=r) for a, r in zip(inputs, grads)]
    t_in = [torch.tensor(a, requires_grad=r) for a, r in zip(inputs, grads)]
    with ggrad.grad_tape():
        g_out = fn(F, *g_in)
        weights = rng.standard_normal(g_out.shape).astype(np.float32)
        (g_out * ggrad.tensor(weights)).sum().backward()
    t_out = fn(TF, *t_in)
    (t_out * torch.tensor(weights)).sum().backward()
    assert g_out.shape == tuple(t_out.shape)
    assert_close(dev, g_out.numpy(), t_out.detach().numpy(), atol=1e-6)
    for i in (i for i, r in enumerate(grads) if r):
        assert_close(dev, g_in[i].grad.numpy(), t_in[i].grad.numpy(), rtol=1e-4, atol=1e-6,
                     err_msg=f"gradient of input {i}")


MODULES = {
    "CrossEntropyLoss": lambda m: m.CrossEntropyLoss(weight=torch.tensor(W5) if m is torch.nn else W5,
                                                     label_smoothing=0.1),
    "NLLLoss": lambda m: m.NLLLoss(ignore_index=2),
    "BCEWithLogitsLoss": lambda m: m.BCEWithLogitsLoss(pos_weight=torch.tensor(W5) if m is torch.nn else W5),
    "HuberLoss": lambda m: m.HuberLoss(delta=0.5),
    "KLDivLoss": lambda m: m.KLDivLoss(reduction="batchmean", log_target=True),
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_loss_modules_hold_torch_state(name):
    g_module, t_module = MODULES[name](nn), MODULES[name](torch.nn)
    assert list(g_module.state_dict()) == list(t_module.state_dict())
    x = f32(6, 5)
    y = classes(6) if name in ("CrossEntropyLoss", "NLLLoss") else probs(6, 5)
    got = g_module(ggrad.tensor(x), ggrad.tensor(y)).item()
    want = t_module(torch.tensor(x), torch.tensor(y)).item()
    assert got == pytest.approx(want, rel=1e-5)


def test_out_of_range_class_targets_raise_and_the_ignored_index_does_not(dev):
    x = ggrad.tensor(LOGITS)
    with pytest.raises(IndexError, match="out of range"):
        F.cross_entropy(x, ggrad.tensor(np.array([0, 1, 5, 2, 3, 4])))
    assert np.isfinite(F.cross_entropy(x, ggrad.tensor(with_ignored(classes(6)))).item())
    with pytest.raises(IndexError, match="out of range"):  # a device-computed target
        F.cross_entropy(x, F.cast(ggrad.tensor(np.array([0.0, 9.0, 1.0, 2.0, 3.0, 4.0])), np.int64)).item()
