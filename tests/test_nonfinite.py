"""NaN and inf as PyTorch has them (issue 11): values and gradients of the ops that turned
NaN into numbers (relu, clamp), of the reductions that made NaN from -inf (max as a
product with a one-hot), clip_grad_norm_, detect_anomaly and fit's on_nonfinite."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch (the test oracle) is not installed: pip install -e .[test]")

import ggrad  # noqa: E402
import ggrad.functional as F  # noqa: E402
from ggrad import nn  # noqa: E402
from ggrad.optim import SGD, Adam, clip_grad_norm_  # noqa: E402

nan, inf = math.nan, math.inf
SPECIAL = [nan, -inf, inf, -1.0, 0.0, 2.0, 0.5]
ROWS = [[1.0, 3, 3, 0], [-inf, -inf, -inf, -inf], [nan, 1, nan, 2], [inf, inf, 1, 2], [-inf, 1, -inf, 0]]


class _Ggrad:
    """ggrad, with ggrad.functional's names (relu, logsumexp...) where the top level lacks them."""

    def __getattr__(self, name):
        return getattr(ggrad, name) if hasattr(ggrad, name) else getattr(F, name)


def _functional(m):
    return torch.nn.functional if m is torch else F


def _leaky(m, a):
    return _functional(m).leaky_relu(a)


def _cross_entropy(m, a):
    """-inf logits are fine where the target is not (a one-hot product made 0 * -inf)."""
    target = m.tensor([1, 0, 2, 0])
    return _functional(m).cross_entropy(a, target), _functional(m).cross_entropy(a, target, reduction="none")


def _bce_with_logits(m, a):
    """torch's values at infinite logits, and its gradient sigmoid(x) - y at x = 0."""
    target = m.tensor([0.0, 1, 1, 0, 0.5, 1, 0, 0.2])
    return _functional(m).binary_cross_entropy_with_logits(a, target, reduction="none")


# (fn(m, x), x): fn is written once against torch or ggrad
CASES = {
    "relu": (lambda m, a: m.relu(a), SPECIAL),
    "leaky_relu": (_leaky, SPECIAL),
    "clamp_scalars": (lambda m, a: a.clamp(0.0, 1.0), SPECIAL),
    "clamp_min_only": (lambda m, a: a.clamp(min=0.0), SPECIAL),  # inf stays inf (was 3e38)
    "clamp_max_only": (lambda m, a: a.clamp(max=0.25), SPECIAL),
    "clamp_tensor_bounds": (lambda m, a: a.clamp(m.tensor([0.0, 0, -1, 0.5, 0, 3, nan]),
                                                 m.tensor([1.0, nan, 0, 0.5, 1, 2, 1])), SPECIAL),
    "log_of_clamp": (lambda m, a: m.log(a.clamp(min=0.0)), SPECIAL),  # inf gradient outside: 0
    "sigmoid_tanh": (lambda m, a: m.sigmoid(a) + m.tanh(a), SPECIAL),
    "max_all": (lambda m, a: a.max(), [1.0, 3, 3, 0]),  # tie: half each
    "max_all_nan": (lambda m, a: a.max(), [1.0, nan, 3, nan]),
    "max_minus_inf": (lambda m, a: a.max(), [-inf, 1.0]),
    "min_all": (lambda m, a: a.min(), [1.0, 0, 3, 0]),
    "max_dim_values": (lambda m, a: a.max(1)[0], ROWS),
    "max_dim_indices": (lambda m, a: a.max(1)[1], ROWS),
    "min_dim": (lambda m, a: tuple(a.min(0, keepdim=True)), ROWS),
    "argmax_argmin": (lambda m, a: (a.argmax(1), a.argmin(1), a.argmax(0), a.argmax()), ROWS),
    "amax_amin": (lambda m, a: (m.amax(a, 1), m.amin(a, 0)), ROWS),
    "amax_dims": (lambda m, a: m.amax(a, (0, 2)), np.arange(24.0).reshape(2, 3, 4) % 5),
    "logsumexp": (lambda m, a: m.logsumexp(a, 1), ROWS),
    "logsumexp_minus_inf": (lambda m, a: m.logsumexp(a, 0), [-inf, 1.0, 2.0]),
    "softmax_minus_inf": (lambda m, a: m.softmax(a, 1), [[-inf, 1.0, 2.0], [0.5, -inf, -inf]]),
    "log_softmax_minus_inf": (lambda m, a: m.log_softmax(a, 1), [[-inf, 1.0, 2.0], [0.5, -inf, -inf]]),
    "std_constant": (lambda m, a: (a.std(), a.std(0)), [[1.0, 2.0], [1.0, 3.0]]),
    "norm_zero": (lambda m, a: (a.norm(), a.norm(dim=1)), [[0.0, 0.0, 0.0], [1.0, 2.0, 2.0]]),
    "norm_p": (lambda m, a: (a.norm(p=3, dim=0), a.norm(p=0.5, dim=0), a.norm(p=1.5, dim=0), a.norm(p=inf),
                             a.norm(p=0)), [[0.0, 1.0], [0.0, -2.0], [0.0, -2.0]]),
    "cross_entropy_minus_inf": (_cross_entropy, [[-inf, 1, 2], [0.5, -inf, 3], [1, 2, -inf], [0, 0, 0]]),
    "bce_with_logits": (_bce_with_logits, [inf, -inf, inf, -inf, 0.0, 100, -100, 0.3]),
    "maximum_nan": (lambda m, a: m.maximum(a, m.tensor([0.0, 0, 0, 0, 0, nan, 0.5])), SPECIAL),
}


