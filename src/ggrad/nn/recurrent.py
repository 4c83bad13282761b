"""Recurrent layers, torch.nn's: RNN, LSTM, GRU (layers, directions, batch_first,
dropout between layers, initial states, unbatched inputs) and RNNCell, LSTMCell,
GRUCell, with torch's parameter names, gate order and initialisation.

Each layer projects the inputs of all time steps with one product, then unrolls the
recurrence in Python: the sequence becomes one lazy graph, and `ggrad.compile`
captures a whole training step over it as one dispatch.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from .. import functional as F
from ..functional.recurrent import recurrent_layer
from ..random import generator
from ..tensor import Tensor, full_like, param, tensor
from .module import Module
from .utils.rnn import PackedSequence, repack, step_masks

_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}


def _rnn_mode(nonlinearity: str) -> str:
    if nonlinearity not in ("tanh", "relu"):
        raise ValueError(f"nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
    return f"RNN_{nonlinearity.upper()}"


def _uniform(shape, hidden: int) -> Tensor:
    bound = 1.0 / math.sqrt(hidden)
    return param(generator().uniform(-bound, bound, shape).astype("float32"))


def _as_input(x, owner: str, what: str) -> Tensor:
    if isinstance(x, np.ndarray):
        return tensor(x)
    if not isinstance(x, Tensor):
        raise TypeError(f"{owner}: {what} must be a Tensor or an array, got {type(x).__name__}")
    return x


def _given_state(mode: str, hx, owner: str) -> tuple[Tensor, Tensor | None]:
    """(h, c) from an LSTM's (h, c) pair, or (h, None) from another layer's h; a bare
    tensor given to an LSTM is refused (unpacking it would split its first axis)."""
    if mode != "LSTM":
        if isinstance(hx, (tuple, list)):
            raise ValueError(f"{owner} takes its initial state as one tensor h, not a {type(hx).__name__}")
        return _as_input(hx, owner, "h"), None
    if not isinstance(hx, (tuple, list)) or len(hx) != 2 or any(s is None for s in hx):
        raise ValueError(f"{owner} takes its initial state as a tuple (h, c) of two tensors")
    return _as_input(hx[0], owner, "h"), _as_input(hx[1], owner, "c")


def _check_state(h: Tensor, c: Tensor | None, want: tuple, owner: str, names=("h0", "c0")) -> None:
    for label, s in zip(names, (h, c)):
        if s is not None and s.shape != want:
            raise ValueError(f"{owner}: {label} must have shape {want}, got {s.shape}")


def _zeros(rows: Tensor, hidden: int) -> Tensor:
    """A (len(rows), hidden) zero state, made on the device."""
    return F.broadcast_to(full_like(rows[:, :1], 0.0), (rows.shape[0], hidden))


def _step(mode: str, x_proj: Tensor, h: Tensor, c: Tensor | None, w_hh: Tensor, b_hh: Tensor | None):
    """One time step from the input's projection (x W_ih^T + b_ih) and the state: the new
    h (and c for an LSTM), with torch's gate order (LSTM: i, f, g, o; GRU: r, z, n)."""
    h_proj = h @ w_hh.T
    if b_hh is not None:
        h_proj = h_proj + b_hh
    if mode == "LSTM":
        i, f, g, o = F.chunk(x_proj + h_proj, 4, -1)
        c = F.sigmoid(f) * c + F.sigmoid(i) * F.tanh(g)
        return F.sigmoid(o) * F.tanh(c), c
    if mode == "GRU":
        xr, xz, xn = F.chunk(x_proj, 3, -1)
        hr, hz, hn = F.chunk(h_proj, 3, -1)
        r, z = F.sigmoid(xr + hr), F.sigmoid(xz + hz)
        n = F.tanh(xn + r * hn)
        return n + z * (h - n), None  # (1 - z) n + z h
    pre = x_proj + h_proj
    return (F.tanh(pre) if mode == "RNN_TANH" else F.relu(pre)), None


