"""nn.init draws on the device from the seeded generator: each fill has the distribution
torch's has (Kolmogorov-Smirnov against the exact law), writes in place and is
reproducible from `ggrad.manual_seed`."""

import math

import numpy as np
import pytest
from scipy import stats

import ggrad
from ggrad import nn
from ggrad.nn import init

SHAPE = (300, 400)  # 120,000 draws: a wrong law fails the KS test, a right one passes


def _fresh():
    return ggrad.param(np.zeros(SHAPE, np.float32))


LAWS = {
    "uniform_": (lambda w: init.uniform_(w, -1.0, 3.0), stats.uniform(-1.0, 4.0)),
    "normal_": (lambda w: init.normal_(w, 1.0, 2.0), stats.norm(1.0, 2.0)),
    "trunc_normal_": (lambda w: init.trunc_normal_(w, 0.5, 1.5, -1.0, 2.0),
                      stats.truncnorm((-1.0 - 0.5) / 1.5, (2.0 - 0.5) / 1.5, 0.5, 1.5)),
    "xavier_uniform_": (lambda w: init.xavier_uniform_(w, gain=2.0),
                        stats.uniform(-2 * math.sqrt(6 / 700), 4 * math.sqrt(6 / 700))),
    "xavier_normal_": (lambda w: init.xavier_normal_(w), stats.norm(0.0, math.sqrt(2 / 700))),
    "kaiming_uniform_": (lambda w: init.kaiming_uniform_(w, a=math.sqrt(5)),
                         stats.uniform(-1 / math.sqrt(400), 2 / math.sqrt(400))),
    "kaiming_normal_fan_out": (lambda w: init.kaiming_normal_(w, mode="fan_out", nonlinearity="relu"),
                               stats.norm(0.0, math.sqrt(2 / 300))),
}


@pytest.mark.parametrize("name", sorted(LAWS))
def test_fills_have_torch_laws_in_place(dev, name):
    fill, law = LAWS[name]
    ggrad.manual_seed(0)
    w = _fresh()
    w.numpy()
    address = w.handle.location()
    assert fill(w) is w
    values = w.numpy().ravel().astype(np.float64)
    assert stats.kstest(values, law.cdf).pvalue > 1e-3
    assert w.handle.location() == address  # the same buffer
    ggrad.manual_seed(0)
    again = _fresh()
    fill(again)
    np.testing.assert_array_equal(again.numpy(), w.numpy())


def test_constant_orthogonal_and_gains(dev):
    w = _fresh()
    np.testing.assert_array_equal(init.constant_(w, 0.25).numpy(), np.full(SHAPE, 0.25, np.float32))
    assert init.ones_(w).numpy().min() == 1.0 and init.zeros_(w).numpy().max() == 0.0
    q = init.orthogonal_(ggrad.param(np.zeros((6, 2, 5), np.float32)), gain=2.0).numpy().reshape(6, 10)
    np.testing.assert_allclose(q @ q.T, 4 * np.eye(6), atol=1e-5)
    torch = pytest.importorskip("torch")
    for args in (("relu",), ("tanh",), ("leaky_relu", 0.2), ("selu",), ("conv2d",)):
        assert init.calculate_gain(*args) == pytest.approx(torch.nn.init.calculate_gain(*args))
    with pytest.raises(ValueError, match="fewer than 2"):
        init.xavier_uniform_(ggrad.param(np.zeros(5, np.float32)))


def test_module_apply_initialises_every_layer():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

    def zero_bias(m):
        if isinstance(m, nn.Linear):
            init.zeros_(m.bias)
    assert model.apply(zero_bias) is model
    assert all(float(abs(m.bias.numpy()).max()) == 0.0 for m in model.modules() if isinstance(m, nn.Linear))
