"""A PyTorch program ports by changing its imports (issue 27): torch's module paths exist
in ggrad and hold the same functions, and what they add equals torch's."""

import importlib
import operator
import re

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


def _pos(*shape):
    return np.random.default_rng(3).uniform(0.5, 2.0, shape).astype(np.float32)


def _any(*shape):
    return np.random.default_rng(4).standard_normal(shape).astype(np.float32)


# torch's top-level functions that ggrad also has at its top level: (args, kwargs) of arrays
TOP_LEVEL = {
    "add": ((_any(3, 4), _any(4)), {"alpha": 2.5}),
    "sub": ((_any(3, 4), _any(3, 4)), {"alpha": -0.5}),
    "mul": ((_any(3, 4), _any(3, 1)), {}),
    "neg": ((_any(5),), {}),
    "pow": ((_pos(5), 2.5), {}),
    "remainder": ((_any(6) * 5, 1.5), {}),
    "sign": ((np.array([-2.0, 0.0, 3.0], np.float32),), {}),
    "sin": ((_any(5),), {}), "cos": ((_any(5),), {}),
    "ceil": ((_any(5) * 3,), {}), "floor": ((_any(5) * 3,), {}), "trunc": ((_any(5) * 3,), {}),
    "round": ((np.array([0.5, 1.5, 2.5, -0.5, 1.2], np.float32),), {}),
    "square": ((_any(5),), {}),
    "floor_divide": ((_any(6) * 5, 1.5), {}),
    "relu": ((_any(6),), {}),
    "log_softmax": ((_any(3, 5), 1), {}),
    "logsumexp": ((_any(3, 5), 1), {}),
    "broadcast_to": ((_any(1, 4), (3, 4)), {}),
    "unflatten": ((_any(3, 8), 1, (2, 4)), {}),
    "addcmul": ((_any(3, 4), _any(3, 4), _any(4)), {"value": 0.5}),
    "addcdiv": ((_any(3, 4), _any(3, 4), _pos(3, 4)), {"value": -2.0}),
    "tril": ((_any(2, 4, 5),), {"diagonal": 1}),
    "triu": ((_any(4, 5),), {"diagonal": -1}),
    "conv2d": ((_any(2, 3, 6, 6), _any(4, 3, 3, 3)), {"padding": 1}),
    "max_pool2d": ((_any(2, 3, 6, 6), 2), {}),
    "layer_norm": ((_any(3, 6), (6,)), {}),
}


NO_DERIVATIVE = {"floor_divide"}  # torch: "derivative for aten::floor_divide is not implemented"


@pytest.mark.parametrize("name", list(TOP_LEVEL))
def test_top_level_functions_equal_torchs(dev, name):
    """`torch.sin(x)` ports as `ggrad.sin(x)`: the same values and gradients."""
    args, kwargs = TOP_LEVEL[name]

    def call(module, wrap):
        inputs = [wrap(a) if isinstance(a, np.ndarray) else a for a in args]
        out = getattr(module, name)(*inputs, **kwargs)
        return out, [t for t in inputs if hasattr(t, "grad")]

    grad = name not in NO_DERIVATIVE
    with ggrad.grad_tape():
        ours, our_inputs = call(ggrad, lambda a: ggrad.tensor(a, requires_grad=grad))
        if grad:
            (ours * ours).sum().backward()
    theirs, their_inputs = call(torch, lambda a: torch.tensor(a, requires_grad=grad))
    if grad:
        (theirs * theirs).sum().backward()
    np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), rtol=2e-6, atol=1e-6)
    for a, b in zip(our_inputs, their_inputs):
        if grad and b.grad is not None:
            np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=2e-5, atol=1e-5)


