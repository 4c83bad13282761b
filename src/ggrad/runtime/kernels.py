"""ggrad's own ggml kernels (scripts/patch_ggml_kernels.py, applied to every wheel ggrad's
bootstrap builds): where torch's semantics took many ggml nodes, one kernel.

Two kinds. Kernels that changed an existing ggml op (relu and leaky_relu keep NaN, SILU_BACK
modes for their gradients, a parallel REPEAT_BACK on CUDA) are used wherever `version()` is
at least 1. Kernels of ggrad's op, GGML_OP_GGRAD (one op, the kernel named in op_params[0]),
exist only on the backends that implement them: `supported(backend, kernel)` asks. Where a
kernel is missing (an unpatched ggml, a backend without it) the builders compose the same
result from ggml's ops, which stay the kernels' test oracle.
"""

from __future__ import annotations

import ctypes
import functools
import os
import struct

from ggml import ggml as G

from . import backend

# GGML_OP_GGRAD's kernels (scripts/ggml_kernels/ggrad_cpu.inc says what each computes)
CLASS_CROSS_ENTROPY = 1       # logits (C, N), targets i32 (N), weights (C) | None -> (N, 2)
CLASS_CROSS_ENTROPY_BACK = 2  # logits, targets, gradient per target (N), weights | None -> (C, N)
ADAM_HYPER = 3                # corrections (2), lr (1), constants (4), 1 - betas (2) -> (11); in place: (9)
LAYER_NORM_BACK = 4           # x (D, R), gradient of the normalized rows (D, R) -> (D, R); eps
TRANSPOSE = 5                 # x (A, B), rows contiguous -> x^T (B, A), contiguous (cpu only)
GEMM = 6                      # A, B[, bias (N)]; transpose flags, TF32 -> op(A) @ op(B) [+ bias] (cpu with OpenBLAS, cuda, vulkan: set 40)
GELU_BACK = 7                 # x, gradient of gelu(x), gelu(x), contiguous -> the gradient of x (cpu only)
GELU = 8                      # x, contiguous -> gelu(x), the erf form (cpu only)
ADAMW_GROUP = 9               # 9 constants, then (p, g, m, v) x 1 or 2; count -> marker; p, m, v in place (vulkan: set 36)
MAX_POOL = 10                 # x (W, H, planes); window, stride, padding, dilation, out size -> (OW*OH, planes)
MAX_POOL_BACK = 11            # g (OW*OH, planes), x; as MAX_POOL -> (W*H, planes)
COLUMNS = 12                  # x (W, H, C, N); as MAX_POOL -> a convolution's columns (OW*OH, C*KH*KW, N) (cpu only)
COLUMNS_BACK = 13             # the columns' gradient; as COLUMNS -> (W, H, C, N) (cpu only)
CONV = 14                     # x (W, H, C, N), weight (C*KH*KW, OC)[, bias (OC)]; as COLUMNS -> (OW*OH, OC*N) (cpu only)
CONV_BACK_INPUT = 15          # g (OW*OH, OC*N), weight, x's shape; as COLUMNS -> (W*H, C*N) (cpu only)
CONV_BACK_WEIGHT = 16         # g, x; as COLUMNS -> (C*KH*KW, OC) (cpu only)
QMATMUL_BACK = 17             # W quantized (in, out), g (out, T) -> g @ W (in, T), W read in its blocks (cpu, cuda; vulkan: set 41)
CELL = 18                     # [record], proj, h W_hh^T, [b_hh], state0; t, t_prev, H, T, B, cell -> the record
CELL_BACK = 19                # [gradients], record, its gradient, [dh], state0; as CELL -> proj's gradient...
BATCH_STATS = 20              # x (S, C, N); S, C, N -> each channel's mean, then its biased variance (2C)
BATCH_NORM = 21               # x, mean, var, [weight], [bias]; S, C, N, eps -> the normalized x
BATCH_NORM_BACK = 22          # x, g, mean, var, [weight]; as BATCH_NORM -> dx, then the weight's and bias's
FOLD = 23                     # columns (C*KH*KW, OW, OH, N); kh, kw, sh, sw, ph, pw, dh, dw, W, H, C -> the image (vulkan, cuda)
QROWS = 24                    # a quantized table (row length, rows), row indices i32 (T) -> the rows in f32 (cuda)
RUNNING_STAT = 25             # a running buffer (C), statistics (2C); offset, keep, take -> the buffer moved (C)
# BATCH_STATS and BATCH_NORM_BACK with each channel split into P parts, a node to sum the parts
# and one to join them (vulkan: a workgroup per part; CUDA splits inside its own kernels)
BATCH_STATS_PARTS = 26        # x; S, C, N, eps, P -> each part's mean, then its squared deviations (2*C*P)
BATCH_STATS_JOIN = 27         # those; as BATCH_STATS_PARTS -> BATCH_STATS' statistics (2C)
BATCH_NORM_BACK_PARTS = 28    # x, g, mean, var; as BATCH_STATS_PARTS -> each part's sum(g), then sum(g xhat)
BATCH_NORM_BACK_JOIN = 29     # x, g, mean, var, [weight], those; as BATCH_STATS_PARTS -> BATCH_NORM_BACK's
LAYER_NORM = 30               # x (D, R), [weight (D)], [bias (D)]; eps -> xhat * weight + bias (cpu, cuda)
LAYER_NORM_AFFINE_BACK = 31   # x, the output's gradient g (D, R), weight; eps, 1 -> dx, then g * xhat (D, 2R) (cpu, cuda)
CLASS_TOTAL = 32              # CLASS_CROSS_ENTROPY's (N, 2); mean -> the loss, the weights' sum, a target's share of a gradient of 1 (3)
SOFTMAX_LOW = 33              # x (S, L, H, B), [mask]; scale -> softmax rows in f16/bf16, then each row's max and 1/sum (cpu, cuda)
SOFTMAX_LOW_BACK = 34         # x, [mask], the rows' gradient, SOFTMAX_LOW's output; scale -> the gradient of x (S, R) (cpu, cuda)
ATTENTION = 35                # q (D, L, H, B), k, v (D, S, H, B) f16/bf16 views; scale, causal -> out (B, L, H, D), then each row's log-sum-exp, base 2 (cuda)
ATTENTION_BACK = 36           # q, k, v, ATTENTION's node, out's gradient (D, L, H, B); scale, causal, packed -> dq, dk, dv (cuda)
SINCE = {CLASS_CROSS_ENTROPY: 2, CLASS_CROSS_ENTROPY_BACK: 2, ADAM_HYPER: 3, LAYER_NORM_BACK: 4,
         TRANSPOSE: 5, GEMM: 7, GELU_BACK: 12, GELU: 13, ADAMW_GROUP: 15, MAX_POOL: 16,
         MAX_POOL_BACK: 16, COLUMNS: 17, COLUMNS_BACK: 17, CONV: 19, CONV_BACK_INPUT: 19,
         CONV_BACK_WEIGHT: 19, QMATMUL_BACK: 20, CELL: 25, CELL_BACK: 25,
         BATCH_STATS: 26, BATCH_NORM: 26, BATCH_NORM_BACK: 26,
         FOLD: 30, QROWS: 30, RUNNING_STAT: 34, BATCH_STATS_PARTS: 35, BATCH_STATS_JOIN: 35,
         BATCH_NORM_BACK_PARTS: 35, BATCH_NORM_BACK_JOIN: 35, LAYER_NORM: 51, LAYER_NORM_AFFINE_BACK: 51,
         CLASS_TOTAL: 54, SOFTMAX_LOW: 57, SOFTMAX_LOW_BACK: 57, ATTENTION: 60, ATTENTION_BACK: 60}  # the kernel set's version that added each (QROWS: CUDA only, in set 30 builds after it)


