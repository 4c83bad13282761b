"""Layers against float64 numpy references and finite differences; Module mechanics."""

import math

import numpy as np
import pytest

import ggrad
from ggrad import nn
from conftest import tf32

rng = np.random.default_rng(5)


def layer_norm_ref(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def attention_ref(x, wqkv, bqkv, wo, bo, heads, causal):
    b, t, e = x.shape
    d = e // heads
    qkv = x @ wqkv.T + bqkv
    q, k, v = (qkv[..., i * e:(i + 1) * e].reshape(b, t, heads, d).transpose(0, 2, 1, 3) for i in range(3))
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d)
    if causal:
        s = s + np.triu(np.full((t, t), -1e9), 1)
    s = np.exp(s - s.max(-1, keepdims=True))
    a = s / s.sum(-1, keepdims=True)
    y = (a @ v).transpose(0, 2, 1, 3).reshape(b, t, e)
    return y @ wo.T + bo


def test_linear_equals_reference_and_gradchecks(dev):
    layer = nn.Linear(4, 3)
    x = rng.standard_normal((5, 4))
    w, b = layer.weight.numpy(), layer.bias.numpy()
    tol = dict(rtol=3e-3, atol=3e-3) if tf32(dev) else dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(layer(ggrad.tensor(x)).numpy(), x @ w.T + b, **tol)

    def fn(x, w, b):
        layer.weight, layer.bias = w, b
        return layer(x)
    # TF32 on CUDA: a linear map's differences are exact for any step, so a large step
    # divides the ~1e-3 rounding of each product instead of amplifying it
    step = dict(eps=0.5, rtol=0.02, atol=0.01) if tf32(dev) else {}
    assert ggrad.gradcheck(fn, [x, w, b], **step)


def test_layer_norm(dev):
    x, w, b = rng.standard_normal((3, 6)), rng.standard_normal(6), rng.standard_normal(6)
    ln = nn.LayerNorm(6)

    def fn(x, w, b):
        ln.weight, ln.bias = w, b
        return ln(x)
    got = fn(ggrad.tensor(x), ggrad.tensor(w), ggrad.tensor(b)).numpy()
    np.testing.assert_allclose(got, layer_norm_ref(x, w, b), rtol=1e-4, atol=1e-5)
    assert ggrad.gradcheck(fn, [x, w, b])