def _outputs(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


@pytest.mark.parametrize("name", CASES)
def test_values_and_gradients_equal_torch(dev, name):
    fn, data = CASES[name]
    x = np.asarray(data, np.float32)
    t = torch.tensor(x, requires_grad=True)
    t_out = _outputs(fn(torch, t))
    weights = [np.random.default_rng(1).standard_normal(tuple(o.shape)).astype(np.float32) for o in t_out]
    floats = [i for i, o in enumerate(t_out) if o.dtype.is_floating_point and o.requires_grad]
    if floats:
        sum((t_out[i] * torch.tensor(weights[i])).sum() for i in floats).backward()
    with ggrad.grad_tape():
        g = ggrad.tensor(x, requires_grad=True)
        g_out = _outputs(fn(_Ggrad(), g))
        if floats:
            sum(((g_out[i] * ggrad.tensor(weights[i])).sum() for i in floats[1:]),
                (g_out[floats[0]] * ggrad.tensor(weights[floats[0]])).sum()).backward()
    rtol = 3e-5 if dev.startswith("cuda") else 1e-6  # ggml-cuda builds with fast math: exp, tanh
    for k, (a, b) in enumerate(zip(g_out, t_out)):
        assert a.dtype.name == str(b.dtype).removeprefix("torch."), f"output {k}"
        np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=rtol, atol=1e-6, equal_nan=True,
                                   err_msg=f"output {k}")
    if floats:
        want = t.grad.numpy() if t.grad is not None else np.zeros_like(x)
        np.testing.assert_allclose(g.grad.numpy(), want, rtol=max(rtol, 1e-5), atol=1e-6, equal_nan=True,
                                   err_msg="gradient")


def test_argmax_ties_give_the_first_index_on_long_rows(dev):
    """Vulkan's argmax meets a row's elements in thread order: ties far apart came out at the
    later one. Rows longer than a workgroup, ties at both ends, NaN after numbers."""
    x = np.zeros((3, 700), np.float32)
    x[0, [5, 300, 690]] = 7.0
    x[1, [650, 2]] = -1.0
    x[1] -= 2.0
    x[2, [640, 10]] = [nan, 5.0]
    x[2, 699] = nan
    t = torch.tensor(x)
    g = ggrad.tensor(x)
    for got, want in [(g.argmax(1), t.argmax(1)), (g.argmin(1), t.argmin(1)), (g.max(1)[1], t.max(1)[1]),
                      (g.argmax(), t.argmax())]:
        assert got.tolist() == want.tolist()
    assert F.one_hot_argmax(g).numpy().argmax(1).tolist() == t.argmax(1).tolist()