def names() -> dict[int, str]:
    """Each kernel's name, by its number (this module's constants)."""
    return {value: name for name, value in globals().items()
            if name.isupper() and isinstance(value, int) and value in SINCE}


def softmax_low_rows(cols: int, rows: int, type_size: int) -> int:
    """The rows of `cols` values of SOFTMAX_LOW's output for `rows` softmax rows in a type of
    `type_size` bytes: the probabilities, then each row's max and 1/sum as two float32 at
    the first 16-byte boundary after them (ggrad_softmax.h's layout)."""
    stats = -(-rows * cols * type_size // 16) * 16
    return -(-(stats + 8 * rows) // (cols * type_size))


def version() -> int:
    """The kernel set's version in the loaded ggml, 0 without it."""
    return backend.kernel_set()


@functools.cache
def _constructor():
    make = getattr(backend.ggml_library("libggml-base.so"), "ggml_ggrad", None)
    if make is None:
        return None
    tensor = ctypes.POINTER(G.ggml_tensor)
    make.restype = tensor
    make.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                     tensor, tensor, tensor, tensor]
    return make


def op(ctx, kernel: int, shape: tuple[int, int], srcs: list, params: list[int | float], dtype=None):
    """A GGML_OP_GGRAD node running `kernel` over `srcs` (up to GGML_MAX_SRC, None for absent
    ones) into a new tensor of ggml shape `shape` (ne0, ne1), float32 unless `dtype` (a ggml
    type) says; `params` go to op_params[1:] (ints as int32, floats as float32 bits)."""
    if len(srcs) > G.GGML_MAX_SRC:
        raise ValueError(f"a ggml node takes at most {G.GGML_MAX_SRC} sources, got {len(srcs)}")
    first = list(srcs[:4]) + [None] * (4 - len(srcs[:4]))
    node = _constructor()(ctx, kernel, G.GGML_TYPE_F32 if dtype is None else dtype, shape[0], shape[1], *first)
    for i, src in enumerate(srcs[4:], start=4):  # the constructor takes four; the graph walks every slot
        node.contents.src[i] = src
    op_params = node.contents.op_params
    for i, value in enumerate(params, start=1):
        op_params[i] = param(value)
    return node


def op_in_place(ctx, kernel: int, target, srcs: list, params: list[int | float]):
    """A GGML_OP_GGRAD node running `kernel` that writes into `target`'s memory (a view of
    it, as ggml's in-place ops: its shape, after `target` in the graph); `target` is its
    src0 and `srcs` follow (None for absent ones)."""
    node = G.ggml_view_tensor(ctx, target)  # its memory, not its order: src0 below gives that
    c = node.contents
    c.op = _ggrad_op()
    c.src[0] = target
    c.op_params[0] = kernel
    for i, value in enumerate(params, start=1):
        c.op_params[i] = param(value)
    for i, src in enumerate(srcs, start=1):
        c.src[i] = src
    return node


def kernel_of(node) -> int | None:
    """The ggrad kernel a ggml node runs (its op_params[0]), or None for another op."""
    c = node.contents
    return c.op_params[0] if c.op == _ggrad_op() else None


@functools.cache
def _ggrad_op() -> int:
    """GGML_OP_GGRAD's number in the loaded ggml (the bindings' enum predates the patch)."""
    params = G.ggml_init_params(mem_size=2 * G.ggml_tensor_overhead(), mem_buffer=None, no_alloc=True)
    ctx = G.ggml_init(params)
    try:
        return int(_constructor()(ctx, 0, G.GGML_TYPE_F32, 1, 1, None, None, None, None).contents.op)
    finally:
        G.ggml_free(ctx)


def param(value: int | float) -> int:
    """An op_params slot's int32: an int as it is, a float as its float32 bits (ggml's
    ggml_get_op_params_f32 reads them back)."""
    return value if isinstance(value, int) else struct.unpack("<i", struct.pack("<f", value))[0]


@functools.cache
def blas_sgemm() -> bool:
    """Hand the CPU's GEMM kernel OpenBLAS's sgemm (the scipy-openblas32 package, a
    dependency on Linux): True where it took. OpenBLAS runs each call on the calling thread;
    ggml's threads share a product's output. ggml's own float32 products dot each output
    along K and ran at half of OpenBLAS's speed on the short K of every weight gradient
    (bench/cpu_products.py)."""
    install = getattr(backend.ggml_library("libggml-cpu.so"), "ggml_ggrad_cpu_set_sgemm", None)
    if install is None:
        return False
    try:
        import scipy_openblas32
    except ImportError:
        return False
    blas = ctypes.CDLL(os.path.join(scipy_openblas32.get_lib_dir(), scipy_openblas32.get_library(fullname=True)))
    blas.scipy_openblas_set_num_threads(1)
    install.argtypes = [ctypes.c_void_p]
    install(ctypes.cast(blas.scipy_cblas_sgemm, ctypes.c_void_p))
    _keep.append(blas)
    return True


_keep: list = []  # the loaded BLAS, alive as long as ggml may call it


# Kernels whose code for a backend has been compile-checked but has not yet run on such a
# device (scripts/check_cuda_syntax.sh: no GPU was lent): that backend composes them (or, for
# a K-quant table's rows, which nothing else reads there, refuses) unless
# GGRAD_UNVERIFIED_KERNELS=1, which bench/gpu/h200.sh sets so that its test run tries them.
# A kernel leaves this table once the suite has passed with it on such a device.
# (2026-12-05, H100: the suite passed with sets 22-30's CUDA kernels, which left it; H200, later:
# QROWS, GEMM, ADAMW_GROUP and RUNNING_STAT passed their tests on cuda:0 and left it too;
# H100, set 35: the batch statistics and their gradient split over several blocks a channel.)
# H100, set53 (2026-12-06): LayerNorm's kernels (set 51) and its bfloat16 output passed theirs.
# H100, set66 (2026-12-07): set 54's CLASS_TOTAL passed its tests (the cross-entropy's, the budgets).
# H100, set75 (2026-12-07, sixteenth session): set 57's attention softmax under autocast
# (SOFTMAX_LOW, SOFTMAX_LOW_BACK) passed its tests and the attention, autocast and budget tests.
# H100, set82-set83 (2026-12-07, nineteenth session): set 60's attention kernels (ATTENTION,
# ATTENTION_BACK) passed the probe against float64 and, as ggml ops, their tests and
# test_kernels' attention, autocast, budget and product tests, test_attention's and test_amp's
# (88 passed); the bf16 block 1.036-1.047 ms with them, 1.209-1.220 composed.
UNVERIFIED: dict[str, set[int]] = {}

# Changes to ggml's own ops that a node asks for with a 1 in one of its op_params (a slot
# ggml leaves 0), and to ggrad's kernels that a node asks for by its sources, named here with
# the backend kind that has each (a tuple: each of those; None: every one), the kernel set that added it and that
# slot, trusted as UNVERIFIED's kernels are.
# repeat_back_split: CUDA's REPEAT_BACK with op_params[0] = 1 splits its repeats between
# blocks where its outputs are few (set 39; its tests passed on an H100, 2026-12-05).
# cast_x4: CUDA's CPY with op_params[0] = 1 casts contiguous float32 <-> float16/bfloat16
# four values a thread (set 43).
# im2col_rows: CUDA's IM2COL with op_params[7] = 1 stages each output row's input rows in
# shared memory, a block per row (set 44).
# fold_rows: ggrad's FOLD (kernel 23) on CUDA with op_params[12] = 1 stages each image row's
# column entries in shared memory, a block per row (set 44).
# (2026-12-06, H200: test_kernels, the casts' bits and test_conv passed with all three.)
# Set 45 folds a band of image rows a block (its column rows staged whole), stepping its
# indices without dividing: the fold's bit tests passed on an H100 (2026-12-06, third session).
# copy_rows: CUDA's CPY and CONT with op_params[1] = 1 copy views whose rows are contiguous
# (attention's heads, slices of a fused projection) a warp a row (set 45; H200, 2026-12-06:
# the copies' bits, test_kernels, test_ops and test_attention passed with it).
# gemm_low: ggrad's GEMM (kernel 6) on CUDA takes float16 and bfloat16 operands (autocast's),
# float32 sums into a float32 result (set 46; no op_params slot: its operands' types ask;
# H100, 2026-12-06: the autocast, attention and node-budget tests passed with it).
# im2col_low: CUDA's IM2COL writes bfloat16 columns (set 46; float16 is ggml's own), so
# autocast's convolutions cast no columns (no slot: the output's type asks; H100, 2026-12-06:
# test_conv's and the autocast convolution's torch equalities passed with it, and the bf16
# ResNet's losses were the same bits with and without).
# running_count: ggrad's RUNNING_STAT (kernel 25) counts an int32 given as src2 up by one, on
# every backend (kind None; set 47): BatchNorm's num_batches_tracked, three nodes and a copy
# before (no slot: the source asks; H100, 2026-12-06: the batch-norm and node-budget tests
# passed with it on CUDA; cpu and lavapipe in CI).
# im2col_x4: CUDA's IM2COL a block per row (im2col_rows) with op_params[8] = 1 writes four
# values of a column with one store where the columns come in fours (set 47; H100, 2026-12-06:
# the columns' bit test, forced off and on, and test_conv passed with it).
# gemm_wide: ggrad's GEMM (kernel 6) on Vulkan with op_params[4] naming a tile of 128 rows
# and/or columns (ggrad_gemm_wide.comp, set 48; the same sums in the same order as the 64x64
# tile's shader; H100, 2026-12-06: the wide tiles' bits and test_kernels' products passed).
# gemm_bias_epilogue: ggrad's GEMM on CUDA with op_params[5] = 1 adds a bias (one product after
# the kernel took batches of rows over one B as one) in cuBLASLt's epilogue, not in a kernel
# after cuBLAS's product (set 48; H100,
# 2026-12-06: the epilogue's float64 equalities and test_kernels' products passed).
# gemm_whole_k: ggrad's GEMM on CUDA with op_params[6] = 1 takes the first cuBLASLt algorithm
# that does not split K (one kernel, no reduction kernel after it) for a small product (set 49;
# H100, 2026-12-06: the small products' float64 equalities and test_kernels' products passed;
# mlp-small's step 38 -> 32 kernels, 0.071 -> 0.064 ms of device time).
# softmax_rows: CUDA's SOFT_MAX with op_params[2] = 1 runs a warp a row, the row in registers
# (set 50; ggml's gives a row a block and reduces through shared memory: the bf16 block's 65536
# rows of 256, 0.131 ms on an H100; H100, set50: 0.060 ms, test_cuda_softmax_a_warp_a_row_equals_float64,
# the attention and autocast tests passed with it).
# unary_x4: CUDA's float32 unary ops (RELU asks) with op_params[1] = 1 four values a thread
# (set 50; ggml's, one a thread: the bf16 block's relu 0.080 ms on an H100; H100, set50b: the
# relu's bit test passed, 0.047 ms).
# cast_relu: CUDA's contiguous CPY of float32 to float16/bfloat16 with op_params[2] = 1 applies
# relu first (set 52): autocast's cast of relu's output for the next product reads relu's input,
# and relu's float32 output is not written (its gradient reads the input; H100, set54b: its test
# passed, NaN compared as NaN).
# layer_norm_low: ggrad's LAYER_NORM (kernel 30) writes float16 or bfloat16 where its output's
# type asks (set 53; no slot), for autocast's cast of its output, on the CPU and CUDA (kind None:
# the backends that have the kernel; H100, set53: its tests passed).
OP_VARIANTS = {"repeat_back_split": ("cuda", 39, 0), "cast_x4": ("cuda", 43, 0), "im2col_rows": ("cuda", 44, 7),
               "fold_rows": ("cuda", 44, 12), "copy_rows": ("cuda", 45, 1), "gemm_low": ("cuda", 46, None),
               "im2col_low": ("cuda", 46, None), "running_count": (None, 47, None), "im2col_x4": ("cuda", 47, 8),
               "gemm_wide": ("vulkan", 48, 4), "gemm_bias_epilogue": ("cuda", 48, 5), "gemm_whole_k": ("cuda", 49, 6),
               "softmax_rows": ("cuda", 50, 2), "unary_x4": ("cuda", 50, 1), "cast_relu": ("cuda", 52, 2),
               "layer_norm_low": (None, 53, None), "adam_hyper_in_place": (None, 55, None),
               "gemm_low_out": ("cuda", 57, None), "gemm_strided_out": (("cpu", "cuda"), 58, None),
               "binary_x4": ("cuda", 58, 0), "silu_back_x4": ("cuda", 58, 2)}
# (H100, set49e, the alignment hint capped at 16: test_kernels, test_optim, test_capture,
# test_amp, test_autograd's and test_attention's CUDA cases passed with both cuBLASLt paths,
# 235 tests, but test_capture's accumulation iteration one ulp off eager's: a failure seen on
# CUDA since 2026-12-05, before set 48, with these paths off too.)
# (H100, set53: layer_norm_low's tests passed; set54b: cast_relu's, its NaN compared as NaN.)
# adam_hyper_in_place: ggrad's ADAM_HYPER (kernel 3) given the 9 constants' own buffer as src0
# (a 9-element node over it, the four sources after) writes them there and this step's bias
# corrections over its corrections source: Adam's group needs no copy of them a step (set 55;
# no slot: the node's size asks; H100, set66, 2026-12-07: its test, test_optim's, test_capture's
# and test_amp's CUDA cases passed with it, but the known one-ulp accumulation iteration).
# gemm_low_out: ggrad's GEMM on CUDA writes its result in its operands' low type where its
# output's type asks (set 57; no slot): ops.narrow_casts retypes a product whose only reader is
# its cast (autocast's fused projection and attention output, read only by the next products;
# H100, set75: its tests and the autocast, attention and product tests passed with it).
# gemm_strided_out: ggrad's GEMM on the CPU and CUDA writes its result at its output's strides,
# as a view of a larger tensor (set 58; no slot: the output's strides ask): ops.products_in_place
# points a product read only through views by one copy at that copy's destination (attention's
# q/k/v gradients into their joined tensor, its output into the merged heads; H100, set76,
# 2026-12-07: its test and the attention, autocast, product and budget tests passed on CUDA).
# binary_x4: CUDA's ADD, SUB, MUL and DIV with op_params[0] = 1 run contiguous float32 operands of
# one size (or a one-value src1) four values a thread; silu_back_x4: SILU_BACK (relu's and
# leaky_relu's gradients) with op_params[2] = 1 likewise (set 58; the same arithmetic per value
# as ggml's kernels; H100, set80, 2026-12-07: their bit test and the product, convolution, fuzzer
# and budget tests passed on CUDA; the bf16 block 1.295 -> 1.236 ms).
UNVERIFIED_VARIANTS: dict[str, set[str]] = {}


def _trusted(unverified: dict, dev_backend, key) -> bool:
    """Whether `key` (a kernel, a variant) may run on `dev_backend`: not listed as unverified
    for its kind, or GGRAD_UNVERIFIED_KERNELS=1."""
    return key not in unverified.get(dev_backend.info.kind, ()) or os.environ.get("GGRAD_UNVERIFIED_KERNELS") == "1"


def choices() -> tuple:
    """What decides, beside a graph's ops, which kernels and op variants its ggml nodes ask
    for: a graph built under other choices (a test or benchmark refusing a kernel or leaving
    a variant unasked, the unverified ones let in) is not reused under these."""
    return supported, variant, os.environ.get("GGRAD_UNVERIFIED_KERNELS")


def variant(dev_backend, name: str) -> bool:
    """Whether nodes on `dev_backend` may ask for the changed ggml op `name` (OP_VARIANTS):
    its kind has it, the loaded kernel set has it, and it is trusted there."""
    kind, since, _ = OP_VARIANTS[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return (kind is None or dev_backend.info.kind in kinds) and version() >= since and _trusted(UNVERIFIED_VARIANTS, dev_backend, name)


def supported(dev_backend, kernel: int) -> bool:
    """Whether `dev_backend` (a started runtime Backend) runs ggrad's `kernel`: asked of
    ggml's supports_op once per device and kernel, over a small float32 example."""
    key = (dev_backend.name, kernel)  # the device's name: a released backend's id is reused
    if key not in _supported:
        trusted = _trusted(UNVERIFIED, dev_backend, kernel)
        # the CPU's BLAS kernels need OpenBLAS loaded into ggml-cpu; other backends have their own
        blas = kernel not in (GEMM, CONV, CONV_BACK_INPUT, CONV_BACK_WEIGHT, QMATMUL_BACK) or \
            dev_backend.info.kind != "cpu" or blas_sgemm()
        usable = trusted and blas and version() >= SINCE[kernel] and _constructor() is not None
        _supported[key] = usable and _ask(dev_backend, kernel)
    return _supported[key]


_supported: dict[tuple[int, int], bool] = {}


def _ask(dev_backend, kernel: int) -> bool:
    params = G.ggml_init_params(mem_size=12 * G.ggml_tensor_overhead(), mem_buffer=None, no_alloc=True)
    ctx = G.ggml_init(params)
    try:
        vec = lambda n: G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, n)  # noqa: E731
        logits = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 2)
        targets = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_I32, 2)
        if kernel == CLASS_CROSS_ENTROPY:
            node = op(ctx, kernel, (2, 2), [logits, targets], [-100, 1.0, 0.0])
        elif kernel == CLASS_TOTAL:
            node = op(ctx, kernel, (3, 1), [G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 2, 2)], [1])
        elif kernel == CLASS_CROSS_ENTROPY_BACK:
            grad = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 2)
            node = op(ctx, kernel, (4, 2), [logits, targets, grad], [-100, 1.0, 0.0])
        elif kernel == LAYER_NORM_BACK:
            node = op(ctx, kernel, (4, 2), [logits, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 2)], [1e-5])
        elif kernel == LAYER_NORM:
            node = op(ctx, kernel, (4, 2), [logits, vec(4), vec(4)], [1e-5])
        elif kernel == LAYER_NORM_AFFINE_BACK:
            node = op(ctx, kernel, (4, 4), [logits, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 2), vec(4)], [1e-5, 1])
        elif kernel == TRANSPOSE:
            node = op(ctx, kernel, (2, 4), [logits], [])
        elif kernel == GEMM:
            node = op(ctx, kernel, (2, 2), [logits, logits], [0, 1])
        elif kernel == GELU_BACK:
            node = op(ctx, kernel, (4, 2), [logits, logits, logits], [])
        elif kernel == GELU:
            node = op(ctx, kernel, (4, 2), [logits], [])
        elif kernel == ADAMW_GROUP:
            hyper = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 9)
            node = op(ctx, kernel, (1, 1), [hyper] + [G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 8) for _ in range(4)], [1])
        elif kernel in (MAX_POOL, MAX_POOL_BACK):  # 2x2 windows over one 4x2 plane
            pool = [2, 2, 2, 2, 0, 0, 1, 1, 2, 1]
            node = op(ctx, kernel, (2, 1), [logits], pool) if kernel == MAX_POOL else \
                op(ctx, kernel, (8, 1), [G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 2, 1), logits], pool)
        elif kernel in (COLUMNS, COLUMNS_BACK):  # 1x2 taps over one 4x2 plane
            taps = [2, 1, 1, 1, 0, 0, 1, 1, 3, 2]
            node = op(ctx, kernel, (6, 2), [logits], taps) if kernel == COLUMNS else \
                op(ctx, kernel, (4, 2), [G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 6, 2), logits], taps)
        elif kernel in (CONV, CONV_BACK_INPUT, CONV_BACK_WEIGHT):  # 1x2 taps over one 4x2 plane, 2 channels out
            taps = [2, 1, 1, 1, 0, 0, 1, 1, 3, 2]
            weight, grad = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 2, 2), G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 6, 2)
            node = op(ctx, kernel, (6, 2), [logits, weight], taps) if kernel == CONV else \
                op(ctx, kernel, (4, 2), [grad, weight, logits], taps) if kernel == CONV_BACK_INPUT else \
                op(ctx, kernel, (2, 2), [grad, logits], taps)
        elif kernel == QROWS:  # row 1 of a Q8_0 table of 2 rows of 32
            node = op(ctx, kernel, (32, 1), [G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_Q8_0, 32, 2),
                                             G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_I32, 1)], [])
        elif kernel == QMATMUL_BACK:  # a Q8_0 weight of 2 rows of 32
            weight = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_Q8_0, 32, 2)
            node = op(ctx, kernel, (32, 2), [weight, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 2, 2)], [])
        elif kernel in (CELL, CELL_BACK):  # an LSTM step: 2 units, 1 sequence of 1 step
            shape = [0, -1, 2, 1, 1, 0]
            node = op(ctx, kernel, (12, 1), [None, vec(8), vec(8), None, vec(2)], shape) if kernel == CELL else \
                op(ctx, kernel, (10, 1), [None, vec(12), vec(12), None, vec(2)], shape)
        elif kernel in (BATCH_STATS, BATCH_NORM, BATCH_NORM_BACK):  # 2 channels of 2 positions, 2 samples
            shape = [2, 2, 2, 1e-5]
            node = op(ctx, kernel, (4, 1), [vec(8)], shape) if kernel == BATCH_STATS else \
                op(ctx, kernel, (8, 1), [vec(8), vec(2), vec(2), None, None], shape) if kernel == BATCH_NORM else \
                op(ctx, kernel, (12, 1), [vec(8), vec(8), vec(2), vec(2), None], shape)
        elif kernel in (BATCH_STATS_PARTS, BATCH_STATS_JOIN, BATCH_NORM_BACK_PARTS, BATCH_NORM_BACK_JOIN):
            shape = [2, 2, 2, 1e-5, 2]  # as above, each channel in 2 parts
            node = op(ctx, kernel, (8, 1), [vec(8)], shape) if kernel == BATCH_STATS_PARTS else \
                op(ctx, kernel, (4, 1), [vec(8)], shape) if kernel == BATCH_STATS_JOIN else \
                op(ctx, kernel, (8, 1), [vec(8), vec(8), vec(2), vec(2)], shape) if kernel == BATCH_NORM_BACK_PARTS else \
                op(ctx, kernel, (12, 1), [vec(8), vec(8), vec(2), vec(2), None, vec(8)], shape)
        elif kernel == FOLD:  # 1x2 taps over one 4x2 plane: columns (2, 3, 2, 1)
            node = op(ctx, kernel, (8, 1), [G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 2, 3, 2, 1)],
                      [1, 2, 1, 1, 0, 0, 1, 1, 4, 2, 1])
        elif kernel == RUNNING_STAT:  # a running buffer of 2 channels moved toward statistics (4)
            node = op(ctx, kernel, (2, 1), [vec(2), vec(4)], [2, 0.9, 0.1])
        elif kernel == ADAM_HYPER:
            node = op(ctx, kernel, (11, 1), [vec(n) for n in (2, 1, 4, 2)], [])
        elif kernel in (SOFTMAX_LOW, SOFTMAX_LOW_BACK):  # 2 rows of 4, no mask, bfloat16 probabilities
            bf16 = G.GGML_TYPE_BF16
            probs = op(ctx, SOFTMAX_LOW, (4, softmax_low_rows(4, 2, 2)), [logits, None], [1.0], dtype=bf16)
            node = probs if kernel == SOFTMAX_LOW else op(ctx, kernel, (4, 2), [logits, None, logits, probs], [1.0])
        elif kernel in (ATTENTION, ATTENTION_BACK):  # one head of 64, 2 queries and keys, bfloat16
            qkv = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_BF16, 64, 6)
            q, k, v = (G.ggml_view_4d(ctx, qkv, 64, 2, 1, 1, 384, 128, 768, i * 128) for i in range(3))
            node = op(ctx, ATTENTION, (64, 4), [q, k, v], [1.0, 0])
            if kernel == ATTENTION_BACK:
                grad = G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 64, 2, 1, 1)
                node = op(ctx, kernel, (64, 6), [q, k, v, node, grad], [1.0, 0, 1])
        else:
            return False
        return dev_backend.has_op(node)
    finally:
        G.ggml_free(ctx)
