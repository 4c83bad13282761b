"""RNN, LSTM, GRU and their cells against torch's on the same weights, on every device:
outputs, final states, the input's and every parameter's gradients; a compiled LSTM
step is one dispatch that crosses nothing."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch (the test oracle) is not installed: pip install -e .[test]")

import ggrad  # noqa: E402
from ggrad import nn  # noqa: E402
from conftest import assert_close, assert_resident_training  # noqa: E402

rng = np.random.default_rng(7)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def flat(result):
    """Every tensor in a module's result, in order (output, h_n, c_n...)."""
    if isinstance(result, (tuple, list)):
        return [t for r in result for t in flat(r)]
    return [result]


CASES = {
    "lstm_2_layers_bidirectional_batch_first": (
        lambda m: m.LSTM(4, 5, num_layers=2, batch_first=True, bidirectional=True), lambda mod, x: mod(x),
        [f32(3, 6, 4)]),
    "lstm_initial_state_seq_first": (
        lambda m: m.LSTM(4, 5), lambda mod, x, h, c: mod(x, (h, c)), [f32(6, 3, 4), f32(1, 3, 5), f32(1, 3, 5)]),
    "gru_with_h0": (lambda m: m.GRU(4, 5, num_layers=2), lambda mod, x, h: mod(x, h),
                    [f32(6, 3, 4), f32(2, 3, 5)]),
    "gru_bidirectional_no_bias": (lambda m: m.GRU(4, 3, bias=False, bidirectional=True, batch_first=True),
                                  lambda mod, x: mod(x), [f32(2, 5, 4)]),
    "rnn_relu": (lambda m: m.RNN(4, 5, nonlinearity="relu", num_layers=2), lambda mod, x: mod(x), [f32(5, 2, 4)]),
    "rnn_unbatched": (lambda m: m.RNN(4, 5), lambda mod, x, h: mod(x, h), [f32(5, 4), f32(1, 5)]),
    "lstm_unbatched": (lambda m: m.LSTM(4, 5, bidirectional=True), lambda mod, x: mod(x), [f32(5, 4)]),
    "lstm_cell": (lambda m: m.LSTMCell(4, 5), lambda mod, x, h, c: mod(x, (h, c)), [f32(3, 4), f32(3, 5), f32(3, 5)]),
    "gru_cell": (lambda m: m.GRUCell(4, 5), lambda mod, x, h: mod(x, h), [f32(3, 4), f32(3, 5)]),
    "rnn_cell_no_state": (lambda m: m.RNNCell(4, 5, nonlinearity="relu"), lambda mod, x: mod(x), [f32(3, 4)]),
    "gru_cell_unbatched": (lambda m: m.GRUCell(4, 5), lambda mod, x: mod(x), [f32(4)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_recurrent_equals_torch(dev, name):
    make, call, arrays = CASES[name]
    t_module = make(torch.nn)
    g_module = make(nn)
    assert list(g_module.state_dict()) == list(t_module.state_dict())
    g_module.load_state_dict(t_module.state_dict(), strict=True)
    g_in = [ggrad.tensor(a, requires_grad=True) for a in arrays]
    t_in = [torch.tensor(a, requires_grad=True) for a in arrays]
    with ggrad.grad_tape():
        g_out = flat(call(g_module, *g_in))
        weights = [rng.standard_normal(o.shape).astype(np.float32) for o in g_out]
        sum(((o * ggrad.tensor(w)).sum() for o, w in zip(g_out, weights)), ggrad.tensor(0.0)).backward()
    t_out = flat(call(t_module, *t_in))
    sum((o * torch.tensor(w)).sum() for o, w in zip(t_out, weights)).backward()
    assert [o.shape for o in g_out] == [tuple(o.shape) for o in t_out]
    for k, (g, t) in enumerate(zip(g_out, t_out)):
        assert_close(dev, g.numpy(), t.detach().numpy(), err_msg=f"output {k}")
    for k, (g, t) in enumerate(zip(g_in, t_in)):
        assert_close(dev, g.grad.numpy(), t.grad.numpy(), err_msg=f"input {k}")
    t_params = dict(t_module.named_parameters())
    for key, p in g_module.named_parameters():
        # ggml-cuda is built without fast math (scripts/patch_ggml_cuda.py): with it, tanh/exp
        # summed over the time steps reached ~3e-5 relative in these gradients on the H200
        assert_close(dev, p.grad.numpy(), t_params[key].grad.numpy(), err_msg=key)


def test_default_initialisation_is_torch_law():
    ggrad.manual_seed(0)
    values = np.concatenate([p.numpy().ravel() for p in nn.LSTM(8, 16, 2).parameters()])
    assert np.abs(values).max() <= 0.25 and np.abs(values).max() > 0.24  # U(-1/sqrt(16), 1/sqrt(16))


def test_dropout_is_between_layers_and_only_in_training(dev):
    """Eval mode is torch's eval output; in training the first layer's final state is
    untouched (dropout only feeds the next layer) while the output changes."""
    t_module = torch.nn.LSTM(4, 16, num_layers=2, dropout=0.5).eval()
    g_module = nn.LSTM(4, 16, num_layers=2, dropout=0.5)
    g_module.load_state_dict(t_module.state_dict(), strict=True)
    x = f32(5, 3, 4)
    expected, (h_expected, _) = t_module(torch.tensor(x))
    out, (h_n, _) = g_module.eval()(ggrad.tensor(x))
    assert_close(dev, out.numpy(), expected.detach().numpy())
    ggrad.manual_seed(0)
    out, (h_n, _) = g_module.train()(ggrad.tensor(x))
    assert_close(dev, h_n.numpy()[0], h_expected.detach().numpy()[0])
    assert not np.allclose(out.numpy(), expected.detach().numpy(), atol=1e-3)


def test_numpy_inputs_are_taken_as_tensors():
    lstm = nn.LSTM(4, 5, batch_first=True)
    x, h, c = f32(2, 3, 4), f32(1, 2, 5), f32(1, 2, 5)
    out, (h_n, c_n) = lstm(x, (h, c))
    np.testing.assert_allclose(out.numpy(), lstm(ggrad.tensor(x), (ggrad.tensor(h), ggrad.tensor(c)))[0].numpy())
    assert nn.GRUCell(4, 5)(f32(2, 4), f32(2, 5)).shape == (2, 5)


def test_a_compiled_lstm_step_is_one_dispatch_and_crosses_nothing(dev):
    ggrad.manual_seed(0)
    lstm, head = nn.LSTM(6, 8, num_layers=2, batch_first=True), nn.Linear(8, 3)
    assert_resident_training(lambda x: head(lstm(x)[0][:, -1]), [*lstm.parameters(), *head.parameters()],
                             ggrad.tensor(f32(4, 5, 6)), ggrad.tensor(rng.integers(0, 3, 4)))


@pytest.mark.parametrize("call, message", [
    (lambda: nn.LSTM(4, 5)(ggrad.tensor(f32(3, 2, 3))), "input_size=4"),
    (lambda: nn.GRU(4, 5)(ggrad.tensor(f32(3, 2, 4)), ggrad.tensor(f32(2, 2, 5))), "h0 must have shape"),
    (lambda: nn.LSTM(4, 5)(ggrad.tensor(f32(3, 2, 4)), ggrad.tensor(f32(1, 2, 5))), "tuple"),
    (lambda: nn.RNN(4, 5, nonlinearity="sigmoid"), "nonlinearity"),
    (lambda: nn.LSTMCell(4, 5)(ggrad.tensor(f32(2, 4)), (ggrad.tensor(f32(3, 5)), ggrad.tensor(f32(3, 5)))), "shape"),
    # a bare (2, H) tensor must not be split into h and c along its first axis
    (lambda: nn.LSTMCell(4, 5)(ggrad.tensor(f32(4)), ggrad.tensor(f32(2, 5))), "tuple"),
    (lambda: nn.LSTMCell(4, 5)(ggrad.tensor(f32(2, 4)), (ggrad.tensor(f32(2, 5)), None)), "tuple"),
    (lambda: nn.LSTM(4, 5)(ggrad.tensor(f32(3, 2, 4)), (ggrad.tensor(f32(1, 2, 5)),) * 3), "tuple"),
    (lambda: nn.GRU(4, 5)(ggrad.tensor(f32(3, 2, 4)), (ggrad.tensor(f32(1, 2, 5)),)), "one tensor"),
    (lambda: nn.RNN(4, 5)(ggrad.tensor(f32(3, 4)), ggrad.tensor(f32(1, 1, 5))), "h0 must have shape"),
    (lambda: nn.RNN(4, 5)(ggrad.tensor(f32(3, 2, 4, 1))), "input_size=4"),
    (lambda: nn.GRUCell(4, 5)(ggrad.tensor(f32(3, 2, 4))), r"\(N, 4\)"),
    (lambda: nn.LSTM(4, 5, dropout=1.0), "dropout"),
])
def test_bad_arguments_raise(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_what_torch_warns_or_refuses():
    with pytest.warns(UserWarning, match="num_layers=1"):
        nn.GRU(4, 5, dropout=0.2)
    assert nn.LSTM(4, 5, proj_size=0).hidden_size == 5
    with pytest.raises(NotImplementedError, match="proj_size"):
        nn.LSTM(4, 5, proj_size=3)
    with pytest.raises(TypeError, match="Tensor or an array"):
        nn.RNN(4, 5)([[0.0] * 4] * 3)


@pytest.mark.parametrize("cls", ["LSTM", "GRU", "RNN"])
def test_packed_sequences_run_as_torchs(dev, cls):
    """pack_padded_sequence (unsorted lengths, batch_first), a 2-layer bidirectional
    recurrent layer over the PackedSequence, pad_packed_sequence: the packed data, batch
    sizes and orders, the padded outputs (padding_value past each end), the final states
    and every gradient (input and weights) equal torch's."""
    import torch.nn.utils.rnn as torch_rnn
    from ggrad.nn.utils import rnn
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 6, 3)).astype(np.float32)  # batch first
    lengths = [4, 6, 2, 5]
    torch.manual_seed(0)  # the same weights whatever ran before (an unseeded init made the test order-dependent)
    theirs = getattr(torch.nn, cls)(3, 5, num_layers=2, bidirectional=True)
    ours = getattr(nn, cls)(3, 5, num_layers=2, bidirectional=True)
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    xt = torch.tensor(x, requires_grad=True)
    packed_t = torch_rnn.pack_padded_sequence(xt, lengths, batch_first=True, enforce_sorted=False)
    out_t, state_t = theirs(packed_t)
    padded_t, lengths_t = torch_rnn.pad_packed_sequence(out_t, batch_first=True, padding_value=-1.0, total_length=7)
    h_t = state_t[0] if cls == "LSTM" else state_t
    (padded_t.sum() + (h_t * h_t).sum()).backward()
    xg = ggrad.tensor(x, requires_grad=True)
    with ggrad.grad_tape():
        packed = rnn.pack_padded_sequence(xg, lengths, batch_first=True, enforce_sorted=False)
        out, state = ours(packed)
        padded, lengths_g = rnn.pad_packed_sequence(out, batch_first=True, padding_value=-1.0, total_length=7)
        h = state[0] if cls == "LSTM" else state
        (padded.sum() + (h * h).sum()).backward()
    for key in ("batch_sizes", "sorted_indices", "unsorted_indices"):
        assert np.array_equal(getattr(packed, key).numpy(), getattr(packed_t, key).numpy()), key
        assert np.array_equal(getattr(out, key).numpy(), getattr(out_t, key).numpy()), key
    assert np.array_equal(lengths_g.numpy(), lengths_t.numpy()) and lengths_g.dtype is ggrad.int64
    close = dict(rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.data.numpy(), out_t.data.detach().numpy(), **close)
    np.testing.assert_allclose(padded.numpy(), padded_t.detach().numpy(), **close)
    np.testing.assert_allclose(h.numpy(), h_t.detach().numpy(), **close)
    np.testing.assert_allclose(xg.grad.numpy(), xt.grad.numpy(), **close)
    for name, p in theirs.named_parameters():
        np.testing.assert_allclose(dict(ours.named_parameters())[name].grad.numpy(), p.grad.numpy(), **close)


def test_pad_and_pack_sequence_as_torchs(dev):
    """pad_sequence (both sides), pack_sequence and their errors, as torch's."""
    import torch.nn.utils.rnn as torch_rnn
    from ggrad.nn.utils import rnn
    rng = np.random.default_rng(1)
    seqs = [rng.standard_normal((n, 2)).astype(np.float32) for n in (3, 1, 4)]
    for kwargs in (dict(), dict(batch_first=True, padding_value=9.0), dict(padding_side="left")):
        np.testing.assert_array_equal(rnn.pad_sequence([ggrad.tensor(s) for s in seqs], **kwargs).numpy(),
                                      torch_rnn.pad_sequence([torch.tensor(s) for s in seqs], **kwargs).numpy())
    ordered = sorted(seqs, key=len, reverse=True)
    ours, theirs = rnn.pack_sequence([ggrad.tensor(s) for s in ordered]), torch_rnn.pack_sequence(
        [torch.tensor(s) for s in ordered])
    np.testing.assert_array_equal(ours.data.numpy(), theirs.data.numpy())
    np.testing.assert_array_equal(ours.batch_sizes.numpy(), theirs.batch_sizes.numpy())
    assert ours.sorted_indices is None and theirs.sorted_indices is None
    x = ggrad.tensor(np.zeros((4, 3, 2), np.float32))
    with pytest.raises(RuntimeError, match="sorted in decreasing order"):
        rnn.pack_padded_sequence(x, [2, 4, 1])
    with pytest.raises(RuntimeError, match="greater than 0"):
        rnn.pack_padded_sequence(x, [4, 0, 1], enforce_sorted=False)


def _run_layer(module, x, states, weights):
    """(the output, the final states, then the gradients of x, the initial states and every
    parameter) of a weighted sum of the results, as float64 arrays."""
    module.zero_grad()
    inputs = [ggrad.tensor(a, requires_grad=True) for a in [x] + states]
    with ggrad.grad_tape():
        results = flat(module(inputs[0], tuple(inputs[1:]) if len(states) == 2 else inputs[1]))
        sum(((r * ggrad.tensor(w)).sum() for r, w in zip(results, weights)), ggrad.tensor(0.0)).backward()
    return [t.numpy().astype(np.float64) for t in results] + \
        [t.grad.numpy().astype(np.float64) for t in inputs] + \
        [p.grad.numpy().astype(np.float64) for p in module.parameters()]


needs_cell_kernels = pytest.mark.skipif(ggrad.runtime.kernels.version() < 25,
                                        reason="ggml built without ggrad's recurrent kernels (kernel set 25)")


@needs_cell_kernels
@pytest.mark.parametrize("cls, kwargs, steps", [
    ("LSTM", dict(), 1), ("LSTM", dict(bidirectional=True), 7), ("LSTM", dict(bias=False), 4),
    ("GRU", dict(bidirectional=True), 5), ("GRU", dict(bias=False), 1),
    ("RNN", dict(), 6), ("RNN", dict(nonlinearity="relu", bidirectional=True), 5)])
def test_recurrent_kernels_equal_the_composed_cell(dev, monkeypatch, cls, kwargs, steps):
    """The recurrent kernels (one node per time step each way) against the composed cell
    they replace, the path of a backend without them: outputs, final states and every
    gradient (input, initial states, weights, biases) to float32 rounding; then with a NaN
    in one sequence and an inf (saturated gates) in another: NaN exactly where the composed
    cell has NaN, the rest equal."""
    from ggrad.nn import recurrent
    from ggrad.runtime import kernels
    assert kernels.supported(ggrad.runtime.current().backend, kernels.CELL), "set 25 serves cpu, Vulkan, CUDA"
    ggrad.manual_seed(3)
    module = getattr(nn, cls)(4, 6, num_layers=2, batch_first=True, **kwargs)
    layers = 4 if kwargs.get("bidirectional") else 2
    x = f32(3, steps, 4)
    states = [f32(layers, 3, 6) for _ in range(2 if cls == "LSTM" else 1)]
    bad = x.copy()
    bad[0, steps // 2, 1], bad[2, 0, 3] = np.nan, np.inf
    weights = [f32(3, steps, 6 * layers // 2)] + [f32(layers, 3, 6) for _ in states]
    ours = [_run_layer(module, a, states, weights) for a in (x, bad)]
    monkeypatch.setattr(recurrent, "recurrent_layer", lambda *args: None)
    composed = [_run_layer(module, a, states, weights) for a in (x, bad)]
    for k, (a, b) in enumerate(zip(ours[0], composed[0])):
        assert np.isfinite(a).all()
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=2e-6, err_msg=f"result {k}")
    assert any(np.isnan(b).any() for b in composed[1])
    for k, (a, b) in enumerate(zip(ours[1], composed[1])):
        assert np.array_equal(np.isnan(a), np.isnan(b)), f"result {k}"
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=2e-6, err_msg=f"result {k}")


@needs_cell_kernels
@pytest.mark.parametrize("cls", ["LSTM", "GRU"])
def test_a_long_sequence_builds_and_equals_torch(dev, cls):
    """700 steps: a layer's graph holds five ggml tensors a step each way (the builders
    reserve the room; without it ggml aborted past ~600 steps), and the output and the
    gradients still equal torch's."""
    torch.manual_seed(0)
    theirs = getattr(torch.nn, cls)(2, 3, batch_first=True)
    ours = getattr(nn, cls)(2, 3, batch_first=True)
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    x = f32(2, 700, 2)
    xt, xg = torch.tensor(x, requires_grad=True), ggrad.tensor(x, requires_grad=True)
    with ggrad.grad_tape():
        out = ours(xg)[0]
        out.sum().backward()
    out_t = theirs(xt)[0]
    out_t.sum().backward()
    assert_close(dev, out.numpy(), out_t.detach().numpy())
    assert_close(dev, xg.grad.numpy(), xt.grad.numpy())
    for name, p in theirs.named_parameters():
        assert_close(dev, dict(ours.named_parameters())[name].grad.numpy(), p.grad.numpy(), rtol=1e-4, atol=1e-4)
