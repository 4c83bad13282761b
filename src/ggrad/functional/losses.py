"""Training helpers (device random numbers, dropout) and the losses."""

from __future__ import annotations

import ctypes
import math

import numpy as np
from ggml import ggml as G

from .. import autograd, checks, dtypes, replay, runtime
from ..ops import compute, contiguous_rows, once_per_graph, repeated_view, template
from ..runtime import kernels
from ._core import Tensor, _apply, _as_tensor, _float, cast, reshape, result_type, tensor
from .compare import eq, ne, where
from .elementwise import _with_rule, abs, affine, clamp, exp, log, relu, sigmoid, square, step
from .layout import movedim
from .reduce import _one_hot, _pick, _to_index_rule, log_softmax, mean, sum


# ---- training helpers and losses ---------------------------------------------------------------
def rand_like(x) -> Tensor:
    """Uniform [0, 1) numbers shaped like `x`, drawn on the device: no crossing. The
    device generator's state advances in place (`ggrad.manual_seed` resets it)."""
    from ..random import device_state
    x = _as_tensor(x)
    if not x.dtype.is_floating_point:
        raise TypeError(f"rand_like needs a floating-point tensor, got {x.dtype}")
    state = device_state()
    u = _apply("rand", (state,), x.shape, dtype=x.dtype)
    with autograd.no_grad():
        state._assign(_apply("rand_next", (state,), (1,)))
    return u


def dropout(x, p: float = 0.5, training: bool = True, rng: np.random.Generator | None = None) -> Tensor:
    """Zero each element with probability p and scale the rest by 1/(1-p). The mask is
    drawn on the device (no crossing); with `rng` it is drawn on the host from that
    generator and uploaded instead (a reproducible reference)."""
    x = _as_tensor(x)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if not training or p == 0.0:
        return x
    if rng is not None:
        replay.refuse("dropout with a host rng draws its mask on the host; a replay would reuse it")
        mask = tensor((rng.random(x.shape) >= p).astype(np.float32) / np.float32(1.0 - p))
    else:
        mask = affine(step(affine(rand_like(x), 1.0, -p)), 1.0 / (1.0 - p))
    return x * (mask if mask.dtype is x.dtype else cast(mask, x.dtype))


REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(reduction: str, allowed=REDUCTIONS) -> None:
    if reduction not in allowed:
        raise ValueError(f"reduction must be one of {', '.join(map(repr, allowed))}, got {reduction!r}")


def _reduce(loss: Tensor, reduction: str) -> Tensor:
    _check_reduction(reduction)
    if reduction == "mean":
        return mean(loss)
    return sum(loss) if reduction == "sum" else loss


