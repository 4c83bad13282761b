"""Module's API as torch's: traversal, hooks, buffers (persistent or not), freezing,
zero_grad, load_state_dict's result and strictness, containers."""

from collections import OrderedDict

import numpy as np
import pytest

import ggrad
from ggrad import nn

torch = pytest.importorskip("torch", reason="torch (the test oracle) is not installed: pip install -e .[test]")


def build(m):
    return m.Sequential(OrderedDict([("conv", m.Conv2d(1, 2, 3)), ("norm", m.BatchNorm2d(2)), ("act", m.ReLU()),
                                     ("flat", m.Flatten()), ("head", m.Linear(8, 3))]))


def test_names_and_traversal_match_torch():
    ours, theirs = build(nn), build(torch.nn)
    assert [k for k, _ in ours.named_modules()] == [k for k, _ in theirs.named_modules()]
    assert [k for k, _ in ours.named_children()] == [k for k, _ in theirs.named_children()]
    assert [k for k, _ in ours.named_parameters()] == [k for k, _ in theirs.named_parameters()]
    assert [k for k, _ in ours.named_buffers()] == [k for k, _ in theirs.named_buffers()]
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [k for k, _ in ours.head.named_parameters(recurse=False)] == ["weight", "bias"]
    assert ours.head is ours[4] and len(ours) == 5


def test_load_state_dict_reports_keys_as_torch():
    ours = build(nn)
    state = {k: v.numpy() for k, v in build(torch.nn).state_dict().items()}
    del state["norm.num_batches_tracked"]  # tolerated, as torch does for older files
    assert ours.load_state_dict(state) == ([], [])
    state["extra"] = np.zeros(2, np.float32)
    del state["head.bias"]
    result = ours.load_state_dict(state, strict=False)
    assert result.missing_keys == ["head.bias"] and result.unexpected_keys == ["extra"]
    with pytest.raises(RuntimeError, match=r"missing keys: \['head.bias'\]"):  # torch's exception type too
        ours.load_state_dict(state)


def test_buffers_can_be_left_out_of_the_state_dict():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("scale", ggrad.tensor(np.full(3, 2.0, np.float32)))
            self.register_buffer("cache", ggrad.tensor(np.zeros(3, np.float32)), persistent=False)

        def forward(self, x):
            return x * self.scale + self.cache
    m = Scaled()
    assert list(m.state_dict()) == ["scale"]
    assert [k for k, _ in m.named_buffers()] == ["scale", "cache"]
    np.testing.assert_array_equal(m(ggrad.tensor(np.ones(3, np.float32))).numpy(), [2.0, 2.0, 2.0])


def test_forward_hooks_run_change_and_are_removed():
    m = nn.Linear(2, 2)
    seen = []
    pre = m.register_forward_pre_hook(lambda mod, args: (args[0] * 2.0,))
    post = m.register_forward_hook(lambda mod, args, out: seen.append(out.shape) or out + 1.0)
    x = ggrad.tensor(np.ones((1, 2), np.float32))
    expected = (2 * np.ones((1, 2))) @ m.weight.numpy().T + m.bias.numpy() + 1.0
    np.testing.assert_allclose(m(x).numpy(), expected, rtol=1e-6)
    assert seen == [(1, 2)]
    pre.remove(), post.remove()
    np.testing.assert_allclose(m(x).numpy(), np.ones((1, 2)) @ m.weight.numpy().T + m.bias.numpy(), rtol=1e-6)


def test_requires_grad_freezes_and_zero_grad_clears():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    model[0].requires_grad_(False)
    x = ggrad.tensor(np.ones((2, 3), np.float32))
    with ggrad.grad_tape():
        model(x).sum().backward()
    assert model[0].weight.grad is None and model[2].weight.grad is not None
    assert len(list(model.parameters())) == 4  # frozen parameters stay parameters
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_containers():
    layers = nn.ModuleList([nn.Linear(2, 2)]).extend([nn.Linear(2, 2), nn.ReLU()])
    assert len(layers) == 3 and [k for k, _ in layers.named_parameters()][:2] == ["0.weight", "0.bias"]
    params = nn.ParameterList([np.ones(2, np.float32), np.zeros(3, np.float32)])
    assert list(params.state_dict()) == ["0", "1"] and params[1].shape == (3,)
    heads = nn.ModuleDict({"a": nn.Linear(2, 1)})
    assert "a" in heads and list(heads) == ["a"] and list(heads.values())[0] is heads["a"]
    x = ggrad.tensor(np.ones(3, np.float32))
    assert nn.Identity(7, any_keyword=1)(x) is x


def test_a_deep_copied_model_is_independent_and_equal_as_torchs(dev):
    """copy.deepcopy(model) (an EMA or the best model so far): equal values, its own buffers,
    unchanged by training the original; requires_grad and gradients copied; a tensor with
    history refuses, as torch's does."""
    import copy
    import ggrad.functional as F
    from ggrad.optim import SGD
    ggrad.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    x = ggrad.tensor(np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32))
    with ggrad.grad_tape():
        model(x).sum().backward()
    twin = copy.deepcopy(model)
    before = [p.numpy().copy() for p in model.parameters()]
    for p, q in zip(model.parameters(), twin.parameters()):
        assert q is not p and q.requires_grad and q.node is not p.node
        np.testing.assert_array_equal(q.numpy(), p.numpy())
        np.testing.assert_array_equal(q.grad.numpy(), p.grad.numpy())
    opt = SGD(model.parameters(), lr=0.5)
    opt.step()
    for p, q, b in zip(model.parameters(), twin.parameters(), before):
        np.testing.assert_array_equal(q.numpy(), b)
        assert not np.array_equal(p.numpy(), b)
    shallow = copy.copy(model[0].weight)
    assert shallow.node is model[0].weight.node and shallow.requires_grad
    with ggrad.grad_tape():
        y = F.relu(model(x))
        with pytest.raises(RuntimeError, match="graph leaves"):
            copy.deepcopy(y)
