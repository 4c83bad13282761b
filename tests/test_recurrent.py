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
        assert_close(dev, g.grad.numpy(), t.grad.numpy(), rtol=1e-4, err_msg=f"input {k}")
    t_params = dict(t_module.named_parameters())
    for key, p in g_module.named_parameters():
        assert_close(dev, p.grad.numpy(), t_params[key].grad.numpy(), rtol=1e-4, err_msg=key)


def test_default_initialisation_is_torch_law():
    ggrad.manual_seed(0)
    values = np.concatenate([p.numpy().ravel() for p in nn.LSTM(8, 16, 2).parameters()])
    assert np.abs(values).max() <= 0.25 and np.abs(values).max() > 0.24  # U(-1/sqrt(16), 1/sqrt(16))


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
])
def test_bad_arguments_raise(call, message):
    with pytest.raises(ValueError, match=message):
        call()
