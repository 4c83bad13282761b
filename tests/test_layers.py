"""Every module against torch's on the same weights, on every device: a torch module's
state_dict loads into the ggrad module (strict) and back; forward values, the input's and
every parameter's gradients, and buffers after a training step equal torch's."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch (the test oracle) is not installed: pip install -e .[test]")

import ggrad  # noqa: E402
from ggrad import nn  # noqa: E402
from conftest import assert_close  # noqa: E402

rng = np.random.default_rng(1)

MODULES = {
    "Conv1d": (lambda m: m.Conv1d(4, 6, 3, stride=2, padding=1), (3, 4, 17)),
    "Conv1d_groups_same": (lambda m: m.Conv1d(4, 8, 4, padding="same", groups=2, bias=False), (3, 4, 12)),
    "Conv2d": (lambda m: m.Conv2d(3, 5, 3, padding=1), (2, 3, 8, 9)),
    "Conv2d_strided_dilated": (lambda m: m.Conv2d(4, 6, (3, 2), stride=(2, 1), dilation=(1, 2), groups=2), (2, 4, 9, 9)),
    "Conv2d_depthwise": (lambda m: m.Conv2d(4, 4, 3, groups=4, padding="same"), (2, 4, 7, 7)),
    "ConvTranspose2d": (lambda m: m.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1), (2, 4, 5, 6)),
    "MaxPool2d": (lambda m: m.MaxPool2d(3, 2, padding=1), (2, 3, 9, 8)),
    "MaxPool1d": (lambda m: m.MaxPool1d(2), (2, 3, 9)),
    "AvgPool2d": (lambda m: m.AvgPool2d(2, ceil_mode=True), (2, 3, 9, 8)),
    "AvgPool1d": (lambda m: m.AvgPool1d(3, 2, 1, count_include_pad=False), (2, 3, 9)),
    "AdaptiveAvgPool2d": (lambda m: m.AdaptiveAvgPool2d((3, 2)), (2, 3, 9, 8)),
    "Flatten": (lambda m: m.Flatten(), (2, 3, 4, 5)),
    "Upsample_scale": (lambda m: m.Upsample(scale_factor=2), (2, 3, 4, 5)),
    "Upsample_size": (lambda m: m.Upsample(size=(7, 3)), (2, 3, 4, 5)),
    "Upsample_1d_fraction": (lambda m: m.Upsample(scale_factor=1.5), (2, 3, 5)),
    "Unflatten": (lambda m: m.Unflatten(1, (2, 6)), (2, 12, 5)),
    "BatchNorm1d": (lambda m: m.BatchNorm1d(5), (8, 5)),
    "BatchNorm1d_3d": (lambda m: m.BatchNorm1d(5, momentum=None), (4, 5, 6)),
    "BatchNorm2d": (lambda m: m.BatchNorm2d(3), (4, 3, 5, 6)),
    "BatchNorm2d_untracked": (lambda m: m.BatchNorm2d(3, affine=False, track_running_stats=False), (4, 3, 5, 6)),
    "LayerNorm": (lambda m: m.LayerNorm(6), (3, 4, 6)),
    "LayerNorm_shape": (lambda m: m.LayerNorm((4, 6), bias=False), (3, 4, 6)),
    "RMSNorm": (lambda m: m.RMSNorm((4, 6)), (3, 4, 6)),
    "RMSNorm_eps": (lambda m: m.RMSNorm(6, eps=1e-3), (3, 6)),
    "GroupNorm": (lambda m: m.GroupNorm(2, 6), (3, 6, 4, 5)),
    "InstanceNorm2d": (lambda m: m.InstanceNorm2d(3), (2, 3, 5, 6)),
    "InstanceNorm2d_affine": (lambda m: m.InstanceNorm2d(3, affine=True), (2, 3, 5, 6)),
}


def _randomized(module):
    """torch's module with every float parameter and buffer drawn at random (so a ones /
    zeros default cannot hide a swapped weight and bias)."""
    with torch.no_grad():
        for _, value in [*module.named_parameters(), *module.named_buffers()]:
            if value.dtype.is_floating_point:
                value.copy_(torch.from_numpy(rng.uniform(0.5, 1.5, tuple(value.shape)).astype(np.float32)))
    return module


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_equals_torch(dev, name):
    make, shape = MODULES[name]
    t_module = _randomized(make(torch.nn))
    g_module = make(nn)
    assert list(g_module.state_dict()) == list(t_module.state_dict())
    g_module.load_state_dict(t_module.state_dict(), strict=True)
    x = rng.standard_normal(shape).astype(np.float32)
    with ggrad.grad_tape():
        g_x = ggrad.tensor(x, requires_grad=True)
        g_y = g_module(g_x)
        weights = rng.standard_normal(g_y.shape).astype(np.float32)
        (g_y * ggrad.tensor(weights)).sum().backward()
    t_x = torch.tensor(x, requires_grad=True)
    t_y = t_module(t_x)
    (t_y * torch.tensor(weights)).sum().backward()
    assert_close(dev, g_y.numpy(), t_y.detach().numpy())
    assert_close(dev, g_x.grad.numpy(), t_x.grad.numpy(), err_msg="input gradient")
    t_params = dict(t_module.named_parameters())
    for key, p in g_module.named_parameters():
        assert_close(dev, p.grad.numpy(), t_params[key].grad.numpy(), err_msg=key)
    t_state = t_module.state_dict()
    for key, value in g_module.state_dict().items():  # buffers after the training step
        assert_close(dev, value.numpy(), t_state[key].numpy(), rtol=1e-6, atol=1e-6, err_msg=key)
    g_module.eval(), t_module.eval()
    assert_close(dev, g_module(ggrad.tensor(x)).numpy(), t_module(torch.tensor(x)).detach().numpy(), err_msg="eval")
    back = _randomized(make(torch.nn))  # and ggrad's state_dict loads into torch's module
    ours = {k: np.array(v.numpy()) for k, v in g_module.state_dict().items()}
    back.load_state_dict({k: torch.from_numpy(v) for k, v in ours.items()}, strict=True)
    for key, value in back.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), ours[key], err_msg=key)


@pytest.mark.parametrize("name", ["Conv1d", "Conv2d", "ConvTranspose2d", "Conv2d_depthwise"])
def test_default_initialisation_follows_torch(name):
    """U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias, fan_in = shape[1] * kernel."""
    make, _ = MODULES[name]
    ggrad.manual_seed(0)
    g_module, t_module = make(nn), make(torch.nn)
    for (key, g), (_, t) in zip(g_module.named_parameters(), t_module.named_parameters()):
        fan_in = t_module.weight.shape[1] * int(np.prod(t_module.weight.shape[2:]))
        bound = 1 / np.sqrt(fan_in)
        values = g.numpy()
        assert values.shape == tuple(t.shape), key
        assert np.abs(values).max() <= bound and np.abs(values).max() > 0.5 * bound, key


def test_embedding_padding_row_is_zero_and_untrained(dev):
    t_module = torch.nn.Embedding(6, 4, padding_idx=2)
    g_module = nn.Embedding(6, 4, padding_idx=2)
    assert not g_module.weight.numpy()[2].any()
    g_module.load_state_dict(t_module.state_dict())
    ids = np.array([[0, 2, 5], [2, 2, 1]])
    with ggrad.grad_tape():
        g_out = g_module(ggrad.tensor(ids))
        weights = rng.standard_normal(g_out.shape).astype(np.float32)
        (g_out * ggrad.tensor(weights)).sum().backward()
    t_out = t_module(torch.tensor(ids))
    (t_out * torch.tensor(weights)).sum().backward()
    np.testing.assert_allclose(g_out.numpy(), t_out.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(g_module.weight.grad.numpy(), t_module.weight.grad.numpy(), rtol=1e-6, atol=1e-7)
    assert not g_module.weight.grad.numpy()[2].any()


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_embedding_turns_pairs_by_position(dev, interleaved):
    """Rotate-half (GPT-NeoX) or adjacent pairs (llama.cpp's llama), against float64."""
    import ggrad.functional as F
    x = rng.standard_normal((2, 5, 3, 8)).astype(np.float32)
    positions = np.array([0, 1, 2, 7, 30])
    theta = positions[:, None] * 500.0 ** (-2.0 * np.arange(4) / 8)
    cos, sin = np.cos(theta)[:, None], np.sin(theta)[:, None]
    x64 = x.astype(np.float64)
    a, b = (x64[..., 0::2], x64[..., 1::2]) if interleaved else (x64[..., :4], x64[..., 4:])
    turned_a, turned_b = a * cos - b * sin, b * cos + a * sin
    want = np.empty_like(x64)
    if interleaved:
        want[..., 0::2], want[..., 1::2] = turned_a, turned_b
    else:
        want = np.concatenate([turned_a, turned_b], -1)
    got = F.rotary_embedding(x, ggrad.tensor(positions), base=500.0, interleaved=interleaved)
    assert_close(dev, got.numpy(), want)
    assert ggrad.gradcheck(lambda t: F.rotary_embedding(t, ggrad.tensor(positions), 500.0, interleaved), [x])