def test_batch_norm_train_eval_and_running_stats(dev):
    x = rng.standard_normal((8, 4)) * 2 + 1
    bn = nn.BatchNorm1d(4, momentum=0.1)
    y = bn(ggrad.tensor(x)).numpy()
    mu, var = x.mean(0), x.var(0)
    np.testing.assert_allclose(y, (x - mu) / np.sqrt(var + 1e-5), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(bn.running_mean.numpy(), 0.9 * 0 + 0.1 * mu, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn.running_var.numpy(), 0.9 * 1 + 0.1 * x.var(0, ddof=1), rtol=1e-5)
    ptr = bn.running_mean.handle.ptr
    bn.eval()
    z = rng.standard_normal((3, 4))
    expected = (z - bn.running_mean.numpy()) / np.sqrt(bn.running_var.numpy() + 1e-5)
    np.testing.assert_allclose(bn(ggrad.tensor(z)).numpy(), expected, rtol=1e-4, atol=1e-5)
    assert bn.running_mean.handle.ptr == ptr  # updated in place
    bn.train()

    def fn(x, w, b):
        bn.weight, bn.bias = w, b
        return bn(x)
    assert ggrad.gradcheck(fn, [x, rng.standard_normal(4), rng.standard_normal(4)])


@pytest.mark.parametrize("causal", [False, True])
def test_attention_equals_reference(dev, causal):
    ggrad.manual_seed(1)
    attn = nn.MultiheadAttention(8, 2, batch_first=True)
    x = rng.standard_normal((2, 3, 8))
    ref = attention_ref(x, attn.in_proj_weight.numpy(), attn.in_proj_bias.numpy(), attn.out_proj.weight.numpy(),
                        attn.out_proj.bias.numpy(), 2, causal)

    def self_attention(x):
        return attn(x, x, x, need_weights=False, is_causal=causal)[0]
    tol = dict(rtol=3e-3, atol=3e-3) if tf32(dev) else dict(rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(self_attention(ggrad.tensor(x)).numpy(), ref, **tol)
    assert ggrad.gradcheck(self_attention, [x], rtol=2e-2, atol=2e-3)


def test_transformer_block_trains(dev):
    ggrad.manual_seed(2)
    block = nn.Sequential(nn.TransformerBlock(8, 2), nn.Linear(8, 4))
    x = ggrad.tensor(rng.standard_normal((2, 5, 8)))
    y = ggrad.tensor(rng.standard_normal((2, 5, 4)))
    opt = ggrad.optim.Adam(block.parameters(), lr=1e-2)
    losses = []
    for _ in range(10):
        with ggrad.grad_tape():
            loss = ggrad.functional.mse_loss(block(x), y)
            loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] and np.isfinite(losses).all()


def test_module_registration_state_dict_and_modes():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Dropout(0.5))
            self.heads = nn.ModuleList([nn.Linear(4, 2), nn.Linear(4, 1)])
            self.extra = nn.ModuleDict({"norm": nn.BatchNorm1d(4)})
            self.scale = ggrad.param(np.ones(1))

    net = Net()
    names = [n for n, _ in net.named_parameters()]
    assert names == ["scale", "body.0.weight", "body.0.bias", "heads.0.weight", "heads.0.bias",
                     "heads.1.weight", "heads.1.bias", "extra.norm.weight", "extra.norm.bias"]
    assert "extra.norm.running_mean" in net.state_dict()
    net.eval()
    assert not any(m.training for m in net.modules())
    net.train()
    assert all(m.training for m in net.modules())
    assert "Linear(in_features=3, out_features=4, bias=True)" in repr(net)

    other = Net()
    ptr = other.body[0].weight.handle.ptr
    other.load_state_dict(net.state_dict())
    assert other.body[0].weight.handle.ptr == ptr
    np.testing.assert_array_equal(other.body[0].weight.numpy(), net.body[0].weight.numpy())

    bad = {k: v.numpy() for k, v in net.state_dict().items()}
    bad["body.0.weight"] = np.zeros((2, 2), np.float32)
    bad["nope"] = np.zeros(1, np.float32)
    del bad["scale"]
    before = other.body[0].bias.numpy()
    with pytest.raises(ValueError, match=r"missing keys: \['scale'\].*unexpected keys: \['nope'\].*body.0.weight"):
        other.load_state_dict(bad)
    np.testing.assert_array_equal(other.body[0].bias.numpy(), before)  # nothing changed


def test_manual_seed_reproduces_init_and_dropout():
    def run():
        ggrad.manual_seed(7)
        layer = nn.Linear(4, 4)
        drop = nn.Dropout(0.5)
        return layer.weight.numpy(), drop(ggrad.tensor(np.ones((4, 4)))).numpy()
    a, b = run(), run()
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert set(np.unique(a[1])) <= {0.0, 2.0}


def test_dropout_draws_on_the_device_without_crossings(dev):
    ggrad.manual_seed(3)
    drop = nn.Dropout(0.25)
    x = ggrad.tensor(np.ones((64, 64)))
    ggrad.realize(drop(x))  # uploads x and the generator's 4-byte state, once
    with ggrad.count_transfers() as t:
        a = drop(x)
        b = drop(x)
        ggrad.realize(a, b)
    assert t.crossings == 0
    a, b = a.numpy(), b.numpy()
    assert set(np.unique(a)) <= {0.0, np.float32(1 / 0.75)}
    assert abs((a == 0).mean() - 0.25) < 0.03 and abs((b == 0).mean() - 0.25) < 0.03
    assert (a != b).any()  # the state advanced between the draws
    drop.eval()
    np.testing.assert_array_equal(drop(x).numpy(), np.ones((64, 64)))


