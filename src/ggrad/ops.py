"""ggml builders: how each primitive op becomes ggml nodes, in numpy layout.

A numpy shape ``(..., rows, cols)`` is a ggml tensor with ``ne = (cols, rows, ...)``.
Every builder takes contiguous sources and returns a contiguous result of
`node.shape`, so the next builder may reshape it freely. Shapes were validated when
the node was made (functional.py); nothing here may reach a ggml assert.

Dtypes: arithmetic runs in float32 (`@compute`): float16/bfloat16 and integer sources
are cast up first and the result is cast to the node's storage type, so every backend
computes the same thing whatever it supports for the low types (PyTorch's CPU half ops
do the same: float math, one rounding). Layout ops (`@builder`) move data as it is.
"""

from __future__ import annotations

import ctypes
import math

from ggml import ggml as G

from . import dtypes, lazy
from .lazy import builder
from .runtime import kernels, launch
from .runtime.handle import DTYPES, MAX_DIMS, ggml_ne

F32 = G.GGML_TYPE_F32
F16 = G.GGML_TYPE_F16
I32 = G.GGML_TYPE_I32


def once_per_graph(key: tuple, make):
    """`make()`, made once per graph being filled (lazy.build_memo) for ggml tensors named
    by `key` (what and from which source tensor), each time outside a fill."""
    memo = lazy.build_memo()
    if memo is None:
        return make()
    if key not in memo:
        memo[key] = make()
    return memo[key]


def contiguous(ctx, x):
    """`x`, copied into a contiguous tensor where it is a strided view."""
    return x if G.ggml_is_contiguous(x) else cont(ctx, x)


def _batched_transpose(x) -> tuple[int, int, int] | None:
    """(cols, rows, mats) where the view `x`, its mergeable axes merged, is `mats` packed
    (rows, cols) matrices read transposed; None where it is something else or ggml-cuda
    already sees it as one (three axes, the last packed)."""
    c, size = x.contents, G.ggml_type_size(x.contents.type)
    axes: list[list[int]] = []
    for ne, nb in zip(c.ne, c.nb):
        if ne == 1:
            continue
        if axes and nb == axes[-1][0] * axes[-1][1]:
            axes[-1][0] *= ne
        else:
            axes.append([ne, nb])
    if len(axes) not in (2, 3) or G.ggml_blck_size(c.type) != 1:
        return None
    (cols, col_stride), (rows, row_stride) = axes[0], axes[1]
    mats = axes[2][0] if len(axes) == 3 else 1
    if row_stride != size or col_stride != rows * size or (len(axes) == 3 and axes[2][1] != cols * rows * size):
        return None
    if c.ne[3] == 1 and c.nb[1] == size and c.nb[0] == rows * size and c.nb[2] == cols * rows * size:
        return None  # ggml-cuda's check passes as it is
    return cols, rows, mats


def cont(ctx, x):
    """CONT of the view `x`. A batch of transposed matrices spread over four axes (a
    convolution's NHWC <-> NCHW, attention's key transposes) is copied through the same
    values seen as at most three axes: ggml-cuda copies that shape in 32x32 tiles and any
    other one a value a thread with a 64-bit index computed per value (ResNet-18's 30
    copies: 1.5 ms of an H100's 13.3 ms step). The same copy on every backend."""
    shape = _batched_transpose(x)
    if shape is None:
        made = _asking(G.ggml_cont(ctx, x), "copy_rows")  # copy_rows: a warp a contiguous row
        _note_copied_product(made)
        return made
    cols, rows, mats = shape
    size = G.ggml_type_size(x.contents.type)
    packed = G.ggml_view_3d(ctx, x, rows, cols, mats, rows * size, rows * cols * size, 0)
    copied = G.ggml_cont(ctx, G.ggml_transpose(ctx, packed))
    return G.ggml_reshape_4d(ctx, copied, *x.contents.ne)


def _cont_source(t):
    """The view whose copy `t` is, where `t` is cont's three-axis copy; else None."""
    c = t.contents
    if c.op != G.GGML_OP_RESHAPE or c.src[0].contents.op != G.GGML_OP_CONT:
        return None
    transposed = c.src[0].contents.src[0]
    if transposed.contents.op != G.GGML_OP_TRANSPOSE or transposed.contents.src[0].contents.op != G.GGML_OP_VIEW:
        return None
    source = transposed.contents.src[0].contents.src[0]  # cont's copy has its view's shape, and covers it whole
    return source if tuple(source.contents.ne) == tuple(c.ne) else None


def as_type(ctx, x, ggml_type):
    """`x` in `ggml_type`: one cast per source and type in a graph, so a weight read by a
    product forward and by its gradient's product is cast once. A contiguous copy of a
    view (attention's permuted heads, a transposed operand) is cast from the view: one
    pass over the values, and the copy leaves the graph where nothing else reads it."""
    if x.contents.type == ggml_type:
        return x
    if x.contents.op == G.GGML_OP_RESHAPE:  # the reshaped tensor cast once, however many reshapes a graph casts
        return G.ggml_reshape_4d(ctx, as_type(ctx, x.contents.src[0], ggml_type), *x.contents.ne)
    widened = x.contents.src[0]
    if _is_cast(x) and x.contents.type == F32 and widened.contents.type == ggml_type and G.ggml_is_contiguous(widened) \
            and ggml_type in (G.GGML_TYPE_BF16, G.GGML_TYPE_F16):
        return widened  # a low tensor widened to float32 (exactly) and narrowed again: itself

    def cast():
        made = _columns_as(ctx, x, ggml_type)
        if made is None and x.contents.type == F32 and ggml_type in (G.GGML_TYPE_BF16, G.GGML_TYPE_F16):
            made = _relu_cast(ctx, x, ggml_type)
        if made is not None:
            return made
        # CUDA copies a transposed float32 view in tiles, reading and writing whole rows; its
        # cast of such a view reads a value a thread across rows: there the copy stays
        view = _uncopied(x, transposes=backend_kind() != "cuda")
        from_view = None if view is x else _supported(G.ggml_cast(ctx, view, ggml_type))
        # cast_x4: CUDA four values a thread (its one-value-a-thread kernel ran an H100's
        # autocast casts at ~0.5 TB/s); copy_rows: a view's contiguous rows a warp each
        if from_view is not None:
            _note_copied_product(from_view)
            return _asking(_asking(from_view, "cast_x4"), "copy_rows")
        made = _asking(_asking(G.ggml_cast(ctx, x, ggml_type), "cast_x4"), "copy_rows")
        if ggml_type in (G.GGML_TYPE_BF16, G.GGML_TYPE_F16):
            _note_narrowable(x, made)
        return made
    return once_per_graph(("cast", ctypes.addressof(x.contents), ggml_type), cast)


def _relu_cast(ctx, x, ggml_type):
    """`x`, where it is relu's float32 output, in `ggml_type` as one cast of relu's input that
    applies relu first, where the backend has it (CUDA's cast_relu, set 52): the same bits as
    the cast of relu's output (rounding keeps signs, NaN and zeros), and relu's float32 output
    is not written where nothing else reads it (its gradient reads the input); else None."""
    from . import runtime
    c = x.contents
    backend = runtime.current().backend
    # CUDA only, however the variant is set: other backends' CPY ignores op_params[2]
    if c.op != G.GGML_OP_UNARY or G.ggml_get_unary_op(x) != G.GGML_UNARY_OP_RELU \
            or c.src[0].contents.type != F32 or not G.ggml_is_contiguous(c.src[0]) or backend_kind() != "cuda" \
            or not kernels.variant(backend, "cast_relu"):
        return None
    cast = G.ggml_cast(ctx, c.src[0], ggml_type)
    cast.contents.op_params[0] = int(kernels.variant(backend, "cast_x4"))  # four values a thread where aligned
    cast.contents.op_params[2] = 1  # relu first
    return _supported(cast)


# ggrad's kernels that write float16 or bfloat16 where their output's type asks, each value
# converted as a cast converts (the same bits as the cast of their float32 output), with the op
# variant that says the backend has it (None: every backend with the kernel): LayerNorm's
# (set 53), attention's softmax gradient (set 57), the GEMM's on CUDA (set 57)
_LOW_WRITERS = {kernels.LAYER_NORM: "layer_norm_low", kernels.SOFTMAX_LOW_BACK: None, kernels.GEMM: "gemm_low_out"}


def _note_narrowable(x, cast) -> None:
    """Note `cast` (of all of `x` to a low type) for `narrow_casts` where `x` is one of
    _LOW_WRITERS' kernels' float32 output on a backend that has its low writing."""
    from . import runtime
    kernel = kernels.kernel_of(x)
    memo = lazy.build_memo()
    if memo is not None and kernel in _LOW_WRITERS and x.contents.type == F32 and (
            _LOW_WRITERS[kernel] is None or kernels.variant(runtime.current().backend, _LOW_WRITERS[kernel])):
        memo.setdefault("narrowable", []).append((x, cast))


def narrow_casts(graph, memo: dict) -> None:
    """Each noted kernel node whose only reader in the filled ggml `graph` is its cast writes
    the cast's low type itself, and the cast becomes a view of it: the float32 values are
    neither written nor read again (LayerNorm's output, the softmax gradient and a product's
    result under autocast, each read only by the next products). A node read by anything
    else (its float32 values wanted too) keeps them, and its cast stays. Before allocation."""
    from . import runtime
    noted = memo.get("narrowable")
    if not noted:
        return
    nodes, readers = _graph_readers(graph)
    backend = runtime.current().backend
    for x, cast in noted:
        c, cc = x.contents, cast.contents
        # x read once, and the cast in the graph (ggml_cast's node is its own src[1]: one count)
        only_reader = readers.get(ctypes.addressof(c)) == 1 and readers.get(ctypes.addressof(cc), 0) > 0
        if not only_reader or cc.op != G.GGML_OP_CPY or ctypes.addressof(cc.src[0].contents) != ctypes.addressof(c) \
                or cc.op_params[2] != 0 or c.flags & G.GGML_TENSOR_FLAG_OUTPUT or not G.ggml_is_contiguous(x):
            continue  # read elsewhere, not in this graph, or a cast that applies relu (_relu_cast)
        if kernels.kernel_of(x) == kernels.GEMM and c.src[0].contents.type != cc.type:
            continue  # cuBLAS writes a product in its operands' low type
        _retype(x, cc.type)
        if not backend.supports(x):
            _retype(x, F32)
            continue
        cc.op, cc.src[1], cc.view_src, cc.view_offs = G.GGML_OP_VIEW, None, x, 0
        for k in range(len(cc.op_params)):
            cc.op_params[k] = 0  # a view at offset 0
        for c in nodes:  # views of the cast: of its storage now (ggml's allocator follows one level)
            if c.view_src and ctypes.addressof(c.view_src.contents) == ctypes.addressof(cc):
                c.view_src = x


def _graph_readers(graph) -> tuple[list, dict[int, int]]:
    """The filled ggml `graph`'s nodes (their structs) and, by address, how many sources of
    theirs each tensor is."""
    nodes = [G.ggml_graph_node(graph, i).contents for i in range(G.ggml_graph_n_nodes(graph))]
    readers: dict[int, int] = {}
    for c in nodes:
        for j in range(G.GGML_MAX_SRC):
            if c.src[j]:
                key = ctypes.addressof(c.src[j].contents)
                readers[key] = readers.get(key, 0) + 1
    return nodes, readers


def _view_chain(t) -> list:
    """`t`, then each tensor it views through VIEW, RESHAPE, PERMUTE and TRANSPOSE (_PURE_VIEWS),
    ending with the first that is none of them."""
    chain = [t]
    while chain[-1].contents.op in _PURE_VIEWS:
        chain.append(chain[-1].contents.src[0])
    return chain


def _retype(x, ggml_type: int) -> None:
    """`x` (not yet allocated) as a contiguous tensor of `ggml_type`."""
    c = x.contents
    c.type = ggml_type
    c.nb[0] = G.ggml_type_size(ggml_type)
    for i in range(1, MAX_DIMS):
        c.nb[i] = c.nb[i - 1] * c.ne[i - 1]


lazy.GRAPH_PASSES.append(narrow_casts)


def _note_copied_product(copy) -> None:
    """Note `copy` (a CPY or CONT of a view of a GEMM node: attention's heads permuted back,
    joined or merged) for `products_in_place` where the backend writes products at any strides."""
    from . import runtime
    memo = lazy.build_memo()
    if memo is not None and kernels.kernel_of(_view_chain(copy.contents.src[0])[-1]) == kernels.GEMM \
            and kernels.variant(runtime.current().backend, "gemm_strided_out"):
        memo.setdefault("copied_products", []).append(copy)