def test_tril_and_triu_drop_nan_and_inf_as_torch(dev):
    """The dropped triangle holds exact zeros, whatever was there (NaN * 0 would be NaN)."""
    a = np.array([[1.0, np.nan, np.inf], [-np.inf, 2.0, np.nan], [3.0, 4.0, 5.0]], np.float32)
    for name in ("tril", "triu"):
        for diagonal in (-1, 0, 1):
            np.testing.assert_array_equal(getattr(ggrad.tensor(a), name)(diagonal).numpy(),
                                          getattr(torch.tensor(a), name)(diagonal).numpy())
    x = ggrad.tensor(np.arange(6, dtype=np.int64).reshape(2, 3))
    assert x.tril().dtype is ggrad.int64
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        ggrad.tril(ggrad.ones(3))


def test_in_place_arithmetic_with_alpha_and_value_equals_torch(dev):
    a, b, c = _any(3, 4), _any(3, 4), _pos(3, 4)
    ours, theirs = ggrad.tensor(a), torch.tensor(a)
    for t, m in ((ours, ggrad), (theirs, torch)):
        t.add_(m.tensor(b), alpha=2.0).sub_(m.tensor(c), alpha=0.5)
        t.addcmul_(m.tensor(b), m.tensor(c), value=-1.5).addcdiv_(m.tensor(b), m.tensor(c), value=0.25)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6, atol=1e-6)


def test_new_tensors_take_this_dtype_as_torch(dev):
    for dtype in ("float16", "int32", "float32"):
        ours, theirs = ggrad.ones(2, dtype=dtype), torch.ones(2, dtype=getattr(torch, dtype))
        for method, args in (("new_zeros", ((2, 3),)), ("new_ones", (4,)), ("new_full", ((2,), 7)),
                             ("new_tensor", ([1, 2, 3],)), ("new_empty", (2, 2))):
            got, want = getattr(ours, method)(*args), getattr(theirs, method)(*args)
            assert got.shape == tuple(want.shape) and got.dtype.name == str(want.dtype).split(".")[-1], method
            if method != "new_empty":
                np.testing.assert_array_equal(got.numpy().astype(np.float64), want.numpy().astype(np.float64))
    assert ggrad.ones(2).new_zeros(3, dtype=ggrad.int64).dtype is ggrad.int64


def test_f_strings_of_zero_dim_tensors_format_their_value():
    loss = ggrad.tensor(1.234567)
    assert f"{loss:.3f}" == f"{torch.tensor(1.234567):.3f}" == "1.235"
    assert f"{ggrad.tensor(7)}" == f"{torch.tensor(7)}" == "7" and f"{ggrad.tensor(3):4d}" == "   3"
    assert f"{ggrad.ones(2)}" == str(ggrad.ones(2))
    with pytest.raises(TypeError):
        f"{ggrad.ones(2):.3f}"


