"""Convolutions and pooling, torch.nn.functional's, composed from one primitive pair.

An image's windows become columns (ggml's IM2COL: (N, C, H, W) -> (N, OH, OW, C*KH*KW),
in the order of a torch weight's (C, KH, KW)); a convolution is one matrix product over
them, a transposed convolution the product's adjoint (folding columns back onto an
image), and a pool a max or mean over each window. Gradients come from the pieces: the
adjoint of unfolding is folding (ggml's IM2COL_BACK; where a backend lacks it, Vulkan and
CUDA, each window entry's columns are padded into place and summed), and the product's,
max's and mean's gradients are the ones they always have.
"""

from __future__ import annotations

import ctypes
import math
import numbers

import numpy as np
from ggml import ggml as G

from .. import autograd, dtypes, lazy, ops, runtime
from ..runtime import kernels, launch
from ..ops import F32, _supported, compute, concat_all, pad_axis, reshape as ggml_reshape, template
from ..tensor import Tensor
from ._core import _apply, _as_tensor, _constant, _float, broadcast_to, cast, record, reshape, sum_to
from .indexing import gather
from .layout import _matmul_nt, _product_arg, concat, matmul, matmul_nt, narrow, pad, permute, transpose
from .elementwise import _number
from .reduce import max as reduce_max, mean, one_hot_argmax, sum as reduce_sum


def _pair(value, what: str) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, numbers.Integral) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in pair):
        raise TypeError(f"{what} must be an int or a pair of ints, got {value!r}")
    return int(pair[0]), int(pair[1])


def _single(value, what: str) -> int:
    if not isinstance(value, numbers.Integral):
        value = tuple(value)
        if len(value) != 1:
            raise TypeError(f"{what} must be an int or a 1-tuple of ints, got {value!r}")
        value = value[0]
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f"{what} must be an int or a 1-tuple of ints, got {value!r}")
    return int(value)


def _out_size(size: int, kernel: int, stride: int, pad_total: int, dilation: int) -> int:
    return (size + pad_total - dilation * (kernel - 1) - 1) // stride + 1


# ---- the primitive pair: unfold an image into window columns, fold columns back -----------
def unfold_windows(x, kernel_size, stride=1, padding=0, dilation=1) -> Tensor:
    """(N, C, H, W) -> (N, OH, OW, C*KH*KW): each output position's window, zero padded.
    torch.nn.functional.unfold's values, laid out for a product with a (OC, C*KH*KW)
    weight (torch's unfold is this transposed to (N, C*KH*KW, OH*OW))."""
    x = _float(_as_tensor(x), "unfold")
    if x.ndim != 4:
        raise ValueError(f"unfold needs a 4-d input (N, C, H, W), got shape {x.shape}")
    (kh, kw), (sh, sw) = _pair(kernel_size, "kernel_size"), _pair(stride, "stride")
    (ph, pw), (dh, dw) = _pair(padding, "padding"), _pair(dilation, "dilation")
    if min(kh, kw, sh, sw, dh, dw) < 1 or min(ph, pw) < 0:
        raise ValueError(f"unfold needs positive kernel_size, stride and dilation and a non-negative padding, "
                         f"got {kernel_size}, {stride}, {dilation}, {padding}")
    n, c, h, w = x.shape
    oh, ow = _out_size(h, kh, sh, 2 * ph, dh), _out_size(w, kw, sw, 2 * pw, dw)
    if oh < 1 or ow < 1:
        raise ValueError(f"a {kh}x{kw} window (dilation {dilation}) is larger than the padded input "
                         f"{h + 2 * ph}x{w + 2 * pw}")
    arg = (kh, kw, sh, sw, ph, pw, dh, dw)
    return _apply("im2col", (x,), (n, oh, ow, c * kh * kw), _unfold_rule, arg, x.dtype)


def _unfold_rule(ctx, g):
    return (_fold(g, ctx.parents[0].shape, ctx.arg),)


def _fold(columns: Tensor, shape: tuple, arg: tuple) -> Tensor:
    """The adjoint of unfold_windows: each column entry added onto the image position its
    window read (overlaps sum)."""
    return _apply("col2im", (columns,), shape, _fold_rule, arg, columns.dtype)


def _fold_rule(ctx, g):
    """Unfolding the gradient, over the windows the columns had: a transposed convolution's
    output_padding may reach past them (output_padding >= stride, allowed below the
    dilation), and the windows that extra adds read no column."""
    kh, kw, sh, sw, ph, pw, dh, dw = ctx.arg
    windows = unfold_windows(g, (kh, kw), (sh, sw), (ph, pw), (dh, dw))
    _, oh, ow, _ = ctx.parents[0].shape
    if windows.shape[1:3] != (oh, ow):
        windows = narrow(narrow(windows, 1, 0, oh), 2, 0, ow)
    return (windows,)


