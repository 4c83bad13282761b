"""PyTorch is the oracle: the same code, written once against a module `m` (torch or
ggrad), gives the same values, dtypes and gradients on every device.

Each case is ``(fn, inputs)``: `fn(m, *tensors)` returns a tensor (or a tuple of them);
inputs are numpy arrays (float ones get gradients). Values compare exactly for integer
and bool results, to 1e-6 relative for float32 and to the dtype's epsilon for float16 /
bfloat16; result dtypes compare by name; gradients (of a fixed random weighting of the
float outputs) to 1e-5.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch (the test oracle) is not installed: pip install -e .[test]")

import ggrad  # noqa: E402
import ggrad.functional as F  # noqa: E402

rng = np.random.default_rng(0)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def distinct(*shape):
    return rng.permutation(int(np.prod(shape))).reshape(shape).astype(np.float32) / 7 - 1


def ints(*shape, high=10):
    return rng.integers(-high, high, shape).astype(np.int64)


SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 2.5, 1e-30], np.float32)
SPECIAL2 = np.array([0.0, 0.0, -1.0, 1.0, np.inf, np.inf, np.nan, np.nan, 1e-30], np.float32)

CASES = {
    # comparisons, with IEEE special values
    "eq_special": (lambda m, a, b: a == b, [SPECIAL, SPECIAL2]),
    "ne_special": (lambda m, a, b: a != b, [SPECIAL, SPECIAL2]),
    "lt_special": (lambda m, a, b: a < b, [SPECIAL, SPECIAL2]),
    "le_special": (lambda m, a, b: a <= b, [SPECIAL, SPECIAL2]),
    "gt_broadcast": (lambda m, a, b: a > b, [f32(3, 4), f32(4)]),
    "ge_scalar": (lambda m, a: a >= 0.25, [f32(3, 4)]),
    "scalar_on_left": (lambda m, a: 0.5 < a, [f32(5)]),
    "eq_ints": (lambda m, a, b: a == b, [ints(20, high=3), ints(20, high=3)]),
    "isnan_isinf_isfinite": (lambda m, a: (m.isnan(a), m.isinf(a), m.isfinite(a)), [SPECIAL]),
    "logical_ops": (lambda m, a, b: ((a > 0) & (b > 0), (a > 0) | (b > 0), (a > 0) ^ (b > 0), ~(a > 0)),
                    [f32(3, 4), f32(3, 4)]),
    "logical_fns": (lambda m, a, b: (m.logical_and(a, b), m.logical_or(a, b), m.logical_not(a), m.logical_xor(a, b)),
                    [ints(12, high=2), ints(12, high=2)]),
    "any_all": (lambda m, a: ((a > 1).any(), (a > 1).all(), (a > -3).all(), (a > 0.5).any(dim=1)), [f32(3, 4)]),
    # selection
    "where": (lambda m, a, b: m.where(a > b, a, b), [f32(3, 4), f32(3, 4)]),
    "where_broadcast_scalar": (lambda m, a, b: m.where(b > 0, a, 0.5), [f32(3, 4), f32(4)]),
    "where_keeps_nan_out": (lambda m, a: m.where(m.isnan(a), 0.0, a), [SPECIAL]),
    "masked_fill": (lambda m, a, b: a.masked_fill(b > 0, -1.5), [f32(3, 4), f32(3, 4)]),
    "masked_fill_inf": (lambda m, a, b: (a.masked_fill(b > 0, float("-inf"))).softmax(-1), [f32(3, 4), f32(1, 4)]),
    "clamp_tensor": (lambda m, a, lo, hi: a.clamp(lo, hi + 1.0), [f32(3, 4), f32(3, 4), f32(4)]),
    "clamp_scalar": (lambda m, a: a.clamp(-0.5, 0.5), [f32(3, 4)]),
    "maximum_minimum": (lambda m, a, b: (m.maximum(a, b), m.minimum(a, b)), [f32(3, 4), f32(4)]),
    "maximum_nan": (lambda m, a, b: m.maximum(a, b), [SPECIAL, SPECIAL2]),
    # dtypes and promotion
    "f16_plus_f32": (lambda m, a, b: a.half() + b, [f32(3), f32(3)]),
    "f16_times_scalar": (lambda m, a: a.half() * 1.5, [f32(3)]),
    "bf16_arith": (lambda m, a, b: (a.bfloat16() * b.bfloat16() + 1.0).exp(), [f32(3), f32(3)]),
    "f16_bf16": (lambda m, a, b: a.half() + b.bfloat16(), [f32(3), f32(3)]),
    "int_plus_float": (lambda m, a, b: a + b, [ints(4), f32(4)]),
    "int_plus_int_scalar": (lambda m, a: (a + 1, a * 3, a - 2, -a), [ints(4)]),
    "int_plus_float_scalar": (lambda m, a: a + 0.5, [ints(4)]),
    "int_div": (lambda m, a, b: (a / (b.abs() + 1), a // (b.abs() + 1), a % (b.abs() + 1)), [ints(6), ints(6)]),
    "bool_plus_int": (lambda m, a, b: (a > 0) + b, [f32(4), ints(4)]),
    "bool_sum": (lambda m, a: ((a > 0).sum(), (a > 0).long().sum(dim=0)), [f32(5, 3)]),
    "int32_and_int64": (lambda m, a, b: a.int() + b, [ints(4), ints(4)]),
    "zero_dim_does_not_promote": (lambda m, a, b: a.half() + b, [f32(3), np.array(2.0, np.float32)]),
    "casts": (lambda m, a: (a.int(), a.long(), a.bool(), (a * 10).long().float()), [f32(6)]),
    "exp_of_int": (lambda m, a: a.exp(), [ints(4, high=3)]),
    # reductions
    "sum_dim_keepdim": (lambda m, a: (a.sum(dim=1), a.sum(dim=(0, 2), keepdim=True)), [f32(2, 3, 4)]),
    "mean_dim": (lambda m, a: a.mean(dim=-1, keepdim=True), [f32(3, 4)]),
    "var_std": (lambda m, a: (a.var(), a.var(dim=1), a.std(dim=0, keepdim=True), a.var(dim=1, correction=0)),
                [f32(3, 5)]),
    "norm": (lambda m, a: (a.norm(), a.norm(dim=1), a.norm(p=1, dim=0)), [f32(3, 4)]),
    "max_values_indices": (lambda m, a: tuple(a.max(dim=1)) + tuple(a.min(dim=0, keepdim=True)), [distinct(3, 4)]),
    "max_all_argmin": (lambda m, a: (a.max(), a.min(), a.argmax(), a.argmin(dim=1), a.argmax(dim=0, keepdim=True)),
                       [distinct(3, 4)]),
    "cumsum": (lambda m, a: (a.cumsum(dim=1), a.cumsum(0)), [f32(3, 4)]),
    "cumsum_int": (lambda m, a: a.cumsum(0), [ints(5)]),
    "topk": (lambda m, a: tuple(a.topk(2, dim=1)) + tuple(a.topk(2, dim=0, largest=False)), [distinct(3, 5)]),
    "sort": (lambda m, a: tuple(a.sort(dim=1)) + tuple(a.sort(dim=0, descending=True)), [distinct(3, 5)]),
    "argsort": (lambda m, a: a.argsort(dim=-1, descending=True), [distinct(2, 6)]),
    # layout
    "view_flatten_unflatten": (lambda m, a: (a.view(6, 4), a.flatten(), a.flatten(1), a.unflatten(2, (2, 2))),
                               [f32(2, 3, 4)]),
    "squeeze_unsqueeze": (lambda m, a: (a.unsqueeze(0), a.unsqueeze(-1), a.unsqueeze(1).squeeze(), a.squeeze(1)),
                          [f32(3, 1, 4)]),
    "permute_transpose_t": (lambda m, a: (a.permute(2, 0, 1), a.transpose(0, 2), a[0].t(), a.mT), [f32(2, 3, 4)]),
    "expand_repeat": (lambda m, a: (a.expand(2, 3, 4), a.expand(-1, 4), a.repeat(2, 3), a.repeat(2, 1, 2)),
                      [f32(3, 1)]),
    "cat_stack": (lambda m, a, b: (m.cat([a, b], dim=0), m.cat([a, b], 1), m.stack([a, b]), m.stack([a, b], dim=2)),
                  [f32(2, 3), f32(2, 3)]),
    "chunk_split": (lambda m, a: tuple(a.chunk(3, dim=1)) + tuple(a.split(2, dim=0)) + tuple(a.split([1, 4], dim=1)),
                    [f32(3, 5)]),
    "pad": (lambda m, a: (m.nn.functional.pad(a, (1, 2)), m.nn.functional.pad(a, (0, 1, 2, 0), value=0.5)),
            [f32(2, 3)]),
    "einsum": (lambda m, a, b, c: (m.einsum("bij,bjk->bik", a, b), m.einsum("bhqd,bhkd->bhqk", c, c),
                                   m.einsum("ij,j->i", a[0], b[0, :, 0]), m.einsum("bij->bji", a)),
               [f32(2, 3, 4), f32(2, 4, 5), f32(2, 2, 3, 4)]),
    "movedim_narrow": (lambda m, a: (a.movedim(0, 2), a.narrow(1, 1, 2), m.narrow(a, -1, 0, 3)), [f32(2, 3, 4)]),
    "floor_ceil_trunc": (lambda m, a: (a.floor(), a.ceil(), a.trunc(), (a * 3).floor()), [f32(3, 4)]),
    "amax_amin_clone": (lambda m, a: (m.amax(a, dim=1), m.amin(a, dim=0), a.clone() * 2), [distinct(3, 4)]),
    "div_rounding": (lambda m, a, b: (m.div(a, b, rounding_mode="floor"), m.div(a, b, rounding_mode="trunc")),
                     [f32(6) * 5, f32(6)]),
    # indexing
    "basic_index": (lambda m, a: (a[1], a[:, 2], a[None], a[..., 0], a[1:, ::2], a[:, None, 1:3], a[-1, -2]),
                    [f32(3, 4, 5)]),
    "stepped_slices": (lambda m, a: (a[::2], a[:, 1::3], a[..., ::2], a[1:4:2, ::3]), [f32(5, 7, 4)]),
    "bool_mask": (lambda m, a: (a[a > 0], a[a[:, 0] > 0]), [f32(6, 3)]),
    "int_array_index": (lambda m, a, i: (a[i], a[:, i], a[i, 1]), [f32(4, 4), np.array([3, 0, 3, 1])]),
    "numpy_mask_and_list": (lambda m, a: (a[np.array([True, False, True])], a[[2, 0]]), [f32(3, 2)]),
}


def _torch(x: np.ndarray):
    t = torch.tensor(x)
    if t.dtype == torch.float64:
        t = t.float()
    return t.requires_grad_(True) if t.dtype.is_floating_point else t


def _ggrad(x: np.ndarray):
    return ggrad.tensor(x, requires_grad=x.dtype.kind == "f")


class _TorchModule:
    """torch, with torch.nn.functional reachable as m.nn.functional (ggrad: F)."""

    def __getattr__(self, name):
        return getattr(torch, name)


class _GgradModule:
    class nn:
        functional = F

    def __getattr__(self, name):
        return getattr(ggrad, name)


def _as_tuple(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _tolerance(dtype_name: str) -> float:
    return {"float16": 1e-3, "bfloat16": 8e-3}.get(dtype_name, 1e-6)


@pytest.mark.parametrize("name", CASES)
def test_values_dtypes_and_gradients_equal_torch(dev, name):
    fn, inputs = CASES[name]
    t_in = [_torch(x) for x in inputs]
    t_out = _as_tuple(fn(_TorchModule(), *t_in))
    with ggrad.grad_tape():
        g_in = [_ggrad(x) for x in inputs]
        g_out = _as_tuple(fn(_GgradModule(), *g_in))
        weights = [rng.standard_normal(tuple(t.shape)).astype(np.float32) for t in t_out]
        floats = [i for i, t in enumerate(t_out) if t.dtype.is_floating_point and t.requires_grad]
        if floats:
            sum(((g_out[i].float() * ggrad.tensor(weights[i])).sum() for i in floats), ggrad.tensor(0.0)).backward()
    if floats:
        sum(((t_out[i].float() * torch.tensor(weights[i])).sum() for i in floats), torch.tensor(0.0)).backward()
    assert len(g_out) == len(t_out)
    for k, (g, t) in enumerate(zip(g_out, t_out)):
        expected_dtype = str(t.dtype).removeprefix("torch.")
        assert g.dtype.name == expected_dtype, f"output {k}: dtype {g.dtype}, torch {t.dtype}"
        assert tuple(g.shape) == tuple(t.shape), f"output {k}: shape {g.shape}, torch {tuple(t.shape)}"
        want = t.detach().float().numpy() if t.dtype.is_floating_point else t.numpy()
        got = g.numpy().astype(np.float32) if g.dtype.is_floating_point else g.numpy()
        if t.dtype.is_floating_point:
            tol = _tolerance(expected_dtype)
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol, equal_nan=True, err_msg=f"output {k}")
        else:
            np.testing.assert_array_equal(got, want, err_msg=f"output {k}")
    for k, (g, t) in enumerate(zip(g_in, t_in)):
        if t.grad is None:
            continue
        assert g.grad is not None, f"input {k}: no gradient"
        np.testing.assert_allclose(g.grad.numpy().astype(np.float32), t.grad.numpy(), rtol=1e-5, atol=1e-5,
                                   err_msg=f"input {k} gradient")


def test_result_type_equals_torch():
    t_dtypes = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                "int32": torch.int32, "int64": torch.int64, "bool": torch.bool}
    operands = [(name, nd) for name in t_dtypes for nd in (0, 1)]
    scalars = [1, 1.5, True]
    for a_name, a_nd in operands:
        ta = torch.zeros((2,) * a_nd, dtype=t_dtypes[a_name])
        ga = ggrad.zeros(*((2,) * a_nd), dtype=a_name)
        for b_name, b_nd in operands:
            tb = torch.zeros((2,) * b_nd, dtype=t_dtypes[b_name])
            gb = ggrad.zeros(*((2,) * b_nd), dtype=b_name)
            assert ggrad.result_type(ga, gb).name == str(torch.result_type(ta, tb)).removeprefix("torch."), \
                (a_name, a_nd, b_name, b_nd)
        for s in scalars:
            assert ggrad.result_type(ga, s).name == str(torch.result_type(ta, s)).removeprefix("torch."), \
                (a_name, a_nd, s)


def test_setitem_equals_torch(dev):
    local = np.random.default_rng(5)  # its own draws: the values below must select something
    base = local.standard_normal((4, 5)).astype(np.float32)
    t, g = torch.tensor(base), ggrad.tensor(base)
    address = g.handle.ptr
    for index, value in [((slice(None), 0), 7.0), ((1,), 2.5), ((slice(1, 3), slice(2, 4)), f32(2, 2)),
                         ((Ellipsis, -1), f32(4)), (np.array([3, 0]), 3 * local.standard_normal((2, 5)).astype(np.float32))]:
        t[index] = torch.tensor(value) if isinstance(value, np.ndarray) else value
        g[index] = value
    t[t > 1.0] = -1.0
    g[g > 1.0] = -1.0
    assert int((t < -1.0).sum()) > 0
    t[t < -1.0] = torch.arange(int((t < -1.0).sum()), dtype=torch.float32)
    g[g < -1.0] = ggrad.arange(int((g < -1.0).sum().item()), dtype=ggrad.float32)
    np.testing.assert_array_equal(g.numpy(), t.numpy())
    assert g.handle.ptr == address  # written in place, same buffer


def test_creation_functions_equal_torch():
    pairs = [
        (ggrad.zeros(2, 3), torch.zeros(2, 3)), (ggrad.ones((2,), dtype=ggrad.int32), torch.ones((2,), dtype=torch.int32)),
        (ggrad.full((2, 2), 7), torch.full((2, 2), 7)), (ggrad.full((2,), True), torch.full((2,), True)),
        (ggrad.arange(5), torch.arange(5)), (ggrad.arange(1, 2, 0.25), torch.arange(1, 2, 0.25)),
        (ggrad.linspace(0, 1, 5), torch.linspace(0, 1, 5)), (ggrad.eye(3), torch.eye(3)),
        (ggrad.eye(2, 3), torch.eye(2, 3)), (ggrad.zeros_like(ggrad.tensor([1, 2])), torch.zeros_like(torch.tensor([1, 2]))),
        (ggrad.full_like(ggrad.tensor([1.0, 2.0]), 3), torch.full_like(torch.tensor([1.0, 2.0]), 3)),
    ]
    for g, t in pairs:
        assert g.dtype.name == str(t.dtype).removeprefix("torch.")
        np.testing.assert_array_equal(g.numpy(), t.numpy())
    ggrad.manual_seed(3)
    r, n, i = ggrad.rand(1000), ggrad.randn(1000), ggrad.randint(0, 5, (1000,))
    assert (r.dtype, n.dtype, i.dtype) == (ggrad.float32, ggrad.float32, ggrad.int64)
    assert 0 <= r.numpy().min() and r.numpy().max() < 1 and abs(n.numpy().mean()) < 0.15
    assert set(np.unique(i.numpy())) == {0, 1, 2, 3, 4}


def test_host_data_dtypes_follow_torch_tensor():
    for data in [np.ones(3, np.float16), np.ones(3, np.float64), np.ones(3, np.int32), np.ones(3, np.int64),
                 np.ones(3, bool), [1, 2], [1.0], [True], 3, 2.5]:
        assert ggrad.tensor(data).dtype.name == str(torch.tensor(data).dtype).removeprefix("torch.").replace(
            "float64", "float32"), data
    with pytest.raises(ValueError, match="out of range"):
        ggrad.tensor(np.array([2**40]))  # int64 is stored in 32 bits: refused, never wrapped
    assert ggrad.tensor([1.7, -1.7], dtype=ggrad.int64).tolist() == [1, -1]
    assert str(ggrad.float16) == "ggrad.float16" and ggrad.tensor([1]).long().dtype is ggrad.int64


def test_clamp_leaves_its_input_unchanged(dev):
    """ggml_clamp writes over its source; a clamped leaf read in a later graph was clamped too."""
    x = ggrad.tensor(np.array([-1.0, 0.2, 1.0], np.float32))
    assert x.clamp(-0.5, 0.5).tolist() == pytest.approx([-0.5, 0.2, 0.5])
    assert x.tolist() == pytest.approx([-1.0, 0.2, 1.0])
    assert (x >= -0.5).tolist() == [False, True, True]


def test_the_snippets_that_gave_wrong_answers_before(dev):
    """Each line of the issue that filed this work: ported PyTorch code that was wrong or raised."""
    logits = ggrad.tensor(np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]], np.float32))
    y = np.array([1, 0, 0])
    hits = logits.argmax(-1) == ggrad.tensor(y)
    assert isinstance(hits, ggrad.Tensor) and hits.tolist() == [True, True, False]
    x = ggrad.tensor(np.array([[0.2, 0.7], [0.9, 0.1], [0.6, 0.4]], np.float32))
    assert (x > 0.5).tolist() == [[False, True], [True, False], [True, False]]
    np.testing.assert_allclose(x[np.array([True, False, True])].numpy(), [[0.2, 0.7], [0.6, 0.4]])
    assert x.sum(dim=1).tolist() == pytest.approx([0.9, 1.0, 1.0]) and x.size(0) == 3
    assert x.unsqueeze(0).shape == (1, 3, 2)
    half = ggrad.tensor(np.ones(3, np.float16))
    assert half.dtype is ggrad.float16 and half.numpy().dtype == np.float16
    m = ggrad.nn.Linear(2, 2)
    assert m.to(dev) is m and ggrad.get_device() == dev
    assert m.to(ggrad.float16).weight.dtype is ggrad.float16


def test_float16_and_bfloat16_train_with_gradients_of_their_dtype(dev):
    for dtype, eps in ((ggrad.float16, 1e-3), (ggrad.bfloat16, 8e-3)):
        x = f32(4, 3)
        w = ggrad.tensor(f32(3, 2), dtype=dtype, requires_grad=True)
        with ggrad.grad_tape():
            loss = (ggrad.tensor(x, dtype=dtype) @ w).sigmoid().sum()
            loss.backward()
        assert loss.dtype is dtype and w.grad.dtype is dtype
        tw = torch.tensor(w.numpy().astype(np.float32), requires_grad=True)
        torch.sigmoid(torch.tensor(x).to(getattr(torch, dtype.name)).float() @ tw).sum().backward()
        np.testing.assert_allclose(w.grad.numpy().astype(np.float32), tw.grad.numpy(), rtol=4 * eps, atol=4 * eps)


def test_review_findings_equal_torch(dev):
    """Wrong answers a review found (each compared with torch on the same data)."""
    assert ggrad.zeros(5, 1).sum(-1).shape == (5,) and ggrad.tensor([1.5]).sum().shape == ()
    assert ggrad.tensor([[1.5]]).mean().shape == () and ggrad.zeros(3, 1).max(1)[0].shape == (3,)
    b = np.array([3, -7, 5])
    for got, want in [(2 / ggrad.tensor(b), 2 / torch.tensor(b)), (2 // ggrad.tensor(b), 2 // torch.tensor(b)),
                      (2 % ggrad.tensor(b), 2 % torch.tensor(b)),
                      (1 / ggrad.tensor([True, False]), 1 / torch.tensor([True, False]))]:
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
    x = np.arange(-300, 300)
    for k in (7, 13, 14, 15):
        assert (ggrad.tensor(x) // k).tolist() == (torch.tensor(x) // k).tolist()
        assert (ggrad.tensor(x) % k).tolist() == (torch.tensor(x) % k).tolist()
        assert (ggrad.tensor(x.astype(np.float32)) // k).tolist() == (torch.tensor(x.astype(np.float32)) // k).tolist()
    assert ggrad.randint(5, (6,)).shape == (6,)
    assert ggrad.rand_like(ggrad.zeros(2, dtype=ggrad.float16)).dtype is ggrad.float16


def test_in_place_methods_and_interop_equal_torch(dev):
    base, mask = f32(3, 4), f32(3, 4) > 0
    for method, args in [("fill_", (2.5,)), ("clamp_", (-0.3, 0.3)), ("masked_fill_", (mask, -1.0)),
                         ("copy_", (f32(4),)), ("add_", (1.5,)), ("zero_", ())]:
        t, g = torch.tensor(base), ggrad.tensor(base)
        address = g.handle.ptr
        getattr(t, method)(*(torch.tensor(a) if isinstance(a, np.ndarray) else a for a in args))
        getattr(g, method)(*args)
        np.testing.assert_array_equal(g.numpy(), t.numpy(), err_msg=method)
        assert g.handle.ptr == address, method
    array = np.arange(6, dtype=np.int32).reshape(2, 3)
    for g, t in [(ggrad.from_numpy(array), torch.from_numpy(array)),
                 (ggrad.from_dlpack(torch.arange(4.0)), torch.arange(4.0))]:
        assert g.dtype.name == str(t.dtype).removeprefix("torch.")
        np.testing.assert_array_equal(g.numpy(), t.numpy())
    np.testing.assert_array_equal(torch.from_dlpack(ggrad.tensor(array)).numpy(), array)
