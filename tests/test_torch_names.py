"""A PyTorch program ports by changing its imports (issue 27): torch's module paths exist
in ggrad and hold the same functions, and what they add equals torch's."""

import importlib

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch (the test oracle) is not installed: pip install -e .[test]")

import ggrad  # noqa: E402
from ggrad import nn  # noqa: E402


@pytest.mark.parametrize("torch_path,ggrad_path,source,used", [
    ("torch.nn.functional", "ggrad.nn.functional", "ggrad.functional",
     ["cross_entropy", "linear", "relu", "gelu", "softmax", "layer_norm", "dropout", "embedding", "conv2d"]),
    ("torch.utils.data", "ggrad.utils.data", "ggrad.data",
     ["DataLoader", "Dataset", "TensorDataset", "random_split", "Subset", "RandomSampler"]),
])
def test_torch_module_paths_import_and_are_ggrads(torch_path, ggrad_path, source, used):
    """`import ggrad.nn.functional as F` and `from ggrad.utils.data import DataLoader` work,
    every name there is the very object of ggrad's own module, and the names programs use
    most are there as in torch."""
    module, original = importlib.import_module(ggrad_path), importlib.import_module(source)
    assert sorted(module.__all__) == sorted(original.__all__)
    for name in original.__all__:
        assert getattr(module, name) is getattr(original, name), name
    theirs = importlib.import_module(torch_path)
    for name in used:
        assert hasattr(theirs, name) and hasattr(module, name), name


def test_nn_utils_holds_the_clipping_and_vector_functions():
    assert ggrad.nn.utils.clip_grad_norm_ is ggrad.optim.clip_grad_norm_
    assert ggrad.nn.utils.clip_grad_value_ is ggrad.optim.clip_grad_value_
    for name in ("parameters_to_vector", "vector_to_parameters"):
        assert callable(getattr(ggrad.nn.utils, name))


def _twins():
    ggrad.manual_seed(0)
    ours = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    theirs = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    return ours, theirs


def test_parameters_to_vector_and_back_equal_torch(dev):
    """The flat vector, its gradient reaching each parameter, and the write back into the
    parameters (in place: the same buffers), against torch.nn.utils."""
    ours, theirs = _twins()
    weights = np.random.default_rng(1).standard_normal(4 * 3 + 4 + 4 * 2 + 2).astype(np.float32)
    with ggrad.grad_tape():
        vec = ggrad.nn.utils.parameters_to_vector(ours.parameters())
        (vec * ggrad.tensor(weights)).sum().backward()
    want = torch.nn.utils.parameters_to_vector(theirs.parameters())
    (want * torch.tensor(weights)).sum().backward()
    np.testing.assert_array_equal(vec.numpy(), want.detach().numpy())
    for p, q in zip(ours.parameters(), theirs.parameters()):
        np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())

    before = [p.node.handle for p in ours.parameters()]
    new = np.arange(weights.size, dtype=np.float32) / 10
    ggrad.nn.utils.vector_to_parameters(ggrad.tensor(new), ours.parameters())
    torch.nn.utils.vector_to_parameters(torch.tensor(new), theirs.parameters())
    for p, q, handle in zip(ours.parameters(), theirs.parameters(), before):
        np.testing.assert_array_equal(p.numpy(), q.detach().numpy())
        assert p.node.handle is handle  # written where it was
    x = np.random.default_rng(2).standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_allclose(ours(ggrad.tensor(x)).numpy(), theirs(torch.tensor(x)).detach().numpy(), rtol=1e-6)


def test_vector_to_parameters_refuses_what_torch_refuses():
    ours, _ = _twins()
    with pytest.raises(TypeError):
        ggrad.nn.utils.vector_to_parameters(np.zeros(26, np.float32), ours.parameters())
    with pytest.raises(ValueError, match="26 elements"):
        ggrad.nn.utils.vector_to_parameters(ggrad.zeros(25), ours.parameters())
    with pytest.raises(ValueError, match="at least one"):
        ggrad.nn.utils.parameters_to_vector([])