def test_relu_nan_no_longer_hides_a_nan_weight(dev):
    """The issue's symptom: a NaN in the data made fit report a finite loss while a weight
    went NaN (relu(NaN) was 0, so the loss never saw it)."""
    w = ggrad.tensor(np.array([[nan, 1.0], [1.0, 1.0]], np.float32))
    out = F.relu(w @ ggrad.tensor(np.ones((2, 1), np.float32))).sum()
    assert math.isnan(out.item())


# ---- clip_grad_norm_ -------------------------------------------------------------------------
GRADS = {
    "finite": [np.random.default_rng(0).standard_normal(5), np.random.default_rng(1).standard_normal((2, 3))],
    "inf": [np.array([1.0, inf, 2.0]), np.array([1.0, 2.0])],
    "nan": [np.array([1.0, nan, 2.0]), np.array([1.0, 2.0])],
    "overflowing_squares": [np.array([1e20, 1e20]), np.array([1.0])],
    "zeros": [np.zeros(3)],
}


@pytest.mark.parametrize("case", GRADS)
def test_clip_grad_norm_equals_torch(dev, case):
    for norm_type in (2.0, 1.0, inf, 3.0, 0.5, 0.0, -inf, "inf"):
        for max_norm in (1.0, 0.0, 100.0):
            tp, gp = [], []
            for grad in GRADS[case]:
                tp.append(torch.zeros(grad.shape, requires_grad=True))
                tp[-1].grad = torch.tensor(grad, dtype=torch.float32)
                gp.append(ggrad.param(np.zeros(grad.shape, np.float32)))
                gp[-1].grad = grad.astype(np.float32)
            want = torch.nn.utils.clip_grad_norm_(tp, max_norm, norm_type=norm_type)
            got = clip_grad_norm_(gp, max_norm, norm_type=norm_type)
            where = f"norm_type={norm_type}, max_norm={max_norm}"
            assert got.shape == () and got.dtype is ggrad.float32, where
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=0, equal_nan=True, err_msg=where)
            for a, b in zip(gp, tp):
                np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-6, atol=0, equal_nan=True,
                                           err_msg=where)


def test_clip_grad_norm_error_if_nonfinite_and_edge_cases(dev):
    p, q = ggrad.param(np.zeros(3, np.float32)), torch.zeros(3, requires_grad=True)
    p.grad, q.grad = np.array([1.0, inf, 0.0], np.float32), torch.tensor([1.0, inf, 0.0])
    with pytest.raises(RuntimeError) as want:
        torch.nn.utils.clip_grad_norm_([q], 1.0, error_if_nonfinite=True)
    with pytest.raises(RuntimeError) as got:
        clip_grad_norm_([p], 1.0, error_if_nonfinite=True)
    assert str(got.value) == str(want.value)
    assert clip_grad_norm_([ggrad.param(np.zeros(2, np.float32))], 1.0).item() == 0.0  # no gradient: 0
    p.grad = np.array([3.0, 4.0, 0.0], np.float32)
    assert clip_grad_norm_(p, 1.0, 2.0, False, foreach=True).item() == pytest.approx(5.0)
    for bad in (nan, -1.0):
        with pytest.raises(ValueError):
            clip_grad_norm_([p], bad)


# ---- detect_anomaly --------------------------------------------------------------------------
def test_detect_anomaly_names_the_forward_op_and_the_line(dev):
    x = ggrad.tensor(np.array([1.0, -1.0, 4.0], np.float32))
    with pytest.raises(RuntimeError, match=r"Function 'log' returned nan values in its output .*test_nonfinite.py"):
        with ggrad.detect_anomaly():
            F.log(x)
    assert not ggrad.is_anomaly_enabled()
    assert math.isnan(F.log(x).numpy()[1])  # off again: nothing checked


