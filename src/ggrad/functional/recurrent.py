"""A recurrent layer's time steps as ggrad's kernels (runtime/kernels.py: CELL, CELL_BACK):
one node per step forward (after the step's h W_hh^T product) and one back (before its
dh W_hh product), where the composed cell took ten to thirty. The steps write into one
record of the layer (h, and what the cell's gradient needs: an LSTM's c and gates, a GRU's
gates and h W_hn^T + b_hn), which the gradient reads; proj's gradient (the gates'
pre-activations) is written whole and gives W_ih's, the biases' and the input's gradients
through the ordinary products.

nn's RNN, LSTM and GRU ask `recurrent_layer` first and compose the cell where it answers
None (another backend, autocast, float64...): the composed cell is the kernels' test oracle."""

from __future__ import annotations

from ggml import ggml as G

from .. import lazy, ops, runtime
from ..ops import compute, contiguous
from ..runtime import kernels, precision
from ._core import F32, Tensor, _apply, _out, reshape
from .layout import _matmul_nn, _matmul_tn, _product_arg, concat, unsqueeze

# the kernels' cell numbers, the record's planes and the gates per cell (torch's modes)
CELLS = {"LSTM": 0, "GRU": 1, "RNN_TANH": 2, "RNN_RELU": 3}
_PLANES = {"LSTM": 6, "GRU": 5, "RNN_TANH": 1, "RNN_RELU": 1}
_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


def recurrent_layer(mode: str, proj: Tensor, w_hh: Tensor, b_hh: Tensor | None, h0: Tensor, c0: Tensor | None,
                    reverse: bool) -> tuple[Tensor, Tensor, Tensor | None] | None:
    """One direction of a `mode` layer (nn's RNN modes, torch's gate orders) over proj =
    x W_ih^T + b_ih (B, T, gates * H) from the state h0 (and an LSTM's c0) (B, H): its
    outputs (B, T, H), its last h and an LSTM's last c (B, H); or None where the kernels do
    not serve."""
    lstm = mode == "LSTM"
    tensors = [proj, w_hh, h0] + ([c0] if lstm else []) + ([] if b_hh is None else [b_hh])
    if any(t.dtype is not F32 for t in tensors) or precision.autocast_dtype() is not None:
        return None
    batch, steps, hidden = proj.shape[0], proj.shape[1], w_hh.shape[1]
    backend = runtime.current().backend
    # the record and the gradient are the largest tensors: within the kernels' int32 indices
    # and the device's tensor limit (Vulkan's storage-buffer range), else the cell composes
    largest = max(_PLANES[mode] * hidden * steps * batch, _gradient_size(mode, batch, steps, hidden))
    if largest >= 2**31 or (backend.max_tensor_bytes is not None and 4 * largest > backend.max_tensor_bytes) \
            or not (kernels.supported(backend, kernels.CELL) and kernels.supported(backend, kernels.CELL_BACK)):
        return None
    inputs = (proj, w_hh) + (() if b_hh is None else (b_hh,)) + (h0,) + ((c0,) if lstm else ())
    arg = (mode, bool(reverse), b_hh is not None, _product_arg(F32))
    record = _apply("recurrent", inputs, (_PLANES[mode], batch, steps, hidden), _rule, arg)
    last = 0 if reverse else steps - 1
    outputs = record[0]
    return outputs, outputs[:, last], (record[1][:, last] if lstm else None)


def _order(steps: int, reverse: bool) -> list[tuple[int, int]]:
    """(step, the step before it or -1) in the order the layer runs them."""
    ts = list(range(steps - 1, -1, -1)) if reverse else list(range(steps))
    return [(t, ts[k - 1] if k else -1) for k, t in enumerate(ts)]


def _gradient_size(mode: str, batch: int, steps: int, hidden: int) -> int:
    """The elements of the kernels' gradient: proj's, a GRU's of h W_hh^T + b_hh too, and the
    accumulator of an LSTM's c or a GRU's h (ggrad_cpu.inc)."""
    n = _GATES[mode] * hidden * steps * batch
    return (2 * n if mode == "GRU" else n) + (hidden * batch if mode in ("LSTM", "GRU") else 0)