def unfold(input, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
    """torch.nn.functional.unfold: (N, C, H, W) -> (N, C*KH*KW, L), L the window count."""
    x = _as_tensor(input)
    windows = unfold_windows(x, kernel_size, stride, padding, dilation)  # (N, OH, OW, C*KH*KW)
    n, oh, ow, width = windows.shape
    return permute(reshape(windows, (n, oh * ow, width)), (0, 2, 1))


def fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
    """torch.nn.functional.fold, unfold's adjoint: (N, C*KH*KW, L) columns summed onto
    (N, C, H, W), overlaps added."""
    columns = _float(_as_tensor(input), "fold")
    (h, w), (kh, kw) = _pair(output_size, "output_size"), _pair(kernel_size, "kernel_size")
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride, "stride"), _pair(padding, "padding"), _pair(dilation, "dilation")
    if min(h, w, kh, kw, sh, sw, dh, dw) < 1 or min(ph, pw) < 0:
        raise ValueError("fold needs positive sizes, strides and dilations and a non-negative padding")
    oh, ow = _out_size(h, kh, sh, 2 * ph, dh), _out_size(w, kw, sw, 2 * pw, dw)
    if columns.ndim != 3 or columns.shape[1] % (kh * kw) or columns.shape[2] != oh * ow or oh < 1 or ow < 1:
        raise ValueError(f"fold: columns {columns.shape} do not fit output_size {(h, w)} with a {kh}x{kw} kernel "
                         f"(want (N, C*{kh * kw}, {max(oh, 0) * max(ow, 0)}))")
    n, width, _ = columns.shape
    windows = reshape(permute(columns, (0, 2, 1)), (n, oh, ow, width))
    return _fold(windows, (n, width // (kh * kw), h, w), (kh, kw, sh, sw, ph, pw, dh, dw))


def _kernel_shape(ctx, channels: int, kh: int, kw: int):
    """IM2COL reads its kernel's sizes only: a shape, (KW, KH, C, 1) in ggml's order."""
    return template(ctx, (1, channels, kh, kw))


@compute("im2col")
def _im2col(ctx, s, node):
    kh, kw, sh, sw, ph, pw, dh, dw = node.arg
    x = s[0]
    # im2col_rows: CUDA's columns a block per output row, staged through shared memory;
    # im2col_x4: four values of a column a store
    columns = G.ggml_im2col(ctx, _kernel_shape(ctx, x.contents.ne[2], kh, kw), x, sw, sh, pw, ph, dw, dh, True, F32)
    return ops._asking(ops._asking(columns, "im2col_rows"), "im2col_x4")


@compute("col2im")
def _col2im(ctx, s, node):
    kh, kw, sh, sw, ph, pw, dh, dw = node.arg
    n, c, h, w = node.shape
    ne = (ctypes.c_int64 * 4)(w, h, c, n)
    folded = _supported(G.ggml_im2col_back(ctx, s[0], _kernel_shape(ctx, c, kh, kw), ne, sw, sh, pw, ph, dw, dh, True))
    if folded is None and kernels.supported(runtime.current().backend, kernels.FOLD):  # Vulkan, CUDA
        # fold_rows: CUDA's fold a block per image row, its column entries staged in shared memory
        folded = _supported(ops._asking(kernels.op(ctx, kernels.FOLD, (w * h, c * n), [ops.contiguous(ctx, s[0])],
                                                   list(node.arg) + [w, h, c]), "fold_rows"))
        folded = None if folded is None else ggml_reshape(ctx, folded, node.shape)
    return folded if folded is not None else _fold_by_taps(ctx, s[0], node)


def _fold_by_taps(ctx, columns, node):
    """Folding without IM2COL_BACK or ggrad's fold kernel: the columns of one window entry (tap)
    form an image of the output grid; spread to the stride, padded into place on a
    canvas of the padded image and summed over the taps, cropped to the image. Padding,
    adds and copies only: every backend runs them."""
    kh, kw, sh, sw, ph, pw, dh, dw = node.arg
    n, c, h, w = node.shape
    ow, oh = columns.contents.ne[1], columns.contents.ne[2]
    taps = kh * kw
    lazy.reserve(ctx, 64 * taps)  # views, pads and sums per tap (pad_axis may split a pad)
    per_tap = G.ggml_cont(ctx, G.ggml_permute(ctx, ggml_reshape(ctx, columns, (n, oh * ow, c, taps)), 1, 2, 0, 3))
    nb = per_tap.contents.nb
    canvas_w, canvas_h = max(w + 2 * pw, (kw - 1) * dw + ow * sw), max(h + 2 * ph, (kh - 1) * dh + oh * sh)
    total = None
    for tap in range(taps):
        y, x = divmod(tap, kw)
        image = G.ggml_cont(ctx, G.ggml_view_4d(ctx, per_tap, oh * ow, 1, c, n, nb[1], nb[2], nb[3], tap * nb[1]))
        image = _spread(ctx, G.ggml_reshape_4d(ctx, image, ow, oh, c, n), sh, sw)
        left, top = x * dw, y * dh
        placed = _pad_plane(ctx, image, left, canvas_w - left - ow * sw, top, canvas_h - top - oh * sh)
        total = placed if total is None else G.ggml_add(ctx, total, placed)
    nb = total.contents.nb
    view = G.ggml_view_4d(ctx, total, w, h, c, n, nb[1], nb[2], nb[3], ph * nb[1] + pw * nb[0])
    return ggml_reshape(ctx, G.ggml_cont(ctx, view), node.shape)


def _spread(ctx, image, by_h: int, by_w: int):
    """`image` with by - 1 zeros after each of its rows / columns (a stride's spacing)."""
    cols, rows, planes, batch = (image.contents.ne[i] for i in range(4))
    if by_w > 1:
        image = pad_axis(ctx, G.ggml_reshape_4d(ctx, image, 1, cols, rows, planes * batch), 0, 0, by_w - 1)
        cols *= by_w
    if by_h > 1:
        image = pad_axis(ctx, G.ggml_reshape_4d(ctx, image, cols, 1, rows, planes * batch), 1, 0, by_h - 1)
        rows *= by_h
    return G.ggml_reshape_4d(ctx, image, cols, rows, planes, batch)


def _pad_plane(ctx, image, left: int, right: int, top: int, bottom: int):
    """Zeros around each (W, H) plane of `image`, one axis at a time (pad_axis keeps
    every kernel inside CUDA's grid, whatever the batch and channels)."""
    cols, rows, planes, batch = (image.contents.ne[i] for i in range(4))
    if top or bottom:
        image = pad_axis(ctx, image, 1, top, bottom)
        rows += top + bottom
    if left or right:
        image = pad_axis(ctx, G.ggml_reshape_4d(ctx, image, cols, rows, planes, batch), 0, left, right)
        cols += left + right
    return G.ggml_reshape_4d(ctx, image, cols, rows, planes, batch)


# ---- convolutions ---------------------------------------------------------------------------
def _batch_parts(batch: int, rows_per_sample: int, bytes_per_sample: int) -> list[tuple[int, int]]:
    """(first, count) parts of a batch whose window columns fit the current device: a
    Vulkan device refuses a tensor past its storage-buffer range (lavapipe: an evaluation
    batch of 297 through a small CNN) and a product of more rows than its grid covers,
    and a convolution splits over its batch exactly. One part where everything fits."""
    backend = runtime.current().backend
    per_part = batch
    if backend.max_tensor_bytes is not None:
        per_part = min(per_part, backend.max_tensor_bytes // bytes_per_sample)
    most_rows = launch.product_rows(backend.info.kind)
    if most_rows is not None:
        per_part = min(per_part, most_rows // rows_per_sample)
    if per_part < 1:
        raise RuntimeError(f"one sample's convolution columns ({rows_per_sample:,} rows, {bytes_per_sample:,} bytes) "
                           f"are more than one tensor may hold on {runtime.current().name}")
    return [(first, min(per_part, batch - first)) for first in range(0, batch, per_part)]


def _conv_padding(padding, kernel: tuple, dilation: tuple, stride: tuple) -> tuple[tuple[int, int], ...]:
    """(before, after) per spatial axis, torch's: "same" puts the odd one after."""
    if isinstance(padding, str):
        if padding == "valid":
            return tuple((0, 0) for _ in kernel)
        if padding != "same":
            raise ValueError(f"padding must be 'valid', 'same', an int or a tuple, got {padding!r}")
        if any(s != 1 for s in stride):
            raise ValueError("padding='same' is not supported for strided convolutions")
        totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return tuple((t // 2, t - t // 2) for t in totals)
    pads = (padding,) * len(kernel) if isinstance(padding, numbers.Integral) else tuple(padding)
    if len(pads) != len(kernel) or not all(isinstance(p, numbers.Integral) and p >= 0 for p in pads):
        raise ValueError(f"padding must be a non-negative int or a {len(kernel)}-tuple of them, got {padding!r}")
    return tuple((int(p), int(p)) for p in pads)


def _even_padding(x: Tensor, pads: tuple) -> tuple[Tensor, int, int]:
    """`x` and the (top, left) padding left to the window op: an uneven (before, after)
    padding is applied explicitly (then none is left)."""
    (top, bottom), (left, right) = pads
    if top != bottom or left != right:
        return pad(x, (left, right, top, bottom)), 0, 0
    return x, top, left


def _windows(x: Tensor, kernel: tuple, stride: tuple, pads: tuple, dilation: tuple) -> Tensor:
    """unfold_windows with (before, after) padding."""
    x, top, left = _even_padding(x, pads)
    return unfold_windows(x, kernel, stride, (top, left), dilation)


def _kernel_geometry(x: Tensor, kernel: tuple, stride: tuple, pads: tuple, dilation: tuple,
                     out: tuple) -> tuple[Tensor, tuple]:
    """x with its padding made even, and the op_params of ggrad's columns and convolution
    kernels: kw, kh, sw, sh, pw, ph, dw, dh, ow, oh."""
    x, top, left = _even_padding(x, pads)
    return x, (kernel[1], kernel[0], stride[1], stride[0], left, top, dilation[1], dilation[0], out[1], out[0])


def _columns(x: Tensor, kernel: tuple, stride: tuple, pads: tuple, dilation: tuple, out: tuple) -> Tensor:
    """A convolution's columns in torch's unfold layout, (N, C*KH*KW, OH*OW): ggrad's CPU
    kernel (a row per tap, copied from input rows), with its adjoint as the gradient."""
    x, geometry = _kernel_geometry(x, kernel, stride, pads, dilation, out)
    n, c = x.shape[:2]
    return _apply("columns", (x,), (n, c * kernel[0] * kernel[1], out[0] * out[1]), _columns_rule, geometry, x.dtype)


def _columns_rule(ctx, g):
    return (_apply("columns_back", (g,), ctx.parents[0].shape, None, ctx.arg, g.dtype),)


@compute("columns")
def _columns_kernel(ctx, s, node):
    x = ops.contiguous(ctx, s[0])
    n, taps, pixels = node.shape
    return ops.reshape(ctx, kernels.op(ctx, kernels.COLUMNS, (pixels, taps * n), [x], list(node.arg)), node.shape)


@compute("columns_back")
def _columns_back_kernel(ctx, s, node):
    g = ops.contiguous(ctx, s[0])
    n, c, h, w = node.shape
    image = ops.template(ctx, node.shape)  # only its sizes are read
    return ops.reshape(ctx, kernels.op(ctx, kernels.COLUMNS_BACK, (w * h, c * n), [g, image], list(node.arg)), node.shape)


def _conv_kernel(x: Tensor, weight: Tensor, bias: Tensor | None, kernel: tuple, stride: tuple, pads: tuple,
                 dilation: tuple, out: tuple) -> Tensor:
    """conv2d (groups 1) as ggrad's CPU kernels, one node each way: each image's columns are
    made in a buffer of the thread's own and multiplied from cache, never written to memory
    (kernel set 19); the bias is added by the forward, its gradient summed as _finish's."""
    x, geometry = _kernel_geometry(x, kernel, stride, pads, dilation, out)
    n, c = x.shape[:2]
    oc = weight.shape[0]
    w = reshape(weight, (oc, c * kernel[0] * kernel[1]))
    parents = (x, w) if bias is None else (x, w, bias)
    return _apply("conv_kernel", parents, (n, oc) + tuple(out), _conv_kernel_rule, geometry, x.dtype)


def _conv_kernel_rule(ctx, g):
    x, w = ctx.parents[:2]
    gx = _apply("conv_kernel_back_input", (g, w.detach()), x.shape, None, ctx.arg, g.dtype) if x.requires_grad else None
    gw = _apply("conv_kernel_back_weight", (g, x.detach()), w.shape, None, ctx.arg, g.dtype) if w.requires_grad else None
    if len(ctx.parents) == 2:
        return gx, gw
    bias = ctx.parents[2]
    return gx, gw, (reshape(sum_to(g, bias.shape + (1, 1)), bias.shape) if bias.requires_grad else None)


@compute("conv_kernel")
def _conv_kernel_node(ctx, s, node):
    n, oc, oh, ow = node.shape
    srcs = [ops.contiguous(ctx, t) for t in s]
    return ops.reshape(ctx, kernels.op(ctx, kernels.CONV, (oh * ow, oc * n), srcs, list(node.arg)), node.shape)


@compute("conv_kernel_back_input")
def _conv_kernel_back_input_node(ctx, s, node):
    n, c, h, w = node.shape
    g, weight = (ops.contiguous(ctx, t) for t in s)
    image = ops.template(ctx, node.shape)  # only its sizes are read
    out = kernels.op(ctx, kernels.CONV_BACK_INPUT, (w * h, c * n), [g, weight, image], list(node.arg))
    return ops.reshape(ctx, out, node.shape)


@compute("conv_kernel_back_weight")
def _conv_kernel_back_weight_node(ctx, s, node):
    oc, width = node.shape
    g, x = (ops.contiguous(ctx, t) for t in s)
    return ops.reshape(ctx, kernels.op(ctx, kernels.CONV_BACK_WEIGHT, (width, oc), [g, x], list(node.arg)), node.shape)


def _grouped_product(columns: Tensor, weight: Tensor, groups: int, arg: tuple) -> Tensor:
    """(P, G*K) columns times a (G*O, K) weight, group by group -> (P, G*O)."""
    rows, width = columns.shape
    outs = weight.shape[0]
    if groups == 1:
        return _matmul_nt(columns, weight, arg)
    per_group = permute(reshape(columns, (rows, groups, width // groups)), (1, 0, 2))
    product = _matmul_nt(per_group, reshape(weight, (groups, outs // groups, width // groups)), arg)
    return reshape(permute(product, (1, 0, 2)), (rows, outs))


def _batched(x: Tensor, spatial: int, what: str) -> tuple[Tensor, bool]:
    """x with a batch axis (torch takes unbatched (C, *spatial) inputs too)."""
    if x.ndim == spatial + 1:
        return reshape(x, (1,) + x.shape), True
    if x.ndim != spatial + 2:
        raise ValueError(f"{what} needs a {spatial + 1}-d or {spatial + 2}-d input, got shape {x.shape}")
    return x, False


def _operands(input, weight, what: str, layout: str) -> tuple[Tensor, Tensor, bool]:
    """A 2-d convolution's input (batched) and 4-d weight, checked; and whether the input
    came unbatched."""
    x, weight = _float(_as_tensor(input), what), _float(_as_tensor(weight), what)
    x, unbatched = _batched(x, 2, what)
    if weight.ndim != 4:
        raise ValueError(f"{what} needs a 4-d weight {layout}, got shape {weight.shape}")
    if x.dtype is not weight.dtype:
        raise TypeError(f"{what} needs input and weight of one dtype, got {x.dtype} and {weight.dtype}")
    return x, weight, unbatched


def _finish(y: Tensor, bias, unbatched: bool, what: str) -> Tensor:
    """y plus a per-channel bias, without the batch axis if the input had none."""
    if bias is not None:
        bias = _as_tensor(bias)
        if bias.shape != (y.shape[1],):
            raise ValueError(f"{what} needs a bias of shape ({y.shape[1]},), got {bias.shape}")
        y = y + reshape(bias, (y.shape[1], 1, 1))
    return reshape(y, y.shape[1:]) if unbatched else y


# where wide layers take a product per image (NCHW as made, no transposed copies of the
# output or its gradient; the weight's gradient summed over the images). On CUDA, cuBLAS's
# strided batch (H100, fp32: the cnn step 1.50 -> 1.23 ms, ResNet-18 26.9 -> 24.7 ms
# against the rows layout below, docs/performance.md); Vulkan is not measured yet
PER_IMAGE_PRODUCT_KINDS = frozenset({"cpu", "cuda"})
# a layer takes the product per image from this many output pixels per output channel (0: every
# layer; an H100's ResNet-18 so took 37.8 ms against 8.5 ms, bf16: the deep layers' weight
# gradients summed over the images, docs/performance.md)
PER_IMAGE_PIXELS_PER_CHANNEL = 4
# where a stride-1 convolution's input gradient is itself a convolution (of the output's
# gradient with the weight's taps reversed and its channel axes swapped): the gradient's
# windows unfolded and multiplied, where the product's adjoint wrote every window's
# columns and folded them back. Only where the gradient's columns are no larger than the
# input's (out channels x input pixels <= in channels x output pixels): an H100, same
# process, "high": ResNet-18 10.88 vs 11.06 ms, bf16 9.47 vs 9.87; the cnn (32 -> 64
# channels) 0.895 vs 0.787 ms, so not there. Vulkan lost (ResNet 44.6 vs 38.7 ms, cnn 2.94 vs 2.07: docs/performance.md).
# The CPU's convolution kernels have their own input gradient.
INPUT_GRADIENT_CONV_KINDS = frozenset({"cuda"})


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1) -> Tensor:
    """torch.nn.functional.conv2d: input (N, C, H, W) or (C, H, W), weight
    (OC, C / groups, KH, KW); padding an int, a pair, "valid" or "same"."""
    x, weight, unbatched = _operands(input, weight, "conv2d", "(OC, C / groups, KH, KW)")
    c = x.shape[1]
    oc, cg, kh, kw = weight.shape
    if not isinstance(groups, numbers.Integral) or groups < 1 or c != cg * groups or oc % groups:
        raise ValueError(f"conv2d: input of {c} channels, weight {weight.shape} and groups={groups} do not fit "
                         f"(want channels == weight.shape[1] * groups and weight.shape[0] divisible by groups)")
    stride, dilation = _pair(stride, "stride"), _pair(dilation, "dilation")
    if min(stride) < 1 or min(dilation) < 1:
        raise ValueError(f"conv2d needs positive stride and dilation, got {stride}, {dilation}")
    pads = _conv_padding(padding, (kh, kw), dilation, stride)
    y = _conv2d(x, weight, bias, stride, pads, dilation, int(groups), _product_arg(x.dtype))
    return reshape(y, y.shape[1:]) if unbatched else y


def _conv2d(x: Tensor, weight: Tensor, bias, stride: tuple, pads: tuple, dilation: tuple, groups: int,
            arg: tuple) -> Tensor:
    """conv2d of a batched input, with (before, after) padding per axis; its products
    computed as `arg` says (_product_arg: precision and autocast, fixed when the forward
    was made, so that a gradient convolution made later computes as the forward did)."""
    n, c, _, _ = x.shape
    oc, cg, kh, kw = weight.shape
    oh, ow = (_out_size(size, k, s, sum(p), d) for size, k, s, p, d in zip(x.shape[2:], (kh, kw), stride, pads, dilation))
    positions = max(oh, 1) * max(ow, 1)
    parts = _batch_parts(n, positions, positions * max(c * kh * kw, oc) * x.dtype.itemsize)
    if len(parts) > 1:
        y = concat([_conv2d(narrow(x, 0, first, count), weight, None, stride, pads, dilation, groups, arg)
                    for first, count in parts], 0)
        return _finish(y, bias, False, "conv2d")
    backend = runtime.current().backend
    if groups == 1 and n > 1 and (oh * ow >= 64 or 0 < 4 * oc <= oh * ow) and x.dtype is dtypes.float32 and \
            kernels.supported(backend, kernels.CONV) and arg[1] is None:
        # the CPU's convolution kernels: each image's columns made in cache, a product per
        # image (faster than the rows layout below from 8x8 outputs up: 180 vs 203 ms for a
        # ResNet's 256-channel 8x8 layer, forward and backward; 225 vs 178 ms at 4x4)
        b = None if bias is None else _as_tensor(bias)
        fused = b is not None and b.shape == (oc,) and b.dtype is dtypes.float32  # else _finish checks and adds it
        y = _conv_kernel(x, weight, b if fused else None, (kh, kw), stride, pads, dilation, (oh, ow))
        return _finish(y, None if fused else bias, False, "conv2d")
    geometry = ((kh, kw), stride, pads, dilation, (oh, ow), groups, arg)
    if groups == 1 and stride == (1, 1) and oc * x.shape[2] * x.shape[3] <= c * oh * ow and \
            backend.info.kind in INPUT_GRADIENT_CONV_KINDS and x.requires_grad and autograd.is_recording() and \
            all(max(p) <= d * (k - 1) for p, k, d in zip(pads, (kh, kw), dilation)):
        y = _with_input_gradient(_product_conv(x.detach(), weight, *geometry), x, weight, geometry)
    else:
        y = _product_conv(x, weight, *geometry)
    return _finish(y, bias, False, "conv2d")


def _product_conv(x: Tensor, weight: Tensor, kernel: tuple, stride: tuple, pads: tuple, dilation: tuple, out: tuple,
                  groups: int, arg: tuple) -> Tensor:
    """conv2d as products over the input's windows, (N, OC, OH, OW)."""
    n, c = x.shape[:2]
    oc = weight.shape[0]
    (kh, kw), (oh, ow) = kernel, out
    backend = runtime.current().backend
    if groups == 1 and n > 1 and 0 < oc and PER_IMAGE_PIXELS_PER_CHANNEL * oc <= oh * ow and \
            x.dtype is dtypes.float32 and backend.info.kind in PER_IMAGE_PRODUCT_KINDS and \
            kernels.supported(backend, kernels.GEMM):
        # the GEMM kernel: each image's channels as rows of pixels, NCHW as it is made (the
        # columns' gradient comes out in their own layout too): no transposed copies. A
        # product per image is for layers with many pixels per channel; a deep layer (a
        # ResNet's 512 channels of 4x4) takes the rows layout below, one product for all
        # the images, whose transposed copies are small there. (Before kernel set 19: the
        # columns written out, the weight repeated per image and its gradient summed.)
        width = c * kh * kw
        flat = broadcast_to(reshape(weight, (1, oc, width)), (n, oc, width))
        if kernels.supported(backend, kernels.COLUMNS):
            y = _matmul_nt(flat, transpose(_columns(x, kernel, stride, pads, dilation, out)), arg)
        else:
            y = _matmul_nt(flat, reshape(_windows(x, kernel, stride, pads, dilation), (n, oh * ow, width)), arg)
        return reshape(y, (n, oc, oh, ow))
    columns = _windows(x, kernel, stride, pads, dilation)
    y = _grouped_product(reshape(columns, (n * oh * ow, columns.shape[3])), reshape(weight, (oc, -1)), groups, arg)
    return permute(reshape(y, (n, oh, ow, oc)), (0, 3, 1, 2))


def _with_input_gradient(y: Tensor, x: Tensor, weight: Tensor, geometry: tuple) -> Tensor:
    """`y`, a stride-1 convolution of x.detach() (its weight's gradient recorded as usual),
    with x's gradient recorded as the convolution of y's gradient by the reversed kernel:
    d/dx[c, i, j] = sum over o, u, v of g[o, i + before - d*u, j + left - d*v] w[o, c, u, v],
    a correlation of g padded by d*(k-1) - before (and - after) with w's taps reversed."""
    (kh, kw), _, pads, dilation, _, _, arg = geometry

    def rule(ctx, g):
        back = tuple((d * (k - 1) - before, d * (k - 1) - after) for (before, after), k, d in zip(pads, (kh, kw), dilation))
        return g, _conv2d(g, _reversed_kernel(weight.detach()), None, (1, 1), back, dilation, 1, arg), None
    out = Tensor._wrap(y.node)
    record(out, "conv2d", rule, (y, x, weight))  # the weight a parent too: its version is checked
    return out


def _reversed_kernel(weight: Tensor) -> Tensor:
    """(OC, C, KH, KW) -> (C, OC, KH, KW) with each kernel's taps in reverse order (turned
    by half a turn): rows of the taps picked backwards, three small nodes over the weight."""
    oc, c, kh, kw = weight.shape
    taps = kh * kw
    by_tap = permute(reshape(weight, (oc, c, taps)), (2, 1, 0))  # (taps, C, OC)
    if taps > 1:
        backwards = _constant(("taps reversed", taps), lambda: np.arange(taps - 1, -1, -1, dtype=np.int32))
        by_tap = reshape(gather(reshape(by_tap, (taps, c * oc)), backwards), (taps, c, oc))
    return reshape(permute(by_tap, (1, 2, 0)), (c, oc, kh, kw))


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1) -> Tensor:
    """torch.nn.functional.conv1d: input (N, C, L) or (C, L), weight (OC, C / groups, K);
    a conv2d over a height of 1."""
    x, weight = _as_tensor(input), _as_tensor(weight)
    x, unbatched = _batched(x, 1, "conv1d")
    if weight.ndim != 3:
        raise ValueError(f"conv1d needs a 3-d weight (OC, C / groups, K), got shape {weight.shape}")
    if not isinstance(padding, str):
        padding = (0, _single(padding, "padding"))
    y = conv2d(reshape(x, (x.shape[0], x.shape[1], 1, x.shape[2])), reshape(weight, weight.shape[:2] + (1, weight.shape[2])),
               bias, (1, _single(stride, "stride")), padding, (1, _single(dilation, "dilation")), groups)
    y = reshape(y, (y.shape[0], y.shape[1], y.shape[3]))
    return reshape(y, y.shape[1:]) if unbatched else y


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups: int = 1,
                     dilation=1) -> Tensor:
    """torch.nn.functional.conv_transpose2d: input (N, C, H, W) or (C, H, W), weight
    (C, OC / groups, KH, KW): conv2d's adjoint, the product's columns folded onto the output."""
    x, weight, unbatched = _operands(input, weight, "conv_transpose2d", "(C, OC / groups, KH, KW)")
    n, c, h, w = x.shape
    ci, ocg, kh, kw = weight.shape
    if not isinstance(groups, numbers.Integral) or groups < 1 or c != ci or c % groups:
        raise ValueError(f"conv_transpose2d: input of {c} channels, weight {weight.shape} and groups={groups} do not "
                         f"fit (want channels == weight.shape[0], divisible by groups)")
    (sh, sw), (ph, pw) = _pair(stride, "stride"), _pair(padding, "padding")
    (dh, dw), (eh, ew) = _pair(dilation, "dilation"), _pair(output_padding, "output_padding")
    if min(sh, sw, dh, dw) < 1 or min(ph, pw, eh, ew) < 0:
        raise ValueError("conv_transpose2d needs positive stride and dilation, non-negative padding")
    if eh >= max(sh, dh) or ew >= max(sw, dw):
        raise ValueError(f"output_padding {output_padding} must be smaller than stride or dilation")
    out_h, out_w = (h - 1) * sh - 2 * ph + dh * (kh - 1) + eh + 1, (w - 1) * sw - 2 * pw + dw * (kw - 1) + ew + 1
    if out_h < 1 or out_w < 1:
        raise ValueError(f"conv_transpose2d's output would be {out_h}x{out_w}")
    oc, taps = ocg * groups, kh * kw
    parts = _batch_parts(n, h * w, max(h * w * oc * taps, out_h * out_w * oc) * x.dtype.itemsize)
    if len(parts) > 1:
        y = concat([conv_transpose2d(narrow(x, 0, first, count), weight, None, stride, padding, output_padding,
                                     groups, dilation) for first, count in parts], 0)
        return _finish(y, bias, unbatched, "conv_transpose2d")
    # (P, C) x (C, OC*KH*KW) per group: the columns of the output's windows
    flat = reshape(permute(x, (0, 2, 3, 1)), (n * h * w, c))
    if groups == 1:
        columns = matmul_nt(flat, permute(reshape(weight, (c, ocg * taps)), (1, 0)))
    else:
        per_group = permute(reshape(flat, (n * h * w, groups, c // groups)), (1, 0, 2))
        kernel = permute(reshape(weight, (groups, c // groups, ocg * taps)), (0, 2, 1))
        columns = reshape(permute(matmul_nt(per_group, kernel), (1, 0, 2)), (n * h * w, oc * taps))
    arg = (kh, kw, sh, sw, ph, pw, dh, dw)
    y = _fold(reshape(columns, (n, h, w, oc * taps)), (n, oc, out_h, out_w), arg)
    return _finish(y, bias, unbatched, "conv_transpose2d")


# ---- pooling --------------------------------------------------------------------------------
def _pool_geometry(size: int, kernel: int, stride: int, padding: int, dilation: int, ceil_mode: bool) -> tuple[int, int]:
    """torch's output size and the extra padding after the input that ceil_mode reads."""
    span = dilation * (kernel - 1) + 1
    out = (size + 2 * padding - span + ((stride - 1) if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + padding:
        out -= 1  # the last window must start inside the input or its left padding
    if out < 1:
        raise ValueError(f"pooling window {kernel} (dilation {dilation}) is larger than the padded input {size + 2 * padding}")
    return out, max((out - 1) * stride + span - size - 2 * padding, 0)


def _pool_args(x: Tensor, kernel_size, stride, padding, dilation, what: str):
    kernel = _pair(kernel_size, "kernel_size")
    stride = kernel if stride is None or (not isinstance(stride, numbers.Integral) and len(stride) == 0) \
        else _pair(stride, "stride")
    padding, dilation = _pair(padding, "padding"), _pair(dilation, "dilation")
    if min(kernel + stride + dilation) < 1 or min(padding) < 0:
        raise ValueError(f"{what} needs positive kernel_size, stride and dilation, got {kernel}, {stride}, {dilation}")
    if any(p > k // 2 for p, k in zip(padding, kernel)):
        raise ValueError(f"{what}: padding {padding} should be at most half the kernel size {kernel}")
    return kernel, stride, padding, dilation


def _channel_images(x: Tensor, what: str) -> tuple[Tensor, tuple]:
    """(N, C, H, W) or (C, H, W) as (N*C, 1, H, W): every channel pooled as its own image."""
    if x.ndim not in (3, 4):
        raise ValueError(f"{what} needs a 3-d or 4-d input, got shape {x.shape}")
    lead = x.shape[:-2]
    return reshape(x, (int(np.prod(lead)), 1) + x.shape[-2:]), lead


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
               return_indices: bool = False) -> Tensor:
    """torch.nn.functional.max_pool2d: the max of each window (padding counts as -inf); the
    gradient goes to the window's first maximum, NaN counting as the maximum."""
    if return_indices:
        raise NotImplementedError("max_pool2d(return_indices=True) is not supported")
    x = _float(_as_tensor(input), "max_pool2d")
    kernel, stride, padding, dilation = _pool_args(x, kernel_size, stride, padding, dilation, "max_pool2d")
    images, lead = _channel_images(x, "max_pool2d")
    (oh, extra_h), (ow, extra_w) = (_pool_geometry(n, k, s, p, d, ceil_mode) for n, k, s, p, d in
                                    zip(images.shape[2:], kernel, stride, padding, dilation))
    if x.dtype is dtypes.float32 and kernels.supported(runtime.current().backend, kernels.MAX_POOL):
        geometry = (*kernel[::-1], *stride[::-1], *padding[::-1], *dilation[::-1], ow, oh)
        pooled = _apply("max_pool_kernel", (images,), images.shape[:2] + (oh, ow), _max_pool_kernel_rule, geometry,
                        x.dtype)
        return reshape(pooled, lead + (oh, ow))
    if padding != (0, 0) or extra_h or extra_w:
        images = pad(images, (padding[1], padding[1] + extra_w, padding[0], padding[0] + extra_h), value=-math.inf)
    if dilation != (1, 1):  # ggml's POOL_2D has no dilation: the max over unfolded windows
        return reshape(reduce_max(unfold_windows(images, kernel, stride, 0, dilation), -1), lead + (oh, ow))
    pooled = _apply("max_pool", (images,), images.shape[:2] + (oh, ow), _max_pool_rule, kernel + stride, x.dtype)
    return reshape(pooled, lead + (oh, ow))


def _max_pool_rule(ctx, g):
    """All of a window's gradient to its first maximum: ggml's POOL_2D_BACK where the
    backend has it (it finds the first maximum; a NaN, which torch counts as the maximum,
    gets none there: the values are NaN anyway), else one_hot_argmax over the unfolded
    windows, folded back."""
    images = ctx.parents[0].detach()
    kh, kw, sh, sw = ctx.arg
    if _has_pool_back():
        return (_apply("max_pool_back", (g, images), images.shape, None, ctx.arg, g.dtype),)
    windows = unfold_windows(images, (kh, kw), (sh, sw))
    hot = one_hot_argmax(windows) * reshape(g, windows.shape[:3] + (1,))
    return (_fold(hot, images.shape, (kh, kw, sh, sw, 0, 0, 1, 1)),)


def _max_pool_kernel_rule(ctx, g):
    images = ctx.parents[0].detach()
    return (_apply("max_pool_kernel_back", (g, images), images.shape, None, ctx.arg, g.dtype),)


@compute("max_pool_kernel")
def _max_pool_kernel(ctx, s, node):
    """ggrad's kernel: torch's max pooling in one node (NaN, padding, dilation as torch's)."""
    x = ops.contiguous(ctx, s[0])
    planes = node.shape[0] * node.shape[1]
    out = kernels.op(ctx, kernels.MAX_POOL, (node.shape[2] * node.shape[3], planes), [x], list(node.arg))
    return ops.reshape(ctx, out, node.shape)


@compute("max_pool_kernel_back")
def _max_pool_kernel_back(ctx, s, node):
    g, x = (ops.contiguous(ctx, t) for t in s)
    planes = node.shape[0] * node.shape[1]
    g = ops.reshape(ctx, g, (planes, node.arg[8] * node.arg[9]))  # (OW*OH, planes), as the kernel reads it
    out = kernels.op(ctx, kernels.MAX_POOL_BACK, (node.shape[2] * node.shape[3], planes), [g, x], list(node.arg))
    return ops.reshape(ctx, out, node.shape)


_pool_back: dict[str, bool] = {}


def _has_pool_back() -> bool:
    dev = runtime.current()
    if dev.name not in _pool_back:
        ctx = G.ggml_init(G.ggml_init_params(mem_size=1 << 16, mem_buffer=None, no_alloc=True))
        try:
            g, x = G.ggml_new_tensor_4d(ctx, F32, 2, 2, 1, 1), G.ggml_new_tensor_4d(ctx, F32, 4, 4, 1, 1)
            node = G.ggml_pool_2d_back(ctx, g, x, G.GGML_OP_POOL_MAX, 2, 2, 2, 2, 0.0, 0.0)
            _pool_back[dev.name] = dev.backend.supports(node)
        finally:
            G.ggml_free(ctx)
    return _pool_back[dev.name]


@compute("max_pool")
def _max_pool(ctx, s, node):
    """ggml's POOL_2D max over the planes, in parts where a Vulkan grid's x axis (one
    block per 512 outputs, 65,535 blocks on lavapipe) would not cover them all."""
    x = s[0]
    w, h, _, planes = (x.contents.ne[i] for i in range(4))
    per_plane = node.shape[-1] * node.shape[-2]
    most = launch.VULKAN_GRID_X * launch.VULKAN_POOL_WORKGROUP // per_plane  # a Vulkan grid's x axis
    if planes > most:
        nb = x.contents.nb
        return concat_all(ctx, [_max_pool_planes(ctx, G.ggml_view_4d(ctx, x, w, h, 1, min(most, planes - first), nb[1],
                                                                      nb[2], nb[3], first * nb[3]), node.arg)
                                for first in range(0, planes, most)], 3)
    return _max_pool_planes(ctx, x, node.arg)


def _max_pool_planes(ctx, x, arg):
    """POOL_2D max made torch's at the edges: its max skips NaN (torch's is NaN where a
    window holds one) and starts from -FLT_MAX (a window of -inf gave -3.4e38)."""
    kh, kw, sh, sw = arg
    pooled = G.ggml_pool_2d(ctx, x, G.GGML_OP_POOL_MAX, kw, kh, sw, sh, 0.0, 0.0)
    lowest = G.ggml_step(ctx, G.ggml_scale_bias(ctx, pooled, -1.0, -_BELOW_LOWEST))  # 1 at -FLT_MAX
    pooled = G.ggml_mul(ctx, pooled, G.ggml_scale_bias(ctx, lowest, 1.0, 1.0))  # doubled: -inf
    has_nan = G.ggml_pool_2d(ctx, G.ggml_scale_bias(ctx, _number(ctx, x), -1.0, 1.0), G.GGML_OP_POOL_MAX,
                             kw, kh, sw, sh, 0.0, 0.0)
    return G.ggml_add(ctx, pooled, G.ggml_div(ctx, G.ggml_scale(ctx, has_nan, 0.0),
                                              G.ggml_scale_bias(ctx, has_nan, -1.0, 1.0)))  # 0, or 0 / 0


_BELOW_LOWEST = float(np.nextafter(np.finfo(np.float32).max, 0, dtype=np.float32))  # one ulp inside -FLT_MAX


@compute("max_pool_back")
def _max_pool_back(ctx, s, node):
    kh, kw, sh, sw = node.arg
    return G.ggml_pool_2d_back(ctx, s[0], s[1], G.GGML_OP_POOL_MAX, kw, kh, sw, sh, 0.0, 0.0)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None) -> Tensor:
    """torch.nn.functional.avg_pool2d: the mean of each window, over its zero padding too
    unless count_include_pad=False (the part ceil_mode adds past the padding never counts)."""
    x = _float(_as_tensor(input), "avg_pool2d")
    kernel, stride, padding, _ = _pool_args(x, kernel_size, stride, padding, 1, "avg_pool2d")
    images, lead = _channel_images(x, "avg_pool2d")
    (h, w) = images.shape[2:]
    (oh, extra_h), (ow, extra_w) = (_pool_geometry(n, k, s, p, 1, ceil_mode) for n, k, s, p in
                                    zip((h, w), kernel, stride, padding))
    if extra_h or extra_w:
        images = pad(images, (0, extra_w, 0, extra_h))
    windows = unfold_windows(images, kernel, stride, padding, 1)
    divisor = _avg_divisors((h, w), (oh, ow), kernel, stride, padding, count_include_pad, divisor_override)
    if divisor is None:
        pooled = mean(windows, -1)
    else:
        key = ("divisors", (h, w), kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
        pooled = reduce_sum(windows, -1) * _constant(key, lambda: (1.0 / divisor).astype(np.float32))
    return reshape(pooled, lead + (oh, ow))


def _avg_divisors(size, out, kernel, stride, padding, count_include_pad: bool, divisor_override):
    """Each window's divisor (torch's rule), or None where every one is the window's size."""
    if divisor_override is not None:
        if not isinstance(divisor_override, numbers.Integral) or divisor_override == 0:
            raise ValueError(f"divisor_override must be a nonzero int, got {divisor_override!r}")
        return np.full(out, float(divisor_override))
    spans = []
    for n, o, k, s, p in zip(size, out, kernel, stride, padding):
        start = np.arange(o) * s - p
        end = np.minimum(start + k, n + p)
        if not count_include_pad:
            start, end = np.maximum(start, 0), np.minimum(end, n)
        spans.append((end - start).astype(np.float64))
    divisor = np.outer(*spans)
    return None if np.all(divisor == kernel[0] * kernel[1]) else divisor


def adaptive_avg_pool2d(input, output_size) -> Tensor:
    """torch.nn.functional.adaptive_avg_pool2d: output cell i averages rows
    floor(i H / oh) to ceil((i + 1) H / oh), as two products with averaging matrices."""
    x = _float(_as_tensor(input), "adaptive_avg_pool2d")
    if x.ndim not in (3, 4):
        raise ValueError(f"adaptive_avg_pool2d needs a 3-d or 4-d input, got shape {x.shape}")
    h, w = x.shape[-2:]
    sizes = (output_size, output_size) if isinstance(output_size, numbers.Integral) or output_size is None \
        else tuple(output_size)
    if len(sizes) != 2:
        raise ValueError(f"output_size must be an int or a pair, got {output_size!r}")
    oh, ow = (n if o is None else int(o) for o, n in zip(sizes, (h, w)))
    if oh < 1 or ow < 1:
        raise ValueError(f"output_size must be positive, got {output_size!r}")
    if h % oh == 0 and w % ow == 0:  # equal windows: a pool (a global one: a mean)
        if (oh, ow) == (1, 1):
            return mean(x, (-2, -1), keepdim=True)
        return avg_pool2d(x, (h // oh, w // ow))
    rows = cast(_constant(("averaging", oh, h), lambda: _averaging(h, oh)), x.dtype)
    cols = cast(_constant(("averaging.T", ow, w), lambda: _averaging(w, ow).T.copy()), x.dtype)
    return matmul(matmul(rows, x), cols)


def _averaging(n: int, out: int) -> np.ndarray:
    """(out, n): row i averages entries floor(i n / out) .. ceil((i + 1) n / out) - 1."""
    matrix = np.zeros((out, n), np.float32)
    for i in range(out):
        start, end = (i * n) // out, -((-(i + 1) * n) // out)
        matrix[i, start:end] = 1.0 / (end - start)
    return matrix


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
               return_indices: bool = False) -> Tensor:
    """torch.nn.functional.max_pool1d over (N, C, L) or (C, L)."""
    x = _as_tensor(input)
    y = max_pool2d(reshape(x, x.shape[:-1] + (1, x.shape[-1])), (1, _single(kernel_size, "kernel_size")),
                   None if stride is None else (1, _single(stride, "stride")), (0, _single(padding, "padding")),
                   (1, _single(dilation, "dilation")), ceil_mode, return_indices)
    return reshape(y, y.shape[:-2] + y.shape[-1:])


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True) -> Tensor:
    """torch.nn.functional.avg_pool1d over (N, C, L) or (C, L)."""
    x = _as_tensor(input)
    y = avg_pool2d(reshape(x, x.shape[:-1] + (1, x.shape[-1])), (1, _single(kernel_size, "kernel_size")),
                   None if stride is None else (1, _single(stride, "stride")), (0, _single(padding, "padding")),
                   ceil_mode, count_include_pad)
    return reshape(y, y.shape[:-2] + y.shape[-1:])


def interpolate(input, size=None, scale_factor=None, mode: str = "nearest") -> Tensor:
    """torch.nn.functional.interpolate, mode "nearest", over the last 1 or 2 axes of
    (N, C, L) or (N, C, H, W): output i reads input floor(i * scale) (torch's float
    arithmetic), a gather whose gradient sums into the rows read."""
    if mode != "nearest":
        raise NotImplementedError(f"interpolate mode {mode!r}: only 'nearest' is supported")
    x = _as_tensor(input)
    if x.ndim not in (3, 4):
        raise ValueError(f"interpolate needs (N, C, L) or (N, C, H, W), got {x.shape}")
    spatial = x.shape[2:]
    if (size is None) == (scale_factor is None):
        raise ValueError("interpolate takes one of size and scale_factor")
    count = len(spatial)
    if size is not None:
        sizes = (size,) * count if isinstance(size, numbers.Integral) else tuple(size)
        scales = [np.float32(n) / np.float32(o) for n, o in zip(spatial, sizes)]
    else:
        factors = (scale_factor,) * count if isinstance(scale_factor, numbers.Real) else tuple(scale_factor)
        if len(factors) != count or not all(isinstance(f, numbers.Real) and math.isfinite(f) and f > 0
                                            for f in factors):
            raise ValueError(f"interpolate needs {count} positive finite scale factors, got {scale_factor!r}")
        sizes = tuple(int(math.floor(n * f)) for n, f in zip(spatial, factors))
        scales = [np.float32(1.0 / f) for f in factors]
    if len(sizes) != count or min(sizes) < 1:
        raise ValueError(f"interpolate: output size {sizes} for input {x.shape}")
    from .indexing import take
    for axis, (n, out, scale) in enumerate(zip(spatial, sizes, scales), start=2):
        if out != n:
            index = np.minimum(np.floor(np.arange(out, dtype=np.float32) * scale).astype(np.int64), n - 1)
            x = take(x, index, axis)
    return x