class _RNNBase(Module):
    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False) -> None:
        super().__init__()
        if min(input_size, hidden_size, num_layers) < 1:
            raise ValueError(f"{type(self).__name__} needs positive sizes, got input_size={input_size}, "
                             f"hidden_size={hidden_size}, num_layers={num_layers}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if dropout and num_layers == 1:
            warnings.warn(f"dropout={dropout} has no effect with num_layers=1: it is applied between layers, "
                          "not after the last (as torch)", stacklevel=3)
        self.mode, self.input_size, self.hidden_size = mode, int(input_size), int(hidden_size)
        self.num_layers, self.bias, self.batch_first = int(num_layers), bool(bias), bool(batch_first)
        self.dropout, self.bidirectional = float(dropout), bool(bidirectional)
        directions = 2 if bidirectional else 1
        gates = _GATES[mode] * hidden_size
        for layer in range(num_layers):
            width = input_size if layer == 0 else hidden_size * directions
            for suffix in ("", "_reverse")[:directions]:
                setattr(self, f"weight_ih_l{layer}{suffix}", _uniform((gates, width), hidden_size))
                setattr(self, f"weight_hh_l{layer}{suffix}", _uniform((gates, hidden_size), hidden_size))
                if bias:
                    setattr(self, f"bias_ih_l{layer}{suffix}", _uniform((gates,), hidden_size))
                    setattr(self, f"bias_hh_l{layer}{suffix}", _uniform((gates,), hidden_size))

    def _weights(self, layer: int, suffix: str):
        get = lambda name: getattr(self, f"{name}_l{layer}{suffix}", None)  # noqa: E731
        return get("weight_ih"), get("weight_hh"), get("bias_ih"), get("bias_hh")

    def forward(self, input: Tensor, hx=None):
        if isinstance(input, PackedSequence):  # sequences of different lengths: each keeps its state past its end
            padded, _, masks = step_masks(input)
            out, state = self._run(F.transpose(padded, 0, 1), hx, False, masks)
            return repack(F.transpose(out, 0, 1), input), state
        name = type(self).__name__
        input = _as_input(input, name, "input")
        unbatched = input.ndim == 2
        if input.ndim not in (2, 3) or input.shape[-1] != self.input_size:
            raise ValueError(f"{name}(input_size={self.input_size}) needs (L, N, {self.input_size}) (or batch_first, "
                             f"or unbatched (L, {self.input_size})), got {input.shape}")
        x = F.unsqueeze(input, 0) if unbatched else (input if self.batch_first else F.transpose(input, 0, 1))
        x, state = self._run(x, hx, unbatched)
        out = F.squeeze(x, 0) if unbatched else (x if self.batch_first else F.transpose(x, 0, 1))
        return out, state

    def _run(self, x: Tensor, hx, unbatched: bool, masks: list[Tensor] | None = None):
        """The layers over a (batch, time, features) `x`: (the last layer's outputs, the
        final states). With `masks` (a (batch, 1) bool per step), a sequence whose mask is
        off keeps its state (packed input: a sequence past its end)."""
        directions = 2 if self.bidirectional else 1
        batch, length = x.shape[0], x.shape[1]
        states = self._initial_states(hx, batch, unbatched, x)
        finals_h, finals_c = [], []
        for layer in range(self.num_layers):
            outputs = []
            for d, suffix in enumerate(("", "_reverse")[:directions]):
                w_ih, w_hh, b_ih, b_hh = self._weights(layer, suffix)
                projected = x @ w_ih.T
                if b_ih is not None:
                    projected = projected + b_ih
                h, c = states[layer * directions + d]
                layer_run = recurrent_layer(self.mode, projected, w_hh, b_hh, h, c, bool(d)) if masks is None else None
                if layer_run is not None:  # ggrad's kernels: one node per step each way
                    sequence, h, c = layer_run
                    outputs.append(sequence)
                    finals_h.append(h)
                    finals_c.append(c)
                    continue
                steps = range(length - 1, -1, -1) if d else range(length)
                seen = [None] * length
                for t in steps:
                    h_new, c_new = _step(self.mode, projected[:, t], h, c, w_hh, b_hh)
                    if masks is None:
                        h, c = h_new, c_new
                    else:
                        h = F.where(masks[t], h_new, h)
                        c = F.where(masks[t], c_new, c) if c is not None else None
                    seen[t] = h
                outputs.append(F.stack(seen, 1))
                finals_h.append(h)
                finals_c.append(c)
            x = outputs[0] if directions == 1 else F.cat(outputs, -1)
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout)
        h_n = F.stack(finals_h, 0)
        h_n = F.squeeze(h_n, 1) if unbatched else h_n
        if self.mode != "LSTM":
            return x, h_n
        c_n = F.stack(finals_c, 0)
        return x, (h_n, F.squeeze(c_n, 1) if unbatched else c_n)

    def _initial_states(self, hx, batch: int, unbatched: bool, like: Tensor) -> list:
        """(h, c) per layer and direction: zeros, or slices of the given (h0[, c0])."""
        count = self.num_layers * (2 if self.bidirectional else 1)
        want = (count, self.hidden_size) if unbatched else (count, batch, self.hidden_size)
        if hx is None:
            zero = _zeros(like[:, 0], self.hidden_size)
            return [(zero, zero if self.mode == "LSTM" else None)] * count
        h0, c0 = _given_state(self.mode, hx, type(self).__name__)
        _check_state(h0, c0, want, type(self).__name__)
        if unbatched:
            h0 = F.unsqueeze(h0, 1)
            c0 = F.unsqueeze(c0, 1) if c0 is not None else None
        return [(h0[i], c0[i] if c0 is not None else None) for i in range(count)]

    def extra_repr(self) -> str:
        text = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            text += f", num_layers={self.num_layers}"
        if self.batch_first:
            text += ", batch_first=True"
        if self.bidirectional:
            text += ", bidirectional=True"
        return text