def test_detect_anomaly_names_the_backward_rule(dev):
    x = ggrad.tensor(np.array([0.0, 4.0], np.float32), requires_grad=True)
    with ggrad.detect_anomaly():
        with ggrad.grad_tape():
            y = F.sqrt(x) * 0.0  # forward fine; backward: 0 * inf = NaN in sqrt's rule
            with pytest.raises(RuntimeError, match=r"Function 'sqrt_backward' returned nan values.*"
                                                   r"forward 'sqrt' was called at .*test_nonfinite.py"):
                y.sum().backward()


def test_detect_anomaly_blames_no_op_for_a_nan_it_was_given(dev):
    data = ggrad.tensor(np.array([nan, 1.0], np.float32))
    with ggrad.detect_anomaly():
        y = F.exp(data * 2.0) + 1.0  # NaN in, NaN out: propagated, not made
        z = F.log(F.relu(data))  # relu(NaN) is NaN; log(0) = -inf is no anomaly
    assert math.isnan(y.numpy()[0]) and z.numpy()[1] == 0.0


def test_a_compiled_step_is_checked_under_detect_anomaly():
    model = nn.Sequential(nn.Linear(2, 2))
    opt = SGD(model.parameters(), lr=0.1)

    @ggrad.compile
    def step(x):
        with ggrad.grad_tape():
            loss = F.log(model(x)).sum()  # NaN where an output is negative
            loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    with ggrad.no_grad():
        model[0].weight.assign_(np.eye(2, dtype=np.float32))
        model[0].bias.assign_(np.zeros(2, np.float32))
    good, bad = np.ones((1, 2), np.float32), -np.ones((1, 2), np.float32)
    for _ in range(3):
        step(good)
    assert step.captured
    with ggrad.detect_anomaly():
        with pytest.raises(RuntimeError, match="Function 'log'"):
            step(bad)


# ---- fit(on_nonfinite=...) ---------------------------------------------------------------------
def _data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    x[21, 2] = nan  # in the second batch of 16
    return x, y


def _model():
    ggrad.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def test_fit_raises_at_a_nonfinite_loss_naming_the_step(dev):
    x, y = _data()
    model = _model()
    with pytest.raises(RuntimeError, match=r"loss of step 2 of epoch 1/3 was not finite.*detect_anomaly"):
        ggrad.fit(model, F.cross_entropy, Adam(model.parameters(), lr=1e-2), ggrad.DataLoader(x, y, batch_size=16),
                  epochs=3, verbose=0)


@pytest.mark.parametrize("fused", [False, True])  # True: ggml's AdamW kernel, which writes in place
def test_fit_skip_leaves_the_weights_as_training_without_that_batch(dev, fit_steps, fused):
    x, y = _data()
    model = _model()
    history = ggrad.fit(model, F.cross_entropy, Adam(model.parameters(), lr=1e-2, fused=fused),
                        ggrad.DataLoader(x, y, batch_size=16), epochs=3, verbose=0, metrics=("loss", "accuracy"),
                        on_nonfinite="skip")
    assert history["skipped"] == [1, 1, 1] and all(math.isfinite(v) for v in history["loss"])
    assert fit_steps[0].captured and fit_steps[0].reason is None  # the select is part of the replayed step
    keep = np.r_[0:16, 32:64]
    reference = _model()
    expected = ggrad.fit(reference, F.cross_entropy, Adam(reference.parameters(), lr=1e-2, fused=fused),
                         ggrad.DataLoader(x[keep], y[keep], batch_size=16), epochs=3, verbose=0,
                         metrics=("loss", "accuracy"))
    for a, b in zip(model.parameters(), reference.parameters()):
        if fused:  # a guarded step computes the kernel's formula from elementwise ops: float32 rounding apart
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)
        else:
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_allclose(history["loss"], expected["loss"], rtol=1e-6)
    assert history["accuracy"] == expected["accuracy"]


def test_fit_refuses_bad_nonfinite_modes():
    x, y = _data()
    model = _model()
    with pytest.raises(ValueError, match="on_nonfinite"):
        ggrad.fit(model, F.cross_entropy, Adam(model.parameters()), (x, y), epochs=1, on_nonfinite="ignore")