def products_in_place(graph, memo: dict) -> None:
    """Each noted copy of a product's view whose product and views nothing else reads: the
    product writes each value where the copy would put it (the GEMM at its output's strides,
    set 58: the CPU's and CUDA's), and the copy becomes a view of where it wrote (or, a copy
    into a tensor of its own, that tensor, computed by nothing). Attention's q/k/v gradients
    go straight into their joined tensor and its output into its merged heads (on CUDA in
    the low type, for the output projection): passes over 17-67 MB each at the bf16 block's
    size. Before allocation."""
    from . import runtime
    candidates = []
    for copy in memo.get("copied_products", ()):
        chain = _view_chain(copy.contents.src[0])
        strides = _product_strides(chain[-1], chain[0], copy)
        if strides is not None:
            candidates.append((copy, chain, strides))
    if not candidates:
        return
    nodes, readers = _graph_readers(graph)
    in_graph = {ctypes.addressof(c) for c in nodes}
    backend = runtime.current().backend
    low_out = kernels.variant(backend, "gemm_low_out")
    for copy, chain, strides in candidates:
        product, views = chain[-1], chain[:-1]
        if ctypes.addressof(copy.contents) not in in_graph or any(
                readers.get(ctypes.addressof(t.contents)) != 1 or t.contents.flags & G.GGML_TENSOR_FLAG_OUTPUT
                for t in chain):
            continue  # not in this graph, or a value read elsewhere (the product's own values wanted)
        c, root = copy.contents, _storage_root(copy)
        if (c.op == G.GGML_OP_CPY and c.op_params[2] != 0) or (c.type != F32 and not low_out) or root.contents.data:
            continue  # a cast that applies relu (_relu_cast), a low result not trusted, or storage made
            # outside this graph (the product would write it at its own place in the order, not the copy's)
        # the product a view of the copy's storage, at the copy's type and strides; the storage also
        # its src[3], so that ggml's allocator places it before the product runs (its own node
        # comes later in the graph)
        layout = _layout(product)
        _set_layout(product, (c.type, _gemm_shape(product), tuple(strides), root, c.view_offs if c.view_src else 0, root))
        if not backend.supports(product):
            _set_layout(product, layout)
            continue
        for view in views:  # its storage now, at the product's place (ggml's allocator follows one level)
            view.contents.view_offs = (product.contents.view_offs + view.contents.view_offs) % 2**64
            view.contents.view_src = root
        if c.view_src:  # a CPY into a view of the joined tensor: that view, after the product
            c.op = G.GGML_OP_VIEW
        else:  # a cast or a CONT: its tensor, which the product writes and nothing computes
            c.op, c.src[1] = G.GGML_OP_NONE, None
        for k in range(len(c.op_params)):
            c.op_params[k] = 0


lazy.GRAPH_PASSES.append(products_in_place)


def _storage_root(copy):
    """The tensor that holds what `copy` writes: its destination's storage, or itself (a cast)."""
    return _pointer_copy(copy.contents.view_src) if copy.contents.view_src else copy


def _product_strides(product, source, copy) -> list[int] | None:
    """The strides, in `copy`'s destination, of the contiguous float32 `product` seen as its
    GEMM's (N, M, b2, b3), where `source` (a view of all of it) is what `copy` copies; None
    where the view is not a permutation of the product's axes or the product has a bias."""
    g, s, d = product.contents, source.contents, copy.contents
    if g.type != F32 or g.src[2] or g.src[3] or not G.ggml_is_contiguous(product) or s.view_offs != 0 \
            or tuple(s.ne) != tuple(d.ne) or G.ggml_nelements(source) != G.ggml_nelements(product):
        return None
    axes = sorted((s.nb[i], s.ne[i], d.nb[i]) for i in range(MAX_DIMS) if s.ne[i] > 1)
    if not axes:
        return None  # one value: nothing to place
    step = G.ggml_type_size(F32)
    for nb, ne, _ in axes:  # the view's axes, in the product's memory order, tile it
        if nb != step:
            return None
        step *= ne
    shape = _gemm_shape(product)
    return None if shape is None else \
        _strides_within(shape, tuple(ne for _, ne, _ in axes), tuple(nb for _, _, nb in axes))


