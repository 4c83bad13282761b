"""Attention against torch on the same weights, on every device: scaled_dot_product_attention,
MultiheadAttention (layouts, kdim/vdim, masks, returned weights), the encoder and decoder
layers both ways round (norm_first) and their stacks; values and all gradients."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch (the test oracle) is not installed: pip install -e .[test]")

import ggrad  # noqa: E402
import ggrad.functional as F  # noqa: E402
from ggrad import nn  # noqa: E402
from conftest import assert_close  # noqa: E402

rng = np.random.default_rng(5)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def _outputs(result):
    return [r for r in (result if isinstance(result, tuple) else (result,)) if r is not None]


def compare(dev, g_result_fn, t_result_fn, arrays, g_params=(), t_params=()):
    """Run both, backprop a random weighting of every output, compare outputs, the float
    inputs' gradients and the parameters' gradients."""
    floats = [a.dtype.kind == "f" for a in arrays]
    g_in = [ggrad.tensor(a, requires_grad=f) for a, f in zip(arrays, floats)]
    t_in = [torch.tensor(a, requires_grad=f) for a, f in zip(arrays, floats)]
    with ggrad.grad_tape():
        g_out = _outputs(g_result_fn(*g_in))
        weights = [rng.standard_normal(o.shape).astype(np.float32) for o in g_out]
        sum(((o * ggrad.tensor(w)).sum() for o, w in zip(g_out, weights)), ggrad.tensor(0.0)).backward()
    t_out = _outputs(t_result_fn(*t_in))
    sum((o * torch.tensor(w)).sum() for o, w in zip(t_out, weights)).backward()
    assert len(g_out) == len(t_out)
    for k, (g, t) in enumerate(zip(g_out, t_out)):
        assert_close(dev, g.numpy(), t.detach().numpy(), err_msg=f"output {k}")
    for k, (g, t, f) in enumerate(zip(g_in, t_in, floats)):
        if f:
            assert_close(dev, g.grad.numpy(), t.grad.numpy(), rtol=1e-4, err_msg=f"input {k}")
    t_named = dict(t_params)
    for key, p in g_params:
        assert_close(dev, p.grad.numpy(), t_named[key].grad.numpy(), rtol=1e-4, err_msg=key)


def twins(make):
    t_module = make(torch.nn)
    g_module = make(nn)
    assert list(g_module.state_dict()) == list(t_module.state_dict())
    with torch.no_grad():  # random biases too: zeros would hide a swapped term
        for _, p in t_module.named_parameters():
            p.copy_(torch.from_numpy(rng.uniform(-0.5, 0.5, tuple(p.shape)).astype(np.float32)))
    g_module.load_state_dict(t_module.state_dict(), strict=True)
    return g_module, t_module


CAUSAL_BOOL = np.tril(np.ones((4, 6), bool))
EMPTY_ROWS = CAUSAL_BOOL.copy()
EMPTY_ROWS[[0, 2]] = False  # queries with no key: torch's SDPA gives zeros, and zero gradients
EMPTY_FLOAT = np.where(np.broadcast_to(EMPTY_ROWS, (2, 4, 6)), f32(2, 4, 6), -np.inf).astype(np.float32)
EMPTY_FLOAT[1] = np.where(CAUSAL_BOOL, EMPTY_FLOAT[1], -np.inf)
SDPA = {
    "plain": (lambda m, q, k, v: m.scaled_dot_product_attention(q, k, v), [f32(2, 3, 4, 8), f32(2, 3, 6, 8), f32(2, 3, 6, 5)]),
    "causal": (lambda m, q, k, v: m.scaled_dot_product_attention(q, k, v, is_causal=True),
               [f32(2, 4, 8), f32(2, 6, 8), f32(2, 6, 8)]),
    "bool_mask_scale": (lambda m, q, k, v, mask: m.scaled_dot_product_attention(q, k, v, mask, scale=0.3),
                        [f32(2, 4, 8), f32(2, 6, 8), f32(2, 6, 8), CAUSAL_BOOL]),
    "float_mask": (lambda m, q, k, v, mask: m.scaled_dot_product_attention(q, k, v, mask),
                   [f32(2, 4, 8), f32(2, 6, 8), f32(2, 6, 8), f32(4, 6)]),
    "scalar_mask": (lambda m, q, k, v, mask: m.scaled_dot_product_attention(q, k, v, mask),
                    [f32(2, 4, 8), f32(2, 6, 8), f32(2, 6, 8), np.float32(0.5)]),
    "bool_mask_empty_rows": (lambda m, q, k, v, mask: m.scaled_dot_product_attention(q, k, v, mask),
                             [f32(2, 4, 8), f32(2, 6, 8), f32(2, 6, 8), EMPTY_ROWS]),
    "float_mask_empty_rows": (lambda m, q, k, v, mask: m.scaled_dot_product_attention(q, k, v, mask),
                              [f32(2, 4, 8), f32(2, 6, 8), f32(2, 6, 8), EMPTY_FLOAT]),
}


@pytest.mark.parametrize("name", sorted(SDPA))
def test_sdpa_equals_torch(dev, name):
    fn, arrays = SDPA[name]
    compare(dev, lambda *a: fn(F, *a), lambda *a: fn(torch.nn.functional, *a), arrays)


PADDING = np.array([[False] * 5 + [True], [False] * 6])
MHA = {
    "self_seq_first": (lambda m: m.MultiheadAttention(8, 2),
                       lambda mod, x: mod(x, x, x), [f32(5, 2, 8)]),
    "batch_first_weights_per_head": (lambda m: m.MultiheadAttention(8, 4, batch_first=True),
                                     lambda mod, x: mod(x, x, x, average_attn_weights=False), [f32(2, 5, 8)]),
    "cross_kdim_vdim": (lambda m: m.MultiheadAttention(8, 2, kdim=6, vdim=3, batch_first=True),
                        lambda mod, q, k, v: mod(q, k, v), [f32(2, 4, 8), f32(2, 6, 6), f32(2, 6, 3)]),
    "masks": (lambda m: m.MultiheadAttention(8, 2, batch_first=True),
              lambda mod, q, kv, mask, pad: mod(q, kv, kv, attn_mask=mask, key_padding_mask=pad),
              [f32(2, 4, 8), f32(2, 6, 8), ~CAUSAL_BOOL, PADDING]),
    "float_mask_per_head_no_weights": (lambda m: m.MultiheadAttention(8, 2, batch_first=True, bias=False),
                                       lambda mod, q, kv, mask: mod(q, kv, kv, attn_mask=mask, need_weights=False),
                                       [f32(2, 4, 8), f32(2, 6, 8), f32(4, 4, 6)]),
    "unbatched": (lambda m: m.MultiheadAttention(8, 2), lambda mod, x: mod(x, x, x), [f32(5, 8)]),
}


@pytest.mark.parametrize("name", sorted(MHA))
def test_multihead_attention_equals_torch(dev, name):
    make, call, arrays = MHA[name]
    g_module, t_module = twins(make)
    compare(dev, lambda *a: call(g_module, *a), lambda *a: call(t_module, *a), arrays,
            list(g_module.named_parameters()), list(t_module.named_parameters()))


LAYERS = {
    "encoder_post_norm": (lambda m: m.TransformerEncoderLayer(8, 2, 16, dropout=0.0),
                          lambda mod, x: mod(x), [f32(5, 2, 8)]),
    "encoder_pre_norm_gelu_mask": (lambda m: m.TransformerEncoderLayer(8, 2, 16, 0.0, "gelu", batch_first=True,
                                                                       norm_first=True),
                                   lambda mod, x, pad: mod(x, src_key_padding_mask=pad), [f32(2, 6, 8), PADDING]),
    "decoder_post_norm_causal": (lambda m: m.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
                                 lambda mod, t, mem, mask: mod(t, mem, tgt_mask=mask),
                                 [f32(2, 4, 8), f32(2, 6, 8), ~np.tril(np.ones((4, 4), bool))]),
    "decoder_pre_norm": (lambda m: m.TransformerDecoderLayer(8, 2, 16, dropout=0.0, norm_first=True),
                         lambda mod, t, mem: mod(t, mem), [f32(4, 2, 8), f32(6, 2, 8)]),
    "encoder_stack_norm": (lambda m: m.TransformerEncoder(m.TransformerEncoderLayer(8, 2, 16, 0.0, batch_first=True),
                                                          2, norm=m.LayerNorm(8)),
                           lambda mod, x: mod(x), [f32(2, 5, 8)]),
    "decoder_stack": (lambda m: m.TransformerDecoder(m.TransformerDecoderLayer(8, 2, 16, 0.0, batch_first=True), 2),
                      lambda mod, t, mem: mod(t, mem), [f32(2, 4, 8), f32(2, 5, 8)]),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_transformer_layers_equal_torch(dev, name):
    make, call, arrays = LAYERS[name]
    g_module, t_module = twins(make)
    compare(dev, lambda *a: call(g_module, *a), lambda *a: call(t_module, *a), arrays,
            list(g_module.named_parameters()), list(t_module.named_parameters()))


def test_stacks_copy_the_layer_they_are_given():
    layer = nn.TransformerEncoderLayer(8, 2, 16)
    stack = nn.TransformerEncoder(layer, 3)
    for copy in stack.layers:
        assert copy is not layer
        np.testing.assert_array_equal(copy.linear1.weight.numpy(), layer.linear1.weight.numpy())


# ---- half precision: the causal mask takes the scores' dtype ------------------------------
ULP = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}
CAUSAL_SQUARE = ~np.tril(np.ones((5, 5), bool))  # MultiheadAttention's: True is masked out
HALF = {
    "sdpa_causal": (None, lambda m, q, k, v: m.scaled_dot_product_attention(q, k, v, is_causal=True),
                    lambda m, q, k, v: m.scaled_dot_product_attention(q, k, v, is_causal=True),
                    [f32(2, 3, 5, 8), f32(2, 3, 5, 8), f32(2, 3, 5, 8)]),
    "sdpa_bool_mask": (None, lambda m, q, k, v, mask: m.scaled_dot_product_attention(q, k, v, mask),
                       lambda m, q, k, v, mask: m.scaled_dot_product_attention(q, k, v, mask),
                       [f32(2, 4, 8), f32(2, 6, 8), f32(2, 6, 8), CAUSAL_BOOL]),
    "mha_causal": (lambda m: m.MultiheadAttention(8, 2, batch_first=True),
                   lambda mod, x: mod(x, x, x, is_causal=True, need_weights=False),
                   lambda mod, x: mod(x, x, x, attn_mask=torch.from_numpy(CAUSAL_SQUARE), need_weights=False),
                   [f32(2, 5, 8)]),
    "mha_masks": (lambda m: m.MultiheadAttention(8, 2, batch_first=True),
                  lambda mod, q, kv, mask, pad: mod(q, kv, kv, attn_mask=mask, key_padding_mask=pad),
                  lambda mod, q, kv, mask, pad: mod(q, kv, kv, attn_mask=mask, key_padding_mask=pad),
                  [f32(2, 4, 8), f32(2, 6, 8), ~CAUSAL_BOOL, PADDING]),
}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(HALF))
def test_half_precision_attention_equals_torch(dev, name, dtype):
    """Causal and masked attention on float16/bfloat16 inputs (and module weights) stays in
    that dtype (a float32 mask promoted the scores, and the product with v raised) and
    equals torch's in the same dtype, values and gradients, within a few units in the
    last place of the largest value."""
    make, g_call, t_call, arrays = HALF[name]
    tdtype = getattr(torch, dtype)
    if make is None:
        g_fn, t_fn = (lambda *a: g_call(F, *a)), (lambda *a: t_call(torch.nn.functional, *a))
        g_params, t_params = [], []
    else:
        g_module, t_module = twins(make)
        g_module.to(dtype=dtype)
        t_module.to(tdtype)
        g_fn, t_fn = (lambda *a: g_call(g_module, *a)), (lambda *a: t_call(t_module, *a))
        g_params, t_params = list(g_module.named_parameters()), list(t_module.named_parameters())
    floats = [a.dtype.kind == "f" for a in arrays]
    g_in = [ggrad.tensor(a, dtype=dtype, requires_grad=True) if f else ggrad.tensor(a) for a, f in zip(arrays, floats)]
    t_in = [torch.tensor(a).to(tdtype).requires_grad_() if f else torch.tensor(a) for a, f in zip(arrays, floats)]
    with ggrad.grad_tape():
        g_out = _outputs(g_fn(*g_in))
        weights = [rng.standard_normal(o.shape).astype(np.float32) for o in g_out]
        sum(((o * ggrad.tensor(w, dtype=dtype)).sum() for o, w in zip(g_out, weights)),
            ggrad.tensor(0.0, dtype=dtype)).backward()
    t_out = _outputs(t_fn(*t_in))
    sum((o * torch.tensor(w).to(tdtype)).sum() for o, w in zip(t_out, weights)).backward()
    pairs = [(f"output {k}", g, t.detach()) for k, (g, t) in enumerate(zip(g_out, t_out))]
    pairs += [(f"input {k}", g.grad, t.grad) for k, (g, t, f) in enumerate(zip(g_in, t_in, floats)) if f]
    pairs += [(key, p.grad, dict(t_params)[key].grad) for key, p in g_params]
    for what, g, t in pairs:
        assert g.dtype.name == dtype, (what, g.dtype)
        want = t.float().numpy()
        np.testing.assert_allclose(g.numpy().astype(np.float32), want, rtol=0,
                                   atol=4 * ULP[dtype] * float(np.abs(want).max()), err_msg=what)