def _same_shape(a: Tensor, b: Tensor, what: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch in {what}: input {a.shape}, target {b.shape}")


def mse_loss(input, target, reduction: str = "mean") -> Tensor:
    input, target = _as_tensor(input), _as_tensor(target)
    _same_shape(input, target, "mse_loss")
    return _reduce(square(input - target), reduction)


def l1_loss(input, target, reduction: str = "mean") -> Tensor:
    input, target = _as_tensor(input), _as_tensor(target)
    _same_shape(input, target, "l1_loss")
    return _reduce(abs(input - target), reduction)


def smooth_l1_loss(input, target, reduction: str = "mean", beta: float = 1.0) -> Tensor:
    """0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta (beta = 0: the L1 loss)."""
    input, target = _as_tensor(input), _as_tensor(target)
    _same_shape(input, target, "smooth_l1_loss")
    if beta < 0:
        raise ValueError(f"smooth_l1_loss needs beta >= 0, got {beta}")
    d = input - target
    if beta == 0:
        return _reduce(abs(d), reduction)
    return _reduce(where(abs(d) < beta, square(d) * (0.5 / beta), abs(d) - 0.5 * beta), reduction)


def huber_loss(input, target, reduction: str = "mean", delta: float = 1.0) -> Tensor:
    """0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta)."""
    input, target = _as_tensor(input), _as_tensor(target)
    _same_shape(input, target, "huber_loss")
    if delta <= 0:
        raise ValueError(f"huber_loss needs delta > 0, got {delta}")
    d = input - target
    return _reduce(where(abs(d) < delta, square(d) * 0.5, (abs(d) - 0.5 * delta) * delta), reduction)


def _classes_last(scores: Tensor, target: Tensor, probabilities: bool, what: str):
    """(M, C) scores and (M,) class or (M, C) probability targets from torch's layouts
    ((C,), (N, C) or (N, C, d1, ...) scores), and the shape of an unreduced loss."""
    if scores.ndim == 0:
        raise ValueError(f"{what} needs scores of shape (C,), (N, C) or (N, C, d1, ...), got a 0-d tensor")
    classes = scores.shape[0] if scores.ndim == 1 else scores.shape[1]
    loss_shape = () if scores.ndim == 1 else (scores.shape[0],) + scores.shape[2:]
    expected = scores.shape if probabilities else loss_shape
    if target.shape != expected:
        kind = "probability" if probabilities else "class"
        raise ValueError(f"shape mismatch in {what}: scores {scores.shape}, {kind} targets {target.shape} "
                         f"(want {expected})")
    if scores.ndim > 2:
        scores = reshape(movedim(scores, 1, -1), (-1, classes))
        if probabilities:
            target = reshape(movedim(target, 1, -1), (-1, classes))
    scores = reshape(scores, (-1, classes))
    rows = scores.shape[0]
    return scores, reshape(target, (rows, classes) if probabilities else (rows,)), loss_shape


def _class_weight(weight, classes: int, dtype) -> Tensor | None:
    if weight is None:
        return None
    weight = _as_tensor(weight)
    if weight.shape != (classes,):
        raise ValueError(f"weight must have shape ({classes},) (one per class), got {weight.shape}")
    return cast(weight, dtype)


def _class_targets(target: Tensor, classes: int, ignore_index: int, what: str) -> tuple[Tensor, Tensor]:
    """Class indices safe to gather with (ignored ones as 0) and the bool mask of the
    kept ones. Host-known targets are checked on the host (every new batch of a
    compiled step too), device-computed ones on the device (checks.py)."""
    host = _checked_on_host(target, classes, ignore_index, what)
    kept = ne(target, ignore_index)
    safe = where(kept, target, 0)
    if host is None:
        safe = checks.bounded(safe, classes, f"{what} class index ({classes} classes)")
    return safe, kept


def _checked_on_host(target: Tensor, classes: int, ignore_index: int, what: str) -> np.ndarray | None:
    """Host-known class targets, checked on the host (every new batch of a compiled step
    too): each in [0, classes) or ignore_index. None for device-computed targets."""
    if target.dtype.category != dtypes.int32.category:
        raise TypeError(f"{what} needs integer class targets (or float probabilities), got {target.dtype}")
    ignore_index = int(ignore_index)
    host = target.node.host
    if host is not None:
        def check(values: np.ndarray) -> None:
            if values.size and 0 <= values.min() and values.max() < classes:  # every batch's case: two reductions
                return
            bad = (values != ignore_index) & ((values < 0) | (values >= classes))
            if bad.any():
                raise IndexError(f"{what}: class index out of range for {classes} classes (got {values[bad].flat[0]})")
        check(host)
        replay.on_input(target.node, check, passes=(0, classes))
    return host


def _kept_weights(kept: Tensor, w: Tensor | None, safe: Tensor, dtype) -> Tensor:
    """Each target's weight in the mean: its class weight (1 without weights), 0 where
    ignored."""
    scale = cast(kept, dtype)
    return scale if w is None else scale * _gather_weights(w, safe)


def _only_kept(per: Tensor, kept: Tensor) -> Tensor:
    """`per` with exact zeros at ignored targets, whose gradient is an exact 0 there: the
    mean of an all-ignored batch is 0/0 (NaN, as torch's), and a product with the 0/1
    mask would send inf * 0 = NaN back to every score where torch sends 0."""
    return where(kept, per, 0.0)


def _weighted_mean(per: Tensor, scale: Tensor, loss_shape: tuple, reduction: str) -> Tensor:
    _check_reduction(reduction)
    if reduction == "none":
        return reshape(per, loss_shape)
    return sum(per) if reduction == "sum" else sum(per) / sum(scale)


def cross_entropy(input, target, weight=None, ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> Tensor:
    """torch.nn.functional.cross_entropy: scores (C,), (N, C) or (N, C, d1, ...) against
    class indices (the target's log-probability is picked: a -inf score elsewhere costs
    nothing) or probabilities; `weight` per class, `ignore_index`, `label_smoothing`; the
    mean over class targets is over the kept targets' weights, as torch's."""
    scores, target = _float(_as_tensor(input), "cross_entropy"), _as_tensor(target)
    _check_reduction(reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    probabilities = target.dtype.is_floating_point
    scores, target, loss_shape = _classes_last(scores, target, probabilities, "cross_entropy")
    rows, classes = scores.shape
    if probabilities:
        dtype = result_type(scores, target)
        scores, target = cast(scores, dtype), cast(target, dtype)
        if label_smoothing:
            target = target * (1.0 - label_smoothing) + label_smoothing / classes
        w = _class_weight(weight, classes, dtype)
        if w is not None:
            target = target * w
        per = _apply("softmax_cross_entropy", (scores, target), (rows,), _cross_entropy_rule, dtype=dtype)
        return _reduce(reshape(per, loss_shape), reduction)
    w = _class_weight(weight, classes, scores.dtype)
    if scores.dtype is dtypes.float32 and kernels.supported(runtime.current().backend, kernels.CLASS_CROSS_ENTROPY) \
            and _checked_on_host(target, classes, ignore_index, "cross_entropy") is not None:
        both = _fused_class_cross_entropy(scores, target, w, int(ignore_index), label_smoothing)
        if reduction == "none":
            return reshape(both[0], loss_shape)
        return _class_total(both, reduction == "mean")
    safe, kept = _class_targets(target, classes, ignore_index, "cross_entropy")
    per = _apply("class_cross_entropy", (scores, safe), (rows,), _class_cross_entropy_rule, dtype=scores.dtype)
    scale = _kept_weights(kept, w, safe, scores.dtype)
    per = _only_kept(per if w is None else per * scale, kept)
    if label_smoothing:
        logp = log_softmax(scores, -1)
        spread = -sum(logp * w if w is not None else logp, -1)
        per = per * (1.0 - label_smoothing) + _only_kept(spread, kept) * (label_smoothing / classes)
    return _weighted_mean(per, scale, loss_shape, reduction)


def _fused_class_cross_entropy(scores: Tensor, target: Tensor, w: Tensor | None, ignore_index: int,
                               label_smoothing: float) -> Tensor:
    """(2, rows): each target's loss, and its weight in the mean, from ggrad's cross-entropy
    kernel: one node forward, one backward, where the composition took about 50
    (runtime/kernels.py). The targets were checked on the host; an ignored one's loss and
    weight are exact zeros, whatever its row holds. The gradient reaches the scores only,
    from the losses' row (the weights' row has none)."""
    rows, classes = scores.shape
    params = (ignore_index, float(np.float32(1.0 - label_smoothing)), float(np.float32(label_smoothing / classes)))
    target = reshape(target, (rows,))
    inputs = (scores, target) + ((w.detach(),) if w is not None else ())

    def rule(ctx, g):  # g: (2, rows); the kernel reads the losses' row
        logits, index = ctx.parents[:2]
        grad = _apply("class_cross_entropy_kernel_back", (logits.detach(), index, g) + tuple(ctx.parents[2:]),
                      logits.shape, arg=params, dtype=logits.dtype)
        return (grad,) + (None,) * (len(ctx.parents) - 1)
    return _apply("class_cross_entropy_kernel", inputs, (2, rows), rule, arg=params, dtype=scores.dtype)


def _class_total(both: Tensor, mean: bool) -> Tensor:
    """The kernel's losses summed, over the weights' sum for the mean (which takes no
    gradient, as torch's): one node each way, where slicing and dividing the sums took
    ten. The gradient is g (over the weights' sum) on the losses' row, 0 on the weights'.
    With ggrad's reduction kernel (CLASS_TOTAL) the forward is that one node, and
    backward's seed of 1 needs no node: the kernel wrote each target's share of it."""
    reduction = kernels.supported(runtime.current().backend, kernels.CLASS_TOTAL)

    def rule(ctx, g):
        both = ctx.parents[0].detach()
        sources = (both,) if reduction and _is_seed(g) else (g, both)
        return (_apply("class_total_back", sources, both.shape, arg=(mean, reduction), dtype=both.dtype),)
    return _apply("class_total", (both,), (), rule, arg=(mean, reduction), dtype=both.dtype)


def _is_seed(g: Tensor) -> bool:
    """Whether `g` is backward's implied seed, a float32 1 filled on the device."""
    node = g._node
    return node.op == "fill" and node.arg == 1.0 and g.dtype is dtypes.float32


def _gather_weights(w: Tensor, index: Tensor) -> Tensor:
    """w[index] for in-range indices (no gradient reaches the class weights)."""
    return reshape(_apply("gather_rows", (reshape(w.detach(), (w.shape[0], 1)), index), index.shape + (1,),
                          dtype=w.dtype), index.shape)


def nll_loss(input, target, weight=None, ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    """torch.nn.functional.nll_loss: -input[i, target[i]] (input holds log-probabilities),
    weighted and with ignored targets as cross_entropy's."""
    scores, target = _float(_as_tensor(input), "nll_loss"), _as_tensor(target)
    _check_reduction(reduction)
    scores, target, loss_shape = _classes_last(scores, target, False, "nll_loss")
    classes = scores.shape[1]
    w = _class_weight(weight, classes, scores.dtype)
    safe, kept = _class_targets(target, classes, ignore_index, "nll_loss")
    scale = _kept_weights(kept, w, safe, scores.dtype)
    picked = reshape(_pick(scores, safe, _to_index_rule), (scores.shape[0],))
    per = _only_kept(-picked if w is None else -picked * scale, kept)
    return _weighted_mean(per, scale, loss_shape, reduction)


def kl_div(input, target, reduction: str = "mean", log_target: bool = False) -> Tensor:
    """torch.nn.functional.kl_div: target * (log target - input) pointwise (0 where the
    target is 0, NaN where it is negative, as torch's), input holding log-probabilities;
    "batchmean" divides the sum by the batch size (the KL divergence proper), "mean" by
    every element."""
    input, target = _float(_as_tensor(input), "kl_div"), _as_tensor(target)
    _same_shape(input, target, "kl_div")
    _check_reduction(reduction, REDUCTIONS + ("batchmean",))
    if log_target:
        pointwise = exp(target) * (target - input)
    else:
        positive = target > 0
        log_t = where(positive, log(where(positive, target, 1.0)), math.nan)  # NaN below 0, as log's
        pointwise = where(eq(target, 0.0), 0.0, target * (log_t - input))
    if reduction == "batchmean":
        return sum(pointwise) / (input.shape[0] if input.ndim else 1)
    return _reduce(pointwise, reduction)


def binary_cross_entropy(input, target, weight=None, reduction: str = "mean") -> Tensor:
    """torch.nn.functional.binary_cross_entropy of probabilities: -(y log p + (1 - y)
    log(1 - p)) with each log clamped at -100, as torch's; its gradient is torch's,
    (p - y) / max(p (1 - p), 1e-12)."""
    p, y = _float(_as_tensor(input), "binary_cross_entropy"), _as_tensor(target)
    _same_shape(p, y, "binary_cross_entropy")
    _check_probabilities(p, "input")
    _check_probabilities(y, "target")
    w = None if weight is None else _as_tensor(weight)
    with autograd.no_grad():
        log_p, log_q = clamp(log(p), min=-100.0), clamp(log(affine(p, -1.0, 1.0)), min=-100.0)
        loss = -(y * log_p + affine(y, -1.0, 1.0) * log_q)
        if w is not None:
            loss = loss * w
    if (p.requires_grad or y.requires_grad) and autograd.is_recording():
        loss = _with_rule(loss, (p, y), _bce_rule(w), "binary_cross_entropy")
    return _reduce(loss, reduction)


def _check_probabilities(x: Tensor, name: str) -> None:
    """Raise as torch does for a value outside [0, 1] (NaN too) where `x` is known on the
    host, and on every new batch of a compiled step; values computed on the device are
    not checked (that would be a host read)."""
    def check(values: np.ndarray) -> None:
        values = np.asarray(values, np.float32)
        bad = ~((values >= 0.0) & (values <= 1.0))
        if bad.any():
            raise RuntimeError(f"binary_cross_entropy: all elements of {name} should be between 0 and 1 "
                               f"(got {values[bad].flat[0]})")
    if x.node.host is not None:
        check(x.node.host)
    replay.on_input(x.node, check)


def _bce_rule(w):
    def rule(ctx, g):
        p, y = (t.detach() for t in ctx.parents)
        if w is not None:
            g = g * w
        g_p = g_y = None
        if ctx.parents[0].requires_grad:
            g_p = g * (p - y) / clamp(p * affine(p, -1.0, 1.0), min=1e-12)
        if ctx.parents[1].requires_grad:
            g_y = g * (clamp(log(affine(p, -1.0, 1.0)), min=-100.0) - clamp(log(p), min=-100.0))
        return g_p, g_y
    return rule


def _class_cross_entropy_rule(ctx, g):
    """d/dlogits = g * (softmax - one_hot(index)), per row."""
    logits, index = ctx.parents
    hot = cast(_one_hot(index, logits.shape[1]), logits.dtype)
    return _apply("softmax_cross_entropy_back", (logits.detach(), hot, g), logits.shape, dtype=logits.dtype), None


def _cross_entropy_rule(ctx, g):
    """d/dlogits = g * (softmax * sum(target) - target); d/dtarget = -g * log_softmax(logits)."""
    logits, target = ctx.parents
    g_logits = _apply("softmax_cross_entropy_back", (logits.detach(), target.detach(), g), logits.shape,
                      dtype=logits.dtype) if logits.requires_grad else None
    g_target = -(log_softmax(logits.detach()) * reshape(g, (g.shape[0], 1))) if target.requires_grad else None
    return g_logits, g_target


def binary_cross_entropy_with_logits(input, target, weight=None, reduction: str = "mean",
                                     pos_weight=None) -> Tensor:
    """torch's: (1 - y) x + (1 + (pos_weight - 1) y) (max(-x, 0) + log(1 + exp(-|x|))), stable
    for large |x| and torch's at infinite x, times `weight`. The gradient is torch's,
    (1 - y) + L (sigmoid(x) - 1) with L the positive weighting (sigmoid(x) - y without
    one): the formula's kinks at x = 0 gave the wrong one there."""
    x, y = _as_tensor(input), _as_tensor(target)
    _same_shape(x, y, "binary_cross_entropy_with_logits")
    w = None if weight is None else _as_tensor(weight)
    pw = None if pos_weight is None else _as_tensor(pos_weight)
    with autograd.no_grad():
        softplus = relu(-x) + log(affine(exp(-abs(x)), 1.0, 1.0))  # log(1 + exp(-x))
        loss = affine(y, -1.0, 1.0) * x + (softplus if pw is None else softplus * affine(y * (pw - 1.0), 1.0, 1.0))
        if w is not None:
            loss = loss * w
    if (x.requires_grad or y.requires_grad) and autograd.is_recording():
        loss = _with_rule(loss, (x, y), _bce_with_logits_rule(w, pw), "binary_cross_entropy_with_logits")
    return _reduce(loss, reduction)


def _bce_with_logits_rule(w, pw):
    def rule(ctx, g):
        x, y = (t.detach() for t in ctx.parents)
        if w is not None:
            g = g * w
        g_x = g_y = None
        if ctx.parents[0].requires_grad:
            if pw is None:
                g_x = g * (sigmoid(x) - y)
            else:
                g_x = g * (affine(y, -1.0, 1.0) + affine(y * (pw - 1.0), 1.0, 1.0) * affine(sigmoid(x), 1.0, -1.0))
        if ctx.parents[1].requires_grad:
            if pw is None:
                g_y = -(g * x)
            else:
                g_y = g * ((pw - 1.0) * (relu(-x) + log(affine(exp(-abs(x)), 1.0, 1.0))) - x)
        return g_x, g_y
    return rule


@compute("class_cross_entropy_kernel", keep_int=True)
def _class_cross_entropy_kernel(ctx, s, node):
    logits, target = contiguous_rows(ctx, s[0]), contiguous_rows(ctx, s[1])
    return kernels.op(ctx, kernels.CLASS_CROSS_ENTROPY, (logits.contents.ne[1], 2),
                      [logits, target, s[2] if len(s) > 2 else None], list(node.arg))


def _class_sums(ctx, both):
    """(losses' sum, weights' sum) of the kernel's (rows, 2) as one SUM_ROWS, made once per
    graph: the gradient's builder reuses the forward's where both are in one graph."""
    return once_per_graph(("class sums", ctypes.addressof(both.contents)),
                          lambda: G.ggml_sum_rows(ctx, contiguous_rows(ctx, both)))


def _class_reduced(ctx, both, mean: bool):
    """CLASS_TOTAL's (loss, weights' sum, a target's share of a gradient of 1) over the
    kernel's (rows, 2), made once per graph as `_class_sums`."""
    return once_per_graph(("class total", ctypes.addressof(both.contents), mean),
                          lambda: kernels.op(ctx, kernels.CLASS_TOTAL, (3, 1), [contiguous_rows(ctx, both)],
                                             [int(mean)]))


def _element(ctx, vector, i: int):
    """Element `i` of a contiguous float32 vector, as a one-value view (DIV and the
    cross-entropy kernels read views off their buffer's alignment on every backend:
    ggml-vulkan passes the offset to the shader)."""
    return G.ggml_view_1d(ctx, vector, 1, i * vector.contents.nb[0])


@compute("class_total")
def _class_total_build(ctx, s, node):
    mean, reduction = node.arg
    if reduction:
        return _element(ctx, _class_reduced(ctx, s[0], mean), 0)
    sums = _class_sums(ctx, s[0])
    total = _element(ctx, sums, 0)
    return G.ggml_div(ctx, total, _element(ctx, sums, 1)) if mean else G.ggml_cont(ctx, total)


@compute("class_total_back")
def _class_total_back(ctx, s, node):
    mean, reduction = node.arg
    both = s[-1]
    if len(s) == 1:  # backward's seed of 1 (`_is_seed`): the reduction kernel's share of it
        g = _element(ctx, _class_reduced(ctx, both, mean), 2)
    elif not mean:
        g = s[0]
    else:
        weights = _element(ctx, _class_reduced(ctx, both, mean) if reduction else _class_sums(ctx, both), 1)
        g = G.ggml_div(ctx, s[0], weights)
    rows = both.contents.ne[0]
    losses = G.ggml_repeat(ctx, g, template(ctx, (rows,)))
    padded = G.ggml_pad(ctx, G.ggml_reshape_2d(ctx, losses, rows, 1), 0, 1, 0, 0)
    # the kernel's gradient reads the losses' row before its padding (the PAD then leaves the
    # graph): g itself through a stride of 0 where the backend reads it so (the REPEAT leaves too)
    once_per_graph(("losses' row", ctypes.addressof(padded.contents)), lambda: repeated_view(ctx, g, rows) or losses)
    return padded


@compute("class_cross_entropy_kernel_back", keep_int=True)
def _class_cross_entropy_kernel_back(ctx, s, node):
    # the losses' row of (rows, 2): class_total_back's before it was padded, else a view of it
    per_target = once_per_graph(("losses' row", ctypes.addressof(s[2].contents)),
                                lambda: G.ggml_view_1d(ctx, s[2], s[2].contents.ne[0], 0))
    logits, target = contiguous_rows(ctx, s[0]), contiguous_rows(ctx, s[1])
    if per_target.contents.nb[0] != 0:  # a repeated_view is read as it is
        per_target = contiguous_rows(ctx, per_target)
    return kernels.op(ctx, kernels.CLASS_CROSS_ENTROPY_BACK, tuple(logits.contents.ne[:2]),
                      [logits, target, per_target, s[3] if len(s) > 3 else None], list(node.arg))