def _gemm_shape(product) -> tuple[int, int, int, int] | None:
    """A packed GEMM node's result as its kernel's (N, M, b2, b3): its batches are its
    operands' larger ones along ggml's axes 2 and 3 (ggrad_gemm.h)."""
    g = product.contents
    a, b = g.src[0].contents, g.src[1].contents
    b2, b3 = max(a.ne[2], b.ne[2]), max(a.ne[3], b.ne[3])
    return None if g.ne[1] % (b2 * b3) else (g.ne[0], g.ne[1] // (b2 * b3), b2, b3)


def _layout(t) -> tuple:
    """What `_set_layout` sets: type, sizes, strides, storage, offset in it, src[3] (the
    pointers copied: a struct's pointer field read through ctypes is a view of the field)."""
    c = t.contents
    return c.type, tuple(c.ne), tuple(c.nb), _pointer_copy(c.view_src), c.view_offs, _pointer_copy(c.src[3])


def _pointer_copy(p):
    return ctypes.cast(ctypes.cast(p, ctypes.c_void_p), type(p)) if p else None


def _set_layout(t, layout: tuple) -> None:
    c = t.contents
    c.type, ne, nb, c.view_src, c.view_offs, c.src[3] = layout
    for i in range(MAX_DIMS):
        c.ne[i], c.nb[i] = ne[i], nb[i]


def writes_weights_low() -> bool:
    """Whether the current backend has both of set 57's attention softmax kernels."""
    from . import runtime
    backend = runtime.current().backend
    return kernels.supported(backend, kernels.SOFTMAX_LOW) and kernels.supported(backend, kernels.SOFTMAX_LOW_BACK)


def softmax_low(ctx, x, mask, scale: float, storage: str):
    """softmax(x * scale + mask) over the rows of the contiguous float32 `x`, written in the
    low dtype of `storage` (autocast's) by ggrad's kernel (SOFTMAX_LOW, set 57), as a view of
    x's shape, where the backend has it; else None. For attention's weights under autocast,
    which only their product with the values reads: each is the kernel's float32 softmax
    rounded once, as that product's cast of it would round it, and neither float32 weights
    nor their cast are written. The kernel keeps each row's max and 1/sum after the rows,
    for softmax_low_back."""
    if not writes_weights_low():
        return None
    low = DTYPES[storage]
    c, size = x.contents, G.ggml_type_size(low)
    rows, cols = G.ggml_nrows(x), c.ne[0]
    probs = _supported(kernels.op(ctx, kernels.SOFTMAX_LOW, (cols, kernels.softmax_low_rows(cols, rows, size)),
                                  [x, mask], [float(scale)], dtype=low))
    if probs is None:
        return None
    return G.ggml_view_4d(ctx, probs, *c.ne, cols * size, cols * c.ne[1] * size, cols * c.ne[1] * c.ne[2] * size, 0)


def softmax_low_source(y):
    """The SOFTMAX_LOW node whose probabilities `y` holds (the float32 value softmax_low's
    caller returned: a cast of its view, through views and reshapes), or None."""
    node = y
    while node.contents.op in _PURE_VIEWS or _is_cast(node):
        node = node.contents.src[0]
    return node if kernels.kernel_of(node) == kernels.SOFTMAX_LOW else None


def softmax_low_back(ctx, probs, grad):
    """The gradient of the scores softmax_low's `probs` node was made from, given the
    probabilities' gradient `grad` (SOFTMAX_LOW_BACK): each float32 probability computed again
    from the row's max and 1/sum, as the forward computed it. float32, in the scores' shape;
    a cast of it for a product is the kernel writing the low type (narrow_casts)."""
    pc = probs.contents
    x = pc.src[0]
    xc = x.contents
    grad = G.ggml_reshape_4d(ctx, contiguous(ctx, grad), *xc.ne)
    node = kernels.op(ctx, kernels.SOFTMAX_LOW_BACK, (xc.ne[0], G.ggml_nrows(x)), [x, pc.src[1], grad, probs], [])
    node.contents.op_params[1] = pc.op_params[1]  # the scale, its bits
    return G.ggml_reshape_4d(ctx, node, *xc.ne)


def fuses_attention() -> bool:
    """Whether the current backend has both of set 59's attention kernels (CUDA)."""
    from . import runtime
    backend = runtime.current().backend
    return kernels.supported(backend, kernels.ATTENTION) and kernels.supported(backend, kernels.ATTENTION_BACK)


def _low_operand(ctx, x, low_type: int):
    """The float32 (D, rows, heads, batches) tensor `x` in `low_type` for the attention kernels:
    a view of one cast of the tensor it views, where its strides suit them (rows on 16 bytes;
    the product that made that tensor writes the low type where the cast is its only reader:
    narrow_casts); else a contiguous cast of it."""
    c = x.contents
    root = c.view_src if c.view_src else x
    size = G.ggml_type_size(low_type)
    low = [n // 4 * size for n in (c.nb[1], c.nb[2], c.nb[3], c.view_offs if c.view_src else 0)]
    if c.type == F32 and c.nb[0] == 4 and root.contents.type == F32 and G.ggml_is_contiguous(root) \
            and all(n % 16 == 0 for n in low):
        return G.ggml_view_4d(ctx, as_type(ctx, root, low_type), *c.ne, *low)
    return as_type(ctx, contiguous(ctx, x), low_type)


def attention(ctx, q, k, v, scale: float, causal: bool, storage: str):
    """softmax(q k^T * scale [+ causal mask]) v over float32 q (D, L, H, B) and k, v (D, S, H, B),
    as one ggrad kernel (ATTENTION, set 59) over their `storage` (autocast's low) type, or None
    where the backend refuses it. The node holds the output (B, L, H, D) in float32 (heads
    merged), then each row's log-sum-exp (base 2) for attention_back."""
    d, length, heads, batch = (q.contents.ne[i] for i in range(4))
    low = DTYPES[storage]
    operands = [_low_operand(ctx, t, low) for t in (q, k, v)]
    rows = -(-(batch * length * heads * d + batch * heads * length) // d)
    return _supported(kernels.op(ctx, kernels.ATTENTION, (d, rows), operands, [float(scale), int(causal)]))


def attention_back(ctx, node, grad, scale: float, causal: bool, packed: bool):
    """The gradient of ATTENTION's `node` given its output's gradient `grad` (D, L, H, B; rows
    contiguous), as one (D, rows) float32 tensor (ATTENTION_BACK): `packed` (L == S), dq, dk and dv
    side by side in each row, (B, L, 3, H, D); else dq (B, H, L, D), then dk and dv (B, H, S, D)."""
    src = node.contents.src
    d, length, heads, batch = (src[0].contents.ne[i] for i in range(4))
    keys = src[1].contents.ne[1]
    rows = 3 * batch * length * heads if packed else batch * heads * (length + 2 * keys)
    grad = grad if grad.contents.nb[0] == 4 else contiguous(ctx, grad)
    back = kernels.op(ctx, kernels.ATTENTION_BACK, (d, rows), [src[0], src[1], src[2], node, grad],
                      [float(scale), int(causal), int(packed)])
    if _supported(back) is None:
        raise RuntimeError(f"the backend ran ggrad's attention kernel but refuses its gradient (heads of {d}, "
                           f"{heads} x {batch}, {length} queries, {keys} keys)")
    return back


def attention_node(out, forward):
    """The ATTENTION node whose output `out` views in this graph; else (its values kept from an
    earlier graph, without the rows' statistics) the node `forward()` makes again (attention())."""
    node = _view_chain(out)[-1]
    if kernels.kernel_of(node) == kernels.ATTENTION:
        return node
    again = forward()
    if again is None:
        raise RuntimeError("the backend no longer runs ggrad's attention kernel for this gradient's forward")
    return again


def _heads(ctx, qkv, heads: int) -> list:
    """q, k, v of a fused projection's float32 output `qkv` (3E, L, B) as (D, L, heads, B) views."""
    e3, length, batch = (qkv.contents.ne[i] for i in range(3))
    qkv = contiguous(ctx, qkv)
    e = e3 // 3
    d = e // heads
    return [G.ggml_view_4d(ctx, qkv, d, length, heads, batch, e3 * 4, d * 4, length * e3 * 4, i * e * 4) for i in range(3)]


def self_attention(ctx, qkv, heads: int, scale: float, causal: bool, storage: str):
    """attention() over q, k, v side by side in the rows of a fused projection's float32 output
    `qkv` (3E, L, B), read as views of one cast of it: the (E, L, B) output, heads merged."""
    e, length, batch = qkv.contents.ne[0] // 3, qkv.contents.ne[1], qkv.contents.ne[2]
    node = attention(ctx, *_heads(ctx, qkv, heads), scale, causal, storage)
    return None if node is None else G.ggml_view_3d(ctx, node, e, length, batch, e * 4, length * e * 4, 0)


def self_attention_back(ctx, grad, out, qkv, heads: int, scale: float, causal: bool, storage: str):
    """The gradient of self_attention's output `out` given `grad` (E, L, B): the (3E, L, B)
    gradient of `qkv`, dq, dk and dv side by side in each row as the projection's rows hold them."""
    e3, length, batch = (qkv.contents.ne[i] for i in range(3))
    e = e3 // 3
    d = e // heads
    node = attention_node(out, lambda: attention(ctx, *_heads(ctx, qkv, heads), scale, causal, storage))
    g = G.ggml_view_4d(ctx, contiguous(ctx, grad), d, length, heads, batch, e * 4, d * 4, length * e * 4, 0)
    return G.ggml_reshape_3d(ctx, attention_back(ctx, node, g, scale, causal, True), e3, length, batch)


def computed_by(t, op: int) -> bool:
    """Whether the ggml tensor `t` is, through views and reshapes, a node of `op` in the graph being built."""
    return _view_chain(t)[-1].contents.op == op


def _is_cast(x) -> bool:
    """Whether `x` is ggml_cast's node (a CPY into a new tensor: itself its destination)."""
    c = x.contents
    return c.op == G.GGML_OP_CPY and bool(c.src[1]) and ctypes.addressof(c.src[1].contents) == ctypes.addressof(c)


def _columns_as(ctx, x, ggml_type):
    """A convolution's columns (IM2COL) written in `ggml_type` by IM2COL itself, where the
    backend has it (CUDA's im2col_low, set 46: bfloat16 and float16, converted as a cast
    converts), instead of float32 columns and then a cast of them; else None."""
    from . import runtime
    c = x.contents  # never a reshape: as_type casts what it reshapes
    if c.op != G.GGML_OP_IM2COL or c.type != F32 or ggml_type not in (G.GGML_TYPE_BF16, G.GGML_TYPE_F16) \
            or not kernels.variant(runtime.current().backend, "im2col_low"):
        return None
    p = c.op_params
    # the kernel's shape (its sizes alone are read) in the columns' type: ggml's CPU asks that of float16's
    shape = G.ggml_new_tensor(ctx, ggml_type, MAX_DIMS, (ctypes.c_int64 * MAX_DIMS)(*c.src[0].contents.ne))
    columns = G.ggml_im2col(ctx, shape, c.src[1], p[0], p[1], p[2], p[3], p[4], p[5], bool(p[6]), ggml_type)
    columns.contents.op_params[7], columns.contents.op_params[8] = p[7], p[8]  # im2col_rows, im2col_x4, as asked
    return columns


def _asking(node, name: str):
    """`node` asking for ggml's changed op `name` (a 1 in its op_params slot, which ggml's
    own op leaves 0) where the current backend has it and trusts it (kernels.OP_VARIANTS)."""
    from . import runtime
    if kernels.variant(runtime.current().backend, name):
        node.contents.op_params[kernels.OP_VARIANTS[name][2]] = 1
    return node


def compute(name: str, keep_int: bool = False):
    """Register a builder that computes in float32 (integer sources too, unless
    `keep_int`: indices stay I32) and returns the node's storage type."""
    def register(fn):
        def build(ctx, s, node):
            srcs = [x if keep_int and x.contents.type == I32 else as_type(ctx, x, F32) for x in s]
            return as_type(ctx, fn(ctx, srcs, node), DTYPES[node.dtype.storage])
        builder(name)(build)
        return fn
    return register


def reshape(ctx, x, shape):
    return G.ggml_reshape_4d(ctx, x, *ggml_ne(shape))


def template(ctx, shape, dtype=F32):
    """A shape-only tensor: never allocated, only read for its sizes."""
    ne = (ctypes.c_int64 * MAX_DIMS)(*ggml_ne(shape))
    return G.ggml_new_tensor(ctx, dtype, MAX_DIMS, ne)


# backends whose readers of a per-row vector through its stride (the cross-entropy kernel's
# gradient, set 48) are verified with a vector of stride 0
STRIDE_ZERO_KINDS = frozenset({"cpu", "vulkan", "cuda"})


def repeated_view(ctx, x, n: int):
    """A one-value `x` seen as `n` values, a view of stride 0 (no copy), for a kernel that
    reads a vector through its stride; None where the backend is not in STRIDE_ZERO_KINDS.
    ggml's view checks its size against the source's as if contiguous, so the view is made
    of one value and then widened."""
    if backend_kind() not in STRIDE_ZERO_KINDS:
        return None
    view = G.ggml_view_1d(ctx, x, 1, 0)
    view.contents.ne[0], view.contents.nb[0] = n, 0
    return view


def expand(ctx, x, shape):
    """`x` repeated (numpy broadcasting) to `shape`, unless it already has it."""
    if tuple(x.contents.ne) == ggml_ne(shape):
        return x
    return G.ggml_repeat_4d(ctx, x, *ggml_ne(shape))


def _binary(fn, commutative: bool):
    def build(ctx, s, node):
        a, b = s
        full = ggml_ne(node.shape)
        if commutative and (tuple(a.contents.ne) != full or _repeated(a) is not None) \
                and tuple(b.contents.ne) == full and _repeated(b) is None:
            a, b = b, a
        if tuple(a.contents.ne) != full:
            a = expand(ctx, a, node.shape)
        source = _repeated(b)
        if source is not None and G.ggml_can_repeat(source, a):
            b = source  # ggml broadcasts b into a: no copy of it repeated (a mean's gradient)
        return _asking(fn(ctx, a, b), "binary_x4")  # CUDA: four values a thread where they fit
    return build


def _repeated(t):
    """The contiguous tensor that `t` is a REPEAT of, else None."""
    c = t.contents
    return c.src[0] if c.op == G.GGML_OP_REPEAT and G.ggml_is_contiguous(c.src[0]) else None


compute("add")(_binary(G.ggml_add, True))
compute("sub")(_binary(G.ggml_sub, False))
compute("mul")(_binary(G.ggml_mul, True))
compute("div")(_binary(G.ggml_div, False))


def soft_max(ctx, x, mask=None, scale: float = 1.0):
    """softmax(x * scale + mask) over each row: ggml's SOFT_MAX, asking CUDA for a warp a row
    (softmax_rows, set 50)."""
    return _asking(G.ggml_soft_max_ext(ctx, x, mask, scale, 0.0), "softmax_rows")


_UNARY = {
    "neg": G.ggml_neg, "exp": G.ggml_exp, "log": G.ggml_log, "sqrt": G.ggml_sqrt,
    "sqr": G.ggml_sqr, "abs": G.ggml_abs, "sgn": G.ggml_sgn,
    "relu": G.ggml_relu, "sigmoid": G.ggml_sigmoid, "tanh": G.ggml_tanh,
    "silu": G.ggml_silu,
    "softmax": soft_max, "floor": G.ggml_floor, "ceil": G.ggml_ceil,
    "trunc": G.ggml_trunc, "sin": G.ggml_sin, "cos": G.ggml_cos,
}
for _name, _fn in _UNARY.items():
    compute(_name)(lambda ctx, s, node, fn=_fn: fn(ctx, s[0]))
builder("cont")(lambda ctx, s, node: G.ggml_cont(ctx, s[0]))


@compute("gelu")
def _gelu(ctx, s, node):
    """x Phi(x): ggrad's kernel where the backend has it (a vectorized erf: ggml's GELU_ERF
    calls erff for each element), else ggml's."""
    from . import runtime
    if not kernels.supported(runtime.current().backend, kernels.GELU):
        return G.ggml_gelu_erf(ctx, s[0])
    x = contiguous(ctx, s[0])
    return reshape(ctx, kernels.op(ctx, kernels.GELU, (math.prod(node.shape), 1), [x], []), node.shape)


@compute("step")
def _step(ctx, s, node):
    # relu(sign(x)), not ggml_step: Vulkan's step(0) is 1, the CPU's is 0.
    return G.ggml_relu(ctx, G.ggml_sgn(ctx, s[0]))


@compute("affine")
def _affine(ctx, s, node):
    scale, bias = node.arg
    if bias == 0.0:
        return G.ggml_scale(ctx, s[0], scale)
    return G.ggml_scale_bias(ctx, s[0], scale, bias)


@compute("leaky_relu")
def _leaky_relu(ctx, s, node):
    return G.ggml_leaky_relu(ctx, s[0], node.arg, False)


OPEN_BOUND = 3.0e38  # a bound this large stands for none (functional's stand-in for None)


@compute("clamp")
def _clamp(ctx, s, node):
    """min(max(x, lo), hi) as torch's: an open bound is infinite (an infinite x passes
    it), and NaN stays NaN (every backend's clamp treats it differently; 0 * sigmoid(x)
    added is NaN for NaN and 0 for every number and infinity).
    NOTE: ggml_clamp is always in place (its result is a view of its source, ggml
    0.15.3), so it runs on a copy: over a leaf it overwrote the tensor being clamped."""
    lo, hi = node.arg
    lo = -math.inf if lo <= -OPEN_BOUND else lo
    hi = math.inf if hi >= OPEN_BOUND else hi
    x = s[0]
    clamped = G.ggml_clamp(ctx, G.ggml_cont(ctx, x), lo, hi)
    return G.ggml_add(ctx, clamped, G.ggml_scale(ctx, G.ggml_sigmoid(ctx, x), 0.0))


@compute("pow")
def _pow(ctx, s, node):
    x, p = s[0], node.arg
    if p == 2:
        return G.ggml_sqr(ctx, x)
    if p == 0.5:
        return G.ggml_sqrt(ctx, x)
    if float(p).is_integer() and abs(p) <= 16:
        n, result, base = abs(int(p)), None, x
        while n:  # exponentiation by squaring
            if n & 1:
                result = base if result is None else G.ggml_mul(ctx, result, base)
            n >>= 1
            if n:
                base = G.ggml_sqr(ctx, base)
        if result is None:  # p == 0
            return G.ggml_fill(ctx, x, 1.0)
        if p < 0:
            return G.ggml_div(ctx, G.ggml_fill(ctx, x, 1.0), result)
        return G.ggml_cont(ctx, result) if result is x else result
    return G.ggml_exp(ctx, G.ggml_scale(ctx, G.ggml_log(ctx, x), p))


@compute("softmax_back")
def _softmax_back(ctx, s, node):
    """NOTE: ggml's allocator may compute SOFT_MAX_BACK in place over either source, but the
    CPU kernel copies dy into dx before it reads y: in place over y it multiplies by dy.
    Flagging y as an output keeps its memory (it was wrong gradients upstream of attention
    whenever the softmax's output had no other reader left; ggml 0.15.3, 2026-12-02)."""
    grad, y = s
    y.contents.flags |= G.GGML_TENSOR_FLAG_OUTPUT
    return G.ggml_soft_max_ext_back(ctx, grad, y, 1.0, 0.0)


def _product(ctx, src0, src1, arg):
    """ggml's mul_mat(src0, src1) as `arg` = (matmul precision, autocast storage type or
    None) asks. Under autocast both operands are stored in the low type and the sums are
    float32; where the backend has no such product, the operands are rounded to the low
    type and multiplied in float32: the same values, without the speed. "highest" marks
    float32 products GGML_PREC_F32, which a ggml-cuda built by `make cuda` runs without
    TF32 (runtime/precision.py)."""
    low = arg[1]
    gemm = _gemm(ctx, src1, src0, False, True, arg)
    if gemm is not None:
        return gemm
    if _half_operands(arg, src1.contents.ne[1], src0, src1):
        return _marked(G.ggml_mul_mat(ctx, as_type(ctx, src0, F16), as_type(ctx, src1, F16)), arg)
    if low is not None:
        kind = DTYPES[low]
        src0 = as_type(ctx, src0, kind)
        # ggml-vulkan's low-precision products assert on a BF16 src1 and never finish on
        # lavapipe for a src1 of 5 to 8 columns (bf16 and f16; supports_op says yes to
        # both): Vulkan takes the rounded operands in float32, unless its matrix cores do
        # (they round a float32 src1 to src0's type themselves: src1 goes as it is, widened)
        fast = None
        if backend_kind() != "vulkan":
            fast = _supported(_precise(G.ggml_mul_mat(ctx, src0, as_type(ctx, src1, kind))))
        elif _vulkan_matrix_cores_take(kind):
            fast = _supported(_precise(G.ggml_mul_mat(ctx, src0, as_type(ctx, src1, F32))))
        if fast is not None:
            return fast
        src0, src1 = as_type(ctx, src0, F32), as_type(ctx, as_type(ctx, src1, kind), F32)
        exact = _gemm(ctx, src1, src0, False, True, ("highest", None))  # the rounded operands, float32 sums
        if exact is not None:
            return exact
    return _marked(G.ggml_mul_mat(ctx, src0, src1), arg)


# ggml-vulkan multiplies a product of at most this many columns (src1's rows) by its
# matrix-vector shaders, which read float32 operands as they are (MUL_MAT_VEC_MAX_COLS)
VULKAN_VECTOR_MAX_COLUMNS = 8


def _half_operands(arg, columns: int, *operands) -> bool:
    """Whether a float32 product of `columns` columns takes its `operands` cast to float16
    once per graph (as_type): on a Vulkan device whose matrix cores are ggml's NV_coopmat2
    ones (on where it started at "medium"), ggml-vulkan copies each float32 operand to
    float16 inside every product, so a weight read forward and by its gradient's product
    was converted twice and a transposed operand copied twice (ggrad's transpose, then
    ggml's cast); cast first, the transpose moves half the bytes. The same float16 values
    reach the same shader. Not for autocast's products (_product casts those) nor ggml's
    matrix-vector products, which multiply in float32."""
    if arg[1] is not None or columns <= VULKAN_VECTOR_MAX_COLUMNS \
            or any(x.contents.type not in (F32, F16) for x in operands):
        return False
    return _vulkan_traits_on().get("matrix cores") == "NV_coopmat2"


def _vulkan_traits_on() -> dict[str, str]:
    """What ggml-vulkan reported of this device (backend.vulkan_traits: its matrix cores,
    fp16, bf16) where the device started with its float16 paths on ("medium"); {} where
    they are off or the device is not a Vulkan one."""
    from . import runtime
    from .runtime import backend, precision
    name = runtime.current().backend.info.name
    return backend.vulkan_traits(name) if precision.vulkan_float16_on(name) else {}


def _vulkan_matrix_cores_take(low: int) -> bool:
    """Whether this Vulkan device multiplies operands of the ggml type `low` on its
    matrix cores: they are on (the device started at matmul precision "medium") and, for
    bfloat16, the driver has the type (VK_KHR_shader_bfloat16) and the build its shaders
    (a glslc with GL_EXT_bfloat16: GGRAD_GLSLC_SUITE=forky)."""
    from .runtime import backend
    traits = _vulkan_traits_on()
    if traits.get("matrix cores", "none") == "none":
        return False
    if low == G.GGML_TYPE_BF16:
        return traits.get("bf16") == "1" and "bf16 coopmat" in (backend.vulkan_shader_features() or ())
    return traits.get("fp16", "0") != "0"  # "1", or "dot2" with mixed-precision dot products


# Vulkan's GEMM shader gives each 64x64 tile of the product one workgroup and no split of
# the sum: a product of few tiles over a long sum (a convolution's weight gradient: 64 x 576
# over 131072 pixels, 9 tiles) runs on a few of the GPU's cores, where ggml's mul_mat splits
# the sum among workgroups. H200 (2026-12-06), every float32 product on the shader against
# ggml's: cnn 18.2 vs 8.1 ms, ResNet-18 55.4 vs 49.7 ms; the MLPs' products (sums over the
# batch, 128-512) gained from it. The shader takes such products in parts, its sums cut
# into batches of at least VULKAN_GEMM_SPLIT_ROWS terms, the parts' products then added:
# ggml's mul_mat splits their sums only a few ways (H200: the ResNet stem's 27 x 64 over
# 131072 pixels took 7.1 ms, 64 GFLOP/s; the cnn's 9 x 32, 4.4 ms of a 7 ms step). Set 48
# (H100, bench/gpu/vulkan_gemm.py): in parts up to 512 workgroups, the ResNet's weight
# gradients of 9 and 36 tiles took 1.21 and 1.06 ms against ggml's 3.07 and 1.30 (parts
# up to 256 workgroups: 1.65 and 1.39), so every product of fewer tiles than
# VULKAN_GEMM_MIN_TILES is taken so (set 47: at most 4 tiles) where its sum splits.
VULKAN_GEMM_MIN_TILES = 64
VULKAN_GEMM_LONG_K = 4096
VULKAN_GEMM_SPLIT_TILES = VULKAN_GEMM_MIN_TILES - 1
VULKAN_GEMM_SPLIT_WORKGROUPS = 512  # parts times tiles, at most (~4 a multiprocessor of an H100)
VULKAN_GEMM_SPLIT_ROWS = 256  # rows of the sum a part, at least
# Larger products take ggrad_gemm_wide.comp's tiles of 128 rows and/or columns (set 48: up to
# 8x8 outputs an invocation, twice the multiply-adds per value read of the 64x64 tile's 4x4),
# where they still give this many workgroups (~one a multiprocessor of an H100, 132).
VULKAN_GEMM_WIDE_MIN_TILES = 128
_WIDE_TILES = {(128, 128): 1, (128, 64): 2, (64, 128): 3}  # (rows, columns) -> op_params[4]


def _vulkan_tile(dev_backend, m: int, n: int, batches: int) -> int:
    """The GEMM shader's tile for an m x n product (op_params[4]: 0 for 64x64, else
    _WIDE_TILES's): 128 along each side of at least 128, where enough tiles remain."""
    tm, tn = 128 if m >= 128 else 64, 128 if n >= 128 else 64
    if (tm, tn) not in _WIDE_TILES or not kernels.variant(dev_backend, "gemm_wide") or \
            -(-m // tm) * -(-n // tn) * batches < VULKAN_GEMM_WIDE_MIN_TILES:
        return 0
    return _WIDE_TILES[tm, tn]


def _gemm_by_parts(ctx, dev_backend, a, b, trans_a: bool, trans_b: bool, m: int, n: int, k: int):
    """op(a) @ op(b) (2-d, rows of unit stride) as one GEMM over `parts` batches of K/parts
    terms of the sum each, a workgroup a tile and part, the parts' products then added
    (REPEAT_BACK, in order); None where the sum does not split so."""
    ca, cb = a.contents, b.contents
    if any(t.ne[2] != 1 or t.ne[3] != 1 or t.nb[0] != 4 for t in (ca, cb)):
        return None
    tiles, parts = -(-m // 64) * -(-n // 64), 1
    while tiles * parts * 2 <= VULKAN_GEMM_SPLIT_WORKGROUPS and k % (parts * 2) == 0 \
            and k // (parts * 2) >= VULKAN_GEMM_SPLIT_ROWS:
        parts *= 2
    if parts == 1:
        return None
    terms = k // parts

    def in_parts(t, sum_on_rows: bool):  # the operand's K axis cut into `parts` batches
        c = t.contents
        if sum_on_rows:
            return G.ggml_view_3d(ctx, t, c.ne[0], terms, parts, c.nb[1], c.nb[1] * terms, 0)
        return G.ggml_view_3d(ctx, t, terms, c.ne[1], parts, c.nb[1], terms * 4, 0)
    operands = [in_parts(a, trans_a), in_parts(b, not trans_b)]
    tile = _vulkan_tile(dev_backend, m, n, parts)
    params = _gemm_params(trans_a, trans_b, False, tile)  # Vulkan's shader: float32 sums
    products = _supported(kernels.op(ctx, kernels.GEMM, (n, m * parts), operands, params))
    if products is None:
        return None
    summed = _repeat_back(ctx, G.ggml_reshape_2d(ctx, products, n * m, parts), template(ctx, (1, n * m)))
    return G.ggml_reshape_2d(ctx, summed, n, m)


# CUDA products of at most this many multiply-adds, over at most WHOLE_K_MAX_K terms each, take a
# cuBLASLt algorithm that does not split K (set 49): cuBLAS split mlp-small's 64 x 64 x 64
# products, each a product kernel and a reduction kernel, for ~1 us of work. A long K over few
# outputs (a weight gradient over many rows) is what splitting is for.
WHOLE_K_MAX_TERMS = 1 << 24
WHOLE_K_MAX_K = 1024


def _gemm(ctx, a, b, trans_a: bool, trans_b: bool, arg, bias=None):
    """op(a) @ op(b) over the last two axes, in torch's terms (op transposes where asked),
    plus `bias` on every row where given, as ggrad's GEMM kernel: float32 products through
    the CPU's OpenBLAS, CUDA's cuBLAS or a Vulkan shader (a transposed view is read in
    place, no copy; on CUDA TF32 unless the precision is "highest"), and under autocast
    CUDA's products of low-precision operands (_gemm_low). None where the kernel does not
    serve: autocast elsewhere, layouts or batch shapes it cannot read, and a Vulkan device
    started at "medium", whose float32 products ggml's matrix cores take (the shader has none:
    on an H100 it equals ggml's float32 shaders on mlp-large's products and halves
    mlp-mnist's step, docs/performance.md)."""
    from . import runtime
    from .runtime import precision
    dev_backend = runtime.current().backend
    if a.contents.type != F32 or b.contents.type != F32 or not kernels.supported(dev_backend, kernels.GEMM):
        return None
    ne_a, ne_b = a.contents.ne, b.contents.ne
    m, n = ne_a[0] if trans_a else ne_a[1], ne_b[1] if trans_b else ne_b[0]
    k = ne_a[1] if trans_a else ne_a[0]
    b2, b3 = max(ne_a[2], ne_b[2]), max(ne_a[3], ne_b[3])
    added = [] if bias is None else [bias]
    tf32, tile = arg[1] is None and arg[0] != "highest", 0
    # CUDA adds a product's bias in cuBLASLt's epilogue (set 48) where B is one matrix (a linear
    # layer's weight; the kernel takes batches of A's rows over it as one product); at every size
    # (H100, set49b: mlp-small 0.073 vs 0.082 ms a step, mlp-mnist 0.109 vs 0.120, mlp-large 0.734
    # vs 0.752, against the epilogue on outputs of >= 4M values only)
    epilogue = bias is not None and ne_b[2] * ne_b[3] == 1 and kernels.variant(dev_backend, "gemm_bias_epilogue")
    whole_k = b2 * b3 == 1 and m * n * k <= WHOLE_K_MAX_TERMS and k <= WHOLE_K_MAX_K and \
        kernels.variant(dev_backend, "gemm_whole_k")

    def product(operands):
        params = _gemm_params(trans_a, trans_b, tf32, tile, epilogue, whole_k)
        return _supported(kernels.op(ctx, kernels.GEMM, (n, m * b2 * b3), operands + added, params))
    if arg[1] is not None:
        if not kernels.variant(dev_backend, "gemm_low"):
            return None
        result = _gemm_low(ctx, a, b, DTYPES[arg[1]], product)
    else:
        if dev_backend.info.kind == "vulkan":
            tiles = -(-m // 64) * -(-n // 64) * b2 * b3
            if precision.vulkan_float16_on(dev_backend.info.name):
                return None
            if tiles < VULKAN_GEMM_MIN_TILES and k >= VULKAN_GEMM_LONG_K:
                by_parts = _gemm_by_parts(ctx, dev_backend, a, b, trans_a, trans_b, m, n, k) \
                    if tiles <= VULKAN_GEMM_SPLIT_TILES and bias is None else None
                return None if by_parts is None else G.ggml_reshape_4d(ctx, by_parts, n, m, 1, 1)
            tile = _vulkan_tile(dev_backend, m, n, b2 * b3)
        in_place = [_read_in_place(ctx, a), _read_in_place(ctx, b)]
        result = None
        if in_place != [a, b]:  # the kernel reads strided rows and batches: try the views first
            result = product(in_place)
        if result is None:
            result = product([a, b])
    return None if result is None else G.ggml_reshape_4d(ctx, result, n, m, b2, b3)


def _gemm_params(trans_a: bool, trans_b: bool, tf32: bool, tile: int = 0, bias_epilogue: bool = False,
                 whole_k: bool = False) -> list[int]:
    """The GEMM node's op_params[1:7]: A and B read transposed; TF32 allowed (CUDA, float32
    operands); Vulkan's tile (set 48, _vulkan_tile); CUDA's bias in cuBLASLt's epilogue (set 48);
    CUDA's product without split K (set 49). Every backend's node has every slot; each reads
    its own."""
    return [int(trans_a), int(trans_b), int(tf32), tile, int(bias_epilogue), int(whole_k)]


def _gemm_low(ctx, a, b, low: int, product):
    """_gemm's product under autocast (CUDA, set 46): the operands in the low type `low`,
    float32 sums into a float32 result, each operand read as the view it is (a transpose,
    attention's heads) of its storage cast whole, once in the graph: a weight, an activation
    or a gradient is cast once for every product that reads it, where a cast of each view
    copied it again (the bf16 block's 25 transposing copies and casts). `product(operands)`
    is _gemm's GEMM node over them, or None."""
    copies = [lambda x=x: as_type(ctx, x, low) for x in (a, b)]  # the operands as they are, cast (copies of views)
    views = [_low_view(ctx, _read_in_place(ctx, x), low) or copy() for x, copy in zip((a, b), copies)]
    return product(views) or product([copy() for copy in copies])


def _read_in_place(ctx, t):
    """`t` as the GEMM kernel reads it without copies: the view a CONT copies, or a view of
    a copy re-viewed in the copied tensor's storage (_uncopied, then _through_copy), through
    as many copies as there are (attention's values read transposed: a view of the heads'
    copy of a copy of the fused projection's third)."""
    t = _uncopied(t)
    while True:
        seen = _through_copy(ctx, t)
        if seen is t or not _gemm_readable(seen):
            return t
        t = seen


def _gemm_readable(t) -> bool:
    """Whether the GEMM kernels read `t`'s matrices in place: rows or columns of unit stride
    (ggrad_gemm.h's layout rule; any batch strides)."""
    c, size = t.contents, G.ggml_type_size(t.contents.type)
    return c.nb[0] == size or c.ne[0] == 1 or c.nb[1] == size or c.ne[1] == 1


def _strided_view(ctx, storage, ne, nb, offset: int):
    """A view of `storage` (a tensor that is no view) with any strides, the first axis's too
    (ggml_view_4d gives it the element size, as ggml_permute then sets it)."""
    view = G.ggml_view_4d(ctx, storage, *ne, nb[1], nb[2], nb[3], offset)
    view.contents.nb[0] = nb[0]
    return view


# a view is cast through its storage where that holds at most this many times its values
# (the thirds of a fused projection: 3)
LOW_VIEW_STORAGE = 4
_PURE_VIEWS = (G.GGML_OP_VIEW, G.GGML_OP_RESHAPE, G.GGML_OP_PERMUTE, G.GGML_OP_TRANSPOSE)


def _low_view(ctx, t, low: int):
    """The float32 view `t` in the ggml type `low`: the same view (shape and strides in
    elements) of its storage cast once in the graph (as_type's memo); None where `t` is no
    view, a small part of its storage, or one made by a node that writes (an in-place
    kernel's output is a view of a buffer it rewrites: a cast of that buffer could run first)."""
    c = t.contents
    root = c.view_src
    if not root:
        return as_type(ctx, t, low)
    whole = _whole_storage(t)
    if whole is None or G.ggml_nelements(root) > LOW_VIEW_STORAGE * G.ggml_nelements(t) \
            or root.contents.type != F32 or not G.ggml_is_contiguous(root):
        return None
    shrink = G.ggml_type_size(F32) // G.ggml_type_size(low)
    return _strided_view(ctx, as_type(ctx, whole, low), c.ne, [nb // shrink for nb in c.nb], c.view_offs // shrink)


def _whole_storage(t):
    """What a cast of `t`'s storage is made from: the storage itself where `t` reaches it
    through views only (_pure_view), else the view of all of the storage, at its start and
    contiguous, that `t` reaches through views only and that a writing node made or follows
    (ops._joined_by_copies' result: a cast of it runs after the copies, one of the storage
    could run before them); None where there is no such view."""
    root, node, whole = t.contents.view_src, t, None
    while ctypes.addressof(node.contents) != ctypes.addressof(root.contents):
        c = node.contents
        if c.view_offs == 0 and c.type == root.contents.type and G.ggml_is_contiguous(node) \
                and G.ggml_nelements(node) == G.ggml_nelements(root):
            whole = node
        if c.op not in _PURE_VIEWS:
            return whole
        node = c.src[0]
    return root


def _uncopied(t, transposes: bool = True):
    """The view a CONT copies (attention's heads: a permute of the projections; a
    transpose, unless `transposes` is False), else `t`: the GEMM kernel reads a view's
    strided rows in place, and the copy, which no other node may need, is then left out
    of the graph (it was 16% of char_lm's step)."""
    c = t.contents
    views = (G.GGML_OP_PERMUTE, G.GGML_OP_VIEW) + ((G.GGML_OP_TRANSPOSE,) if transposes else ())
    if c.op == G.GGML_OP_CONT and c.src[0] and c.src[0].contents.op in views:
        return c.src[0]
    source = _cont_source(t) if transposes else None  # cont's copy is of a transpose
    return source if source is not None and source.contents.op in views else t


def _pure_view(t) -> bool:
    """Whether `t` is its storage or reaches it through VIEW, RESHAPE, PERMUTE and TRANSPOSE
    only: a view made by a node that writes (an in-place kernel's) reads its storage as that
    node leaves it, which a reader of the storage itself might run before."""
    root = t.contents.view_src
    node = t
    while root and ctypes.addressof(node.contents) != ctypes.addressof(root.contents):
        if node.contents.op not in _PURE_VIEWS:
            return False
        node = node.contents.src[0]
    return True


def _through_copy(ctx, t):
    """`t`, a view (through VIEW, RESHAPE, PERMUTE, TRANSPOSE only) of a CONT's copy, as
    the same elements viewed in the copied tensor's storage, where each of its axes keeps
    to one axis of the copied view (a fused projection's third copied, then split into
    heads and permuted: attention's queries, keys and values); else `t`. The GEMM kernel
    then reads the projection in place and the copy leaves the graph (three copies of a
    third of the projection in every attention forward)."""
    c = t.contents
    copy = c.view_src
    if not copy or copy.contents.op != G.GGML_OP_CONT or G.ggml_blck_size(c.type) != 1 or not _pure_view(t):
        return t
    source = copy.contents.src[0]
    sc, size = source.contents, G.ggml_type_size(c.type)
    if sc.type != c.type or any(nb % size for nb in c.nb) or c.view_offs % size or not _pure_view(source):
        return t
    places = [1, sc.ne[0], sc.ne[0] * sc.ne[1], sc.ne[0] * sc.ne[1] * sc.ne[2]]  # the copy's strides, in elements
    first = c.view_offs // size
    start = [(first // places[j]) % sc.ne[j] for j in range(4)]
    reach = list(start)  # the largest index each of the source's axes is read at
    strides = []
    for n, nb in zip(c.ne, c.nb):
        step = nb // size
        if n == 1:
            strides.append(nb)
            continue
        axis = max(j for j in range(4) if places[j] <= step) if step else -1
        if axis < 0 or step % places[axis]:
            return t
        reach[axis] += (n - 1) * (step // places[axis])
        strides.append(step // places[axis] * sc.nb[axis])
    if any(r >= ne for r, ne in zip(reach, sc.ne)):
        return t  # an axis of t runs across two of the source's
    root = sc.view_src if sc.view_src else source
    offset = (sc.view_offs if sc.view_src else 0) + sum(i * nb for i, nb in zip(start, sc.nb))
    if G.ggml_nelements(t) * size + offset > G.ggml_nbytes(root):
        return t  # ggml_view_4d's own bound (a strided view may end before it)
    return _strided_view(ctx, root, c.ne, strides, offset)


def _storage_alignment() -> int:
    """The current device's buffer alignment (Vulkan: minStorageBufferOffsetAlignment): a
    view whose offset from its buffer's start is a multiple of it reads as a tensor of its own."""
    from . import runtime
    return runtime.current().backend.alignment


def backend_kind() -> str:
    from . import runtime
    return runtime.current().backend.info.kind


def _precise(product):
    """Mark a product GGML_PREC_F32 (op_params[0]: ggml_mul_mat_set_prec, which OUT_PROD
    lacks)."""
    product.contents.op_params[0] = G.GGML_PREC_F32
    return product


def _marked(product, arg):
    """`product` marked GGML_PREC_F32 where `arg` asks for float32 sums: "highest", or
    low-precision operands, or a Vulkan device started at "medium": ggml-vulkan sums
    float16 operands (its matrix cores take float32 ones as float16) in float16 unless
    marked (a float16 sum of ones stops at 2048), where PyTorch's "medium" rounds the
    operands and sums in float32."""
    precision, low = arg
    float32_sums = precision == "highest" or low is not None or (VULKAN_FLOAT32_SUMS and _vulkan_float16_on())
    return _precise(product) if float32_sums else product


# ggml-vulkan's float16 products marked to sum in float32 (_marked); bench/train_step.py
# --without float32_sums times them unmarked
VULKAN_FLOAT32_SUMS = True


def _vulkan_float16_on() -> bool:
    """Whether this device is a Vulkan one started with its float16 paths on ("medium")."""
    from . import runtime
    from .runtime import precision
    info = runtime.current().backend.info
    return info.kind == "vulkan" and precision.vulkan_float16_on(info.name)


@compute("matmul_nt")
def _matmul_nt(ctx, s, node):
    """a @ b^T, contracting the last axes: ggml's mul_mat(b, a) with no transposes. b's
    batch dims may be smaller (broadcast): the GEMM kernel reads them in place; where it
    does not serve and ggml's product does not broadcast them (Vulkan: not the
    outermost), b is repeated to a's batch first."""
    a, b = s
    ne_a, ne_b = a.contents.ne, b.contents.ne
    if tuple(ne_b[2:]) != tuple(ne_a[2:]):
        broadcast = _gemm(ctx, a, b, False, True, node.arg)
        if broadcast is not None:
            return reshape(ctx, broadcast, node.shape)
        if _supported(G.ggml_mul_mat(ctx, b, a)) is None:
            b = G.ggml_repeat_4d(ctx, b, ne_b[0], ne_b[1], ne_a[2], ne_a[3])
    return reshape(ctx, _product(ctx, b, a, node.arg), node.shape)


@compute("linear")
def _linear(ctx, s, node):
    """F.linear's float32 x @ w^T + b, recorded as one op: the CPU's GEMM kernel with the
    bias added to its rows (kernel set 14), or the product's nodes and then b added across
    the rows (ggml broadcasts it), as the two ops would build. Equal either way: the sum is
    rounded once, after the product."""
    x, w, b = s
    if kernels.version() >= 14:  # the CPU's GEMM kernel adds the bias to its own rows (no ADD node)
        fused = _gemm(ctx, x, w, False, True, node.arg, bias=contiguous(ctx, b))
        if fused is not None:
            return reshape(ctx, fused, node.shape)
    return G.ggml_add(ctx, _matmul_nt(ctx, [x, w], node), b)


@builder("permute")
def _permute(ctx, s, node):
    axes = node.arg
    d = len(axes)
    dest = list(range(MAX_DIMS))
    for j, src_axis in enumerate(axes):
        dest[d - 1 - src_axis] = d - 1 - j
    return cont(ctx, G.ggml_permute(ctx, s[0], *dest))


@builder("reshape")
def _reshape(ctx, s, node):
    return reshape(ctx, s[0], node.shape)


# ggml-vulkan sums a whole tensor in one workgroup (6.5 ms for 4M values on an H100): there,
# a tensor of more values than this is summed as rows first
_VULKAN_SUM_ROWS_FROM = 1 << 16


def _sum_all(ctx, x):
    """Every value of x summed: one SUM, or on Vulkan SUM_ROWS over up to 4096 rows (n's
    power-of-two factor) and a SUM of the rows' sums."""
    n = G.ggml_nelements(x)
    rows = math.gcd(n, 4096)
    if n <= _VULKAN_SUM_ROWS_FROM or rows < 64 or backend_kind() != "vulkan":
        return G.ggml_sum(ctx, x)
    return G.ggml_sum(ctx, G.ggml_sum_rows(ctx, G.ggml_reshape_2d(ctx, contiguous(ctx, x), n // rows, rows)))


@compute("sum_to")
def _sum_to(ctx, s, node):
    """Sum over the axes where node.arg (the kept shape, same rank as the source) has 1."""
    x, keep = s[0], node.arg
    if all(n == 1 for n in keep):
        return reshape(ctx, _sum_all(ctx, x), node.shape)
    kept = ggml_ne(keep)
    full = tuple(x.contents.ne)
    inner = next(d for d in range(MAX_DIMS) if kept[d] != 1 or full[d] == 1)
    if inner:
        # the innermost axes are summed first: rows, which SUM_ROWS reduces in parallel on
        # every backend (REPEAT_BACK gives each output one thread and reads a conv bias's
        # gradient across strides: 25 ms of the cnn's CPU step); outer axes still summed
        # (the batch) are left to the small result
        rows = G.ggml_reshape_2d(ctx, contiguous(ctx, x), math.prod(full[:inner]), math.prod(full[inner:]))
        x = G.ggml_sum_rows(ctx, rows)
        if all(kept[d] == full[d] for d in range(inner, MAX_DIMS)):
            return reshape(ctx, x, node.shape)
        full = (1,) * inner + full[inner:]
        x = G.ggml_reshape_4d(ctx, x, *full)
    if kept[0] == full[0] and all(k == 1 for k in kept[1:]) and G.ggml_is_contiguous(x):
        # every outer axis summed (a bias's gradient over (batch, sequence)): as one axis of rows,
        # which CUDA's REPEAT_BACK reads with loads in flight (over two axes it divided by each
        # per row, a load at a time: a 512-wide sum over 32 x 256 rows took 55 us on an H200)
        x = G.ggml_reshape_2d(ctx, x, full[0], math.prod(full[1:]))
        by_product = _row_sums_by_product(ctx, x)
        return reshape(ctx, by_product if by_product is not None else _repeat_back(ctx, x, template(ctx, (1, full[0]))),
                       node.shape)
    if kept[1] <= _ROWS and kept[2] * kept[3] <= _ROWS and full[2] * full[3] <= launch.REPEAT_BACK_PLANES:
        return reshape(ctx, _repeat_back(ctx, x, template(ctx, keep)), node.shape)
    # REPEAT_BACK starts a block per kept row along y and z (ggml-cuda aborts past 65,535)
    # and ggml-cuda refuses a source of more than 32,768 planes (a BatchNorm2d of 512
    # channels over a batch of 128): move the summed axes innermost and sum rows, which
    # starts one block per row along x
    summed = [d for d in range(MAX_DIMS) if kept[d] == 1 and full[d] > 1]
    order = summed + [d for d in range(MAX_DIMS) if d not in summed]
    moved = cont(ctx, G.ggml_permute(ctx, x, *[order.index(d) for d in range(MAX_DIMS)]))
    rows = G.ggml_reshape_2d(ctx, moved, math.prod(full[d] for d in summed), math.prod(keep))
    return reshape(ctx, G.ggml_sum_rows(ctx, rows), node.shape)


@compute("relu_back")
def _relu_back(ctx, s, node):
    """g where relu's output is positive, else 0."""
    g, out = s
    return G.ggml_mul(ctx, g, G.ggml_sgn(ctx, out))


@compute("broadcast_to", keep_int=True)
def _broadcast_to(ctx, s, node):
    return expand(ctx, s[0], node.shape)


@compute("onehot_argmax")
def _onehot_argmax(ctx, s, node):
    """1.0 at the first maximum of each row (last axis), 0.0 elsewhere."""
    x = s[0]
    cols = node.shape[-1]
    rows = math.prod(node.shape[:-1])
    index = _first_max(ctx, reshape(ctx, x, (rows, cols)))
    return reshape(ctx, _onehot(ctx, reshape(ctx, index, (rows, 1)), rows, cols), node.shape)


@compute("onehot", keep_int=True)
def _onehot_build(ctx, s, node):
    """Integer class indices (any shape) -> float one-hot rows of node.arg classes."""
    rows = math.prod(node.shape[:-1])
    index = reshape(ctx, G.ggml_cast(ctx, s[0], F32), (rows, 1))
    return reshape(ctx, _onehot(ctx, index, rows, node.arg), node.shape)


def _onehot(ctx, index, rows: int, cols: int):
    # relu(1 - |j - index|) is exactly 1 where j == index and 0 elsewhere, for integers.
    columns = G.ggml_repeat_4d(ctx, G.ggml_arange(ctx, 0.0, float(cols), 1.0), cols, rows, 1, 1)
    distance = G.ggml_abs(ctx, G.ggml_sub(ctx, columns, index))
    return G.ggml_relu(ctx, G.ggml_scale_bias(ctx, distance, -1.0, 1.0))


@compute("argmax")
def _argmax(ctx, s, node):
    x = s[0]
    rows = math.prod(node.shape) if node.shape else 1
    return reshape(ctx, _first_max(ctx, reshape(ctx, x, (rows, x.contents.ne[0]))), node.shape)


def _first_max(ctx, x):
    """The column of each row's first maximum, or first NaN (torch's argmax), as floats
    (1, rows). NOTE: not ggml_argmax, which picks the last of equal maxima on the CPU and
    the first on Vulkan (ggml 0.15.3), and NaN differently again.
    A column j holding the row's peak gets the rank cols - j, a NaN 2 cols - j (NaN wins
    over numbers), and the largest rank names the first such column: j = (cols - rank)
    mod cols. A row of -inf holds no peak (the max-pool starts from -FLT_MAX): rank 0,
    answer 0, as torch's."""
    cols = x.contents.ne[0]

    def row_max(t):
        return G.ggml_pool_2d(ctx, t, G.GGML_OP_POOL_MAX, cols, 1, cols, 1, 0.0, 0.0)
    hit = _not(ctx, _positive(ctx, G.ggml_neg(ctx, G.ggml_sub(ctx, x, row_max(x)))))  # NaN hits too
    nan = G.ggml_scale(ctx, _not(ctx, _not_nan(ctx, x)), float(cols))
    rank = G.ggml_scale_bias(ctx, G.ggml_arange(ctx, 0.0, float(cols), 1.0), -1.0, float(cols))
    v = G.ggml_scale_bias(ctx, row_max(G.ggml_add(ctx, G.ggml_mul(ctx, hit, rank), nan)), -1.0, float(cols))
    # v in [-cols, cols]: the +0.5 keeps v / cols away from the integers floor would misround
    q = G.ggml_floor(ctx, G.ggml_scale_bias(ctx, v, 1.0 / cols, 0.5 / cols))
    return G.ggml_sub(ctx, v, G.ggml_scale(ctx, q, float(cols)))


@builder("cast")
def _cast(ctx, s, node):
    """Storage conversion (float -> int truncates toward zero, as torch); between two
    non-float32 types through float32, which every backend converts to and from."""
    x, want = s[0], DTYPES[node.dtype.storage]
    if x.contents.type not in (F32, want) and want != F32:
        x = G.ggml_cast(ctx, x, F32)
    return as_type(ctx, x, want)


@compute("gather_rows", keep_int=True)
def _gather_rows(ctx, s, node):
    table, index = s
    flat = G.ggml_get_rows(ctx, table, reshape(ctx, index, (math.prod(node.shape[:-1]),)))
    return reshape(ctx, flat, node.shape)


@compute("scatter_rows", keep_int=True)
def _scatter_rows(ctx, s, node):
    """Gradient of gather_rows: rows of `grad` summed into a table of node.shape."""
    grad, index = s
    n = math.prod(index.contents.ne)
    grad, index = reshape(ctx, grad, (n, node.shape[-1])), reshape(ctx, index, (n,))
    rows, width = math.prod(node.shape[:-1]), node.shape[-1]
    from . import runtime
    # only CUDA needs the blocks, and only CUDA may have them: the CPU's GET_ROWS_BACK
    # writes row index[i] unchecked, so a shifted index would write outside the table
    if rows <= _ROWS or runtime.current().backend.info.kind != "cuda":
        return G.ggml_get_rows_back(ctx, grad, index, template(ctx, node.shape))
    # ggml-cuda's GET_ROWS_BACK starts a block per table row along y (at most 65,535) and
    # each block sums the gradient rows whose index is its row: the table in blocks of
    # rows, each given the indices shifted to its first row (others match none of its rows)
    shifted = G.ggml_cast(ctx, index, F32)
    blocks = []
    for first in range(0, rows, _ROWS):
        local = G.ggml_cast(ctx, G.ggml_scale_bias(ctx, shifted, 1.0, -float(first)), I32)
        blocks.append(G.ggml_get_rows_back(ctx, grad, local, template(ctx, (min(_ROWS, rows - first), width))))
    return reshape(ctx, _stack_rows(ctx, blocks), node.shape)


@compute("concat", keep_int=True)
def _concat(ctx, s, node):
    axis = node.arg
    return G.ggml_concat(ctx, s[0], s[1], len(node.shape) - 1 - axis)


@builder("slice")
def _slice(ctx, s, node):
    """Elements start, start + step, ... along one axis: a strided view, then a copy, unless
    the view is contiguous (a slice of the outermost axis, a row of a small result) and
    every kernel can read it where it starts: then the view itself, which ggml's allocator
    keeps alive for its readers. On Vulkan only a view at an offset its device aligns
    storage to (ggml-vulkan asserts on others in most ops; the fuzzer's attention case)."""
    axis, start, step = node.arg
    x = s[0]
    nb = list(x.contents.nb)
    dim = len(node.shape) - 1 - axis
    offset = start * nb[dim]
    nb[dim] *= step
    ne = ggml_ne(node.shape)
    if dim == 0 and step != 1:  # elements of a row are adjacent: make each its own row
        view = G.ggml_view_4d(ctx, x, 1, *ne[:3], nb[0], nb[1], nb[2], offset)
        return reshape(ctx, cont(ctx, view), node.shape)
    view = G.ggml_view_4d(ctx, x, *ne, nb[1], nb[2], nb[3], offset)
    if not G.ggml_is_contiguous(view) or (backend_kind() == "vulkan" and view.contents.view_offs % _storage_alignment()):
        return cont(ctx, view)
    # the same memory with the strides of a fresh tensor: ggml calls a view contiguous
    # whatever the strides of its axes of length 1, but some ops (SCALE) assert on them
    row = G.ggml_row_size(x.contents.type, ne[0])
    return G.ggml_view_4d(ctx, x, *ne, row, row * ne[1], row * ne[1] * ne[2], offset)


@compute("pad")
def _pad(ctx, s, node):
    """Zeros around `x` along one axis: the gradient of slice."""
    axis, before, after = node.arg
    return reshape(ctx, pad_axis(ctx, s[0], len(node.shape) - 1 - axis, before, after), node.shape)


@compute("place")
def _place(ctx, s, node):
    """The pieces `s` at `starts` along one axis, zeros elsewhere (a sum of slices'
    gradients): CONCATs where they tile the axis, else a padded copy of each, summed."""
    axis, starts = node.arg
    dim = len(node.shape) - 1 - axis
    n = node.shape[axis]
    sizes = [x.contents.ne[dim] for x in s]
    ends = [start + size for start, size in zip(starts, sizes)]
    if starts[0] == 0 and ends[-1] == n and all(e == b for e, b in zip(ends, starts[1:])):
        joined = _joined_by_copies(ctx, s, starts, dim)
        if joined is not None:
            return joined
        out = contiguous(ctx, s[0])
        for x in s[1:]:
            out = G.ggml_concat(ctx, out, contiguous(ctx, x), dim)
        return out
    padded = [reshape(ctx, pad_axis(ctx, x, dim, start, n - end), node.shape) for x, start, end in zip(s, starts, ends)]
    out = padded[0]
    for x in padded[1:]:
        out = G.ggml_add(ctx, out, x)
    return out


def _joined_by_copies(ctx, pieces, starts, dim: int):
    """The pieces, which tile ggml axis `dim`, each copied into its part of one new tensor,
    read through the view a CONT of it copied (attention's query, key and value gradients
    with their heads permuted back): one pass over the values, where CONCAT (binary) read
    the parts joined so far again after each CONT (the bf16 block's two CONCATs, 0.137 ms
    on the H100). Each copy writes through a view of the copy before it, so the copies run
    in order and the tensor returned (a view of the last) after all of them; a view's
    offset is taken relative to its source's, modulo 2^64 (ggml adds them as size_t).
    None where a piece would be copied as a transpose (see `_copied_as_transpose`)."""
    first = pieces[0].contents
    ne = [first.ne[i] if i != dim else sum(p.contents.ne[dim] for p in pieces) for i in range(MAX_DIMS)]
    if any(p.contents.ne[i] != ne[i] or p.contents.type != first.type for p in pieces for i in range(MAX_DIMS) if i != dim):
        return None
    out = G.ggml_new_tensor(ctx, first.type, MAX_DIMS, (ctypes.c_int64 * MAX_DIMS)(*ne))
    # a node, not a leaf: ggml's allocator places leaves before the graph's first node, which
    # kept every layer's joined gradient alive through the whole forward (a 6-layer encoder's
    # scratch +15%); the backends skip an op-NONE node
    out.contents.flags |= G.GGML_TENSOR_FLAG_PARAM
    nb = tuple(out.contents.nb)
    sources = [_copy_source(piece, nb) for piece in pieces]
    if any(_copied_as_transpose(source) for source, _ in sources):
        return None
    last, last_offset = out, 0
    for (source, strides), start in zip(sources, starts):
        offset = start * nb[dim]
        place = _strided_view(ctx, last, source.contents.ne, strides, (offset - last_offset) % 2**64)
        last, last_offset = _asking(G.ggml_cpy(ctx, source, place), "copy_rows"), offset
        _note_copied_product(last)
    return G.ggml_view_4d(ctx, last, *ne, nb[1], nb[2], nb[3], -last_offset % 2**64)


def _copied_as_transpose(source) -> bool:
    """Whether ggml-cuda's CPY takes `source` for a batch of transposed matrices (its first
    two axes' strides swapped), a copy that writes its destination as contiguous: a part of
    a larger tensor may not take it."""
    c = source.contents
    size = G.ggml_type_size(c.type)
    return c.ne[3] == 1 and c.nb[1] == size and c.nb[2] == c.ne[0] * c.ne[1] * size


def _copy_source(piece, nb) -> tuple:
    """(source, strides): the view that `piece` (through RESHAPEs) is a CONT's copy of, or
    `piece` itself, and the strides that place the source's elements where the piece's go
    in a tensor of strides `nb`: the source's axes, in order, make up the piece's (a CONT's
    copy is contiguous in the source's shape and reshaped to the piece's)."""
    copy = piece
    while copy.contents.op == G.GGML_OP_RESHAPE:
        copy = copy.contents.src[0]
    if copy.contents.op == G.GGML_OP_CONT and copy.contents.src[0].contents.op in _PURE_VIEWS:
        source = copy.contents.src[0]
        strides = _strides_within(tuple(source.contents.ne), tuple(piece.contents.ne), nb)
        if strides is not None and not _copied_as_transpose(source):
            return source, strides
    return piece, nb


def _strides_within(inner: tuple, outer: tuple, nb: tuple) -> list | None:
    """Strides for axes `inner` that split the axes `outer` (of strides `nb`) in order,
    each outer axis a product of consecutive inner ones; None where one runs across two."""
    strides, axis, step = [], 0, 1
    for n in inner:
        while axis < len(outer) and step == outer[axis] and n != 1:
            axis, step = axis + 1, 1
        if n == 1:
            strides.append(nb[min(axis, len(nb) - 1)])
            continue
        if axis == len(outer) or outer[axis] % (step * n):
            return None
        strides.append(nb[axis] * step)
        step *= n
    return strides


def pad_axis(ctx, x, dim: int, before: int, after: int):
    """`x` with zeros before and after it along ggml axis `dim`, as a pad of the first
    axis only: in memory, padding axis d of a contiguous tensor pads each run of its
    first d + 1 axes, so the runs become the rows of a 3-d (run, a, b) tensor with a * b
    runs, each at most 65,535 (ggml-cuda's PAD starts a block per row along y and z, and
    aborts past that: issue 24). Returned flat: (padded run, a, b) in ggml order."""
    x = contiguous(ctx, x)
    ne = tuple(x.contents.ne)
    run, runs = math.prod(ne[:dim + 1]), math.prod(ne[dim + 1:])
    inner = run // ne[dim]
    item = x.contents.nb[0]
    pieces = []
    for first, count in _row_blocks(runs):
        rows_a, rows_b = _two_factors(count)
        piece = G.ggml_reshape_3d(ctx, x, run, rows_a, rows_b) if count == runs else \
            G.ggml_view_3d(ctx, x, run, rows_a, rows_b, item * run, item * run * rows_a, item * run * first)
        pieces.append(G.ggml_pad_ext(ctx, piece, before * inner, after * inner, 0, 0, 0, 0, 0, 0))
    return _stack_rows(ctx, pieces)


_ROWS = launch.GRID_YZ  # ggml-cuda's grid limit along y and z


def _two_factors(count: int) -> tuple[int, int] | None:
    """(a, b) with a * b == count and both at most 65,535, or None if there are none."""
    if count <= _ROWS:
        return count, 1
    for b in range(-(-count // _ROWS), _ROWS + 1):
        if count % b == 0:
            return count // b, b
    return None


def _row_blocks(rows: int) -> list[tuple[int, int]]:
    """(first row, count) blocks covering `rows`, each with two factors <= 65,535: one
    block if `rows` has them (nearly always), else a multiple of 65,535 and the rest."""
    if _two_factors(rows) is not None:
        return [(0, rows)]
    whole = rows - rows % _ROWS
    return [(0, whole), (whole, rows - whole)]


def _stack_rows(ctx, pieces: list):
    """Pieces of equal row length, one after the other, as (row, rows) in ggml order."""
    return concat_all(ctx, [G.ggml_reshape_2d(ctx, p, p.contents.ne[0], math.prod(tuple(p.contents.ne)[1:]))
                            for p in pieces], 1)


def concat_all(ctx, pieces: list, dim: int):
    """`pieces` joined along ggml axis `dim`, in order."""
    out = pieces[0]
    for piece in pieces[1:]:
        out = G.ggml_concat(ctx, out, piece, dim)
    return out


@compute("fill")
def _fill(ctx, s, node):
    """Every element node.arg; a bool is stored as 0 or 1 whatever the number (NaN is
    true, as torch's): `select` picks rows by it, and ggml asserts the row exists."""
    value = node.arg
    if node.dtype is dtypes.bool_:
        value = 0.0 if value == 0 else 1.0
    return G.ggml_fill(ctx, s[0], value)


# ---- effects: ops that write their targets in place ----------------------------------
# ggml-vulkan dispatches AdamW as one workgroup of 512 per 512 elements along x, and
# devices may cap x at 65535 workgroups (lavapipe does; GGML_ASSERT aborts past it).
ADAMW_CHUNK = 512 * 65535
ADAMW_ROW = 4096


@builder("adamw")
def _adamw(ctx, s, effect):
    """ggml's fused AdamW over each (p, g, m, v) of `s` (then the params `hyper`): with the
    exact form's 9 constants, two parameters a node where the backend has ggrad's ADAMW_GROUP
    kernel (the CPU, CUDA, Vulkan: the same update, element for element), else one
    OPT_STEP_ADAMW per parameter."""
    *quads, hyper = s
    quads = [quads[i:i + 4] for i in range(0, len(quads), 4)]
    if hyper.contents.ne[0] == 9 and all(G.ggml_is_contiguous(t) for quad in quads for t in quad):
        from . import runtime
        if kernels.supported(runtime.current().backend, kernels.ADAMW_GROUP):
            return [kernels.op(ctx, kernels.ADAMW_GROUP, (1, 1), [hyper] + [t for quad in pair for t in quad], [len(pair)])
                    for pair in (quads[i:i + 2] for i in range(0, len(quads), 2))]
    return [step for quad, target in zip(quads, effect.targets[::3])
            for step in _adamw_one(ctx, *quad, hyper, math.prod(target.shape))]


def _adamw_one(ctx, p, g, m, v, hyper, n: int) -> list:
    """ggml's fused AdamW over (p, g, m, v) of n elements with params (7,), in chunks of
    contiguous views: at most ADAMW_CHUNK elements each (lavapipe's dispatch limit), as rows
    of ADAMW_ROW elements where they fill one (the CPU kernel splits rows between threads;
    a 1-d view is one row, run by one thread) and a 1-d rest."""
    flat = [G.ggml_reshape_1d(ctx, t, n) for t in (p, g, m, v)]
    steps = []
    for start in range(0, n, ADAMW_CHUNK):
        size = min(ADAMW_CHUNK, n - start)
        rows, rest = divmod(size, ADAMW_ROW)
        parts = [(start, rows * ADAMW_ROW, rows)] if rows else []
        parts += [(start + rows * ADAMW_ROW, rest, 1)] if rest else []
        for offset, count, nrows in parts:
            views = [G.ggml_view_2d(ctx, t, count // nrows, nrows, 4 * (count // nrows), offset * 4)
                     for t in flat]
            # ggml_set_param asserts on views; the flag itself is all opt_step_adamw checks
            views[0].contents.flags |= G.GGML_TENSOR_FLAG_PARAM
            steps.append(G.ggml_opt_step_adamw(ctx, *views, hyper))
    return steps


def contiguous_rows(ctx, x):
    """`x` as contiguous rows of its first ggml axis (ggrad's kernels index rows by stride)."""
    x = contiguous(ctx, x)
    return G.ggml_reshape_2d(ctx, x, x.contents.ne[0], G.ggml_nrows(x))


# ---- fused row-wise ops: one lazy node, several ggml nodes ---------------------------
def _rows(ctx, x, shape):
    """`x` as a (rows, cols) matrix over its last axis."""
    return reshape(ctx, x, (math.prod(shape[:-1]), shape[-1]))


def _log_softmax_rows(ctx, x):
    """x - max - log(sum(exp(x - max))) per row, stable for any logits. The row max is a
    max-pool over the whole row: one node (an argmax and a one-hot took ten)."""
    cols = x.contents.ne[0]
    peak = G.ggml_pool_2d(ctx, x, G.GGML_OP_POOL_MAX, cols, 1, cols, 1, 0.0, 0.0)
    shifted = G.ggml_sub(ctx, x, peak)
    return G.ggml_sub(ctx, shifted, G.ggml_log(ctx, G.ggml_sum_rows(ctx, G.ggml_exp(ctx, shifted))))


@compute("log_softmax")
def _log_softmax(ctx, s, node):
    return reshape(ctx, _log_softmax_rows(ctx, _rows(ctx, s[0], node.shape)), node.shape)


@compute("log_softmax_back")
def _log_softmax_back(ctx, s, node):
    """g - softmax * sum(g) per row, with softmax = exp(log_softmax)."""
    g, out = (_rows(ctx, t, node.shape) for t in s)
    return reshape(ctx, G.ggml_sub(ctx, g, G.ggml_mul(ctx, G.ggml_exp(ctx, out), G.ggml_sum_rows(ctx, g))),
                   node.shape)


def _cross_entropy_rows(ctx, logits, target):
    """-sum(target * log_softmax(logits)) per row, as a (1, rows) column."""
    picked = G.ggml_sum_rows(ctx, G.ggml_mul(ctx, target, _log_softmax_rows(ctx, logits)))
    return G.ggml_neg(ctx, picked)


@compute("softmax_cross_entropy")
def _softmax_cross_entropy(ctx, s, node):
    return reshape(ctx, _cross_entropy_rows(ctx, *s), node.shape)


@compute("class_cross_entropy", keep_int=True)
def _class_cross_entropy(ctx, s, node):
    """-log_softmax(logits)[r, index[r]] per row: the picked entry alone, so a -inf logit
    elsewhere in the row costs nothing (a one-hot product made 0 * -inf = NaN there,
    ggml's fused CROSS_ENTROPY_LOSS too)."""
    logits, index = s
    rows, cols = logits.contents.ne[1], logits.contents.ne[0]
    table = reshape(ctx, _log_softmax_rows(ctx, logits), (rows, cols, 1))
    picked = G.ggml_get_rows(ctx, table, reshape(ctx, index, (rows, 1)))
    return reshape(ctx, G.ggml_neg(ctx, picked), node.shape)


# where a sum over many rows (a bias's gradient over batch x sequence) is a product with a row
# of ones on the GEMM kernel: cuBLAS reads the rows at full bandwidth, where REPEAT_BACK read
# a 512-wide gradient over 8192 rows in 26 us (0.6 TB/s; the bf16 block's 8 sums 0.32 ms of
# 2.2, H100). Float32 sums ("highest"'s product, never TF32: a gradient is not rounded).
ROW_SUM_PRODUCT_KINDS = frozenset({"cuda"})
ROW_SUM_PRODUCT_MIN_ROWS = 2048


def _row_sums_by_product(ctx, x):
    """The sums of x's rows (ggml (N, R): R rows of N) as ones (1 x R) @ x on the GEMM kernel,
    (1, N); None where it does not serve (then REPEAT_BACK sums them)."""
    rows = x.contents.ne[1]
    if backend_kind() not in ROW_SUM_PRODUCT_KINDS or rows < ROW_SUM_PRODUCT_MIN_ROWS:
        return None
    ones = once_per_graph(("ones", rows), lambda: G.ggml_fill(ctx, template(ctx, (1, rows)), 1.0))
    return _gemm(ctx, ones, x, False, False, ("highest", None))


def _repeat_back(ctx, x, like):
    """ggml's REPEAT_BACK, asking CUDA to split the repeats between blocks where trusted:
    a 512-wide bias gradient over 8192 rows otherwise runs on 16 of an H100's 132
    multiprocessors."""
    return _asking(G.ggml_repeat_back(ctx, x, like), "repeat_back_split")


def _supported(node):
    """`node` if the current backend runs its op, else None (then the caller composes it)."""
    from . import runtime
    return node if runtime.current().backend.supports(node) else None


@compute("softmax_cross_entropy_back")
def _softmax_cross_entropy_back(ctx, s, node):
    """d/dlogits = g * (softmax * sum(target) - target), per row."""
    logits, target, g = s
    rows = logits.contents.ne[1]
    probs = soft_max(ctx, logits)
    diff = G.ggml_sub(ctx, G.ggml_mul(ctx, probs, G.ggml_sum_rows(ctx, target)), target)
    return G.ggml_mul(ctx, diff, reshape(ctx, g, (rows, 1)))


# ---- random numbers on the device --------------------------------------------------------
def _fract(ctx, x):
    return G.ggml_sub(ctx, x, G.ggml_floor(ctx, x))


@compute("round")
def _round(ctx, s, node):
    """torch.round: the nearest integer, ties to even (ggml's ROUND takes ties away from
    zero: 2.5 gave 3 where torch gives 2). floor(x) + k, k = 1 where d = x - floor(x) is
    above one half, or is one half and the floor odd. Worked on x clamped to 2^24, past
    which every float is an integer: x - clamped (0 below, exact above, inf and NaN as
    they are) is added back. A zero result is +0 (torch keeps -0.4's sign)."""
    x = s[0]
    clamped = G.ggml_clamp(ctx, G.ggml_cont(ctx, x), -16777216.0, 16777216.0)  # clamp writes its source
    floor = G.ggml_floor(ctx, clamped)
    d = G.ggml_sub(ctx, clamped, floor)
    above = _positive(ctx, G.ggml_scale_bias(ctx, d, 1.0, -0.5))
    below = _positive(ctx, G.ggml_scale_bias(ctx, d, -1.0, 0.5))
    half = G.ggml_scale_bias(ctx, G.ggml_add(ctx, above, below), -1.0, 1.0)
    odd = G.ggml_scale(ctx, _fract(ctx, G.ggml_scale(ctx, floor, 0.5)), 2.0)
    k = G.ggml_add(ctx, above, G.ggml_mul(ctx, half, odd))
    return G.ggml_add(ctx, G.ggml_add(ctx, floor, k), G.ggml_sub(ctx, x, clamped))


@compute("rand")
def _rand(ctx, s, node):
    """Uniform [0, 1) per element: Dave Hoskins' sine-free hash of the element's (row,
    column) in a 4096-wide grid, the state added to the column. Only products, sums and
    floors of numbers below ~2e4, so every backend computes it alike (a sine hash was
    biased on GPUs, whose fast sine is inaccurate for large arguments: a 0.25 dropout
    dropped 0.219 on the H200). Values come in steps of about 1e-4; indices past 2^24 repeat."""
    n = math.prod(node.shape)
    i = G.ggml_arange(ctx, 0.0, float(n), 1.0)
    row = G.ggml_floor(ctx, G.ggml_scale(ctx, i, 1.0 / 4096))
    column = G.ggml_sub(ctx, i, G.ggml_scale(ctx, row, 4096.0))
    x = G.ggml_add(ctx, column, G.ggml_repeat_4d(ctx, s[0], n, 1, 1, 1))
    a = _fract(ctx, G.ggml_scale(ctx, x, 0.1031))
    b = _fract(ctx, G.ggml_scale(ctx, row, 0.1031))

    def shifted(t):
        return G.ggml_scale_bias(ctx, t, 1.0, 33.33)
    d = G.ggml_add(ctx, G.ggml_add(ctx, G.ggml_mul(ctx, a, shifted(b)), G.ggml_mul(ctx, b, shifted(a))),
                   G.ggml_mul(ctx, a, shifted(a)))
    e = G.ggml_add(ctx, a, d)
    return reshape(ctx, _fract(ctx, G.ggml_mul(ctx, G.ggml_add(ctx, e, G.ggml_add(ctx, b, d)), e)), node.shape)


# The device generator's state: k / 2^13 for an integer k below 8,192,000 (so below 1000, where
# rand's hash stays precise), each draw stepping k by RAND_STEP modulo 8,192,000: a Weyl
# sequence, whose states are exact float32 sums on every backend and all distinct for
# 8,192,000 draws (RAND_STEP is odd and prime to 5; ~0.618 of the range, so consecutive states
# lie far apart). The old step, fract(state * golden + 1/pi) * 1000, rounded onto ~8000 values
# and was no permutation: from 4 of the 1000 seeds ten draws held a repeat, and every sequence
# fell into a cycle of ~100 draws (dropout masks repeating through training).
RAND_GRID = 8192.0
RAND_STATES = 8_192_000
RAND_STEP = 5_062_797


@compute("rand_next")
def _rand_next(ctx, s, node):
    """The next state (RAND_STEP above; a restored state is put on the grid by
    random.set_rng_state)."""
    stepped = G.ggml_scale_bias(ctx, s[0], 1.0, RAND_STEP / RAND_GRID)  # exact: on the grid, below 2048
    wrapped = G.ggml_step(ctx, G.ggml_scale_bias(ctx, stepped, 1.0, -(RAND_STATES - 0.5) / RAND_GRID))
    return G.ggml_sub(ctx, stepped, G.ggml_scale(ctx, wrapped, RAND_STATES / RAND_GRID))


# Where weight gradients come from OUT_PROD (no transposes) rather than from transposing
# both operands into mul_mat: always on CUDA; on the CPU for products of at most this many
# elements (measured on 2 cores: 64x64 0.055 vs 0.077 ms, 256x256 0.71 vs 0.80, 512x512
# 1.77 vs 1.38, where llamafile's sgemm wins); never on Vulkan, which lacks OUT_PROD.
OUT_PROD_BACKENDS = {"cuda"}
CPU_OUT_PROD_MAX_ELEMENTS = 256 * 256


def _transposed_copy(ctx, y):
    """y^T made contiguous, once per graph: a weight read by several gradient products is
    copied once."""
    return once_per_graph(("transposed", ctypes.addressof(y.contents)), lambda: _transpose(ctx, y))


def _transpose(ctx, y):
    """y^T contiguous: ggrad's tiled kernel for a float32 matrix where the backend has it
    (the CPU: ggml's CONT of a transposed view was a fifth of a transformer step there),
    else CONT of the transposed view."""
    from . import runtime
    ne = y.contents.ne
    if y.contents.type == F32 and y.contents.nb[0] == 4 and ne[2] == 1 and ne[3] == 1 \
            and kernels.supported(runtime.current().backend, kernels.TRANSPOSE):
        return kernels.op(ctx, kernels.TRANSPOSE, (ne[1], ne[0]), [y], [])
    return cont(ctx, G.ggml_transpose(ctx, y))


def _transposed_operand(ctx, y, arg, columns: int):
    """y^T contiguous, as a product of `arg` over `columns` columns reads it: under autocast
    the low cast comes first, so the forward product's cast of the same tensor is reused
    (lazy.build_memo) and the copy moves half the bytes; Vulkan multiplies rounded float32
    operands (_product), unless its matrix cores take float16 ones (_half_operands)."""
    low = arg[1]
    if low is not None and backend_kind() != "vulkan":
        y = as_type(ctx, y, DTYPES[low])
    elif _half_operands(arg, columns, y):
        y = as_type(ctx, y, F16)
    return _transposed_copy(ctx, y)


@compute("matmul_nn")
def _matmul_nn(ctx, s, node):
    """x @ y (a product's input gradient, x the output's gradient and y the weight): on
    the backends in OUT_PROD_BACKENDS, OUT_PROD(y, x^T) reads x^T as a view (cuBLAS takes
    it transposed) where mul_mat needed y^T copied first; elsewhere, and under autocast,
    mul_mat(y^T, x)."""
    x, y = s
    gemm = _gemm(ctx, x, y, False, False, node.arg)
    if gemm is not None:
        return reshape(ctx, gemm, node.shape)
    # ggml-cuda's OUT_PROD asserts unit strides: both operands contiguous. It reads its second
    # operand as transposed from the strides, which a one-column x^T does not show (equal
    # strides): cuBLAS then refused the leading dimension and ggml aborted (a depthwise
    # conv's input gradient); that x^T is x's memory as is, a reshape
    if node.arg[1] is None and backend_kind() in OUT_PROD_BACKENDS and G.ggml_is_contiguous(x) \
            and G.ggml_is_contiguous(y):
        ne = x.contents.ne
        xt = G.ggml_transpose(ctx, x) if ne[0] > 1 else G.ggml_reshape_4d(ctx, x, ne[1], ne[0], ne[2], ne[3])
        product = _supported(G.ggml_out_prod(ctx, y, xt))
        if product is not None:
            return reshape(ctx, _marked(product, node.arg), node.shape)
    yt = _transposed_operand(ctx, y, node.arg, x.contents.ne[1])
    ne_x, ne_y = x.contents.ne, yt.contents.ne
    if tuple(ne_y[2:]) != tuple(ne_x[2:]) and _supported(G.ggml_mul_mat(ctx, yt, x)) is None:
        yt = G.ggml_repeat_4d(ctx, yt, ne_y[0], ne_y[1], ne_x[2], ne_x[3])
    return reshape(ctx, _product(ctx, yt, x, node.arg), node.shape)


@compute("matmul_tn")
def _matmul_tn(ctx, s, node):
    """x^T @ y over the last two axes (the weight gradient of a product): ggml's OUT_PROD
    where it is used, else both operands transposed into mul_mat."""
    x, y = s
    gemm = _gemm(ctx, x, y, True, False, node.arg)
    if gemm is not None:
        return reshape(ctx, gemm, node.shape)
    kind = backend_kind()
    small = math.prod(node.shape[-2:]) <= CPU_OUT_PROD_MAX_ELEMENTS
    low = node.arg[1]
    if low is None and (kind in OUT_PROD_BACKENDS or (kind == "cpu" and small)):
        if kind == "cuda":  # ggml-cuda's OUT_PROD reads rows of unit stride (a grouped conv's are not)
            x, y = contiguous(ctx, x), contiguous(ctx, y)
        product = _supported(G.ggml_out_prod(ctx, y, x))
        if product is not None:
            return reshape(ctx, _marked(product, node.arg), node.shape)
    columns = x.contents.ne[0]  # x^T's rows
    yt, xt = _transposed_operand(ctx, y, node.arg, columns), _transposed_operand(ctx, x, node.arg, columns)
    return reshape(ctx, _product(ctx, yt, xt, node.arg), node.shape)


# ---- comparisons and selection (bool results are float32 0/1) -------------------------
# Built from ggml's step, whose result at 0 differs between backends (CPU and CUDA:
# x > 0; Vulkan: x >= 0) but is 0 for NaN on all of them (an ordered comparison):
# `_positive` is exactly d > 0 everywhere, and NaN is never positive.
def _positive(ctx, d):
    up = G.ggml_step(ctx, d)
    down = G.ggml_step(ctx, G.ggml_neg(ctx, d))
    return G.ggml_mul(ctx, up, G.ggml_scale_bias(ctx, down, -1.0, 1.0))


def _not_nan(ctx, x):
    """1 where x is a number (|x| + 1 > 0 holds for every number, infinities included)."""
    return G.ggml_step(ctx, G.ggml_scale_bias(ctx, G.ggml_abs(ctx, x), 1.0, 1.0))


def _finite(ctx, x):
    """1 where x is finite: x * 0 + 1 is 1 for numbers, NaN for infinities and NaN."""
    return G.ggml_step(ctx, G.ggml_scale_bias(ctx, x, 0.0, 1.0))


def _not(ctx, x):
    return G.ggml_scale_bias(ctx, x, -1.0, 1.0)


@compute("compare")
def _compare(ctx, s, node):
    """a <op> b with IEEE semantics (NaN compares unequal to everything, inf == inf).
    node.arg is (op, scalar): the second operand is s[1], or the scalar when s has one."""
    kind, scalar = node.arg
    a = expand(ctx, s[0], node.shape)
    if len(s) > 1:
        b = expand(ctx, s[1], node.shape)
        d = G.ggml_sub(ctx, a, b)
        ordered = G.ggml_mul(ctx, _not_nan(ctx, a), _not_nan(ctx, b))
    else:
        d = G.ggml_scale_bias(ctx, a, 1.0, -scalar)
        ordered = _not_nan(ctx, a)
    if kind == "gt":
        return _positive(ctx, d)
    if kind == "lt":
        return _positive(ctx, G.ggml_neg(ctx, d))
    unequal = G.ggml_add(ctx, _positive(ctx, d), _positive(ctx, G.ggml_neg(ctx, d)))
    eq = G.ggml_mul(ctx, ordered, _not(ctx, unequal))
    if kind == "eq":
        return eq
    if kind == "ne":
        return _not(ctx, eq)
    side = _positive(ctx, d if kind == "ge" else G.ggml_neg(ctx, d))
    return G.ggml_add(ctx, side, eq)  # ge / le


@compute("classify")
def _classify(ctx, s, node):
    x = s[0]
    if node.arg == "nan":
        return _not(ctx, _not_nan(ctx, x))
    if node.arg == "finite":
        return _finite(ctx, x)
    return G.ggml_mul(ctx, _not_nan(ctx, x), _not(ctx, _finite(ctx, x)))  # inf


@compute("select", keep_int=True)
def _select(ctx, s, node):
    """where(c, a, b) exactly (a NaN or inf in the branch not taken does not leak): each
    element is a 2-row table [a_i, b_i] and get_rows picks row 1 - c_i of it."""
    c, a, b = (expand(ctx, t, node.shape) for t in s)
    if a.contents.type != b.contents.type:
        a, b = as_type(ctx, a, F32), as_type(ctx, b, F32)
    n = math.prod(node.shape)
    table = G.ggml_concat(ctx, reshape(ctx, a, (n, 1, 1)), reshape(ctx, b, (n, 1, 1)), 1)
    pick = G.ggml_cast(ctx, reshape(ctx, _not(ctx, c), (n, 1)), I32)
    return reshape(ctx, G.ggml_get_rows(ctx, table, pick), node.shape)


# ---- along the last axis: running sums, sorting, picking by index ----------------------
@compute("cumsum")
def _cumsum(ctx, s, node):
    return reshape(ctx, G.ggml_cumsum(ctx, _rows(ctx, s[0], node.shape)), node.shape)


@compute("argsort")
def _argsort(ctx, s, node):
    order = G.GGML_SORT_ORDER_DESC if node.arg else G.GGML_SORT_ORDER_ASC
    return reshape(ctx, G.ggml_argsort(ctx, _rows(ctx, s[0], node.shape), order), node.shape)


@compute("take_rows", keep_int=True)
def _take_rows(ctx, s, node):
    """out[r, j] = x[r, index[r, j]]: each row of x a table of one-element rows."""
    x, index = s
    rows = math.prod(node.shape[:-1])
    n, k = x.contents.ne[0], node.shape[-1]
    table = reshape(ctx, x, (rows, n, 1))
    picked = G.ggml_get_rows(ctx, table, reshape(ctx, index, (rows, k)))
    return reshape(ctx, picked, node.shape)


@builder("matmul_q")
def _matmul_q(ctx, s, node):
    """x @ W^T with W in a quantized type: ggml's mul_mat(W, x), which reads W's blocks as
    it multiplies (on the CPU it rounds x to W's block type for the dot products, as
    llama.cpp does)."""
    x, w = s
    return reshape(ctx, _precise(G.ggml_mul_mat(ctx, w, as_type(ctx, x, F32))), node.shape)


# the float32 rows of a quantized matrix one backward reads at a time where no kernel reads
# its blocks (a ggml without ggrad's kernel set 41 on Vulkan): the scratch of g @ W stays
# this size however large W is
QUANT_BACK_CHUNK_BYTES = 16 << 20


@builder("matmul_q_back")
def _matmul_q_back(ctx, s, node):
    """The gradient g @ W of x @ W^T for a quantized W, W never held whole in float32:
    ggrad's kernel (the CPU's, kernel set 20: chunks of W converted in a thread's buffer,
    then the BLAS; CUDA's, kernel set 22: chunks dequantized into pool scratch, then
    cuBLAS; Vulkan's, kernel set 41: a shader reading W's blocks), else ggml's out_prod(W,
    g^T), which reads W's blocks; where the backend has neither (Vulkan before set 41),
    chunks of W's rows (QUANT_BACK_CHUNK_BYTES of float32 each: scratch of this graph) are
    read with GET_ROWS and multiplied, their products added."""
    g, w = s
    rows = math.prod(node.shape[:-1])
    n_in, n_out = w.contents.ne[0], w.contents.ne[1]
    g2 = G.ggml_reshape_2d(ctx, contiguous(ctx, as_type(ctx, g, F32)), n_out, rows)
    from . import runtime
    if kernels.supported(runtime.current().backend, kernels.QMATMUL_BACK):
        product = _supported(kernels.op(ctx, kernels.QMATMUL_BACK, (n_in, rows), [w, g2], []))
        if product is not None:
            return reshape(ctx, product, node.shape)
    product = _supported(G.ggml_out_prod(ctx, w, G.ggml_cont(ctx, G.ggml_transpose(ctx, g2))))
    if product is None:
        chunk = max(1, QUANT_BACK_CHUNK_BYTES // (4 * n_in))
        for first in range(0, n_out, chunk):
            count = min(chunk, n_out - first)
            index = G.ggml_cast(ctx, G.ggml_arange(ctx, float(first), float(first + count), 1.0), G.GGML_TYPE_I32)
            wt = G.ggml_cont(ctx, G.ggml_transpose(ctx, G.ggml_get_rows(ctx, w, index)))  # (count, in) -> W^T rows
            part_g = G.ggml_view_2d(ctx, g2, count, rows, g2.contents.nb[1], first * 4)
            part = _precise(G.ggml_mul_mat(ctx, wt, contiguous(ctx, part_g)))
            product = part if product is None else G.ggml_add(ctx, product, part)
    return reshape(ctx, product, node.shape)


@builder("gather_rows_q")
def _gather_rows_q(ctx, s, node):
    """Rows of a quantized table, converted to float32 as they are read (ggml's get_rows)."""
    table, index = s
    rows = reshape(ctx, index, (math.prod(node.shape[:-1]),))
    flat = G.ggml_get_rows(ctx, table, rows)
    from . import runtime
    if _supported(flat) is None and kernels.supported(runtime.current().backend, kernels.QROWS):
        # ggml-cuda's GET_ROWS lacks the K-quants: ggrad's kernel gathers the rows' blocks
        flat = kernels.op(ctx, kernels.QROWS, (table.contents.ne[0], math.prod(node.shape[:-1])),
                          [table, contiguous(ctx, rows)], [])
    return reshape(ctx, flat, node.shape)