def _rule(ctx, g):
    mode, reverse, has_bias, arg = ctx.arg
    proj, w_hh = ctx.parents[:2]
    h0 = ctx.parents[3 if has_bias else 2]
    c0 = ctx.parents[-1] if mode == "LSTM" else None
    batch, steps, hidden = proj.shape[0], proj.shape[1], w_hh.shape[1]
    width = _GATES[mode] * hidden
    n = width * steps * batch
    record = _out(ctx)
    state = (c0 if mode == "LSTM" else h0).detach()
    grads = _apply("recurrent_back", (record, g, w_hh.detach(), state),
                   (_gradient_size(mode, batch, steps, hidden),), arg=ctx.arg)
    d_proj = reshape(grads[:n], (batch, steps, width))
    d_hw = reshape(grads[n:2 * n], (batch, steps, width)) if mode == "GRU" else d_proj  # of h W_hh^T + b_hh
    # the state gradient reaching the first step's (an LSTM's c0, a GRU's h0 other than through h0 W_hh^T)
    carried = reshape(grads[2 * n if mode == "GRU" else n:], (batch, hidden)) if mode in ("LSTM", "GRU") else None
    d_w = d_b = d_h0 = d_c0 = None
    if w_hh.requires_grad:
        outputs, start = record[0], unsqueeze(h0.detach(), 1)
        before = start if steps == 1 else \
            concat([outputs[:, 1:], start], 1) if reverse else concat([start, outputs[:, :-1]], 1)
        d_w = _matmul_tn(reshape(d_hw, (-1, width)), reshape(before, (-1, hidden)), arg)
    if has_bias and ctx.parents[2].requires_grad:
        d_b = d_hw.sum((0, 1))
    if h0.requires_grad:
        d_h0 = _matmul_nn(d_hw[:, steps - 1 if reverse else 0], w_hh.detach(), arg)
        d_h0 = d_h0 + carried if mode == "GRU" else d_h0
    if c0 is not None and c0.requires_grad:
        d_c0 = carried
    return (d_proj, d_w) + ((d_b,) if has_bias else ()) + (d_h0,) + ((d_c0,) if mode == "LSTM" else ())


@compute("recurrent")
def _recurrent(ctx, s, node):
    mode, reverse, has_bias, arg = node.arg
    planes, batch, steps, hidden = node.shape
    proj, w_hh = contiguous(ctx, s[0]), s[1]
    b_hh = contiguous(ctx, s[2]) if has_bias else None
    h = s[3 if has_bias else 2]
    state = contiguous(ctx, s[-1] if mode == "LSTM" else h)
    lazy.reserve(ctx, 8 * steps)  # a product, its copies and views, and the kernel per step
    record = None
    for t, before in _order(steps, reverse):
        hw = contiguous(ctx, ops._product(ctx, w_hh, h, arg))
        srcs, params = [proj, hw, b_hh, state], [t, before, hidden, steps, batch, CELLS[mode]]
        record = kernels.op(ctx, kernels.CELL, (planes * hidden * steps * batch, 1), [None] + srcs, params) \
            if record is None else kernels.op_in_place(ctx, kernels.CELL, record, srcs, params)
        h = _step_rows(ctx, record, 0, hidden, batch, steps, t)
    return ops.reshape(ctx, record, node.shape)


@compute("recurrent_back")
def _recurrent_back(ctx, s, node):
    """The steps' gradients in reverse, each step's dh W_hh product (the gradient reaching
    the h before it) between them."""
    mode, reverse, _, arg = node.arg
    record, grad, w_hh, state = contiguous(ctx, s[0]), contiguous(ctx, s[1]), s[2], contiguous(ctx, s[3])
    hidden = int(w_hh.contents.ne[0])
    steps, batch = int(record.contents.ne[1]), int(record.contents.ne[2])
    width = _GATES[mode] * hidden
    start = width * steps * batch if mode == "GRU" else 0  # where the gradient of h W_hh^T is
    lazy.reserve(ctx, 8 * steps)
    out, dh = None, None
    for t, before in reversed(_order(steps, reverse)):
        srcs, params = [record, grad, dh, state], [t, before, hidden, steps, batch, CELLS[mode]]
        out = kernels.op(ctx, kernels.CELL_BACK, (node.shape[0], 1), [None] + srcs, params) if out is None \
            else kernels.op_in_place(ctx, kernels.CELL_BACK, out, srcs, params)
        if before >= 0:
            gates = _step_rows(ctx, out, start, width, batch, steps, t)
            dh = ops._gemm(ctx, gates, w_hh, False, False, arg)
            if dh is None:
                dh = ops._product(ctx, ops._transposed_operand(ctx, w_hh, arg, gates.contents.ne[1]), gates, arg)
            dh = contiguous(ctx, dh)
    return ops.reshape(ctx, out, node.shape)


def _step_rows(ctx, x, start: int, width: int, batch: int, steps: int, t: int):
    """Step t's rows (width, batch) of the (width, steps, batch) block at element `start` of
    `x`, as a product reads them: a strided view on the CPU; elsewhere a copy (ggml-vulkan's
    products assert on views that start off its buffers' alignment, and copy strided
    operands anyway)."""
    rows = G.ggml_view_2d(ctx, x, width, batch, 4 * width * steps, 4 * (start + width * t))
    return rows if ops.backend_kind() == "cpu" else G.ggml_cont(ctx, rows)
