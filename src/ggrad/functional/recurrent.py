"""A recurrent layer's time steps as ggrad's kernels (runtime/kernels.py: LSTM, LSTM_BACK):
one node per step forward (after the step's h W_hh^T product) and one back (before its
dh W_hh product), where the composed cell took about thirty. The steps write into one
record of the layer (h, c and the four gate activations of every step), which the gradient
reads; proj's gradient (the gates' pre-activations) is written whole and gives W_ih's, the
biases' and the input's gradients through the ordinary products.

nn.LSTM asks `lstm_layer` first and composes the cell where it answers None (another
backend, autocast, float64...): the composed form is the kernels' test oracle."""

from __future__ import annotations

from ggml import ggml as G

from .. import ops, runtime
from ..ops import compute, contiguous
from ..runtime import kernels, precision
from ._core import F32, Tensor, _apply, _out, reshape
from .layout import _matmul_nn, _matmul_tn, _product_arg, concat, unsqueeze


def lstm_layer(proj: Tensor, w_hh: Tensor, b_hh: Tensor | None, h0: Tensor, c0: Tensor,
               reverse: bool) -> tuple[Tensor, Tensor, Tensor] | None:
    """One direction of an LSTM layer over proj = x W_ih^T + b_ih (B, T, 4H) from the state
    (h0, c0) (B, H): its outputs (B, T, H) and its last h and c (B, H), torch's gates
    (i, f, g, o); or None where the kernels do not serve."""
    tensors = [proj, w_hh, h0, c0] + ([] if b_hh is None else [b_hh])
    if any(t.dtype is not F32 for t in tensors) or precision.autocast_dtype() is not None:
        return None
    batch, steps, hidden = proj.shape[0], proj.shape[1], w_hh.shape[1]
    backend = runtime.current().backend
    if 6 * batch * steps * hidden >= 2**31 or not (kernels.supported(backend, kernels.LSTM)
                                                   and kernels.supported(backend, kernels.LSTM_BACK)):
        return None
    inputs = (proj, w_hh) + (() if b_hh is None else (b_hh,)) + (h0, c0)
    arg = (bool(reverse), b_hh is not None, _product_arg(F32))
    record = _apply("lstm", inputs, (6, batch, steps, hidden), _lstm_rule, arg)
    last = 0 if reverse else steps - 1
    outputs = record[0]
    return outputs, outputs[:, last], record[1][:, last]


def _order(steps: int, reverse: bool) -> list[tuple[int, int]]:
    """(step, the step before it or -1) in the order the layer runs them."""
    ts = list(range(steps - 1, -1, -1)) if reverse else list(range(steps))
    return [(t, ts[k - 1] if k else -1) for k, t in enumerate(ts)]


def _lstm_rule(ctx, g):
    reverse, has_bias, arg = ctx.arg
    proj, w_hh = ctx.parents[:2]
    h0, c0 = ctx.parents[-2:]
    batch, steps, hidden = proj.shape[0], proj.shape[1], w_hh.shape[1]
    record = _out(ctx)
    n = 4 * hidden * steps * batch
    grads = _apply("lstm_back", (record, g, w_hh.detach(), c0.detach()), (n + hidden * batch,), arg=ctx.arg)
    d_proj = reshape(grads[:n], (batch, steps, 4 * hidden))
    d_w = d_b = d_h0 = None
    if w_hh.requires_grad:
        outputs, start = record[0], unsqueeze(h0.detach(), 1)
        before = start if steps == 1 else \
            concat([outputs[:, 1:], start], 1) if reverse else concat([start, outputs[:, :-1]], 1)
        d_w = _matmul_tn(reshape(d_proj, (-1, 4 * hidden)), reshape(before, (-1, hidden)), arg)
    if has_bias and ctx.parents[2].requires_grad:
        d_b = d_proj.sum((0, 1))
    if h0.requires_grad:
        d_h0 = _matmul_nn(d_proj[:, steps - 1 if reverse else 0], w_hh.detach(), arg)
    d_c0 = reshape(grads[n:], (batch, hidden)) if c0.requires_grad else None
    return (d_proj, d_w) + ((d_b,) if has_bias else ()) + (d_h0, d_c0)


@compute("lstm")
def _lstm(ctx, s, node):
    reverse, has_bias, arg = node.arg
    _, batch, steps, hidden = node.shape
    proj, w_hh = contiguous(ctx, s[0]), s[1]
    b_hh = contiguous(ctx, s[2]) if has_bias else None
    h, c0 = s[-2], contiguous(ctx, s[-1])
    record = None
    for t, before in _order(steps, reverse):
        hw = contiguous(ctx, ops._product(ctx, w_hh, h, arg))
        srcs, params = [proj, hw, b_hh, c0], [t, before, hidden, steps, batch]
        record = kernels.op(ctx, kernels.LSTM, (6 * hidden * steps * batch, 1), [None] + srcs, params) \
            if record is None else kernels.op_in_place(ctx, kernels.LSTM, record, srcs, params)
        h = _step_rows(ctx, record, hidden, batch, steps, t)
    return ops.reshape(ctx, record, node.shape)


@compute("lstm_back")
def _lstm_back(ctx, s, node):
    """The steps' gradients in reverse, each step's dh W_hh product (the gradient reaching
    the h before it) between them."""
    reverse, _, arg = node.arg
    record, grad, w_hh, c0 = contiguous(ctx, s[0]), contiguous(ctx, s[1]), s[2], contiguous(ctx, s[3])
    hidden, steps, batch = (int(n) for n in record.contents.ne[:3])
    out, dh = None, None
    for t, before in reversed(_order(steps, reverse)):
        srcs, params = [record, grad, dh, c0], [t, before, hidden, steps, batch]
        out = kernels.op(ctx, kernels.LSTM_BACK, (node.shape[0], 1), [None] + srcs, params) if out is None \
            else kernels.op_in_place(ctx, kernels.LSTM_BACK, out, srcs, params)
        if before >= 0:
            gates = _step_rows(ctx, out, 4 * hidden, batch, steps, t)
            dh = ops._gemm(ctx, gates, w_hh, False, False, arg)
            if dh is None:
                dh = ops._product(ctx, ops._transposed_operand(ctx, w_hh, arg), gates, arg)
            dh = contiguous(ctx, dh)
    return ops.reshape(ctx, out, node.shape)


def _step_rows(ctx, x, width: int, batch: int, steps: int, t: int):
    """Step t's rows (width, batch) of `x` (width, steps, batch...), as a product reads them:
    a strided view on the CPU; elsewhere a copy (ggml-vulkan's products assert on views that
    start off its buffers' alignment, and copy strided operands anyway)."""
    rows = G.ggml_view_2d(ctx, x, width, batch, 4 * width * steps, 4 * width * t)
    return rows if ops.backend_kind() == "cpu" else G.ggml_cont(ctx, rows)