def test_a_transformer_language_model_gradient_matches_finite_differences(dev):
    """End to end through embedding, positions, a pre-norm block and the loss: on the CPU
    it catches ggml computing SOFT_MAX_BACK in place over the softmax's output, which its
    kernel overwrites before reading (ops.py `_softmax_back`)."""
    ggrad.manual_seed(0)
    vocab, context, dim = 11, 6, 8

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = nn.Embedding(vocab, dim)
            self.positions = ggrad.param(np.random.default_rng(1).standard_normal((context, dim)) * 0.1)
            self.block = nn.TransformerBlock(dim, 2, causal=True)
            self.head = nn.Linear(dim, vocab)

        def forward(self, ids):
            return self.head(self.block(self.tokens(ids) * 0.5 + self.positions))

    model = LM()
    ids = np.random.default_rng(2).integers(0, vocab, (3, context + 1))
    x, y = ggrad.tensor(ids[:, :-1]), ggrad.tensor(ids[:, 1:].reshape(-1))

    def loss():
        return ggrad.functional.cross_entropy(model(x).reshape(-1, vocab), y)

    with ggrad.grad_tape():
        loss().backward()
    reduced = tf32(dev)
    for name, p in model.named_parameters():
        grad, base = p.grad.numpy().ravel(), p.numpy()
        for j in np.argsort(-np.abs(grad))[:2]:
            values = []
            for delta in (1e-2, -1e-2):
                v = base.copy().ravel()
                v[j] += delta
                with ggrad.no_grad():
                    p.assign_(v.reshape(base.shape))
                    values.append(loss().item())
            with ggrad.no_grad():
                p.assign_(base)
            numeric = (values[0] - values[1]) / 2e-2
            assert abs(numeric - grad[j]) <= (3e-2 if reduced else 3e-3) * abs(grad[j]) + 1e-3, (name, j, numeric, grad[j])


@pytest.mark.parametrize("x_shape,w_shape,bias", [((5, 4), (3, 4), True), ((2, 5, 4), (3, 4), False),
                                                  ((2, 5, 4), (3, 4), True), ((5, 4), (4,), False),
                                                  ((4,), (3, 4), True)])
def test_functional_linear_equals_torch(dev, x_shape, w_shape, bias):
    """F.linear: torch's shapes (a 1-d weight drops the output axis), values and gradients."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in (x_shape, w_shape)]
    if bias:
        arrays.append(rng.standard_normal(w_shape[:1]).astype(np.float32))
    ours = [ggrad.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    with ggrad.grad_tape():
        y = ggrad.functional.linear(*ours)
        (y * y).sum().backward()
    want = torch.nn.functional.linear(*theirs)
    (want * want).sum().backward()
    assert y.shape == tuple(want.shape)
    np.testing.assert_allclose(y.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("x_shape,w_shape", [((5, 4), (3, 4)), ((2, 5, 4), (3, 4)), ((300, 70), (90, 70)),
                                              ((13, 70), (300, 70))])
def test_linear_with_bias_is_one_op_equal_to_its_parts(dev, x_shape, w_shape):
    """F.linear's float32 case with a bias records one op (eager Python per layer), and its
    value and gradients are bit-equal to the product and the sum recorded apart (on the
    CPU the bias is added by the GEMM kernel's threads, to the rows or the columns each
    computed: the larger shapes)."""
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in (x_shape, w_shape, w_shape[:1])]
    results = []
    for fused in (True, False):
        x, w, b = [ggrad.tensor(a, requires_grad=True) for a in arrays]
        with ggrad.grad_tape():
            y = ggrad.functional.linear(x, w, b) if fused else ggrad.functional.matmul_nt(x, w) + b
            assert (y.node.op == "linear") == fused
            (y * y).sum().backward()
        results.append([t.numpy() for t in (y, x.grad, w.grad, b.grad)])
    for got, want in zip(*results):
        np.testing.assert_array_equal(got, want)