def test_the_user_defined_optimizer_in_the_docs_runs():
    """docs/coming_from_pytorch.md's Lion, run as written (its block checks itself
    against numpy)."""
    import pathlib
    import re
    text = (pathlib.Path(__file__).parents[1] / "docs" / "coming_from_pytorch.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 1 and "class Lion(Optimizer)" in blocks[0]
    namespace: dict = {}
    exec(compile(blocks[0], "coming_from_pytorch.md", "exec"), namespace)
    assert namespace["opt"].state[namespace["w"]]["step"] == 2


@pytest.fixture
def precision_restored():
    before = ggrad.get_float32_matmul_precision()
    yield
    ggrad.set_float32_matmul_precision(before)


def test_the_cuda_namespace_answers_what_scripts_ask(precision_restored):
    """nanoGPT's first lines (`torch.cuda.is_available() and torch.cuda.is_bf16_supported()`,
    `torch.backends.cuda.matmul.allow_tf32 = True`, `torch.cuda.amp.GradScaler`) run, and
    answer for ggml's CUDA devices."""
    cuda = [d for d in ggrad.devices() if d.kind == "cuda"]
    assert ggrad.cuda.is_available() == bool(cuda) and ggrad.cuda.device_count() == len(cuda)
    assert ggrad.cuda.is_bf16_supported() == bool(cuda)
    if cuda:
        assert ggrad.cuda.get_device_name(0) == cuda[0].description
    else:
        with pytest.raises(RuntimeError, match="does not exist"):
            ggrad.cuda.set_device(0)
    with pytest.raises(ValueError, match="CUDA device index"):
        ggrad.cuda.set_device("vulkan:0")
    ggrad.cuda.manual_seed(3)
    first = ggrad.rand(4).numpy()
    ggrad.manual_seed(3)
    np.testing.assert_array_equal(first, ggrad.rand(4).numpy())
    x = ggrad.ones(3) * 2
    assert x.node.pending
    ggrad.cuda.synchronize()
    assert not x.node.pending
    assert isinstance(ggrad.cuda.amp.GradScaler(enabled=False), ggrad.amp.GradScaler)
    assert ggrad.cuda.amp.autocast().fast_dtype is ggrad.float16  # torch.cuda.amp's default
    assert ggrad.accelerator.is_available() == ggrad.gpu_available()


def test_tf32_switches_are_the_matmul_precision(precision_restored):
    ggrad.set_float32_matmul_precision("highest")
    assert ggrad.backends.cuda.matmul.allow_tf32 is False and ggrad.backends.cudnn.allow_tf32 is False
    ggrad.backends.cuda.matmul.allow_tf32 = True
    assert ggrad.get_float32_matmul_precision() == "high" and ggrad.backends.cudnn.allow_tf32
    ggrad.backends.cudnn.allow_tf32 = False
    assert ggrad.get_float32_matmul_precision() == "highest"
    ggrad.backends.cudnn.benchmark = True  # kept, no effect: ggrad has no cuDNN
    assert ggrad.backends.cudnn.benchmark is True and not ggrad.backends.cudnn.is_available()
    ggrad.backends.cudnn.benchmark = False


def test_tied_weights_are_listed_under_both_names_as_torchs():
    """torch's state dict names a shared weight twice; ggrad's does too, loads torch's
    strictly, and still takes a state dict that names it once."""
    def build(m, base):
        class Model(base):
            def __init__(self):
                super().__init__()
                self.emb, self.head = m.Embedding(10, 4), m.Linear(4, 10, bias=False)
                self.head.weight = self.emb.weight
        return Model()
    ours, theirs = build(nn, nn.Module), build(torch.nn, torch.nn.Module)
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["emb.weight", "head.weight"]
    assert len(list(ours.parameters())) == len(list(theirs.parameters())) == 1
    result = ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    assert result.missing_keys == [] and result.unexpected_keys == []
    np.testing.assert_array_equal(ours.head.weight.numpy(), theirs.emb.weight.detach().numpy())
    ours.load_state_dict({"emb.weight": np.zeros((10, 4), np.float32)})  # one name: the other is the same tensor
    assert not ours.head.weight.numpy().any()


def test_device_is_a_device_object_as_torchs():
    """`ggrad.device("cpu")` is made without touching a device, has torch's type, index,
    repr and equality, goes where a device name goes, and still runs a block on a device."""
    for ours, theirs in ((ggrad.device("cpu"), torch.device("cpu")), (ggrad.device("cuda:1"), torch.device("cuda:1")),
                         (ggrad.device("cuda", 1), torch.device("cuda", 1)), (ggrad.device("cuda"), torch.device("cuda"))):
        assert (ours.type, ours.index, repr(ours), str(ours)) == (theirs.type, theirs.index, repr(theirs), str(theirs))
        assert ours == str(theirs) and hash(ours) == hash(str(theirs))
    with pytest.raises(RuntimeError, match="Expected one of"):
        ggrad.device("tpu")
    with pytest.raises(RuntimeError, match="must not include an index"):
        ggrad.device("cuda:0", 1)
    cpu = ggrad.device("cpu")
    model = nn.Linear(2, 2).to(cpu)
    assert ggrad.get_device() == "cpu" and model(ggrad.ones(1, 2, device=cpu)).shape == (1, 2)
    assert ggrad.ones(2).to(cpu).dtype is ggrad.float32
    with cpu as name:  # the context form: runs the block there, restores the previous device
        assert name == ggrad.get_device() == "cpu"


STEPPED = [((4, 6), (slice(None), slice(0, None, 2)), (4, 3)), ((4, 6), (slice(None), slice(1, None, 2)), (4, 3)),
           ((7, 5), (slice(1, 6, 3), slice(None)), (2, 5)), ((2, 3, 9), (1, slice(None), slice(2, 8, 4)), (3, 2)),
           ((5, 6), (slice(0, None, 2), slice(1, 5, 3)), (3, 2)), ((8,), (slice(None, None, 3),), (3,)),
           ((2, 3, 4, 7), (slice(None), 1, slice(None), slice(0, None, 3)), (2, 4, 3))]


@pytest.mark.parametrize("shape,index,value_shape", STEPPED)
def test_assignment_through_stepped_slices_equals_torchs(dev, shape, index, value_shape):
    """`pe[:, 0::2] = torch.sin(...)` (the transformer tutorial's positional encoding) and
    other stepped selections, with a tensor and with a number."""
    rng = np.random.default_rng(0)
    a, v = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(value_shape).astype(np.float32)
    for value in (v, 2.5):
        ours, theirs = ggrad.tensor(a), torch.tensor(a)
        ours[index] = ggrad.tensor(value) if isinstance(value, np.ndarray) else value
        theirs[index] = torch.tensor(value) if isinstance(value, np.ndarray) else value
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


@pytest.mark.parametrize("training", [True, False])
def test_functional_norms_equal_torchs(dev, training):
    """F.batch_norm (its running statistics moved in place in training), F.group_norm and
    F.instance_norm: values, gradients and running statistics against torch's."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((4, 6, 3, 5)).astype(np.float32)
    w, b = rng.standard_normal(6).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    mean, var = rng.standard_normal(6).astype(np.float32), rng.uniform(0.5, 2, 6).astype(np.float32)
    cases = {
        "batch_norm": (lambda m, t, rm, rv: m.batch_norm(t, rm, rv, weights[0], weights[1], training, 0.3, 1e-4)),
        "group_norm": (lambda m, t, rm, rv: m.group_norm(t, 3, weights[0], weights[1], 1e-5)),
        "instance_norm": (lambda m, t, rm, rv: m.instance_norm(t, weight=weights[0], bias=weights[1])),
    }
    for name, fn in cases.items():
        results = []
        for module, wrap in ((ggrad.nn.functional, lambda a, g=True: ggrad.tensor(a, requires_grad=g)),
                             (torch.nn.functional, lambda a, g=True: torch.tensor(a, requires_grad=g))):
            t = wrap(x)
            weights = (wrap(w), wrap(b))
            rm, rv = wrap(mean.copy(), False), wrap(var.copy(), False)
            if module is ggrad.nn.functional:
                with ggrad.grad_tape():
                    y = fn(module, t, rm, rv)
                    (y * y).sum().backward()
            else:
                y = fn(module, t, rm, rv)
                (y * y).sum().backward()
            results.append([np.asarray(v.detach().numpy()) for v in (y, t.grad, weights[0].grad, weights[1].grad, rm, rv)])
        for ours, theirs, what in zip(*results, ("output", "input grad", "weight grad", "bias grad", "running mean",
                                                 "running var")):
            np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4, err_msg=f"{name}: {what}")


def test_iterating_a_tensor_reads_it_once(dev):
    """`[data[i] for i in ix]` with a device tensor of indices: one read, no graph per
    element; the rows keep the dtype; inside a recording tape, rows of a tensor that
    requires grad still carry its gradient."""
    data = np.arange(1000, dtype=np.int64) * 3
    ix = ggrad.randint(0, 1000, (12,))
    ggrad.realize(ix)
    with ggrad.count_transfers() as moved:
        picked = [data[i] for i in ix]
    assert moved.dispatches == 0 and moved.crossings <= 1
    np.testing.assert_array_equal(picked, data[ix.numpy()])
    rows = list(ggrad.tensor(np.arange(6, dtype=np.float32).reshape(3, 2)).to(ggrad.bfloat16))
    assert [r.dtype for r in rows] == [ggrad.bfloat16] * 3 and rows[2].numpy().tolist() == [4.0, 5.0]
    w = ggrad.tensor(np.ones((3, 2), np.float32), requires_grad=True)
    with ggrad.grad_tape():
        sum(row.sum() * k for k, row in enumerate(w)).backward()
    np.testing.assert_array_equal(w.grad.numpy(), [[0, 0], [1, 1], [2, 2]])


def test_nanogpt_get_batch_runs_no_graph_and_equals_torchs(dev):
    """nanoGPT's get_batch: slices of a numpy array at `i:i+k` for each element of a
    random index tensor, stacked. The index arithmetic (an integer moved by integers) and
    the stack of host rows are done on the host: one read of the indices per loop, no graph, no
    upload until the batch is used; the same batch as torch's for the same indices."""
    data = np.random.default_rng(0).integers(0, 65, 5000).astype(np.uint16)
    ix = ggrad.randint(len(data) - 32, (12,))
    ggrad.realize(ix)
    with ggrad.count_transfers() as moved:
        x = ggrad.stack([ggrad.from_numpy(data[i:i + 32].astype(np.int64)) for i in ix])
        y = ggrad.stack([ggrad.from_numpy(data[i + 1:i + 1 + 32].astype(np.int64)) for i in ix])
    assert moved.dispatches == 0 and moved.uploads == 0 and moved.crossings <= 2  # a read per loop over ix
    tix = torch.tensor(ix.numpy())
    tx = torch.stack([torch.from_numpy(data[i:i + 32].astype(np.int64)) for i in tix])
    ty = torch.stack([torch.from_numpy(data[i + 1:i + 1 + 32].astype(np.int64)) for i in tix])
    assert x.dtype == y.dtype == ggrad.int64
    np.testing.assert_array_equal(x.numpy(), tx.numpy())
    np.testing.assert_array_equal(y.numpy(), ty.numpy())
    # what the host computes is what the device computes; past float32's exact integers
    # (or with a fractional step) the device computes it
    for value, scale, bias in [(7, 3, -5), (2 ** 23, 1, 1), (2 ** 24 + 1, 1, 1), (5, 0.5, 0)]:
        i = ggrad.tensor(value)
        moved_expr = ggrad.functional.affine(i, scale, bias, dtype=ggrad.int64)
        on_device = ggrad.functional.affine(i, scale, bias, dtype=ggrad.int64) * 1
        ggrad.realize(on_device)
        assert int(moved_expr) == int(on_device.numpy()) == operator.index(moved_expr)
    assert ggrad.cat([ggrad.tensor([1, 2]), ggrad.tensor([3.5])]).tolist() == [1.0, 2.0, 3.5]  # promoted
    w = ggrad.tensor([1.0, 2.0], requires_grad=True)
    with ggrad.grad_tape():
        (ggrad.stack([w, ggrad.tensor([3.0, 4.0])]) * ggrad.tensor([[1.0], [2.0]])).sum().backward()
    assert w.grad.tolist() == [1.0, 1.0]


@pytest.mark.parametrize("shape,r", [((2, 18, 3, 4), 3), ((8, 2, 5), 2), ((1, 4, 1, 1), 2)])
def test_pixel_shuffle_and_unshuffle_equal_torchs(dev, shape, r):
    x = np.random.default_rng(9).standard_normal(shape).astype(np.float32)
    for name in ("pixel_shuffle", "pixel_unshuffle"):
        a = x if name == "pixel_shuffle" else np.asarray(torch.nn.functional.pixel_shuffle(torch.tensor(x), r))
        ours, theirs = ggrad.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
        weights = np.random.default_rng(1).standard_normal(getattr(torch.nn.functional, name)(theirs, r).shape)
        with ggrad.grad_tape():
            y = getattr(ggrad.nn.functional, name)(ours, r)
            (y * ggrad.tensor(weights.astype(np.float32))).sum().backward()
        want = getattr(torch.nn.functional, name)(theirs, r)
        (want * torch.tensor(weights.astype(np.float32))).sum().backward()
        np.testing.assert_array_equal(y.numpy(), want.detach().numpy())
        np.testing.assert_array_equal(ours.grad.numpy(), theirs.grad.numpy())
    assert nn.PixelShuffle(r)(ggrad.tensor(x)).shape == tuple(torch.nn.PixelShuffle(r)(torch.tensor(x)).shape)


def test_bilinear_equals_torchs(dev):
    torch.manual_seed(0)
    theirs = torch.nn.Bilinear(3, 5, 4)
    ours = nn.Bilinear(3, 5, 4)
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((2, 6, 3)).astype(np.float32), rng.standard_normal((2, 6, 5)).astype(np.float32)
    x1, x2 = ggrad.tensor(a, requires_grad=True), ggrad.tensor(b, requires_grad=True)
    t1, t2 = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    with ggrad.grad_tape():
        y = ours(x1, x2)
        (y * y).sum().backward()
    want = theirs(t1, t2)
    (want * want).sum().backward()
    np.testing.assert_allclose(y.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    for g, t in ((x1, t1), (x2, t2), (ours.weight, theirs.weight), (ours.bias, theirs.bias)):
        np.testing.assert_allclose(g.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-5)
    bound = 1 / np.sqrt(3)
    fresh = nn.Bilinear(3, 5, 4)
    assert np.abs(fresh.weight.numpy()).max() <= bound and np.abs(fresh.bias.numpy()).max() <= bound


def test_conv3d_says_why_it_is_not_there():
    with pytest.raises(NotImplementedError, match="at most four"):
        nn.Conv3d(1, 2, 3)


@pytest.mark.parametrize("batch_first,norm_first", [(False, False), (True, True)])
def test_the_full_transformer_equals_torchs(dev, batch_first, norm_first):
    """nn.Transformer with torch's weights: outputs and gradients under the causal target
    mask of generate_square_subsequent_mask and key padding masks."""
    torch.manual_seed(0)
    kw = dict(d_model=16, nhead=2, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=24, dropout=0.0,
              batch_first=batch_first, norm_first=norm_first)
    theirs = torch.nn.Transformer(**kw)
    ours = nn.Transformer(**kw)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    rng = np.random.default_rng(3)
    shape = (lambda n, t: (n, t, 16)) if batch_first else (lambda n, t: (t, n, 16))
    src, tgt = rng.standard_normal(shape(2, 5)).astype(np.float32), rng.standard_normal(shape(2, 4)).astype(np.float32)
    pad = np.array([[False] * 5, [False] * 3 + [True] * 2])
    mask = nn.Transformer.generate_square_subsequent_mask(4)
    np.testing.assert_array_equal(mask.numpy(), torch.nn.Transformer.generate_square_subsequent_mask(4).numpy())
    s, t = ggrad.tensor(src, requires_grad=True), ggrad.tensor(tgt, requires_grad=True)
    with ggrad.grad_tape():
        y = ours(s, t, tgt_mask=mask, src_key_padding_mask=ggrad.tensor(pad), memory_key_padding_mask=ggrad.tensor(pad))
        (y * y).sum().backward()
    ts, tt = torch.tensor(src, requires_grad=True), torch.tensor(tgt, requires_grad=True)
    want = theirs(ts, tt, tgt_mask=torch.nn.Transformer.generate_square_subsequent_mask(4),
                  src_key_padding_mask=torch.tensor(pad), memory_key_padding_mask=torch.tensor(pad))
    (want * want).sum().backward()
    np.testing.assert_allclose(y.numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(s.grad.numpy(), ts.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_top_level_max_and_min_are_torchs(dev):
    """torch.max(x), torch.max(x, dim) -> (values, indices), torch.max(x, y) elementwise."""
    x = np.array([[1.0, 5.0, 3.0], [7.0, 2.0, 9.0]], np.float32)
    y = np.array([[4.0, 0.0, 3.5], [1.0, 8.0, 2.0]], np.float32)
    for name in ("max", "min"):
        ours, theirs = getattr(ggrad, name), getattr(torch, name)
        assert ours(ggrad.tensor(x)).item() == theirs(torch.tensor(x)).item()
        values, indices = ours(ggrad.tensor(x), 1, keepdim=True)
        want = theirs(torch.tensor(x), 1, keepdim=True)
        np.testing.assert_array_equal(values.numpy(), want.values.numpy())
        np.testing.assert_array_equal(indices.numpy(), want.indices.numpy())
        np.testing.assert_array_equal(ours(ggrad.tensor(x), ggrad.tensor(y)).numpy(),
                                      theirs(torch.tensor(x), torch.tensor(y)).numpy())


def test_a_torch_data_loader_call_ports_as_written():
    """DataLoader(dataset, batch_size, shuffle, num_workers, pin_memory, drop_last) as torch
    programs write it: the same batches (pin_memory changes nothing here)."""
    from ggrad.utils.data import DataLoader, TensorDataset
    x, y = np.arange(20, dtype=np.float32).reshape(10, 2), np.arange(10)
    plain = [(a.numpy(), b.numpy()) for a, b in DataLoader(TensorDataset(x, y), batch_size=4)]
    pinned = [(a.numpy(), b.numpy()) for a, b in DataLoader(TensorDataset(x, y), batch_size=4, shuffle=False,
                                                            num_workers=0, pin_memory=True, drop_last=False)]
    assert len(plain) == len(pinned) == 3
    for (a, b), (c, d) in zip(plain, pinned):
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(b, d)


def test_multinomial_draws_as_torchs_does(dev):
    """torch.multinomial's shapes, dtype, errors and distribution: frequencies of 30,000
    draws within 0.01 of the weights, never a zero-weight category while positive ones
    remain, each row's draws distinct without replacement (zero-weight categories last,
    as torch's), and the same draws again after ggrad.manual_seed."""
    torch = pytest.importorskip("torch")
    weights = np.array([[1.0, 2.0, 7.0, 0.0], [0.0, 5.0, 0.0, 5.0]], dtype=np.float32)
    ggrad.manual_seed(0)
    drawn = ggrad.multinomial(ggrad.tensor(weights), 30000, replacement=True)
    assert drawn.shape == (2, 30000) and drawn.dtype is ggrad.int64
    counts = np.stack([np.bincount(row, minlength=4) for row in drawn.numpy()]) / 30000
    np.testing.assert_allclose(counts, weights / weights.sum(1, keepdims=True), atol=0.01)
    ggrad.manual_seed(0)
    assert np.array_equal(ggrad.tensor(weights).multinomial(30000, replacement=True).numpy(), drawn.numpy())
    rows = ggrad.multinomial(ggrad.tensor(weights), 4).numpy()
    for row, w in zip(rows, weights):
        assert sorted(row) == [0, 1, 2, 3] and set(row[:np.count_nonzero(w)]) == set(np.flatnonzero(w))
    assert ggrad.multinomial(ggrad.tensor([0.2, 0.8]), 1).shape == tuple(torch.multinomial(torch.tensor([0.2, 0.8]), 1).shape)
    for bad, n, replacement in [([0.1, -0.2], 1, False), ([0.0, 0.0], 1, False), ([0.5, np.nan], 1, False),
                                ([0.5, 0.5], 3, False), ([0.5, 0.5], 0, True), (np.ones((2, 2, 2)), 1, True)]:
        with pytest.raises(RuntimeError) as theirs:
            torch.multinomial(torch.tensor(bad, dtype=torch.float32), n, replacement)
        with pytest.raises(RuntimeError, match=re.escape(str(theirs.value).splitlines()[0])):
            ggrad.multinomial(ggrad.tensor(np.asarray(bad, dtype=np.float32)), n, replacement)