class RNN(_RNNBase):
    """h_t = tanh(x_t W_ih^T + b_ih + h_(t-1) W_hh^T + b_hh) (or relu), stacked and
    optionally bidirectional; returns (output, h_n)."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, nonlinearity: str = "tanh",
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False) -> None:
        super().__init__(_rnn_mode(nonlinearity), input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional)
        self.nonlinearity = nonlinearity


class LSTM(_RNNBase):
    """Long short-term memory, torch's gates (i, f, g, o); returns (output, (h_n, c_n)).
    `proj_size` (torch's projected LSTM) is accepted only as 0."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 proj_size: int = 0) -> None:
        if proj_size:
            raise NotImplementedError("LSTM(proj_size=...) is not supported")
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional)


class GRU(_RNNBase):
    """Gated recurrent unit, torch's gates (r, z, n; n = tanh(x W_in + b_in + r (h W_hn +
    b_hn))); returns (output, h_n)."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False) -> None:
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional)


class _CellBase(Module):
    def __init__(self, mode: str, input_size: int, hidden_size: int, bias: bool = True) -> None:
        super().__init__()
        self.mode = mode
        if min(input_size, hidden_size) < 1:
            raise ValueError(f"{type(self).__name__} needs positive sizes, got {input_size}, {hidden_size}")
        self.input_size, self.hidden_size, self.bias = int(input_size), int(hidden_size), bool(bias)
        gates = _GATES[self.mode] * hidden_size
        self.weight_ih = _uniform((gates, input_size), hidden_size)
        self.weight_hh = _uniform((gates, hidden_size), hidden_size)
        self.bias_ih = _uniform((gates,), hidden_size) if bias else None
        self.bias_hh = _uniform((gates,), hidden_size) if bias else None

    def forward(self, input: Tensor, hx=None):
        input = _as_input(input, type(self).__name__, "input")
        unbatched = input.ndim == 1
        if input.ndim not in (1, 2) or input.shape[-1] != self.input_size:
            raise ValueError(f"{type(self).__name__}({self.input_size}) needs (N, {self.input_size}) or "
                             f"({self.input_size},), got {input.shape}")
        x = F.unsqueeze(input, 0) if unbatched else input
        want = (self.hidden_size,) if unbatched else (x.shape[0], self.hidden_size)
        if hx is None:
            h = _zeros(x, self.hidden_size)
            c = h if self.mode == "LSTM" else None
        else:
            h, c = _given_state(self.mode, hx, type(self).__name__)
            _check_state(h, c, want, type(self).__name__, ("h", "c"))
            if unbatched:
                h, c = F.unsqueeze(h, 0), (F.unsqueeze(c, 0) if c is not None else None)
        projected = x @ self.weight_ih.T
        if self.bias_ih is not None:
            projected = projected + self.bias_ih
        run = recurrent_layer(self.mode, F.unsqueeze(projected, 1), self.weight_hh, self.bias_hh, h, c, False)
        _, h, c = run if run is not None else (None, *_step(self.mode, projected, h, c, self.weight_hh, self.bias_hh))
        if unbatched:
            h, c = F.squeeze(h, 0), (F.squeeze(c, 0) if c is not None else None)
        return (h, c) if self.mode == "LSTM" else h

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}" + ("" if self.bias else ", bias=False")


class RNNCell(_CellBase):
    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh") -> None:
        super().__init__(_rnn_mode(nonlinearity), input_size, hidden_size, bias)
        self.nonlinearity = nonlinearity


class LSTMCell(_CellBase):
    def __init__(self, input_size: int, hidden_size: int, bias: bool = True) -> None:
        super().__init__("LSTM", input_size, hidden_size, bias)


class GRUCell(_CellBase):
    def __init__(self, input_size: int, hidden_size: int, bias: bool = True) -> None:
        super().__init__("GRU", input_size, hidden_size, bias)
