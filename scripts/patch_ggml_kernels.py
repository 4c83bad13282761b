"""ggrad's kernel set: ggml kernels changed where PyTorch's semantics took several nodes
(ggrad issue 25), on every backend a wheel carries (CPU, CUDA, Vulkan).

- RELU keeps NaN and the sign of zero, as torch.relu: `x < 0 ? 0 : x` (ggml: `x > 0 ? x : 0`,
  `fmaxf(x, 0)` or GLSL `max`, which turn NaN into 0). One node where ggrad composed five.
- LEAKY_RELU is torch's `x > 0 ? x : x * slope` (NaN stays NaN; ggml gave 0).
- SILU_BACK takes a mode in op_params[0], set by ggrad only (0, ggml's own, leaves
  SiLU's gradient as it was):
    1: relu's gradient from its output y, torch's threshold_backward: y <= 0 ? 0 : g
       (a NaN output passes g; an inf g where y is 0 gives 0, not inf * 0)
    2: leaky_relu's gradient from its input x, slope in op_params[1] (float bits):
       x > 0 ? g : g * slope
- REPEAT_BACK on CUDA sums each output over its repeats along the outer axes with up to
  32 threads per output and a shared-memory reduction (ggrad sums along the first axis
  with SUM_ROWS); where its outputs fill fewer than two blocks per multiprocessor, the
  repeats split between blocks too where the node's op_params[0] is 1 (set 39; ggml's
  REPEAT_BACK leaves it 0), a second kernel adding the splits' sums in order; on the CPU its threads share the columns (it ran on one thread), each
  column summed in ggml's order (ggml's kernel walks every repeat in one thread: 72% of a
  transformer block's step on the H200). Its grid is ggml's, so the launch limits in
  ggrad/runtime/launch.py still hold.
- On the CPU: SUM_ROWS's threads share its rows (each row summed in ggml's order), and
  POOL_2D's and POOL_2D_BACK's their planes;
  IM2COL_BACK scatters each image's column rows once (ggml gathered strided taps);
  ADD/SUB/MUL/DIV with one value per row run one loop per row (ggml called its row loop
  once per element); the cross_entropy kernels use ggml's vectorised exp; torch's max
  pooling and its gradient are one node each (NaN, padding, dilation as torch's kernel:
  thirteen nodes made ggml's POOL_2D torch's at the edges); a convolution's columns in
  torch's unfold layout (a row per tap: strided copies of input rows) and their adjoint;
  float32 sums (SUM_ROWS, SUM, MEAN) accumulate in eight doubles the compiler vectorizes;
  a convolution and its two gradients as three nodes that make each image's columns in a
  buffer of the thread's own (they never reach memory); a quantized weight's product
  gradient (g @ W) from chunks of W converted to float32 in a thread's buffer (on CUDA:
  in pool scratch, with cuBLAS); a recurrent layer's time step (LSTM, GRU, RNN) and its
  gradient, one node each, written in place into the layer's record (on Vulkan and CUDA
  too: ggrad_cell.h); batch normalization in training as three nodes (the statistics, the
  normalization with the affine, the gradient with the weight's and bias's; CPU, Vulkan,
  CUDA); torch's max pooling and its gradient on Vulkan and CUDA too (ggrad_pool.h; the
  gradient gathered per input element, no atomics), and there the adjoint of IM2COL (a
  convolution's input gradient, which they lack) as one node.
- On Vulkan (set 36): relu and its gradients test a float's sign and class on its bits, and
  DIV, SQRT and the exact AdamW's division and root are corrected to IEEE's results
  (ggrad_ieee.glsl: a driver may assume no NaN and divide or take roots through
  approximations: NVIDIA's did); Adam over one or two parameters in one dispatch
  (ADAMW_GROUP, ggrad_adamw_group.comp), its in-place writes to its sources ordered by
  ggml_vk_build_graph's synchronization.
- On Vulkan (set 37; 38: four sums per thread, loads in flight): REPEAT_BACK with up to 64 threads per output and a shared-memory sum
  (ggrad_repeat_back.comp; ggml's shader walked every repeat in one thread: 46% of a
  transformer block's step on an H100); split-k counts a batched product's batch among its
  tiles (it split each of 32 batches 8 ways: 11x slower); SQRT of a subnormal from its bits.
- On Vulkan (set 40): the GEMM kernel (6) as a shader, ggrad_gemm.comp: 64x64 tiles of C,
  operands read through their strides (a transposed view in place: no copies before a
  product's gradients), the bias added to C's rows. Set 41: a quantized product's gradient
  g @ W (kernel 17) as a shader per block type ggrad loads (ggrad_qmatmul_back.comp, ggml's
  dequantize functions): W read in its blocks, no float32 rows of it (16 MiB chunks through
  GET_ROWS before). Set 42: the shader for those eight types only (41 built Q2_K, Q3_K and
  IQ4_NL too, which ggrad never loads).
- On Vulkan (set 48): the GEMM kernel's large products on tiles of 128 (ggrad_gemm_wide.comp:
  128x128, 128x64 and 64x128 tiles, 8x8 outputs an invocation at most, shared memory read as
  vec4, the next slice loaded while one is multiplied; the same sums in the same order as the
  64x64 shader), the tile named by op_params[4] (ggrad chooses it); ggml-vulkan's perf logger
  names ggrad's kernels by number, a product's by its sizes and FLOPs. On CUDA (set 48): a
  product with a bias (one, no batches) is one cuBLASLt call with its bias epilogue where
  op_params[5] asks (ggml-cuda links cuBLASLt). On CUDA (set 49): where op_params[6] asks, a
  product (one, no batches) takes the first cuBLASLt algorithm that does not split K: one
  kernel, no reduction kernel after it. On CUDA (set 50): SOFT_MAX with op_params[2] = 1 runs a
  warp a row, its values in registers; a float32 unary op (RELU) with op_params[1] = 1 four
  values a thread. On the CPU and CUDA (set 51): LayerNorm with its affine in one kernel (30)
  and its gradient through the weight in one (31). On CUDA (set 52): a contiguous cast of
  float32 to float16 or bfloat16 with op_params[2] = 1 applies relu to each value first. On the
  CPU and CUDA (set 53): LayerNorm's kernel writes float16 or bfloat16 where its output's type
  asks (autocast's cast of its output). On the CPU, CUDA and Vulkan (set 54): the
  class-target cross-entropy's reduction in one kernel (32): the loss, the weights' sum and each
  target's share of a gradient of 1, where SUM_ROWS, DIV, FILL and DIV took four nodes.
  On Vulkan (set 56): a graph computed while earlier ones may still run (ggrad leaves them
  running, as on CUDA) starts with one barrier after all of their work, and ggml-vulkan's
  lists of unsynchronized nodes start empty (theirs named tensors since freed or re-pointed).
  On the CPU and CUDA (set 57): attention's softmax under autocast (33) writes its
  probabilities in the low type, for the product with the values, and each row's max and 1/sum
  after them; its gradient (34) computes the float32 probabilities again from those and writes
  float32, or the low type for the products that read it (ggrad_softmax.h). On CUDA (set 58):
  ggrad's GEMM writes C at its output's strides (a view of a larger tensor): attention's
  products straight into the q/k/v gradients' joined tensor and into the merged heads (and on
  the CPU), and a low product's bias added four values a thread where no epilogue adds it;
  ADD, SUB, MUL and DIV of contiguous float32 operands of one size (or a one-value src1) with
  op_params[0] = 1, and SILU_BACK with op_params[2] = 1, four values a thread (the same
  arithmetic on each value as ggml's kernels). On CUDA (set 59): attention in one kernel each
  way (35, 36; ggrad_attention.cuh) for float16/bfloat16 q, k, v of head size 32, 64 or 128:
  the scores never written, the probabilities computed again in the gradient from each row's
  log-sum-exp (set 60: one float a row where set 59 kept the max and 1/sum; scores in base 2,
  ex2.approx, the masks only in the steps a tail or the causal diagonal crosses; tiles copied
  with cp.async into two buffers taken in turn, one barrier a step).

ggml-base exports `ggml_ggrad_kernels`, returning KERNELS_VERSION, so ggrad can tell a build
that has these kernels (runtime/backend.py) and composes the old way otherwise.

    python scripts/patch_ggml_kernels.py SOURCE_TREE   (ggml-python's sdist, unpacked)

Idempotent; fails loudly when ggml's source no longer matches what it rewrites.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from patch_ggml_adamw import _patch_file as _patch_with_mark

MARK = "ggrad: kernels"
KERNELS_VERSION = 60


# Vulkan lets a driver assume no NaN, inf or signed zero in float arithmetic unless a
# shader asks otherwise (SPV_KHR_float_controls), and NVIDIA's does: `x < 0 ? 0 : x` ran as
# max(x, 0), relu(NaN) came out 0 on the H100. ggrad's tests on a float's sign and class
# read its bits, which no float assumption touches (ggml_kernels/ggrad_ieee.glsl:
# ggrad_negative, ggrad_at_most_zero, ggrad_positive).
# Float32 division and square roots as IEEE's (numpy's, torch's): NVIDIA's driver computes
# `a / b` through a reciprocal (a third of quotients one ulp off) and roots likewise (half
# of them). ggml_kernels/ggrad_ieee.glsl corrects both from their exact residuals where the
# operands and results are far from underflow and overflow (for division the refinement of
# CUDA's div.rn), then keeps the neighbour with the smallest residual (float32 simulations:
# every root of x in [1, 4) and quotients across the range, from results 1 ulp either side:
# all IEEE's); elsewhere (NaN, inf, zero, the extremes) the driver's result stands. DIV,
# SQRT and the exact AdamW shaders (OPT_STEP_ADAMW's, ADAMW_GROUP's) include it.
IEEE_INCLUDE = '#include "ggrad_ieee.glsl"  // ' + MARK + "\n"

# ggrad_gemm_wide.comp's tiles (rows x columns of C), op_params[4] 1, 2, 3 in this order
GEMM_WIDE_TILES = ("128x128", "128x64", "64x128")


VULKAN_DISPATCH = """
#include "ggrad_adamw.h"
#include "ggrad_bn.h"
#include "ggrad_ce.h"
#include "ggrad_cell.h"
#include "ggrad_gemm.h"
#include "ggrad_pool.h"

/* the block types ggrad_qmatmul_back.comp is built for (QMATMUL_BACK_TYPES) */
static bool ggml_vk_ggrad_qmatmul_back_type(ggml_type type) {
    switch (type) {
        case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1: case GGML_TYPE_Q8_0:
        case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K:
            return true;
        default:
            return false;
    }
}

/* g (n_out, T) @ W (n_in, n_out, whole blocks from its buffer's alignment: not a view); the
   shader indexes in uint32 and takes a workgroup per 512 values of a row and 16 rows of g */
static bool ggml_vk_ggrad_qmatmul_back_supported(const ggml_tensor * op) {
    const ggml_tensor * w = op->src[0];
    const ggml_tensor * g = op->src[1];
    if (w == nullptr || g == nullptr || !ggml_vk_ggrad_qmatmul_back_type(w->type) || w->view_src != nullptr ||
        !ggml_is_contiguous(w) || ggml_nrows(w) != w->ne[1] || g->type != GGML_TYPE_F32 || g->nb[0] != sizeof(float) ||
        g->nb[1] % sizeof(float) != 0 || ggml_nrows(g) != g->ne[1] || op->type != GGML_TYPE_F32 ||
        !ggml_is_contiguous(op) || ggml_nrows(op) != op->ne[1] || g->ne[0] != w->ne[1] || op->ne[0] != w->ne[0] ||
        op->ne[1] != g->ne[1]) {
        return false;
    }
    const int64_t limit = (int64_t) UINT32_MAX - 65536;
    return ggml_nelements(op) < limit && (int64_t) (ggml_nbytes(g)/sizeof(float)) < limit &&
           ggml_nrows(w)*(int64_t) (w->nb[1]/ggml_type_size(w->type)) < limit &&
           CEIL_DIV(w->ne[0], 512) <= 65535 && CEIL_DIV(g->ne[1], 16) <= 65535;
}

/* """ + MARK + """: GGML_OP_GGRAD, one workgroup per row (scripts/ggml_kernels/ggrad_ce.comp) */
static bool ggml_vk_ggrad_supported(const ggml_tensor * op) {
    const int kernel = ggml_get_op_params_i32(op, 0);
    if (kernel == 4) {
        return op->src[0]->type == GGML_TYPE_F32 && op->src[1]->type == GGML_TYPE_F32 && op->type == GGML_TYPE_F32 &&
               ggml_is_contiguous_rows(op->src[0]) && ggml_is_contiguous_rows(op->src[1]) &&
               op->src[0]->ne[2] == 1 && op->src[0]->ne[3] == 1 && op->src[1]->ne[2] == 1 && op->src[1]->ne[3] == 1;
    }
    if (kernel == 18 || kernel == 19) {
        return ggrad_cell_supported(op);  // ggrad_cell.h
    }
    if (kernel >= 20 && kernel <= 22) {
        return ggrad_bn_supported(op);  // ggrad_bn.h
    }
    if (kernel >= 26 && kernel <= 29) {
        return ggrad_bn_split_supported(op);  // ggrad_bn.h
    }
    if (kernel == 25) {
        return ggrad_running_stat_supported(op);  // ggrad_bn.h
    }
    if (kernel == 32) {  // ggrad_ce.h; the shader indexes in uint32
        return ggrad_class_total_supported(op) && ggml_nelements(op->src[0]) < (int64_t) UINT32_MAX - 65536;
    }
    if (kernel == 9) {  // ggrad_adamw.h; the shader indexes the two parameters' elements in uint32,
        // and binds each (an empty one would be a descriptor range of 0 bytes)
        if (!ggrad_adamw_group_supported(op)) {
            return false;
        }
        const int64_t n1 = ggml_nelements(op->src[1]), n2 = ggml_get_op_params_i32(op, 1) > 1 ? ggml_nelements(op->src[5]) : 1;
        return n1 > 0 && n2 > 0 && n1 + n2 <= (int64_t) UINT32_MAX - 131072;
    }
    if (kernel == 23) {  // ggrad_pool.h
        return ggrad_fold_supported(op);
    }
    if (kernel == 17) {  // g @ W, W in its blocks (ggrad_qmatmul_back.comp, one shader per block type)
        return ggml_vk_ggrad_qmatmul_back_supported(op);
    }
    if (kernel == 6) {  // ggrad_gemm.h; the shader indexes in uint32, a workgroup per 64x64 tile of C
        ggrad_gemm_shape s;
        if (!ggrad_gemm_plan(op, &s) || s.M <= 0 || s.N <= 0 || s.K <= 0) {
            return false;
        }
        const int64_t limit = (int64_t) UINT32_MAX - 65536;
        for (int i = 0; i < 3; ++i) {
            if (op->src[i] != nullptr && (int64_t) (ggml_nbytes(op->src[i])/sizeof(float)) > limit) {
                return false;
            }
        }
        return ggml_nelements(op) <= limit && CEIL_DIV(s.N, 64) <= 65535 && CEIL_DIV(s.M, 64) <= 65535 &&
               s.b2*s.b3 <= 65535;
    }
    if (kernel == 10 || kernel == 11) {  // ggrad_pool.h; the shader indexes in int32
        return ggrad_max_pool_supported(op) && ggml_nelements(op) < INT32_MAX &&
               ggml_nelements(op->src[kernel == 10 ? 0 : 1]) < INT32_MAX;
    }
    if (kernel == 3) {
        return ggrad_adam_hyper_supported(op);  // ggrad_adamw.h
    }
    if (kernel != 1 && kernel != 2) {
        return false;
    }
    const ggml_tensor * w = op->src[kernel == 1 ? 2 : 3];
    return op->src[0]->type == GGML_TYPE_F32 && op->src[1]->type == GGML_TYPE_I32 && op->type == GGML_TYPE_F32 &&
           ggml_is_contiguous_rows(op->src[0]) && op->src[0]->ne[2] == 1 && op->src[0]->ne[3] == 1 &&
           (w == nullptr || ggml_is_contiguous(w));
}

// a subbuffer starts at the aligned-down offset: the shaders add the difference, in elements
static uint32_t ggml_vk_ggrad_misalign(const vk_subbuffer & sb, const ggml_tensor * tensor) {
    return (uint32_t) ((sb.size - ggml_nbytes(tensor)) / ggml_type_size(tensor->type));
}

// the subbuffers and misalignments of dst's first `count` sources; an absent one binds src0
// (the shader never reads it)
static void ggml_vk_ggrad_sources(ggml_backend_vk_context * ctx, const ggml_tensor * dst, int count, vk_subbuffer * b,
                                  uint32_t * off) {
    for (int i = 0; i < count; ++i) {
        const ggml_tensor * s = dst->src[i] ? dst->src[i] : dst->src[0];
        b[i] = ggml_vk_tensor_subbuffer(ctx, s, true);
        off[i] = ggml_vk_ggrad_misalign(b[i], s);
    }
}

// dispatch sizes for shaders that take one workgroup per row, row z*262144 + y*512 + x
// (devices cap the workgroups along each axis at 65535)
static std::array<uint32_t, 3> ggml_vk_ggrad_rows(uint32_t R) {
    return R > 262144 ? std::array<uint32_t, 3>{ 512, 512, CEIL_DIV(R, 262144) }
         : R > 512    ? std::array<uint32_t, 3>{ 512, CEIL_DIV(R, 512), 1 }
                      : std::array<uint32_t, 3>{ R, 1, 1 };
}

// dispatch sizes for shaders of 256 invocations along x that take element z*131072 + y*256 + x
static std::array<uint32_t, 3> ggml_vk_ggrad_elements(uint32_t n) {
    return n > 131072 ? std::array<uint32_t, 3>{ 256, 512, CEIL_DIV(n, 131072) }
                      : std::array<uint32_t, 3>{ 256, CEIL_DIV(n, 256), 1 };
}

static void ggml_vk_ggrad_adam_hyper(ggml_backend_vk_context * ctx, vk_context& subctx, ggml_tensor * dst) {
    vk_pipeline pipeline = ctx->device->pipeline_ggrad_adam_hyper_f32;
    ggml_pipeline_request_descriptor_sets(ctx, pipeline, 1);
    const int first = ggrad_adam_hyper_first(dst);  // 1: in place (ggrad_adamw.h)
    vk_subbuffer b[5];
    uint32_t off[5];
    for (int i = 0; i < 5; ++i) {
        const ggml_tensor * t = i < 4 ? dst->src[first + i] : dst;
        b[i] = ggml_vk_tensor_subbuffer(ctx, t, true);
        off[i] = ggml_vk_ggrad_misalign(b[i], t);
    }
    const std::array<uint32_t, 6> pc = { off[0], off[1], off[2], off[3], off[4], (uint32_t) first };
    ggml_vk_dispatch_pipeline(ctx, subctx, pipeline, { b[0], b[1], b[2], b[3], b[4] }, pc, { 1, 1, 1 });
}

// the cross-entropy's reduction (ggrad_class_total.comp): one workgroup
static void ggml_vk_ggrad_class_total(ggml_backend_vk_context * ctx, vk_context& subctx, ggml_tensor * dst) {
    const ggml_tensor * both = dst->src[0];
    vk_pipeline pipeline = ctx->device->pipeline_ggrad_class_total_f32;
    ggml_pipeline_request_descriptor_sets(ctx, pipeline, 1);
    vk_subbuffer b_buf = ggml_vk_tensor_subbuffer(ctx, both, true);
    vk_subbuffer o_buf = ggml_vk_tensor_subbuffer(ctx, dst, true);
    const std::array<uint32_t, 5> pc = {
        (uint32_t) both->ne[0], (uint32_t) (both->nb[1] / sizeof(float)), ggml_vk_ggrad_misalign(b_buf, both),
        ggml_vk_ggrad_misalign(o_buf, dst), (uint32_t) ggml_get_op_params_i32(dst, 1),
    };
    ggml_vk_dispatch_pipeline(ctx, subctx, pipeline, { b_buf, o_buf }, pc, { 1, 1, 1 });
}

static void ggml_vk_ggrad_layer_norm_back(ggml_backend_vk_context * ctx, vk_context& subctx, ggml_tensor * dst) {
    const ggml_tensor * x = dst->src[0];
    const ggml_tensor * g = dst->src[1];
    vk_pipeline pipeline = ctx->device->pipeline_ggrad_ln_back_f32;
    ggml_pipeline_request_descriptor_sets(ctx, pipeline, 1);
    vk_subbuffer x_buf = ggml_vk_tensor_subbuffer(ctx, x, true);
    vk_subbuffer g_buf = ggml_vk_tensor_subbuffer(ctx, g, true);
    vk_subbuffer o_buf = ggml_vk_tensor_subbuffer(ctx, dst, true);
    const uint32_t R = (uint32_t) ggml_nrows(x);
    struct { uint32_t D, R, x_stride, g_stride, o_stride, x_off, g_off, o_off; float eps; } pc = {
        (uint32_t) x->ne[0], R, (uint32_t) (x->nb[1] / sizeof(float)), (uint32_t) (g->nb[1] / sizeof(float)),
        (uint32_t) (dst->nb[1] / sizeof(float)), ggml_vk_ggrad_misalign(x_buf, x), ggml_vk_ggrad_misalign(g_buf, g),
        ggml_vk_ggrad_misalign(o_buf, dst), ggml_get_op_params_f32(dst, 1),
    };
    const std::array<uint32_t, 3> elements = ggml_vk_ggrad_rows(R);
    ggml_vk_dispatch_pipeline(ctx, subctx, pipeline, { x_buf, g_buf, o_buf }, pc, elements);
}

static void ggml_vk_ggrad_cell(ggml_backend_vk_context * ctx, vk_context& subctx, ggml_tensor * dst, bool back) {
    vk_pipeline pipeline = back ? ctx->device->pipeline_ggrad_cell_back_f32 : ctx->device->pipeline_ggrad_cell_f32;
    ggml_pipeline_request_descriptor_sets(ctx, pipeline, 1);
    vk_subbuffer o_buf = ggml_vk_tensor_subbuffer(ctx, dst, true);
    vk_subbuffer b[4];
    uint32_t off[4];
    for (int i = 0; i < 4; ++i) {  // src1..src4; an absent src3 binds src1 (never read)
        const ggml_tensor * s = dst->src[i + 1] ? dst->src[i + 1] : dst->src[1];
        b[i] = ggml_vk_tensor_subbuffer(ctx, s, true);
        off[i] = ggml_vk_ggrad_misalign(b[i], s);
    }
    const uint32_t H = (uint32_t) ggml_get_op_params_i32(dst, 3), B = (uint32_t) ggml_get_op_params_i32(dst, 5);
    struct { uint32_t H, T, B; int32_t t, tp, mode; uint32_t has_3, has_0, off0, off1, off2, off3, off4; } pc = {
        H, (uint32_t) ggml_get_op_params_i32(dst, 4), B, ggml_get_op_params_i32(dst, 1), ggml_get_op_params_i32(dst, 2),
        ggml_get_op_params_i32(dst, 6), dst->src[3] != nullptr, dst->src[0] != nullptr,
        ggml_vk_ggrad_misalign(o_buf, dst), off[0], off[1], off[2], off[3],
    };
    const uint32_t n = H*B;
    const std::array<uint32_t, 3> elements = ggml_vk_ggrad_elements(n);
    ggml_vk_dispatch_pipeline(ctx, subctx, pipeline, { o_buf, b[0], b[1], b[2], b[3] }, pc, elements);
}

// batch normalization (ggrad_bn.comp): the statistics and the gradient one workgroup per
// channel, the normalization one per row of positions
static void ggml_vk_ggrad_bn(ggml_backend_vk_context * ctx, vk_context& subctx, ggml_tensor * dst, int kernel) {
    vk_pipeline pipeline = kernel == 20 ? ctx->device->pipeline_ggrad_bn_stats_f32
                         : kernel == 21 ? ctx->device->pipeline_ggrad_bn_apply_f32 : ctx->device->pipeline_ggrad_bn_back_f32;
    ggml_pipeline_request_descriptor_sets(ctx, pipeline, 1);
    vk_subbuffer o_buf = ggml_vk_tensor_subbuffer(ctx, dst, true);
    vk_subbuffer b[5];
    uint32_t off[5];
    ggml_vk_ggrad_sources(ctx, dst, 5, b, off);
    const ggrad_bn_dims d = ggrad_bn_dims_of(dst);
    struct { uint32_t S, C, N; float eps; uint32_t has_w, has_b, off0, off1, off2, off3, off4, off_d; } pc = {
        (uint32_t) d.S, (uint32_t) d.C, (uint32_t) d.N, d.eps,
        dst->src[kernel == 21 ? 3 : 4] != nullptr, kernel == 21 && dst->src[4] != nullptr,
        off[0], off[1], off[2], off[3], off[4], ggml_vk_ggrad_misalign(o_buf, dst),
    };
    const uint32_t R = (uint32_t) (kernel == 21 ? d.C*d.N : d.C);
    const std::array<uint32_t, 3> elements = ggml_vk_ggrad_rows(R);
    ggml_vk_dispatch_pipeline(ctx, subctx, pipeline, { b[0], b[1], b[2], b[3], b[4], o_buf }, pc, elements);
}

// batch normalization with each channel split into parts (ggrad_bn_split.comp): a workgroup
// per part, the statistics' join an invocation per channel
static void ggml_vk_ggrad_bn_split(ggml_backend_vk_context * ctx, vk_context& subctx, ggml_tensor * dst, int kernel) {
    const vk_device & device = ctx->device;
    vk_pipeline pipeline = kernel == 26 ? device->pipeline_ggrad_bn_stats_parts_f32
                         : kernel == 27 ? device->pipeline_ggrad_bn_stats_join_f32
                         : kernel == 28 ? device->pipeline_ggrad_bn_back_parts_f32 : device->pipeline_ggrad_bn_back_apply_f32;
    ggml_pipeline_request_descriptor_sets(ctx, pipeline, 1);
    vk_subbuffer o_buf = ggml_vk_tensor_subbuffer(ctx, dst, true);
    vk_subbuffer b[6];
    uint32_t off[6];
    ggml_vk_ggrad_sources(ctx, dst, 6, b, off);
    const ggrad_bn_dims d = ggrad_bn_dims_of(dst);
    const uint32_t P = (uint32_t) ggrad_bn_parts_of(dst);
    struct { uint32_t S, C, N, P, chunk; float eps; uint32_t has_w, off0, off1, off2, off3, off4, off5, off_d; } pc = {
        (uint32_t) d.S, (uint32_t) d.C, (uint32_t) d.N, P, (uint32_t) ((d.S*d.N + P - 1)/P), d.eps,
        dst->src[4] != nullptr, off[0], off[1], off[2], off[3], off[4], off[5], ggml_vk_ggrad_misalign(o_buf, dst),
    };
    const std::array<uint32_t, 3> elements = kernel == 27 ? ggml_vk_ggrad_elements((uint32_t) d.C)
                                                          : ggml_vk_ggrad_rows((uint32_t) (d.C*P));
    ggml_vk_dispatch_pipeline(ctx, subctx, pipeline, { b[0], b[1], b[2], b[3], b[4], o_buf, b[5] }, pc, elements);
}

// torch's max pooling and its gradient (ggrad_pool.comp): an invocation per output, or per
// input element (the gradient gathered)
static void ggml_vk_ggrad_pool(ggml_backend_vk_context * ctx, vk_context& subctx, ggml_tensor * dst, bool back) {
    const ggml_tensor * x = dst->src[back ? 1 : 0];
    const ggml_tensor * g = back ? dst->src[0] : x;
    vk_pipeline pipeline = back ? ctx->device->pipeline_ggrad_pool_back_f32 : ctx->device->pipeline_ggrad_pool_f32;
    ggml_pipeline_request_descriptor_sets(ctx, pipeline, 1);
    vk_subbuffer x_buf = ggml_vk_tensor_subbuffer(ctx, x, true);
    vk_subbuffer g_buf = ggml_vk_tensor_subbuffer(ctx, g, true);
    vk_subbuffer o_buf = ggml_vk_tensor_subbuffer(ctx, dst, true);
    const ggrad_pool_geometry geo = ggrad_pool_geometry_of(dst, x);
    struct { int32_t kw, kh, sw, sh, pw, ph, dw, dh, ow, oh, w, h; uint32_t planes, x_off, g_off, d_off; } pc = {
        geo.kw, geo.kh, geo.sw, geo.sh, geo.pw, geo.ph, geo.dw, geo.dh, geo.ow, geo.oh, (int32_t) geo.w, (int32_t) geo.h,
        (uint32_t) geo.planes, ggml_vk_ggrad_misalign(x_buf, x), ggml_vk_ggrad_misalign(g_buf, g),
        ggml_vk_ggrad_misalign(o_buf, dst),
    };
    const uint32_t n = (uint32_t) ggml_nelements(dst);
    const std::array<uint32_t, 3> elements = ggml_vk_ggrad_elements(n);
    ggml_vk_dispatch_pipeline(ctx, subctx, pipeline, { x_buf, g_buf, o_buf }, pc, elements);
}

// a running statistic moved toward the batch's (ggrad_running.comp): an invocation per channel
static void ggml_vk_ggrad_running_stat(ggml_backend_vk_context * ctx, vk_context& subctx, ggml_tensor * dst) {
    const ggml_tensor * running = dst->src[0];
    const ggml_tensor * stats = dst->src[1];
    const ggml_tensor * counter = dst->src[2];  // optional: counted up by one (set 47)
    vk_pipeline pipeline = ctx->device->pipeline_ggrad_running_f32;
    ggml_pipeline_request_descriptor_sets(ctx, pipeline, 1);
    vk_subbuffer r_buf = ggml_vk_tensor_subbuffer(ctx, running, true);
    vk_subbuffer s_buf = ggml_vk_tensor_subbuffer(ctx, stats, true);
    vk_subbuffer o_buf = ggml_vk_tensor_subbuffer(ctx, dst, true);
    vk_subbuffer c_buf = counter != nullptr ? ggml_vk_tensor_subbuffer(ctx, counter, true) : r_buf;  // unread without one
    const ggrad_running_stat r = ggrad_running_stat_of(dst);
    const uint32_t n = (uint32_t) ggml_nelements(dst);
    struct { uint32_t n, offset; float keep, take; uint32_t r_off, s_off, d_off, count, c_off; } pc = {
        n, (uint32_t) r.offset, r.keep, r.take, ggml_vk_ggrad_misalign(r_buf, running),
        ggml_vk_ggrad_misalign(s_buf, stats), ggml_vk_ggrad_misalign(o_buf, dst), counter != nullptr ? 1u : 0u,
        counter != nullptr ? ggml_vk_ggrad_misalign(c_buf, counter) : 0u,
    };
    const std::array<uint32_t, 3> elements = ggml_vk_ggrad_elements(n);
    ggml_vk_dispatch_pipeline(ctx, subctx, pipeline, { r_buf, s_buf, o_buf, c_buf }, pc, elements);
}

// the window fold (ggrad_fold.comp): an invocation per image element
static void ggml_vk_ggrad_fold(ggml_backend_vk_context * ctx, vk_context& subctx, ggml_tensor * dst) {
    const ggml_tensor * cols = dst->src[0];
    vk_pipeline pipeline = ctx->device->pipeline_ggrad_fold_f32;
    ggml_pipeline_request_descriptor_sets(ctx, pipeline, 1);
    vk_subbuffer c_buf = ggml_vk_tensor_subbuffer(ctx, cols, true);
    vk_subbuffer o_buf = ggml_vk_tensor_subbuffer(ctx, dst, true);
    const ggrad_fold_geometry g = ggrad_fold_geometry_of(dst);
    struct { int32_t kh, kw, sh, sw, ph, pw, dh, dw, w, h, c, ow, oh; uint32_t n, cols_off, d_off; } pc = {
        g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, (int32_t) g.w, (int32_t) g.h, (int32_t) g.c, (int32_t) g.ow,
        (int32_t) g.oh, (uint32_t) g.n, ggml_vk_ggrad_misalign(c_buf, cols), ggml_vk_ggrad_misalign(o_buf, dst),
    };
    const uint32_t n = (uint32_t) ggml_nelements(dst);
    const std::array<uint32_t, 3> elements = ggml_vk_ggrad_elements(n);
    ggml_vk_dispatch_pipeline(ctx, subctx, pipeline, { c_buf, o_buf }, pc, elements);
}

// a quantized product's gradient g @ W (ggrad_qmatmul_back.comp, as the CPU's and CUDA's
// kernel 17): W read in its blocks by its type's pipeline
static void ggml_vk_ggrad_qmatmul_back(ggml_backend_vk_context * ctx, vk_context& subctx, ggml_tensor * dst) {
    const ggml_tensor * w = dst->src[0];
    const ggml_tensor * g = dst->src[1];
    vk_pipeline pipeline = ctx->device->pipeline_ggrad_qmatmul_back[w->type];
    ggml_pipeline_request_descriptor_sets(ctx, pipeline, 1);
    vk_subbuffer w_buf = ggml_vk_tensor_subbuffer(ctx, w, false);
    vk_subbuffer g_buf = ggml_vk_tensor_subbuffer(ctx, g, true);
    vk_subbuffer o_buf = ggml_vk_tensor_subbuffer(ctx, dst, true);
    const uint32_t n_in = (uint32_t) w->ne[0], T = (uint32_t) g->ne[1];
    const std::array<uint32_t, 7> pc = {
        n_in, (uint32_t) w->ne[1], T, (uint32_t) (w->nb[1]/ggml_type_size(w->type)), (uint32_t) (g->nb[1]/sizeof(float)),
        ggml_vk_ggrad_misalign(g_buf, g), ggml_vk_ggrad_misalign(o_buf, dst),
    };
    ggml_vk_dispatch_pipeline(ctx, subctx, pipeline, { w_buf, g_buf, o_buf }, pc, { CEIL_DIV(n_in, 512), CEIL_DIV(T, 16), 1 });
}

// a float32 product (ggrad_gemm.comp, as the CPU's and CUDA's kernel 6): a workgroup per tile
// of C (64x64, or ggrad_gemm_wide.comp's where op_params[4] asks) and per batch
static void ggml_vk_ggrad_gemm(ggml_backend_vk_context * ctx, vk_context& subctx, ggml_tensor * dst) {
    ggrad_gemm_shape s;
    GGML_ASSERT(ggrad_gemm_plan(dst, &s));
    const ggml_tensor * A = dst->src[0];
    const ggml_tensor * B = dst->src[1];
    const ggml_tensor * bias = dst->src[2];
    // op_params[4]: the tile (0: 64x64; 1: 128x128, 2: 128 rows x 64 columns, 3: 64 x 128)
    const int tile = ggml_get_op_params_i32(dst, 4);
    const uint32_t tm = tile == 1 || tile == 2 ? 128 : 64, tn = tile == 1 || tile == 3 ? 128 : 64;
    vk_pipeline pipeline = tile >= 1 && tile <= 3 ? ctx->device->pipeline_ggrad_gemm_wide_f32[tile - 1]
                                                  : ctx->device->pipeline_ggrad_gemm_f32;
    ggml_pipeline_request_descriptor_sets(ctx, pipeline, 1);
    const auto misalign = ggml_vk_ggrad_misalign;
    vk_subbuffer a_buf = ggml_vk_tensor_subbuffer(ctx, A, true);
    vk_subbuffer b_buf = ggml_vk_tensor_subbuffer(ctx, B, true);
    vk_subbuffer bias_buf = bias ? ggml_vk_tensor_subbuffer(ctx, bias, true) : a_buf;  // unread without one
    vk_subbuffer o_buf = ggml_vk_tensor_subbuffer(ctx, dst, true);
    const uint32_t f = sizeof(float);
    const std::array<uint32_t, 19> pc = {
        (uint32_t) s.M, (uint32_t) s.N, (uint32_t) s.K, (uint32_t) s.a.ld, (uint32_t) s.b.ld,
        (s.ta ? 1u : 0u) | (s.tb ? 2u : 0u) | (bias ? 4u : 0u), (uint32_t) s.b2,
        (uint32_t) s.a_r2, (uint32_t) s.a_r3, (uint32_t) s.b_r2, (uint32_t) s.b_r3,
        (uint32_t) (A->nb[2]/f), (uint32_t) (A->nb[3]/f), (uint32_t) (B->nb[2]/f), (uint32_t) (B->nb[3]/f),
        misalign(a_buf, A), misalign(b_buf, B), misalign(o_buf, dst), bias ? misalign(bias_buf, bias) : 0u,
    };
    ggml_vk_dispatch_pipeline(ctx, subctx, pipeline, { a_buf, b_buf, bias_buf, o_buf }, pc,
                              { (uint32_t) CEIL_DIV(s.N, tn), (uint32_t) CEIL_DIV(s.M, tm), (uint32_t) (s.b2*s.b3) });
}

// Adam over one or two parameters (ggrad_adamw_group.comp): an invocation per element of
// both, p, m and v written in place (ggml_vk_build_graph syncs around those writes too)
static void ggml_vk_ggrad_adamw_group(ggml_backend_vk_context * ctx, vk_context& subctx, ggml_tensor * dst) {
    vk_pipeline pipeline = ctx->device->pipeline_ggrad_adamw_group_f32;
    ggml_pipeline_request_descriptor_sets(ctx, pipeline, 1);
    const bool two = ggml_get_op_params_i32(dst, 1) > 1;
    vk_subbuffer b[9];
    uint32_t off[9];
    ggml_vk_ggrad_sources(ctx, dst, 9, b, off);  // one parameter: the second's bindings hold the constants, unread
    const uint32_t n1 = (uint32_t) ggml_nelements(dst->src[1]), n2 = two ? (uint32_t) ggml_nelements(dst->src[5]) : 0u;
    const std::array<uint32_t, 11> pc = { n1, n2, off[0], off[1], off[2], off[3], off[4], off[5], off[6], off[7], off[8] };
    ggml_vk_dispatch_pipeline(ctx, subctx, pipeline, { b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8] }, pc,
                              ggml_vk_ggrad_elements(n1 + n2));
}

// the sources a node writes in place besides its own memory: ADAMW_GROUP's p, m and v;
// RUNNING_STAT's counter (set 47); the in-place ADAM_HYPER's bias corrections (set 55)
static bool ggml_vk_ggrad_writes_source(const ggml_tensor * node, int j) {
    if (node->op != GGML_OP_GGRAD) {
        return false;
    }
    const int kernel = ggml_get_op_params_i32(node, 0);
    return (kernel == 9 && j >= 1 && (j - 1) % 4 != 1) || (kernel == 25 && j == 2) ||
           (kernel == 3 && j == 1 && ggrad_adam_hyper_first(node) == 1);
}

static void ggml_vk_ggrad(ggml_backend_vk_context * ctx, vk_context& subctx, ggml_tensor * dst) {
    const int kernel = ggml_get_op_params_i32(dst, 0);
    switch (kernel) {
        case 3:  ggml_vk_ggrad_adam_hyper(ctx, subctx, dst); return;
        case 32: ggml_vk_ggrad_class_total(ctx, subctx, dst); return;
        case 4:  ggml_vk_ggrad_layer_norm_back(ctx, subctx, dst); return;
        case 6:  ggml_vk_ggrad_gemm(ctx, subctx, dst); return;
        case 9:  ggml_vk_ggrad_adamw_group(ctx, subctx, dst); return;
        case 10: case 11: ggml_vk_ggrad_pool(ctx, subctx, dst, kernel == 11); return;
        case 17: ggml_vk_ggrad_qmatmul_back(ctx, subctx, dst); return;
        case 18: case 19: ggml_vk_ggrad_cell(ctx, subctx, dst, kernel == 19); return;
        case 20: case 21: case 22: ggml_vk_ggrad_bn(ctx, subctx, dst, kernel); return;
        case 23: ggml_vk_ggrad_fold(ctx, subctx, dst); return;
        case 25: ggml_vk_ggrad_running_stat(ctx, subctx, dst); return;
        case 26: case 27: case 28: case 29: ggml_vk_ggrad_bn_split(ctx, subctx, dst, kernel); return;
        default: break;  // 1 and 2, the cross-entropy kernels: below
    }
    const bool back = kernel == 2;
    const ggml_tensor * x = dst->src[0];
    const ggml_tensor * t = dst->src[1];
    const ggml_tensor * d = back ? dst->src[2] : nullptr;
    const ggml_tensor * w = dst->src[back ? 3 : 2];
    vk_pipeline pipeline = back ? ctx->device->pipeline_ggrad_ce_back_f32 : ctx->device->pipeline_ggrad_ce_f32;
    ggml_pipeline_request_descriptor_sets(ctx, pipeline, 1);
    const auto misalign = ggml_vk_ggrad_misalign;
    vk_subbuffer x_buf = ggml_vk_tensor_subbuffer(ctx, x, true);
    vk_subbuffer t_buf = ggml_vk_tensor_subbuffer(ctx, t, true);
    vk_subbuffer d_buf = d ? ggml_vk_tensor_subbuffer(ctx, d, true) : x_buf;
    vk_subbuffer w_buf = w ? ggml_vk_tensor_subbuffer(ctx, w, true) : x_buf;
    vk_subbuffer o_buf = ggml_vk_tensor_subbuffer(ctx, dst, true);
    const uint32_t N = (uint32_t) ggml_nrows(x);
    const vk_op_ggrad_push_constants pc = {
        (uint32_t) x->ne[0], N,
        (uint32_t) (x->nb[1] / sizeof(float)), (uint32_t) (t->nb[0] / sizeof(int32_t)),
        d ? (uint32_t) (d->nb[0] / sizeof(float)) : 0u, (uint32_t) (dst->nb[1] / sizeof(float)),
        misalign(x_buf, x), misalign(t_buf, t), d ? misalign(d_buf, d) : 0u, w ? misalign(w_buf, w) : 0u,
        misalign(o_buf, dst),
        ggml_get_op_params_i32(dst, 1), ggml_get_op_params_f32(dst, 2), ggml_get_op_params_f32(dst, 3),
        w ? 1u : 0u,
    };
    const std::array<uint32_t, 3> elements = ggml_vk_ggrad_rows(N);
    if (back) {
        ggml_vk_dispatch_pipeline(ctx, subctx, pipeline, { x_buf, t_buf, d_buf, w_buf, o_buf }, pc, elements);
    } else {
        ggml_vk_dispatch_pipeline(ctx, subctx, pipeline, { x_buf, t_buf, w_buf, o_buf }, pc, elements);
    }
}
"""


def _patch_file(path: Path, edits: list[tuple[str, str]], mark: str = MARK) -> None:
    """`edits` once: a file that already holds `mark` is left as it is."""
    _patch_with_mark(path, edits, mark)


# modes of SILU_BACK, shared with ggrad/functional/elementwise.py
RELU_BACK, LEAKY_RELU_BACK = 1, 2

# the block types of Vulkan's quantized backward (ggrad_qmatmul_back.comp, a shader each):
# those ggrad loads (ggrad/runtime/quants.py)
QMATMUL_BACK_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k")
QMATMUL_BACK_TEST = " || ".join(f'tname == "{name}"' for name in QMATMUL_BACK_TYPES)

# the kernels' sources, copied into ggml's tree
SOURCES = Path(__file__).parent / "ggml_kernels"

GGRAD_OP_C = """/* """ + MARK + """: GGML_OP_GGRAD, ggrad's own kernels; op_params[0] names the kernel
   (scripts/ggml_kernels/ggrad_cpu.inc says what each computes), the caller sets the rest */
__attribute__((visibility("default"))) struct ggml_tensor * ggml_ggrad(
        struct ggml_context * ctx, int32_t kernel, enum ggml_type type, int64_t ne0, int64_t ne1,
        struct ggml_tensor * a, struct ggml_tensor * b, struct ggml_tensor * c, struct ggml_tensor * d);
struct ggml_tensor * ggml_ggrad(
        struct ggml_context * ctx, int32_t kernel, enum ggml_type type, int64_t ne0, int64_t ne1,
        struct ggml_tensor * a, struct ggml_tensor * b, struct ggml_tensor * c, struct ggml_tensor * d) {
    struct ggml_tensor * result = ggml_new_tensor_2d(ctx, type, ne0, ne1);
    ggml_set_op_params_i32(result, 0, kernel);
    result->op     = GGML_OP_GGRAD;
    result->src[0] = a;
    result->src[1] = b;
    result->src[2] = c;
    result->src[3] = d;
    return result;
}

"""


VULKAN_REPEAT_BACK_LANES = """/* """ + MARK + """: threads per output of REPEAT_BACK (ggrad_repeat_back.comp):
   more where each output sums more repeats, fewer where the dispatch would pass 2^32 threads */
static uint32_t ggrad_repeat_back_lanes(const ggml_tensor * src0, const ggml_tensor * dst) {
    const int64_t outer = ggml_nelements(src0) / ggml_nelements(dst) / (src0->ne[0] / dst->ne[0]);
    uint32_t lanes = outer >= 2048 ? 64 : outer >= 64 ? 16 : outer >= 8 ? 4 : 1;
    while (lanes > 1 && CEIL_DIV(ggml_nelements(dst), 512 / lanes) * 512 > (int64_t) UINT32_MAX - 512) {
        lanes /= 4;
    }
    return lanes;
}

"""


def _replace_all(path: Path, old: str, new: str, count: int) -> None:
    """Replace `old`, which must occur `count` times (a table's size asserted twice)."""
    text = path.read_text()
    if text.count(new) == count:
        return
    if text.count(old) != count:
        raise SystemExit(f"{path.name}: expected {count} of {old!r}, found {text.count(old)}")
    path.write_text(text.replace(old, new))

# set 43: contiguous casts between float32 and float16/bfloat16, four values a thread through
# vector loads and stores, each value converted by ggml's own ggml_cuda_cast (the same bits as
# its one-value-a-thread kernel, whose blocks of 64 moved an H100's autocast casts at ~0.5 TB/s:
# 22 casts, 1.63 ms of the bf16 block's 7.5). A node asks with op_params[0] = 1 (ggml's CPY
# leaves it 0), as ops.as_type does where kernels.variant trusts "cast_x4".
CUDA_CAST_X4 = """/* """ + MARK + """: contiguous casts, four values a thread */
#include <type_traits>

/* set 52: with relu (op_params[2] = 1, float32 sources only) each value is torch's relu of it,
   x < 0 ? 0 : x (NaN and -0 kept, as ggrad's RELU), before it is converted: the cast of relu's
   output without that output written */
template <bool relu, typename src_t>
static __device__ __forceinline__ src_t ggrad_relu_if(const src_t x) {
    if constexpr (relu) {
        return x < 0.0f ? 0.0f : x;
    } else {
        return x;
    }
}

template <typename src_t, typename dst_t, bool relu>
static __global__ void ggrad_cpy_contiguous_x4(const src_t * __restrict__ x, dst_t * __restrict__ dst, const int64_t ne) {
    struct alignas(4*sizeof(src_t)) src4 { src_t v[4]; };
    struct alignas(4*sizeof(dst_t)) dst4 { dst_t v[4]; };
    const int64_t i = 4*((int64_t) blockDim.x*blockIdx.x + threadIdx.x);
    if (i + 4 <= ne) {
        const src4 a = *(const src4 *) (x + i);
        dst4 b;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            b.v[k] = ggml_cuda_cast<dst_t>(ggrad_relu_if<relu>(a.v[k]));
        }
        *(dst4 *) (dst + i) = b;
    } else {
        for (int64_t k = i; k < ne; ++k) {
            dst[k] = ggml_cuda_cast<dst_t>(ggrad_relu_if<relu>(x[k]));
        }
    }
}

/* relu and a cast, a value a thread: either end not at a 4-value vector's address */
template <typename dst_t>
static __global__ void ggrad_cpy_relu_scalar(const float * __restrict__ x, dst_t * __restrict__ dst, const int64_t ne) {
    const int64_t i = (int64_t) blockDim.x*blockIdx.x + threadIdx.x;
    if (i < ne) {
        dst[i] = ggml_cuda_cast<dst_t>(ggrad_relu_if<true>(x[i]));
    }
}

/* ggml's one-value-a-thread kernel unless asked and both ends take 4-value vectors; relu
   (float32 to float16 or bfloat16 only: supports_op) in ggrad's kernels either way */
template <typename src_t, typename dst_t>
static void ggrad_cpy_contiguous_cuda(const char * cx, char * cdst, const int64_t ne, cudaStream_t stream,
                                      const bool vectorized, const bool relu) {
    const bool x4 = vectorized && (uintptr_t) cx % (4*sizeof(src_t)) == 0 && (uintptr_t) cdst % (4*sizeof(dst_t)) == 0;
    const int64_t blocks = x4 ? ((ne + 3)/4 + 255)/256 : (ne + 255)/256;
    GGML_ASSERT(blocks <= INT_MAX);
    if constexpr (std::is_same<src_t, float>::value && !std::is_same<dst_t, float>::value) {
        if (relu) {
            if (x4) {
                ggrad_cpy_contiguous_x4<float, dst_t, true><<<(unsigned int) blocks, 256, 0, stream>>>(
                    (const float *) cx, (dst_t *) cdst, ne);
            } else {
                ggrad_cpy_relu_scalar<dst_t><<<(unsigned int) blocks, 256, 0, stream>>>((const float *) cx, (dst_t *) cdst, ne);
            }
            CUDA_CHECK(cudaGetLastError());
            return;
        }
    }
    GGML_ASSERT(!relu);
    if (!x4) {
        ggml_cpy_scalar_contiguous_cuda<src_t, dst_t>(cx, cdst, ne, stream);
        return;
    }
    ggrad_cpy_contiguous_x4<src_t, dst_t, false><<<(unsigned int) blocks, 256, 0, stream>>>((const src_t *) cx, (dst_t *) cdst, ne);
    CUDA_CHECK(cudaGetLastError());
}

/* set 45: a copy between views whose rows are contiguous (attention's heads, the thirds of a
   fused projection), a warp a row: each row's place is found once (ggml's kernel gives a
   thread one value, its place from eight 64-bit divisions, in blocks of 64 threads) */
template <typename src_t, typename dst_t>
static __global__ void ggrad_cpy_rows(const char * __restrict__ cx, char * __restrict__ cdst, const int64_t rows,
                                      const int64_t ne00, const int64_t ne01, const int64_t ne02, const int64_t nb01,
                                      const int64_t nb02, const int64_t nb03, const int64_t ne11, const int64_t ne12,
                                      const int64_t nb11, const int64_t nb12, const int64_t nb13) {
    const int64_t row = (int64_t) blockIdx.x*blockDim.y + threadIdx.y;
    if (row >= rows) {
        return;
    }
    const src_t * x = (const src_t *) (cx + (row % ne01)*nb01 + (row/ne01 % ne02)*nb02 + row/(ne01*ne02)*nb03);
    dst_t * y = (dst_t *) (cdst + (row % ne11)*nb11 + (row/ne11 % ne12)*nb12 + row/(ne11*ne12)*nb13);
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < ne00; i += 32) {
        y[i] = ggml_cuda_cast<dst_t>(x[i]);
    }
}

template <typename src_t, typename dst_t>
static void ggrad_cpy_rows_cuda(const ggml_tensor * src0, ggml_tensor * src1, cudaStream_t stream) {
    const int64_t rows = ggml_nrows(src0), blocks = (rows + 7)/8;
    GGML_ASSERT(blocks <= INT_MAX);
    ggrad_cpy_rows<src_t, dst_t><<<(unsigned int) blocks, dim3(32, 8), 0, stream>>>(
        (const char *) src0->data, (char *) src1->data, rows, src0->ne[0], src0->ne[1], src0->ne[2], src0->nb[1],
        src0->nb[2], src0->nb[3], src1->ne[1], src1->ne[2], src1->nb[1], src1->nb[2], src1->nb[3]);
    CUDA_CHECK(cudaGetLastError());
}

/* whether the rows kernel took the copy: rows of at least a warp's values, contiguous at both
   ends and of one length, between float32, float16 and bfloat16 */
static bool ggrad_cpy_by_rows(const ggml_tensor * src0, ggml_tensor * src1, cudaStream_t stream) {
    if (src0->ne[0] != src1->ne[0] || src0->ne[0] < 32 || src0->nb[0] != ggml_type_size(src0->type) ||
            src1->nb[0] != ggml_type_size(src1->type)) {
        return false;
    }
    const ggml_type a = src0->type, b = src1->type;
    if (a == GGML_TYPE_F32 && b == GGML_TYPE_F32) {
        ggrad_cpy_rows_cuda<float, float>(src0, src1, stream);
    } else if (a == GGML_TYPE_F32 && b == GGML_TYPE_BF16) {
        ggrad_cpy_rows_cuda<float, nv_bfloat16>(src0, src1, stream);
    } else if (a == GGML_TYPE_F32 && b == GGML_TYPE_F16) {
        ggrad_cpy_rows_cuda<float, half>(src0, src1, stream);
    } else if (a == GGML_TYPE_BF16 && b == GGML_TYPE_BF16) {
        ggrad_cpy_rows_cuda<nv_bfloat16, nv_bfloat16>(src0, src1, stream);
    } else if (a == GGML_TYPE_F16 && b == GGML_TYPE_F16) {
        ggrad_cpy_rows_cuda<half, half>(src0, src1, stream);
    } else if (a == GGML_TYPE_BF16 && b == GGML_TYPE_F32) {
        ggrad_cpy_rows_cuda<nv_bfloat16, float>(src0, src1, stream);
    } else if (a == GGML_TYPE_F16 && b == GGML_TYPE_F32) {
        ggrad_cpy_rows_cuda<half, float>(src0, src1, stream);
    } else {
        return false;
    }
    return true;
}

void ggml_cuda_cpy(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, ggml_tensor * src1, bool vectorized,
                   bool rows, bool relu) {
"""


# set 44: IM2COL on CUDA with a block per output row (image, row) and chunk of channels: the
# input rows its windows read are staged in shared memory (loads along a row), then the
# columns are written along C*KH*KW (stores along the row of the output). ggml's kernel
# gives a thread one value, loaded from a scattered address, after three 64-bit divisions,
# with blocks of 256 threads over C*KH*KW (576 values: a quarter of the third block idle);
# an H100's ResNet-18 step spent 5.7 ms of 24.5 in its 20 calls (~0.4 TB/s). Pure data
# movement: the same bits. A node asks with op_params[7] = 1 (ggml's im2col sets 0-6), as
# conv.py does where kernels.variant trusts "im2col_rows"; a geometry whose rows do not fit
# in shared memory keeps ggml's kernel. Set 47 (op_params[8] = 1, variant im2col_x4): each
# thread writes four consecutive values of a column with one store (8 bytes of bfloat16, 16 of
# float32) where a chunk's column entries come in fours; the bf16 ResNet-18's 33 IM2COL calls
# took 2.4 ms on an H100 (~0.8 TB/s of columns written), a value a store.
CUDA_IM2COL_ROWS = """/* """ + MARK + """: im2col a block per output row */
#define GGRAD_IM2COL_TILE_FLOATS (48*1024/4)
template <typename T>
struct alignas(4*sizeof(T)) ggrad_quad {
    T v[4];
};

template <typename T>
static __global__ void ggrad_im2col_rows(const float * __restrict__ x, T * __restrict__ dst, const bool quads,
        const int IW, const int IH, const int OW, const int OH, const int KH, const int IC, const int K,
        const int64_t chan_stride, const int64_t batch_stride, const int chunk, const int width,
        const uint3 div_width, const uint3 div_kh, const uint3 div_kw, const uint3 div_per, const uint3 div_per_last,
        const int s0, const int s1, const int p0, const int p1, const int d0, const int d1) {
    extern __shared__ float ggrad_rows[];  // [channel of the chunk][kh][input column, from -p0]
    const int row = blockIdx.x, n = row / OH, oh = row - n*OH;
    const int c0 = blockIdx.y*chunk, cc = min(chunk, IC - c0);
    const float * xn = x + n*batch_stride + c0*chan_stride;
    for (int t = threadIdx.x; t < cc*KH*width; t += blockDim.x) {
        const uint2 q = fast_div_modulo(t, div_width);   // (c*KH + kh, input column)
        const uint2 r = fast_div_modulo(q.x, div_kh);    // (c, kh)
        const int ih = oh*s1 + (int) r.y*d1 - p1, iw = (int) q.y - p0;
        ggrad_rows[t] = ih >= 0 && ih < IH && iw >= 0 && iw < IW ? xn[r.x*chan_stride + (int64_t) ih*IW + iw] : 0.0f;
    }
    __syncthreads();
    const uint3 per = blockIdx.y + 1 == gridDim.y ? div_per_last : div_per;  // cc*KH*KW values per output column
    T * out = dst + (int64_t) row*OW*K + (int64_t) c0*(K/IC);
    if (quads) {  /* per.z, K and out's alignment in fours: the caller checks */
        for (int t = threadIdx.x; t < OW*(int) per.z/4; t += blockDim.x) {
            const uint2 q = fast_div_modulo(4*t, per);   // (ow, the first of four entries)
            uint2 a = fast_div_modulo(q.y, div_kw);      // (c*KH + kh, kw), then stepped
            ggrad_quad<T> four;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                four.v[i] = ggrad_rows[a.x*width + q.x*s0 + a.y*d0];  /* converted as below */
                if (++a.y == (unsigned int) div_kw.z) {
                    a.y = 0;
                    ++a.x;
                }
            }
            *(ggrad_quad<T> *) (out + (int64_t) q.x*K + q.y) = four;
        }
        return;
    }
    for (int t = threadIdx.x; t < OW*(int) per.z; t += blockDim.x) {
        const uint2 q = fast_div_modulo(t, per);         // (ow, (c*KH + kh)*KW + kw)
        const uint2 a = fast_div_modulo(q.y, div_kw);    // (c*KH + kh, kw)
        out[(int64_t) q.x*K + q.y] = ggrad_rows[a.x*width + q.x*s0 + a.y*d0];  /* converted as ggml's kernel does */
    }
}

/* false where ggml's kernel is left to do it: rows past shared memory, sizes past 32 bits */
template <typename T>
static bool ggrad_im2col_rows_cuda(const float * x, T * dst, int64_t IW, int64_t IH, int64_t OW, int64_t OH,
        int64_t KW, int64_t KH, int64_t IC, int64_t N, int64_t chan_stride, int64_t batch_stride,
        int s0, int s1, int p0, int p1, int d0, int d1, bool quads, cudaStream_t stream) {
    const int64_t width = (OW - 1)*s0 + (KW - 1)*d0 + 1, K = IC*KH*KW;
    const int64_t chunk = std::min<int64_t>(IC, GGRAD_IM2COL_TILE_FLOATS / std::max<int64_t>(1, KH*width));
    if (chunk < 1 || N*OH > INT_MAX || OW*K > INT_MAX - 1024 || IW*IH > INT_MAX || (IC + chunk - 1)/chunk > 65535 ||
        s0 < 1 || d0 < 1) {  /* 32-bit loop counters and rows */
        return false;
    }
    const int64_t chunks = (IC + chunk - 1)/chunk, last = IC - (chunks - 1)*chunk;
    quads = quads && K % 4 == 0 && (chunk*KH*KW) % 4 == 0 && (last*KH*KW) % 4 == 0 && (uintptr_t) dst % (4*sizeof(T)) == 0;
    const dim3 grid((unsigned int) (N*OH), (unsigned int) chunks);
    ggrad_im2col_rows<T><<<grid, 256, chunk*KH*width*sizeof(float), stream>>>(x, dst, quads, (int) IW, (int) IH, (int) OW,
        (int) OH, (int) KH, (int) IC, (int) K, chan_stride, batch_stride, (int) chunk, (int) width,
        init_fastdiv_values(width), init_fastdiv_values(KH), init_fastdiv_values(KW), init_fastdiv_values(chunk*KH*KW),
        init_fastdiv_values(last*KH*KW), s0, s1, p0, p1, d0, d1);
    CUDA_CHECK(cudaGetLastError());
    return true;
}

void ggml_cuda_op_im2col(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
"""

# set 50: SOFT_MAX a warp a row where op_params[2] = 1 asks (ggml's softmax sets slots 0-1):
# ggml's kernel gives a row a block of up to 1024 threads, one value a thread, and reduces
# twice through shared memory; an H100 ran the bf16 block's 65536 rows of 256 at ~1 TB/s
# (0.131 ms). Here the row stays in registers and both reductions are warp shuffles. The same
# arithmetic (x*scale + mask, expf of the difference from the row's max, times 1/sum); the
# max and the sum taken in another order. Rows of at most 1024, no ALiBi, no sinks.
CUDA_SOFT_MAX_ROWS = """/* """ + MARK + """: softmax a warp a row */
struct ggrad_soft_max_rows_shape {
    int ncols;
    int64_t nrows, ne01, ne02, ne12, ne13, nb11, nb12, nb13;
    float scale;
};

template <int per_lane, typename T>
static __global__ void ggrad_soft_max_rows(const float * x, const T * mask, float * dst,  /* x may be dst (in place) */
                                           const ggrad_soft_max_rows_shape s) {
    const int64_t row = (int64_t) blockIdx.x*blockDim.y + threadIdx.y;
    if (row >= s.nrows) {
        return;
    }
    const int lane = threadIdx.x;
    const int64_t i01 = row % s.ne01, i02 = (row/s.ne01) % s.ne02, i03 = row/(s.ne01*s.ne02);
    const T * m = mask == nullptr ? nullptr
        : (const T *) ((const char *) mask + i01*s.nb11 + (i02 % s.ne12)*s.nb12 + (i03 % s.ne13)*s.nb13);
    x += row*s.ncols;
    dst += row*s.ncols;
    float v[per_lane];
    float top = -INFINITY;
#pragma unroll
    for (int i = 0; i < per_lane; ++i) {
        const int col = lane + i*WARP_SIZE;
        v[i] = col < s.ncols ? x[col]*s.scale + (m ? t2f32(m[col]) : 0.0f) : -INFINITY;
        top = max(top, v[i]);
    }
    top = warp_reduce_max(top);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < per_lane; ++i) {
        if (lane + i*WARP_SIZE < s.ncols) {
            v[i] = expf(v[i] - top);
            sum += v[i];
        }
    }
    sum = warp_reduce_sum(sum);
    const float inv_sum = 1.0f / sum;
#pragma unroll
    for (int i = 0; i < per_lane; ++i) {
        const int col = lane + i*WARP_SIZE;
        if (col < s.ncols) {
            dst[col] = v[i] * inv_sum;
        }
    }
}

template <int per_lane, typename T>
static void ggrad_soft_max_rows_cuda(const float * x, const T * mask, float * dst, const ggrad_soft_max_rows_shape & s,
                                     cudaStream_t stream) {
    const dim3 threads(WARP_SIZE, 4, 1);
    ggrad_soft_max_rows<per_lane, T><<<(unsigned int) ((s.nrows + 3)/4), threads, 0, stream>>>(x, mask, dst, s);
    CUDA_CHECK(cudaGetLastError());
}

/* false where the row is longer than 1024 (ggml's kernel then runs) */
template <typename T>
static bool ggrad_soft_max_by_rows(const float * x, const T * mask, float * dst, const ggrad_soft_max_rows_shape & s,
                                   cudaStream_t stream) {
    const int lanes = (s.ncols + WARP_SIZE - 1)/WARP_SIZE;
    if (lanes <= 1) {
        ggrad_soft_max_rows_cuda<1>(x, mask, dst, s, stream);
    } else if (lanes <= 2) {
        ggrad_soft_max_rows_cuda<2>(x, mask, dst, s, stream);
    } else if (lanes <= 4) {
        ggrad_soft_max_rows_cuda<4>(x, mask, dst, s, stream);
    } else if (lanes <= 8) {
        ggrad_soft_max_rows_cuda<8>(x, mask, dst, s, stream);
    } else if (lanes <= 16) {
        ggrad_soft_max_rows_cuda<16>(x, mask, dst, s, stream);
    } else if (lanes <= 32) {
        ggrad_soft_max_rows_cuda<32>(x, mask, dst, s, stream);
    } else {
        return false;
    }
    return true;
}

void ggml_cuda_op_soft_max(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
"""

# set 50: a float32 unary op (RELU asks, op_params[1] = 1: ggml_unary sets slot 0) four values
# a thread, one 16-byte load and store each: ggml's kernel gives a thread one value (an H100 ran
# the bf16 block's relu over 16.7M values at ~1.7 TB/s, 0.080 ms). The same op on each value.
CUDA_UNARY_X4 = """/* """ + MARK + """: unary ops four values a thread */
template <float (*op)(float)>
static __global__ void ggrad_unary_x4_f32(const float4 * x, float4 * dst, const int64_t n4) {  /* x may be dst */
    const int64_t i = (int64_t) blockDim.x*blockIdx.x + threadIdx.x;
    if (i < n4) {
        float4 v = x[i];
        v.x = op(v.x);
        v.y = op(v.y);
        v.z = op(v.z);
        v.w = op(v.w);
        dst[i] = v;
    }
}

/* false where the values are not whole float4s at 16-byte aligned addresses (ggml's kernel then runs) */
template <float (*op)(float)>
static bool ggrad_unary_x4(const float * x, float * dst, const int64_t n, cudaStream_t stream) {
    const int64_t blocks = (n/4 + 255)/256;
    if (n % 4 != 0 || (uintptr_t) x % 16 != 0 || (uintptr_t) dst % 16 != 0 || blocks > INT_MAX) {
        return false;
    }
    ggrad_unary_x4_f32<op><<<(unsigned int) blocks, 256, 0, stream>>>((const float4 *) x, (float4 *) dst, n/4);
    CUDA_CHECK(cudaGetLastError());
    return true;
}

template <float (*op)(float)>
void ggml_cuda_op_unary(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
"""

CUDA_SILU_BACK_X4 = """/* """ + MARK + """: SILU_BACK's modes (relu's and leaky_relu's gradients), and four values a
   thread where op_params[2] = 1 asks and both operands and the output are whole float4s (set 58:
   a value a thread read and wrote the bf16 block's relu gradient at ~2.5 TB/s on an H100) */
static __device__ __forceinline__ float ggrad_silu_back_mode(const float g, const float x, const int mode, const float slope) {
    return mode == """ + str(RELU_BACK) + """ ? (x <= 0.0f ? 0.0f : g)
         : mode == """ + str(LEAKY_RELU_BACK) + """ ? (x > 0.0f ? g : g*slope) : op_silu_back(g, x);
}

static __global__ void ggrad_silu_back_x4_f32(const float4 * grad, const float4 * xf, float4 * dst, const int64_t n4,
                                              const int mode, const float slope) {
    const int64_t i = (int64_t) blockDim.x*blockIdx.x + threadIdx.x;
    if (i < n4) {
        const float4 g = grad[i], x = xf[i];
        dst[i] = make_float4(ggrad_silu_back_mode(g.x, x.x, mode, slope), ggrad_silu_back_mode(g.y, x.y, mode, slope),
                             ggrad_silu_back_mode(g.z, x.z, mode, slope), ggrad_silu_back_mode(g.w, x.w, mode, slope));
    }
}

static bool ggrad_silu_back_x4(const float * grad, const float * x, float * dst, const int64_t n, const int mode,
                               const float slope, cudaStream_t stream) {
    const int64_t blocks = (n/4 + 255)/256;
    if (n % 4 != 0 || (uintptr_t) grad % 16 != 0 || (uintptr_t) x % 16 != 0 || (uintptr_t) dst % 16 != 0 ||
        blocks > INT_MAX) {
        return false;
    }
    ggrad_silu_back_x4_f32<<<(unsigned int) blocks, 256, 0, stream>>>((const float4 *) grad, (const float4 *) x,
                                                                       (float4 *) dst, n/4, mode, slope);
    CUDA_CHECK(cudaGetLastError());
    return true;
}

"""

CUDA_BIN_X4 = """
/* """ + MARK + """: where op_params[0] = 1 asks (ggml's binary ops leave it 0), contiguous float32
   operands of one size (or a one-value src1) four values a thread (set 58: ggml's k_bin_bcast ran
   the bf16 block's residual ADDs at ~2.3 TB/s on an H100) */
template <float (*bin_op)(const float, const float), bool one>
static __global__ void ggrad_bin_x4_f32(const float4 * a, const float * b, float4 * dst, const int64_t n4) {
    const int64_t i = (int64_t) blockDim.x*blockIdx.x + threadIdx.x;
    if (i < n4) {
        const float4 x = a[i];
        const float4 y = one ? make_float4(b[0], b[0], b[0], b[0]) : ((const float4 *) b)[i];
        dst[i] = make_float4(bin_op(x.x, y.x), bin_op(x.y, y.y), bin_op(x.z, y.z), bin_op(x.w, y.w));
    }
}

/* false where ggml's kernel runs: other types, strides or sizes, or values not at 16-byte addresses */
template <float (*bin_op)(const float, const float)>
static bool ggrad_bin_x4(const ggml_tensor * dst, cudaStream_t stream) {
    const ggml_tensor * a = dst->src[0];
    const ggml_tensor * b = dst->src[1];
    const int64_t n = ggml_nelements(dst), blocks = (n/4 + 255)/256;
    const bool one = ggml_nelements(b) == 1;
    if (a->type != GGML_TYPE_F32 || b->type != GGML_TYPE_F32 || dst->type != GGML_TYPE_F32 || !ggml_is_contiguous(a) ||
        !ggml_is_contiguous(b) || !ggml_is_contiguous(dst) || ggml_nelements(a) != n || (!one && ggml_nelements(b) != n) ||
        n % 4 != 0 || (uintptr_t) a->data % 16 != 0 || (!one && (uintptr_t) b->data % 16 != 0) ||
        (uintptr_t) dst->data % 16 != 0 || blocks > INT_MAX) {
        return false;
    }
    if (one) {
        ggrad_bin_x4_f32<bin_op, true><<<(unsigned int) blocks, 256, 0, stream>>>(
            (const float4 *) a->data, (const float *) b->data, (float4 *) dst->data, n/4);
    } else {
        ggrad_bin_x4_f32<bin_op, false><<<(unsigned int) blocks, 256, 0, stream>>>(
            (const float4 *) a->data, (const float *) b->data, (float4 *) dst->data, n/4);
    }
    CUDA_CHECK(cudaGetLastError());
    return true;
}
"""

CUDA_REPEAT_BACK = """template <typename T>
static __global__ void k_repeat_back_rows(
    const T * __restrict__ src, T * __restrict__ dst, float * __restrict__ partial, const int splits,
    const int64_t ne00, const int64_t ne01, const int64_t ne02, const int64_t ne03,
    const size_t s00, const size_t s01, const size_t s02, const size_t s03,
    const int64_t ne0, const int64_t ne1, const int64_t ne2, const int64_t ne3) { /* """ + MARK + """ */
    __shared__ float partial_y[32][33];
    const int64_t xblocks = gridDim.x / splits;
    const int     split = blockIdx.x / xblocks;
    const int64_t tid0  = int64_t(blockIdx.x % xblocks)*blockDim.x + threadIdx.x;
    const int64_t tid1  = blockIdx.y;
    const int64_t tid23 = blockIdx.z;
    const int64_t tid2  = tid23 % ne2;
    const int64_t tid3  = tid23 / ne2;
    // the repeats of one output: r0 along its row (inner loop), the rest split between the
    // grid's splits (a block each, in order) and then between a block's threads along y
    const int r0 = ne00/ne0, r1 = ne01/ne1, r2 = ne02/ne2;
    const int outer = r1*r2*int(ne03/ne3);
    const int per_split = (outer + splits - 1)/splits;
    const int begin = split*per_split;
    const int end = tid0 < ne0 ? min(outer, begin + per_split) : begin;
    float sum = 0.0f;
    ggml_cuda_pdl_sync();
    if (outer == r1 && r0 == 1) {  // a bias's gradient: one strided column, unrolled so loads overlap
        const T * col = src + tid3*s03 + tid2*s02 + tid1*s01 + tid0*s00;
        const int64_t stride = ne1*s01;
#pragma unroll 8
        for (int o = begin + threadIdx.y; o < end; o += blockDim.y) {
            sum += (float) col[o*stride];
        }
    } else
    for (int o = begin + threadIdx.y; o < end; o += blockDim.y) {
        const int k1 = o % r1, k2 = (o / r1) % r2, k3 = o / (r1*r2);
        const T * row = src + (tid3 + k3*ne3)*s03 + (tid2 + k2*ne2)*s02 + (tid1 + k1*ne1)*s01 + tid0*s00;
        for (int k0 = 0; k0 < r0; ++k0) {
            sum += (float) row[k0*ne0*s00];
        }
    }
    partial_y[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && tid0 < ne0) {
        for (int y = 1; y < blockDim.y; ++y) {
            sum += partial_y[y][threadIdx.x];
        }
        const int64_t i = tid3*ne2*ne1*ne0 + tid2*ne1*ne0 + tid1*ne0 + tid0;
        if (splits == 1) {
            dst[i] = (T) sum;
        } else {
            partial[split*ne0*ne1*ne2*ne3 + i] = sum;
        }
    }
}

/* the splits' sums of each output, added in split order (the same result every run) */
template <typename T>
static __global__ void k_repeat_back_splits(const float * __restrict__ partial, T * __restrict__ dst,
                                            const int64_t n, const int splits) {
    const int64_t i = int64_t(blockIdx.x)*blockDim.x + threadIdx.x;
    if (i >= n) {
        return;
    }
    float sum = partial[i];
    for (int s = 1; s < splits; ++s) {
        sum += partial[s*n + i];
    }
    dst[i] = (T) sum;
}

/* splits of REPEAT_BACK's repeats across blocks: where its outputs fill fewer than two blocks
   per multiprocessor (a 512-wide bias gradient gave 16 blocks of an H100's 132: 230 us where
   the bandwidth allows ~10), up to enough to fill them, each split >= 256 repeats */
static int ggrad_repeat_back_splits(const int64_t blocks, const int64_t outer, const int nsm) {
    if (blocks >= 2*nsm || outer < 512) {
        return 1;
    }
    return (int) std::min<int64_t>((2*nsm + blocks - 1)/blocks, outer/256);
}

template <typename T>
static void repeat_back_cuda("""


def patch(tree: Path) -> None:
    base = next(tree.glob("**/ggml/src/ggml.c"), None)
    if base is None:
        raise SystemExit(f"no ggml/src/ggml.c under {tree}")
    src = base.parent
    _patch_file(src.parent / "include" / "ggml.h", [
        ("        GGML_OP_GLU,\n\n        GGML_OP_COUNT,",
         f"        GGML_OP_GLU,\n\n        GGML_OP_GGRAD, /* {MARK} */\n\n        GGML_OP_COUNT,"),
    ])
    _replace_all(base, "static_assert(GGML_OP_COUNT == 97, \"GGML_OP_COUNT != 97\");",
                 "static_assert(GGML_OP_COUNT == 98, \"GGML_OP_COUNT != 98\");", 2)
    _patch_file(base, [
        ("    \"glu(x)\",\n};", "    \"glu(x)\",\n\n    \"ggrad(x)\",\n};"),
        ("    \"GLU\",\n};", "    \"GLU\",\n\n    \"GGRAD\",\n};"),
        ("// ggml hardswish\n", GGRAD_OP_C + "// ggml hardswish\n"),
        ("// ggml hardswish\n",
         f"/* {MARK}: tells ggrad which of its kernels this build has (scripts/patch_ggml_kernels.py) */\n"
         f"__attribute__((visibility(\"default\"))) int ggml_ggrad_kernels(void) {{ return {KERNELS_VERSION}; }}\n\n"
         "// ggml hardswish\n"),
    ])
    # a binary op whose src1 holds one value per row (a tensor times a scalar on the device:
    # a gradient's clip coefficient) ran one call per element: 1.1 ms for 640k floats
    _patch_file(src / "ggml-cpu" / "binary-ops.cpp", [
        ("template <float (*op)(float, float), typename src0_t, typename src1_t, typename dst_t>\n"
         "static void apply_binary_op(",
         "template <float (*op)(float, float), typename src0_t, typename src1_t, typename dst_t>\n"
         f"static inline void vec_binary_op_one(const int64_t n, dst_t * z, const src0_t * x, const src1_t * y) {{ /* {MARK} */\n"
         "    constexpr auto src0_to_f32 = type_conversion_table<src0_t>::to_f32;\n"
         "    constexpr auto src1_to_f32 = type_conversion_table<src1_t>::to_f32;\n"
         "    constexpr auto f32_to_dst  = type_conversion_table<dst_t >::from_f32;\n"
         "    const float b = src1_to_f32(*y);\n"
         "    for (int64_t i = 0; i < n; i++) {\n"
         "        z[i] = f32_to_dst(op(src0_to_f32(x[i]), b));\n"
         "    }\n"
         "}\n\n"
         "template <float (*op)(float, float), typename src0_t, typename src1_t, typename dst_t>\n"
         "static void apply_binary_op("),
        ("        if (is_src1_contiguous_rows) {\n            // src1 is broadcastable across src0 and dst in i1, i2, i3\n",
         "        if (is_src1_contiguous_rows && ne10 == 1 && ne00 > 1) {\n"
         "            vec_binary_op_one<op>(ne00, dst_ptr, src0_ptr, src1_ptr);\n"
         "        } else if (is_src1_contiguous_rows) {\n            // src1 is broadcastable across src0 and dst in i1, i2, i3\n"),
    ])
    _patch_file(src / "ggml-cpu" / "unary-ops.cpp", [
        ("static inline float op_relu(float x) {\n    return (x > 0.f) ? x : 0.f;",
         f"static inline float op_relu(float x) {{ /* {MARK}: NaN and -0 kept, as torch */\n    return (x < 0.f) ? 0.f : x;"),
    ])
    for name in ("ggrad_cpu.inc", "ggrad_adamw.h", "ggrad_bn.h", "ggrad_ce.h", "ggrad_cell.h", "ggrad_gemm.h",
                 "ggrad_pool.h", "ggrad_softmax.h"):
        shutil.copy(SOURCES / name, src / "ggml-cpu" / name)
    _patch_file(src / "ggml-cpu" / "ggml-cpu.c", [
        ("        case GGML_OP_OPT_STEP_SGD:\n            {\n                ggml_compute_forward_opt_step_sgd(params, tensor);\n"
         "            }\n            break;\n",
         "        case GGML_OP_OPT_STEP_SGD:\n            {\n                ggml_compute_forward_opt_step_sgd(params, tensor);\n"
         f"            }}\n            break;\n        case GGML_OP_GGRAD: /* {MARK} */\n            {{\n"
         "                ggml_compute_forward_ggrad(params, tensor);\n            }\n            break;\n"),
        ("        case GGML_OP_OPT_STEP_SGD:\n            {\n                n_tasks = n_threads;",
         "        case GGML_OP_OPT_STEP_SGD:\n        case GGML_OP_GGRAD:\n            {\n                n_tasks = n_threads;"),
    ])
    _patch_file(src / "ggml-cpu" / "ggml-cpu.cpp", [
        ("    switch (op->op) {\n        case GGML_OP_CPY:\n        case GGML_OP_SET_ROWS:\n",
         f"    switch (op->op) {{\n        case GGML_OP_GGRAD: /* {MARK}: the kernels ggrad_cpu.inc has */\n"
         "            return (ggml_get_op_params_i32(op, 0) >= 1 && ggml_get_op_params_i32(op, 0) <= 5 &&\n"
         "                    ggml_get_op_params_i32(op, 0) != 3) ||\n"
         "                   (ggml_get_op_params_i32(op, 0) == 3 && ggml_ggrad_cpu_adam_hyper_supported(op)) ||\n"
         "                   (ggml_get_op_params_i32(op, 0) == 6 && ggml_ggrad_cpu_gemm_supported(op)) ||\n"
         "                   (ggml_get_op_params_i32(op, 0) == 7 && ggml_is_contiguous(op->src[0]) &&\n"
         "                    ggml_is_contiguous(op->src[1]) && op->src[0]->type == GGML_TYPE_F32 &&\n"
         "                    op->src[1]->type == GGML_TYPE_F32 && op->type == GGML_TYPE_F32 &&\n"
         "                    op->src[2] != NULL && ggml_is_contiguous(op->src[2]) && op->src[2]->type == GGML_TYPE_F32) ||\n"
         "                   (ggml_get_op_params_i32(op, 0) == 8 && ggml_is_contiguous(op->src[0]) &&\n"
         "                    op->src[0]->type == GGML_TYPE_F32 && op->type == GGML_TYPE_F32) ||\n"
         "                   (ggml_get_op_params_i32(op, 0) == 9 && ggml_ggrad_cpu_adamw_group_supported(op)) ||\n"
         "                   ((ggml_get_op_params_i32(op, 0) == 10 || ggml_get_op_params_i32(op, 0) == 11) &&\n"
         "                    ggml_ggrad_cpu_max_pool_supported(op)) ||\n"
         "                   ((ggml_get_op_params_i32(op, 0) == 12 || ggml_get_op_params_i32(op, 0) == 13) &&\n"
         "                    ggml_ggrad_cpu_columns_supported(op)) ||\n"
         "                   (ggml_get_op_params_i32(op, 0) >= 14 && ggml_get_op_params_i32(op, 0) <= 17 &&\n"
         "                    ggml_ggrad_cpu_blas_kernel_supported(op)) ||\n"
         "                   ((ggml_get_op_params_i32(op, 0) == 18 || ggml_get_op_params_i32(op, 0) == 19) &&\n"
         "                    ggml_ggrad_cpu_cell_supported(op)) ||\n"
         "                   (((ggml_get_op_params_i32(op, 0) >= 20 && ggml_get_op_params_i32(op, 0) <= 22) ||\n"
         "                     ggml_get_op_params_i32(op, 0) == 25) && ggml_ggrad_cpu_bn_supported(op)) ||\n"
         "                   ((ggml_get_op_params_i32(op, 0) == 30 || ggml_get_op_params_i32(op, 0) == 31) &&\n"
         "                    ggml_ggrad_cpu_layer_norm_supported(op)) ||\n"
         "                   (ggml_get_op_params_i32(op, 0) == 32 && ggml_ggrad_cpu_class_total_supported(op)) ||\n"
         "                   ((ggml_get_op_params_i32(op, 0) == 33 || ggml_get_op_params_i32(op, 0) == 34) &&\n"
         "                    ggml_ggrad_cpu_softmax_supported(op));\n"
         "        case GGML_OP_CPY:\n        case GGML_OP_SET_ROWS:\n"),
        ("static bool ggml_backend_cpu_device_supports_op(ggml_backend_dev_t dev, const struct ggml_tensor * op) {\n",
         f"extern \"C\" bool ggml_ggrad_cpu_gemm_supported(const struct ggml_tensor * op); /* {MARK}: ggrad_cpu.inc */\n"
         "extern \"C\" bool ggml_ggrad_cpu_adamw_group_supported(const struct ggml_tensor * op);\n"
         "extern \"C\" bool ggml_ggrad_cpu_max_pool_supported(const struct ggml_tensor * op);\n"
         "extern \"C\" bool ggml_ggrad_cpu_columns_supported(const struct ggml_tensor * op);\n"
         "extern \"C\" bool ggml_ggrad_cpu_blas_kernel_supported(const struct ggml_tensor * op);\n"
         "extern \"C\" bool ggml_ggrad_cpu_cell_supported(const struct ggml_tensor * op);\n"
         "extern \"C\" bool ggml_ggrad_cpu_bn_supported(const struct ggml_tensor * op);\n"
         "extern \"C\" bool ggml_ggrad_cpu_layer_norm_supported(const struct ggml_tensor * op);\n"
         "extern \"C\" bool ggml_ggrad_cpu_class_total_supported(const struct ggml_tensor * op);\n"
         "extern \"C\" bool ggml_ggrad_cpu_softmax_supported(const struct ggml_tensor * op);\n"
         "extern \"C\" bool ggml_ggrad_cpu_adam_hyper_supported(const struct ggml_tensor * op);\n\n"
         "static bool ggml_backend_cpu_device_supports_op(ggml_backend_dev_t dev, const struct ggml_tensor * op) {\n"),
    ])
    _patch_file(src / "ggml-cpu" / "ggml-cpu.c", [
        ("        case GGML_OP_REPEAT:\n        case GGML_OP_REPEAT_BACK:\n        case GGML_OP_LEAKY_RELU:\n"
         "            {\n                n_tasks = 1;\n            } break;\n",
         "        case GGML_OP_REPEAT:\n        case GGML_OP_LEAKY_RELU:\n"
         "            {\n                n_tasks = 1;\n            } break;\n"
         f"        case GGML_OP_REPEAT_BACK: /* {MARK}: threads share its columns */\n"
         "            {\n                n_tasks = n_threads;\n            } break;\n"),
    ], mark=MARK + ": threads share")
    _patch_file(src / "ggml-cpu" / "ops.h", [
        ("void ggml_compute_forward_opt_step_sgd(const struct ggml_compute_params * params, struct ggml_tensor * dst);\n",
         "void ggml_compute_forward_opt_step_sgd(const struct ggml_compute_params * params, struct ggml_tensor * dst);\n"
         f"void ggml_compute_forward_ggrad(const struct ggml_compute_params * params, struct ggml_tensor * dst); /* {MARK} */\n"),
    ])
    _patch_file(src / "ggml-cpu" / "vec.h", [
        ("y[i] = ((x[i] > 0.f) ? x[i] : 0.f) + ns * ((x[i] < 0.0f) ? x[i] : 0.f); }",
         f"y[i] = (x[i] > 0.f) ? x[i] : x[i]*ns; }} /* {MARK} */"),
        ("        y[i] = GGML_CPU_FP32_TO_FP16(((v > 0.f) ? v : 0.f) + ns * ((v < 0.0f) ? v : 0.f));",
         "        y[i] = GGML_CPU_FP32_TO_FP16((v > 0.f) ? v : v*ns);"),
    ])
    # ggml's float32 sums (SUM_ROWS, SUM, MEAN, norms): eight double sums side by side, which
    # the compiler vectorizes (one double chain ran a value per add's latency: SUM_ROWS of a
    # conv bias's gradient, 4.7M values, took 1.9 ms on two cores), then added pairwise
    sum_mark = MARK + ": eight double sums"
    eight = ("    ggml_float acc[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};\n    int i = 0;\n"
             "    for (; i + 8 <= n; i += 8) {\n        for (int k = 0; k < 8; ++k) {\n"
             "            acc[k] += (ggml_float)x[i + k];\n        }\n    }\n"
             "    ggml_float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));\n"
             "    for (; i < n; ++i) {\n        sum += (ggml_float)x[i];\n    }\n")
    _patch_file(src / "ggml-cpu" / "vec.h", [
        ("inline static void ggml_vec_sum_f32(const int n, float * s, const float * x) {\n#ifndef GGML_USE_ACCELERATE\n"
         "    ggml_float sum = 0.0;\n    for (int i = 0; i < n; ++i) {\n        sum += (ggml_float)x[i];\n    }\n",
         "inline static void ggml_vec_sum_f32(const int n, float * s, const float * x) {\n#ifndef GGML_USE_ACCELERATE\n"
         f"    /* {sum_mark} */\n" + eight),
        ("inline static void ggml_vec_sum_f32_ggf(const int n, ggml_float * s, const float * x) {\n"
         "    ggml_float sum = 0.0;\n    for (int i = 0; i < n; ++i) {\n        sum += (ggml_float)x[i];\n    }\n",
         "inline static void ggml_vec_sum_f32_ggf(const int n, ggml_float * s, const float * x) {\n" + eight),
    ], mark=sum_mark)
    _patch_file(src / "ggml-cpu" / "ops.cpp", [
        ("    for (int i1 = ir0; i1 < ir1; i1++) {\n        ggml_vec_silu_backward_f32(nc,",
         f"    const int32_t mode = ggml_get_op_params_i32(dst, 0); /* {MARK}: relu / leaky_relu gradients */\n"
         "    const float slope = ggml_get_op_params_f32(dst, 1);\n"
         "    for (int i1 = ir0; i1 < ir1 && mode != 0; i1++) {\n"
         "        float * d = (float *) ((char *) dst->data + i1*dst->nb[1]);\n"
         "        const float * x = (const float *) ((char *) src1->data + i1*src1->nb[1]);\n"
         "        const float * g = (const float *) ((char *) grad->data + i1*grad->nb[1]);\n"
         f"        if (mode == {RELU_BACK}) {{\n"
         "            for (int k = 0; k < nc; k++) d[k] = x[k] <= 0.f ? 0.f : g[k];\n"
         "        } else {\n"
         "            for (int k = 0; k < nc; k++) d[k] = x[k] > 0.f ? g[k] : g[k]*slope;\n"
         "        }\n"
         "    }\n"
         "    for (int i1 = ir0; i1 < ir1 && mode == 0; i1++) {\n        ggml_vec_silu_backward_f32(nc,"),
    ])
    # the CPU's REPEAT_BACK: each thread sums its own range of columns, in the same order
    _patch_file(src / "ggml-cpu" / "ops.cpp", [
        ("    const ggml_tensor * src0 = dst->src[0];\n\n    if (params->ith != 0) {\n        return;\n    }\n\n"
         "    GGML_ASSERT(ggml_can_repeat(dst, src0));",
         "    const ggml_tensor * src0 = dst->src[0];\n\n    GGML_ASSERT(ggml_can_repeat(dst, src0));"),
        ("    if (ggml_is_contiguous(dst)) {\n        ggml_vec_set_f32(ne0*ne1*ne2*ne3, (float *)dst->data, 0);\n    } else {\n"
         "        for         (int k3 = 0; k3 < ne3; k3++) {",
         f"    /* {MARK}: this thread's columns [c0, c1), in blocks of 16 */\n"
         "    const int64_t per = ((ne0 + params->nth - 1)/params->nth + 15)/16*16;\n"
         "    const int64_t c0 = MIN(per*params->ith, ne0), c1 = MIN(c0 + per, ne0);\n"
         "    if (c0 == c1) {\n        return;\n    }\n    {\n"
         "        for         (int k3 = 0; k3 < ne3; k3++) {"),
        ("                    ggml_vec_set_f32(ne0,\n                        (float *) ((char *) dst->data + k1*nb1 + k2*nb2 + k3*nb3),\n",
         "                    ggml_vec_set_f32(c1 - c0,\n                        (float *) ((char *) dst->data + k1*nb1 + k2*nb2 + k3*nb3) + c0,\n"),
        ("                                ggml_vec_acc_f32(ne0,\n"
         "                                        (float *) ((char *)  dst->data + (         k3)*nb3  + (         k2)*nb2  + (         k1)*nb1),\n"
         "                                        (float *) ((char *) src0->data + (i3*ne3 + k3)*nb03 + (i2*ne2 + k2)*nb02 + (i1*ne1 + k1)*nb01 + (i0*ne0)*nb00));",
         "                                ggml_vec_acc_f32(c1 - c0,\n"
         "                                        (float *) ((char *)  dst->data + (         k3)*nb3  + (         k2)*nb2  + (         k1)*nb1) + c0,\n"
         "                                        (float *) ((char *) src0->data + (i3*ne3 + k3)*nb03 + (i2*ne2 + k2)*nb02 + (i1*ne1 + k1)*nb01 + (i0*ne0)*nb00) + c0);"),
    ], mark=MARK + ": this thread's columns")
    # the CPU's SUM_ROWS: the threads share its rows (it ran on one thread: 11 ms for a conv
    # bias's 4.7M-value gradient), each row summed by ggml's own loop (the same bits)
    rows_mark = MARK + ": SUM_ROWS threads"
    _patch_file(src / "ggml-cpu" / "ggml-cpu.c", [
        ("        case GGML_OP_SUM:\n        case GGML_OP_SUM_ROWS:\n        case GGML_OP_MEAN:\n        case GGML_OP_ARGMAX:\n"
         "            {\n                n_tasks = 1;\n            } break;\n",
         "        case GGML_OP_SUM:\n        case GGML_OP_MEAN:\n        case GGML_OP_ARGMAX:\n"
         "            {\n                n_tasks = 1;\n            } break;\n"
         f"        case GGML_OP_SUM_ROWS: /* {rows_mark} */\n"
         "            {\n                n_tasks = n_threads;\n            } break;\n"),
    ], mark=rows_mark)
    _patch_file(src / "ggml-cpu" / "ops.cpp", [
        ("static void ggml_compute_forward_sum_rows_f32(\n        const ggml_compute_params * params,\n        ggml_tensor * dst) {\n\n"
         "    const ggml_tensor * src0 = dst->src[0];\n\n    if (params->ith != 0) {\n        return;\n    }\n",
         "static void ggml_compute_forward_sum_rows_f32(\n        const ggml_compute_params * params,\n        ggml_tensor * dst) {\n\n"
         f"    const ggml_tensor * src0 = dst->src[0]; /* {rows_mark} */\n"),
        ("    for (int64_t i3 = 0; i3 < ne03; i3++) {\n        for (int64_t i2 = 0; i2 < ne02; i2++) {\n"
         "            for (int64_t i1 = 0; i1 < ne01; i1++) {\n"
         "                float * src_row = (float *) ((char *) src0->data + i1*nb01 + i2*nb02 + i3*nb03);\n"
         "                float * dst_row = (float *) ((char *) dst->data  + i1*nb1  + i2*nb2  + i3*nb3);\n"
         "                float row_sum = 0;\n                ggml_vec_sum_f32(ne00, &row_sum, src_row);\n"
         "                dst_row[0] = row_sum;\n            }\n        }\n    }\n",
         "    const int64_t nr = ne01*ne02*ne03;\n    const int64_t dr = (nr + params->nth - 1)/params->nth;\n"
         "    for (int64_t ir = dr*params->ith; ir < MIN(nr, dr*(params->ith + 1)); ir++) {\n"
         "        const int64_t i3 = ir/(ne01*ne02), i2 = (ir/ne01) % ne02, i1 = ir % ne01;\n"
         "        float * src_row = (float *) ((char *) src0->data + i1*nb01 + i2*nb02 + i3*nb03);\n"
         "        float * dst_row = (float *) ((char *) dst->data  + i1*nb1  + i2*nb2  + i3*nb3);\n"
         "        float row_sum = 0;\n        ggml_vec_sum_f32(ne00, &row_sum, src_row);\n"
         "        dst_row[0] = row_sum;\n    }\n"),
    ], mark=rows_mark)
    # the CPU's POOL_2D and POOL_2D_BACK: the threads share the planes (they ran on one
    # thread: 23 ms of the cnn step), each plane computed as ggml computes it (the same bits)
    pool_mark = MARK + ": POOL_2D threads"
    planes = ("    const int64_t nplanes = ggml_nbytes({t})/{t}->nb[2];\n"
              "    const int64_t per = (nplanes + params->nth - 1)/params->nth;\n"
              "    const int64_t first = MIN(nplanes, per*params->ith), last = MIN(nplanes, first + per);\n")
    _patch_file(src / "ggml-cpu" / "ggml-cpu.c", [
        ("        case GGML_OP_POOL_1D:\n        case GGML_OP_POOL_2D:\n        case GGML_OP_POOL_2D_BACK:\n"
         "            {\n                n_tasks = 1;\n            } break;\n",
         "        case GGML_OP_POOL_1D:\n            {\n                n_tasks = 1;\n            } break;\n"
         f"        case GGML_OP_POOL_2D: /* {pool_mark} */\n        case GGML_OP_POOL_2D_BACK:\n"
         "            {\n                n_tasks = n_threads;\n            } break;\n"),
    ], mark=pool_mark)
    _patch_file(src / "ggml-cpu" / "ops.cpp", [
        ("    assert(src->type == GGML_TYPE_F32 || src->type == GGML_TYPE_F16);\n\n    if (params->ith != 0) {\n        return;\n    }\n\n"
         "    const int32_t * opts = (const int32_t *)dst->op_params;\n\n    ggml_op_pool op = static_cast<ggml_op_pool>(opts[0]);\n"
         "    const int k0 = opts[1];\n    const int k1 = opts[2];\n",
         f"    assert(src->type == GGML_TYPE_F32 || src->type == GGML_TYPE_F16); /* {pool_mark} */\n\n"
         "    const int32_t * opts = (const int32_t *)dst->op_params;\n\n    ggml_op_pool op = static_cast<ggml_op_pool>(opts[0]);\n"
         "    const int k0 = opts[1];\n    const int k1 = opts[2];\n"),
        ("    const char * cdata = (const char*)src->data;\n    const char * const data_end = cdata + ggml_nbytes(src);\n",
         planes.format(t="src") + "    const char * cdata = (const char*)src->data + first*src->nb[2];\n"
         "    const char * const data_end = (const char*)src->data + last*src->nb[2];\n"),
        ("    float * dplane = (float *)dst->data;\n", "    float * dplane = (float *)dst->data + first*pa;\n"),
        ("    assert(dst->type == GGML_TYPE_F32 || dst->type == GGML_TYPE_F16);\n\n    if (params->ith != 0) {\n        return;\n    }\n",
         "    assert(dst->type == GGML_TYPE_F32 || dst->type == GGML_TYPE_F16);\n"),
        ("    char       * cdata  = (char       *) dst->data;\n    const char * cdataf = (const char *) dstf->data;\n"
         "    const char * const data_end = cdata + ggml_nbytes(dst);\n\n    GGML_ASSERT(params->ith == 0);\n"
         "    memset(cdata, 0, ggml_nbytes(dst));\n",
         planes.format(t="dst") + "    char       * cdata  = (char       *) dst->data + first*dst->nb[2];\n"
         "    const char * cdataf = (const char *) dstf->data + first*dst->nb[2];\n"
         "    const char * const data_end = (const char *) dst->data + last*dst->nb[2];\n\n"
         "    memset(cdata, 0, (last - first)*dst->nb[2]);\n"),
        ("    const float * splane = (const float *) src->data;\n", "    const float * splane = (const float *) src->data + first*pa;\n"),
    ], mark=pool_mark)
    # the CPU's IM2COL_BACK as a scatter over each image's column rows (ggrad_cpu.inc)
    anchor = ("    GGML_ASSERT(nb0  == sizeof(float));\n\n    // im2col: [N, IC, IH, IW] => [N, OH, OW, IC*KH*KW]\n"
              "    {\n        float * const wdata = (float *) dst->data;\n\n        for (int64_t in = 0; in < N; in++) {\n"
              "            for (int64_t iic = ith; iic < IC; iic += nth) {\n                for (int64_t iih = 0; iih < IH; iih++) {\n")
    _patch_file(src / "ggml-cpu" / "ops.cpp", [
        (anchor, f"    GGML_ASSERT(nb0  == sizeof(float));\n    if (ggrad_im2col_back_scatter(params, dst, is_2D, N, IC, IH, IW, KH, KW, "
                 f"OH, OW, s0, s1, p0, p1, d0, d1, ofs0, ofs1)) {{ /* {MARK}: IM2COL_BACK as a scatter */\n        return;\n    }}\n"
                 + anchor[len("    GGML_ASSERT(nb0  == sizeof(float));\n"):]),
        ("void ggml_compute_forward_im2col_back_f32(\n",
         "static bool ggrad_im2col_back_scatter(const ggml_compute_params * params, ggml_tensor * dst, bool is_2D, "
         "int64_t N, int64_t IC, int64_t IH, int64_t IW, int64_t KH, int64_t KW, int64_t OH, int64_t OW, "
         "int s0, int s1, int p0, int p1, int d0, int d1, int64_t ofs0, int64_t ofs1);\n\n"
         "void ggml_compute_forward_im2col_back_f32(\n"),
    ], mark=MARK + ": IM2COL_BACK")
    # ops.cpp's last line: ggrad's CPU kernels (after the other edits of ops.cpp: one mark per file)
    ops = src / "ggml-cpu" / "ops.cpp"
    if "#include \"ggrad_cpu.inc\"" not in ops.read_text():
        ops.write_text(ops.read_text() + f"\n/* {MARK} */\n#include \"ggrad_cpu.inc\"\n")
    cuda = src / "ggml-cuda"
    for name in ("ggrad.cu", "ggrad.cuh", "ggrad_adamw.h", "ggrad_bn.h", "ggrad_ce.h", "ggrad_cell.h", "ggrad_gemm.h",
                 "ggrad_pool.h", "ggrad_softmax.h", "ggrad_attention.cuh"):
        shutil.copy(SOURCES / name, cuda / name)
    _patch_file(cuda / "ggml-cuda.cu", [
        ("#include \"ggml-cuda/fill.cuh\"\n", f"#include \"ggml-cuda/fill.cuh\"\n#include \"ggml-cuda/ggrad.cuh\" /* {MARK} */\n"),
        ("        case GGML_OP_OPT_STEP_SGD:\n            ggml_cuda_opt_step_sgd(ctx, dst);\n            break;\n",
         "        case GGML_OP_OPT_STEP_SGD:\n            ggml_cuda_opt_step_sgd(ctx, dst);\n            break;\n"
         "        case GGML_OP_GGRAD:\n            ggml_cuda_op_ggrad(ctx, dst);\n            break;\n"),
        ("            ggml_cuda_cpy(ctx, dst->src[0], dst->src[1]);\n",
         "            ggml_cuda_cpy(ctx, dst->src[0], dst->src[1], ggml_get_op_params_i32(dst, 0) == 1,\n"
         "                          ggml_get_op_params_i32(dst, 1) == 1, ggml_get_op_params_i32(dst, 2) == 1);\n"),
        ("        case GGML_OP_CPY:\n            {\n                ggml_type src0_type = op->src[0]->type;\n",
         "        case GGML_OP_CPY:\n            {\n"
         f"                if (ggml_get_op_params_i32(op, 2) == 1) {{  /* {MARK}: relu first (set 52) */\n"
         "                    return op->src[0]->type == GGML_TYPE_F32 && ggml_is_contiguous(op->src[0]) &&\n"
         "                           (op->src[1]->type == GGML_TYPE_BF16 || op->src[1]->type == GGML_TYPE_F16) &&\n"
         "                           ggml_is_contiguous(op->src[1]);\n"
         "                }\n"
         "                ggml_type src0_type = op->src[0]->type;\n"),
        ("        case GGML_OP_FLASH_ATTN_EXT:\n            return ggml_cuda_flash_attn_ext_supported(dev_ctx->device, op);\n",
         "        case GGML_OP_FLASH_ATTN_EXT:\n            return ggml_cuda_flash_attn_ext_supported(dev_ctx->device, op);\n"
         "        case GGML_OP_GGRAD:\n            return ggml_cuda_ggrad_supported(op);\n"),
    ])
    _patch_file(cuda / "unary.cu", [
        ("template <float (*op)(float)>\nvoid ggml_cuda_op_unary(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {\n",
         CUDA_UNARY_X4),
        ("    GGML_ASSERT(src0->type == dst->type);\n\n    if (src0->type == GGML_TYPE_F16) {\n"
         "        unary_cuda<op>((const half *)src0_d, (half *)dst_d, ggml_nelements(src0), stream);\n",
         "    GGML_ASSERT(src0->type == dst->type);\n\n"
         "    if (src0->type == GGML_TYPE_F32 && ggml_get_op_params_i32(dst, 1) == 1 && ggml_is_contiguous(dst) &&  /* set 50 */\n"
         "            ggrad_unary_x4<op>((const float *) src0_d, (float *) dst_d, ggml_nelements(src0), stream)) {\n"
         "        return;\n    }\n"
         "    if (src0->type == GGML_TYPE_F16) {\n"
         "        unary_cuda<op>((const half *)src0_d, (half *)dst_d, ggml_nelements(src0), stream);\n"),
        ("static __device__ __forceinline__ float op_relu(float x) {\n    return fmaxf(x, 0);",
         f"static __device__ __forceinline__ float op_relu(float x) {{ /* {MARK} */\n    return x < 0.0f ? 0.0f : x;"),
        ("    return fmaxf(x, 0) + fminf(x, 0.0f) * negative_slope;",
         "    return x > 0.0f ? x : x * negative_slope;"),
        ("static __global__ void silu_back_kernel(const T * grad, const T * xf, T * dst, const int k) {",
         "static __global__ void silu_back_kernel(const T * grad, const T * xf, T * dst, const int k,\n"
         "                                        const int mode, const float slope) {"),
        ("    dst[i] = (T)op_silu_back((float)grad[i], (float)xf[i]);",
         "    dst[i] = (T)ggrad_silu_back_mode((float)grad[i], (float)xf[i], mode, slope);"),
        ("template <class T>\nstatic __global__ void silu_back_kernel(", CUDA_SILU_BACK_X4 + "template <class T>\nstatic __global__ void silu_back_kernel("),
        ("static void silu_back_cuda(const T * grad, const T * x, T * dst, const int k, cudaStream_t stream) {",
         "static void silu_back_cuda(const T * grad, const T * x, T * dst, const int k, const int mode, const float slope,\n"
         "                           cudaStream_t stream) {"),
        ("(grad, x, dst, k);", "(grad, x, dst, k, mode, slope);"),
        ("        silu_back_cuda((const half *)src0_d, (const half *)src1_d, (half *)dst_d, ggml_nelements(src0), stream);",
         "        silu_back_cuda((const half *)src0_d, (const half *)src1_d, (half *)dst_d, ggml_nelements(src0),\n"
         "                       ggml_get_op_params_i32(dst, 0), ggml_get_op_params_f32(dst, 1), stream);"),
        ("        silu_back_cuda((const float*)src0_d, (const float*)src1_d, (float *)dst_d, ggml_nelements(src0), stream);",
         "        if (ggml_get_op_params_i32(dst, 2) == 1 &&  /* set 58: asked (silu_back_x4) */\n"
         "            ggrad_silu_back_x4(src0_d, src1_d, dst_d, ggml_nelements(src0), ggml_get_op_params_i32(dst, 0),\n"
         "                               ggml_get_op_params_f32(dst, 1), stream)) {\n"
         "            return;\n"
         "        }\n"
         "        silu_back_cuda((const float*)src0_d, (const float*)src1_d, (float *)dst_d, ggml_nelements(src0),\n"
         "                       ggml_get_op_params_i32(dst, 0), ggml_get_op_params_f32(dst, 1), stream);"),
    ])
    _patch_file(cuda / "cpy.cuh", [
        ("void ggml_cuda_cpy(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, ggml_tensor * src1);",
         f"void ggml_cuda_cpy(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, ggml_tensor * src1,\n"
         f"                   bool vectorized = false, bool rows = false, bool relu = false); /* {MARK}: casts four\n"
         f"                                                              values a thread, copies a row a warp, relu */"),
    ])
    _patch_file(cuda / "cpy.cu", [
        ("void ggml_cuda_cpy(ggml_backend_cuda_context & ctx, const ggml_tensor * src0, ggml_tensor * src1) {\n",
         CUDA_CAST_X4),
        ("    if (src0->type == src1->type && contiguous_srcs) {\n",
         "    GGML_ASSERT(!relu || (contiguous_srcs && src0->type == GGML_TYPE_F32 &&\n"
         "                          (src1->type == GGML_TYPE_BF16 || src1->type == GGML_TYPE_F16)));  /* supports_op's */\n"
         "    if (rows && !contiguous_srcs && ggrad_cpy_by_rows(src0, src1, main_stream)) {\n        return;\n    }\n"
         "    if (src0->type == src1->type && contiguous_srcs) {\n"),
        ("    const ggml_tensor * src0 = dst->src[0];\n    ggml_cuda_cpy(ctx, src0, dst);\n",
         "    const ggml_tensor * src0 = dst->src[0];\n    ggml_cuda_cpy(ctx, src0, dst, false, ggml_get_op_params_i32(dst, 1) == 1);\n"),
    ] + [(f"            ggml_cpy_scalar_contiguous_cuda<{a}, {b}>\n                (src0_ddc, src1_ddc, ne, main_stream);",
          f"            ggrad_cpy_contiguous_cuda<{a}, {b}>(src0_ddc, src1_ddc, ne, main_stream, vectorized, relu);")
         for a, b in (("float", "nv_bfloat16"), ("float", "half"), ("half", "float"), ("nv_bfloat16", "float"))])
    # set 46: columns written as bfloat16 (autocast's: the GEMM kernel reads them as they are,
    # where a cast of float32 columns moved them twice); each value converted as ggml's own
    # CPY converts (__float2bfloat16, round to nearest even): the same bits
    _patch_file(cuda / "im2col.cu", [
        ("void ggml_cuda_op_im2col(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {\n", CUDA_IM2COL_ROWS),
        ("    GGML_ASSERT( dst->type == GGML_TYPE_F16 || dst->type == GGML_TYPE_F32);\n\n"
         "    const int32_t s0 = ((const int32_t*)(dst->op_params))[0];\n",  # IM2COL's: IM2COL_3D's reads "int32_t *"
         f"    GGML_ASSERT( dst->type == GGML_TYPE_F16 || dst->type == GGML_TYPE_F32 || dst->type == GGML_TYPE_BF16); /* {MARK} */\n\n"
         "    const int32_t s0 = ((const int32_t*)(dst->op_params))[0];\n"),
        ("    if(dst->type == GGML_TYPE_F16) {\n        im2col_cuda_f16(",
         "    const bool quads = ggml_get_op_params_i32(dst, 8) == 1;  /* set 47: four values a store */\n"
         "    if (ggml_get_op_params_i32(dst, 7) == 1 && (dst->type == GGML_TYPE_F16\n"
         "            ? ggrad_im2col_rows_cuda(src1_d, (half *) dst_d, IW, IH, OW, OH, KW, KH, IC, N, IC_IH_IW, IH_IW, s0, s1, p0, p1, d0, d1, quads, stream)\n"
         "            : dst->type == GGML_TYPE_BF16\n"
         "            ? ggrad_im2col_rows_cuda(src1_d, (nv_bfloat16 *) dst_d, IW, IH, OW, OH, KW, KH, IC, N, IC_IH_IW, IH_IW, s0, s1, p0, p1, d0, d1, quads, stream)\n"
         "            : ggrad_im2col_rows_cuda(src1_d, (float *) dst_d, IW, IH, OW, OH, KW, KH, IC, N, IC_IH_IW, IH_IW, s0, s1, p0, p1, d0, d1, quads, stream))) {\n"
         "        return;\n    }\n"
         "    if (dst->type == GGML_TYPE_BF16) {\n"
         "        im2col_cuda<nv_bfloat16>(src1_d, (nv_bfloat16 *) dst_d, IW, IH, OW, OH, KW, KH, IC, N, IC_IH_IW, IH_IW, s0, s1, p0, p1, d0, d1, stream);\n"
         "        return;\n    }\n"
         "    if(dst->type == GGML_TYPE_F16) {\n        im2col_cuda_f16("),
    ])
    # cuBLASLt for the GEMM's bias epilogue (set 48); ggml's static builds off Windows link it already
    _patch_file(cuda / "CMakeLists.txt", [
        ("        target_link_libraries(ggml-cuda PRIVATE CUDA::cudart CUDA::cublas)\n",
         f"        target_link_libraries(ggml-cuda PRIVATE CUDA::cudart CUDA::cublas CUDA::cublasLt)  # {MARK}\n"),
    ])
    _patch_file(cuda / "softmax.cu", [
        ("void ggml_cuda_op_soft_max(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {\n", CUDA_SOFT_MAX_ROWS),
        ("    const bool use_f16 = (src1 && src1->type == GGML_TYPE_F16);\n",
         "    if (ggml_get_op_params_i32(dst, 2) == 1 && max_bias == 0.0f && src2 == nullptr && ne00 > 0) {  /* set 50 */\n"
         "        const ggrad_soft_max_rows_shape s = {(int) ne00, nrows_x, src0->ne[1], src0->ne[2],\n"
         "            src1 ? src1->ne[2] : 1, src1 ? src1->ne[3] : 1, src1 ? (int64_t) src1->nb[1] : 0,\n"
         "            src1 ? (int64_t) src1->nb[2] : 0, src1 ? (int64_t) src1->nb[3] : 0, scale};\n"
         "        if (src1 && src1->type == GGML_TYPE_F16 ? ggrad_soft_max_by_rows(src0_d, (const half *) src1_d, dst_d, s, stream)\n"
         "                                                : ggrad_soft_max_by_rows(src0_d, (const float *) src1_d, dst_d, s, stream)) {\n"
         "            return;\n        }\n    }\n"
         "    const bool use_f16 = (src1 && src1->type == GGML_TYPE_F16);\n"),
    ])
    _patch_file(cuda / "binbcast.cu", [
        ("static __device__ __forceinline__ float op_div(const float a, const float b) {\n    return a / b;\n}\n",
         "static __device__ __forceinline__ float op_div(const float a, const float b) {\n    return a / b;\n}\n" + CUDA_BIN_X4),
        *((f"void ggml_cuda_op_{name}(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {{\n",
           f"void ggml_cuda_op_{name}(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {{\n"
           f"    if (ggml_get_op_params_i32(dst, 0) == 1 && ggrad_bin_x4<op_{name}>(dst, ctx.stream())) {{  /* {MARK}: set 58 */\n"
           "        return;\n    }\n")
          for name in ("add", "sub", "mul", "div")),
        ("template <typename T>\nstatic void repeat_back_cuda(", CUDA_REPEAT_BACK),
        ("    const int64_t ne0, const int64_t ne1, const int64_t ne2, const int64_t ne3, cudaStream_t stream) {\n\n"
         "    const dim3 block_dims(WARP_SIZE, 1, 1);\n    const dim3 block_nums((ne0 + WARP_SIZE - 1) / WARP_SIZE, ne1, ne2*ne3);\n"
         "    k_repeat_back<T><<<block_nums, block_dims, 0, stream>>>\n"
         "        (src, dst, ne00, ne01, ne02, ne03, s00, s01, s02, s03, ne0, ne1, ne2, ne3);\n",
         "    const int64_t ne0, const int64_t ne1, const int64_t ne2, const int64_t ne3, ggml_backend_cuda_context & ctx,\n"
         "    const bool may_split) {\n\n"
         "    cudaStream_t stream = ctx.stream();\n"
         "    const int64_t outer = (ne01/ne1)*(ne02/ne2)*(ne03/ne3);  /* split between blocks, then threads along y */\n"
         "    const int64_t xblocks = (ne0 + WARP_SIZE - 1) / WARP_SIZE;\n"
         "    const int splits = may_split ? ggrad_repeat_back_splits(xblocks*ne1*ne2*ne3, outer, ggml_cuda_info().devices[ctx.device].nsm) : 1;\n"
         "    const int64_t n = ne0*ne1*ne2*ne3;\n"
         "    ggml_cuda_pool_alloc<float> partial(ctx.pool());\n"
         "    if (splits > 1) {\n        partial.alloc(splits*n);\n    }\n"
         "    const int per_split = (outer + splits - 1) / splits;\n"
         "    const dim3 block_dims(WARP_SIZE, per_split >= 256 ? 32 : per_split >= 32 ? 8 : 1, 1);\n"
         "    const dim3 block_nums(xblocks*splits, ne1, ne2*ne3);\n"
         "    k_repeat_back_rows<T><<<block_nums, block_dims, 0, stream>>>\n"
         "        (src, dst, partial.get(), splits, ne00, ne01, ne02, ne03, s00, s01, s02, s03, ne0, ne1, ne2, ne3);\n"
         "    if (splits > 1) {\n"
         "        k_repeat_back_splits<T><<<(n + 255) / 256, 256, 0, stream>>>(partial.get(), dst, n, splits);\n"
         "    }\n"),
        ("repeat_back_cuda(src0_d, dst_d, ne00, ne01, ne02, ne03, s00, s01, s02, s03, ne0, ne1, ne2, ne3, stream);",
         "repeat_back_cuda(src0_d, dst_d, ne00, ne01, ne02, ne03, s00, s01, s02, s03, ne0, ne1, ne2, ne3, ctx,\n"
         "                             ggml_get_op_params_i32(dst, 0) == 1);"),
    ])
    vk = src / "ggml-vulkan"
    for name in ("ggrad_ce.comp", "ggrad_adam_hyper.comp", "ggrad_ln_back.comp", "ggrad_cell.comp",
                 "ggrad_bn.comp", "ggrad_bn_split.comp", "ggrad_pool.comp", "ggrad_fold.comp", "ggrad_running.comp",
                 "ggrad_class_total.comp",
                 "ggrad_adamw_group.comp", "ggrad_gemm.comp", "ggrad_gemm_wide.comp", "ggrad_qmatmul_back.comp",
                 "ggrad_ieee.glsl"):
        shutil.copy(SOURCES / name, vk / "vulkan-shaders" / name)
    for name in ("ggrad_adamw.h", "ggrad_cell.h", "ggrad_bn.h", "ggrad_ce.h", "ggrad_gemm.h", "ggrad_pool.h"):
        shutil.copy(SOURCES / name, vk / name)
    # REPEAT_BACK with threads per output: ggrad_repeat_back.comp replaces ggml's shader (set 37)
    repeat_back = vk / "vulkan-shaders" / "repeat_back.comp"
    if MARK not in repeat_back.read_text() and "    // Accumulate from sources\n" not in repeat_back.read_text():
        raise SystemExit(f"{repeat_back.name}: not the shader ggrad_repeat_back.comp replaces")
    shutil.copy(SOURCES / "ggrad_repeat_back.comp", repeat_back)
    _patch_file(vk / "vulkan-shaders" / "vulkan-shaders-gen.cpp", [
        ('    string_to_spv("silu_back_f32",  "silu_back.comp",   {{"A_TYPE", "float"}, {"B_TYPE", "float"}, {"D_TYPE", "float"}});\n',
         '    string_to_spv("silu_back_f32",  "silu_back.comp",   {{"A_TYPE", "float"}, {"B_TYPE", "float"}, {"D_TYPE", "float"}});\n'
         f'    string_to_spv("ggrad_ce_f32", "ggrad_ce.comp", {{}}); // {MARK}\n'
         '    string_to_spv("ggrad_ce_back_f32", "ggrad_ce.comp", {{"BACK", "1"}});\n'
         '    string_to_spv("ggrad_adam_hyper_f32", "ggrad_adam_hyper.comp", {});\n'
         '    string_to_spv("ggrad_class_total_f32", "ggrad_class_total.comp", {});\n'
         '    string_to_spv("ggrad_ln_back_f32", "ggrad_ln_back.comp", {});\n'
         '    string_to_spv("ggrad_cell_f32", "ggrad_cell.comp", {});\n'
         '    string_to_spv("ggrad_cell_back_f32", "ggrad_cell.comp", {{"BACK", "1"}});\n'
         '    string_to_spv("ggrad_bn_stats_f32", "ggrad_bn.comp", {{"STATS", "1"}});\n'
         '    string_to_spv("ggrad_bn_apply_f32", "ggrad_bn.comp", {{"APPLY", "1"}});\n'
         '    string_to_spv("ggrad_bn_back_f32", "ggrad_bn.comp", {{"BACK", "1"}});\n'
         '    string_to_spv("ggrad_bn_stats_parts_f32", "ggrad_bn_split.comp", {{"STATS_PARTS", "1"}});\n'
         '    string_to_spv("ggrad_bn_stats_join_f32", "ggrad_bn_split.comp", {{"STATS_JOIN", "1"}});\n'
         '    string_to_spv("ggrad_bn_back_parts_f32", "ggrad_bn_split.comp", {{"BACK_PARTS", "1"}});\n'
         '    string_to_spv("ggrad_bn_back_apply_f32", "ggrad_bn_split.comp", {{"BACK_APPLY", "1"}});\n'
         '    string_to_spv("ggrad_pool_f32", "ggrad_pool.comp", {});\n'
         '    string_to_spv("ggrad_pool_back_f32", "ggrad_pool.comp", {{"BACK", "1"}});\n'
         '    string_to_spv("ggrad_fold_f32", "ggrad_fold.comp", {});\n'
         '    string_to_spv("ggrad_running_f32", "ggrad_running.comp", {});\n'
         '    string_to_spv("ggrad_adamw_group_f32", "ggrad_adamw_group.comp", {});\n'
         '    string_to_spv("ggrad_gemm_f32", "ggrad_gemm.comp", {});\n'
         + "".join(f'    string_to_spv("ggrad_gemm_{tm}x{tn}_f32", "ggrad_gemm_wide.comp", {{{{"TM", "{tm}u"}}, {{"TN", "{tn}u"}}}});\n'
                   for tm, tn in (tile.split("x") for tile in GEMM_WIDE_TILES))),
    ])
    _patch_file(vk / "vulkan-shaders" / "vulkan-shaders-gen.cpp", [
        ('        string_to_spv("get_rows_" + tname + "_f32", shader, merge_maps(base_dict, {{"TEMP_TYPE", "FLOAT_TYPE"}, '
         '{data_a_key, "1"}, {"B_TYPE", "int"}, {"D_TYPE", "float"}}));\n',
         '        string_to_spv("get_rows_" + tname + "_f32", shader, merge_maps(base_dict, {{"TEMP_TYPE", "FLOAT_TYPE"}, '
         '{data_a_key, "1"}, {"B_TYPE", "int"}, {"D_TYPE", "float"}}));\n'
         f'        if ({QMATMUL_BACK_TEST}) {{  // {MARK}: quantized backward\n'
         '            string_to_spv("ggrad_qmatmul_back_" + tname, "ggrad_qmatmul_back.comp", merge_maps(base_dict, {{data_a_key, "1"}}));\n'
         '        }\n'),
    ], mark=MARK + ": quantized backward")
    _patch_file(vk / "vulkan-shaders" / "unary.comp", [
        ("float op_relu(float x) {\n    return max(x, 0.0f);",
         f"float op_relu(float x) {{ // {MARK}\n    return ggrad_negative(x) ? 0.0f : x;"),
        ("    return max(x, 0.0f) + min(x, 0.0f) * p.param1;", "    return x > 0.0f ? x : x * p.param1;"),
        ('#include "generic_unary_head.glsl"\n', '#include "generic_unary_head.glsl"\n' + IEEE_INCLUDE),
        ("float op_sqrt(float x) {\n    return sqrt(x);", "float op_sqrt(float x) {\n    return ggrad_sqrt(x);"),
    ])
    _patch_file(vk / "vulkan-shaders" / "silu_back.comp", [
        ('#include "types.glsl"\n', '#include "types.glsl"\n' + IEEE_INCLUDE),
        ("    const float xi = float(data_x[i]);",
         "    const float xi = float(data_x[i]);  // modes in p.param1\n"
         f"    if (p.param1 == {RELU_BACK}.0f) {{\n"
         "        data_d[i] = D_TYPE(ggrad_at_most_zero(xi) ? 0.0f : float(data_g[i]));\n        return;\n    }\n"
         f"    if (p.param1 == {LEAKY_RELU_BACK}.0f) {{\n"
         "        data_d[i] = D_TYPE(ggrad_positive(xi) ? float(data_g[i]) : float(data_g[i]) * p.param2);\n"
         "        return;\n    }"),
    ])
    _patch_file(vk / "vulkan-shaders" / "opt_step_adamw.comp", [  # its exact form (patch_ggml_adamw.py)
        ('#include "types.glsl"\n', '#include "types.glsl"\n' + IEEE_INCLUDE),
        ("        x_i = x_i - params[5]*(m_i/(sqrt(v_i)/params[6] + params[3]));\n",
         "        x_i = x_i - params[5]*ggrad_divide(m_i, ggrad_divide(ggrad_sqrt(v_i), params[6]) + params[3]);\n"),
    ])
    _patch_file(vk / "vulkan-shaders" / "div.comp", [
        ('#include "generic_binary_head.glsl"\n', '#include "generic_binary_head.glsl"\n' + IEEE_INCLUDE),
        ("D_TYPE(FLOAT_TYPE(data_a[get_aoffset() + src0_idx(i00, i01, i02, i03)]) / "
         "FLOAT_TYPE(data_b[get_boffset() + src1_idx(i00, i01, i02, i03)]))",
         "D_TYPE(ggrad_divide(FLOAT_TYPE(data_a[get_aoffset() + src0_idx(i00, i01, i02, i03)]), "
         "FLOAT_TYPE(data_b[get_boffset() + src1_idx(i00, i01, i02, i03)])))"),
    ])
    _patch_file(vk / "ggml-vulkan.cpp", [
        # a graph may start while the graphs before it still run (ggrad does not wait for
        # each): ggml-vulkan orders nodes by lists of the unsynchronized ones, which it empties
        # only when the host waits, so they still named the earlier graphs' tensors, whose
        # structs ggrad may have freed (an eager op's graph) or re-pointed (a replay's slots)
        # since: the check read stale memory and could leave out a barrier. One barrier after
        # everything submitted before, and empty lists, order each graph after the last
        # whatever its tensors.
        ("    ctx->prealloc_y_last_pipeline_used = nullptr;\n    ctx->prealloc_y_last_tensor_used = nullptr;\n"
         "    ctx->prealloc_y_last_decode_vector_staging = false;\n\n    if (ctx->prealloc_size_add_rms_partials) {\n",
         f"    if (ctx->submit_pending || !ctx->unsynced_nodes_written.empty() || !ctx->unsynced_nodes_read.empty()) {{  // {MARK}\n"
         "        vk_context first = ggml_vk_get_compute_ctx(ctx);\n"
         "        ggml_vk_sync_buffers(ctx, first);\n"
         "        ctx->unsynced_nodes_written.clear();\n"
         "        ctx->unsynced_nodes_read.clear();\n"
         "    }\n\n"
         "    ctx->prealloc_y_last_pipeline_used = nullptr;\n    ctx->prealloc_y_last_tensor_used = nullptr;\n"
         "    ctx->prealloc_y_last_decode_vector_staging = false;\n\n    if (ctx->prealloc_size_add_rms_partials) {\n"),
        # GGML_VK_PERF_LOGGER names ggrad's nodes by kernel, a GEMM by its tile, sizes and FLOPs
        ("class vk_perf_logger {\n", f'#include "ggrad_gemm.h"  // {MARK}: the perf logger\n\nclass vk_perf_logger {{\n'),
        ("        if (node->op == GGML_OP_UNARY) {\n            return fusion_str + ggml_unary_op_name(ggml_get_unary_op(node));\n"
         "        }\n",
         "        if (node->op == GGML_OP_UNARY) {\n            return fusion_str + ggml_unary_op_name(ggml_get_unary_op(node));\n"
         f"        }}\n        if (node->op == GGML_OP_GGRAD) {{  // {MARK}\n"
         "            const int kernel = ggml_get_op_params_i32(node, 0);\n"
         '            std::string name = fusion_str + "GGRAD " + std::to_string(kernel);\n'
         "            ggrad_gemm_shape s;\n"
         "            if (kernel == 6 && ggrad_gemm_plan(node, &s)) {\n"
         '                name += " tile=" + std::to_string(ggml_get_op_params_i32(node, 4)) + " m=" + std::to_string(s.M) +\n'
         '                        " n=" + std::to_string(s.N) + " k=" + std::to_string(s.K) + " batch=" + std::to_string(s.b2*s.b3);\n'
         "                *n_flops = 2 * (uint64_t) s.M * s.N * s.K * s.b2 * s.b3;\n"
         "            }\n            return name;\n        }\n"),
        ("GGML_OP_SILU_BACK, { (uint32_t)ggml_nelements(src0), 0, 0.0f, 0.0f, 0.0f, 0.0f });\n}\n",
         "GGML_OP_SILU_BACK, { (uint32_t)ggml_nelements(src0), 0,\n"
         f"        (float)ggml_get_op_params_i32(dst, 0), ggml_get_op_params_f32(dst, 1), 0.0f, 0.0f }}); /* {MARK} */\n}}\n"
         + VULKAN_DISPATCH),
        ("    vk_pipeline pipeline_silu_back_f32;\n",
         "    vk_pipeline pipeline_silu_back_f32;\n"
         "    vk_pipeline pipeline_ggrad_ce_f32, pipeline_ggrad_ce_back_f32, pipeline_ggrad_adam_hyper_f32;\n"
         "    vk_pipeline pipeline_ggrad_ln_back_f32, pipeline_ggrad_cell_f32, pipeline_ggrad_cell_back_f32;\n"
         "    vk_pipeline pipeline_ggrad_bn_stats_f32, pipeline_ggrad_bn_apply_f32, pipeline_ggrad_bn_back_f32;\n"
         "    vk_pipeline pipeline_ggrad_bn_stats_parts_f32, pipeline_ggrad_bn_stats_join_f32;\n"
         "    vk_pipeline pipeline_ggrad_bn_back_parts_f32, pipeline_ggrad_bn_back_apply_f32;\n"
         "    vk_pipeline pipeline_ggrad_pool_f32, pipeline_ggrad_pool_back_f32, pipeline_ggrad_fold_f32;\n"
         "    vk_pipeline pipeline_ggrad_running_f32, pipeline_ggrad_adamw_group_f32, pipeline_ggrad_gemm_f32;\n"
         "    vk_pipeline pipeline_ggrad_class_total_f32;\n"
         "    vk_pipeline pipeline_ggrad_gemm_wide_f32[3];\n"
         "    vk_pipeline pipeline_ggrad_qmatmul_back[GGML_TYPE_COUNT];\n"),
        ("struct vk_op_push_constants {\n",
         "struct vk_op_ggrad_push_constants {\n    uint32_t C, N, x_stride, t_stride, d_stride, o_stride;\n"
         "    uint32_t x_off, t_off, d_off, w_off, o_off;\n    int32_t ignore_index;\n    float keep, spread;\n"
         "    uint32_t has_w;\n};\n\nstruct vk_op_push_constants {\n"),
        ('"silu_back_f32", silu_back_f32_len, silu_back_f32_data, "main", 3, sizeof(vk_op_push_constants), {512, 1, 1}, {}, 1);\n',
         '"silu_back_f32", silu_back_f32_len, silu_back_f32_data, "main", 3, sizeof(vk_op_push_constants), {512, 1, 1}, {}, 1);\n'
         '    ggml_vk_create_pipeline(device, device->pipeline_ggrad_ce_f32, "ggrad_ce_f32", ggrad_ce_f32_len, ggrad_ce_f32_data, '
         '"main", 4, sizeof(vk_op_ggrad_push_constants), {1, 1, 1}, {}, 1);\n'
         '    ggml_vk_create_pipeline(device, device->pipeline_ggrad_ce_back_f32, "ggrad_ce_back_f32", ggrad_ce_back_f32_len, '
         'ggrad_ce_back_f32_data, "main", 5, sizeof(vk_op_ggrad_push_constants), {1, 1, 1}, {}, 1);\n'
         '    ggml_vk_create_pipeline(device, device->pipeline_ggrad_adam_hyper_f32, "ggrad_adam_hyper_f32", '
         'ggrad_adam_hyper_f32_len, ggrad_adam_hyper_f32_data, "main", 5, 6 * sizeof(uint32_t), {1, 1, 1}, {}, 1);\n'
         '    ggml_vk_create_pipeline(device, device->pipeline_ggrad_class_total_f32, "ggrad_class_total_f32", '
         'ggrad_class_total_f32_len, ggrad_class_total_f32_data, "main", 2, 5 * sizeof(uint32_t), {1, 1, 1}, {}, 1);\n'
         '    ggml_vk_create_pipeline(device, device->pipeline_ggrad_ln_back_f32, "ggrad_ln_back_f32", '
         'ggrad_ln_back_f32_len, ggrad_ln_back_f32_data, "main", 3, 9 * sizeof(uint32_t), {1, 1, 1}, {}, 1);\n'
         '    ggml_vk_create_pipeline(device, device->pipeline_ggrad_cell_f32, "ggrad_cell_f32", '
         'ggrad_cell_f32_len, ggrad_cell_f32_data, "main", 5, 13 * sizeof(uint32_t), {256, 1, 1}, {}, 1);\n'
         '    ggml_vk_create_pipeline(device, device->pipeline_ggrad_cell_back_f32, "ggrad_cell_back_f32", '
         'ggrad_cell_back_f32_len, ggrad_cell_back_f32_data, "main", 5, 13 * sizeof(uint32_t), {256, 1, 1}, {}, 1);\n'
         '    ggml_vk_create_pipeline(device, device->pipeline_ggrad_bn_stats_f32, "ggrad_bn_stats_f32", '
         'ggrad_bn_stats_f32_len, ggrad_bn_stats_f32_data, "main", 6, 12 * sizeof(uint32_t), {1, 1, 1}, {}, 1);\n'
         '    ggml_vk_create_pipeline(device, device->pipeline_ggrad_bn_apply_f32, "ggrad_bn_apply_f32", '
         'ggrad_bn_apply_f32_len, ggrad_bn_apply_f32_data, "main", 6, 12 * sizeof(uint32_t), {1, 1, 1}, {}, 1);\n'
         '    ggml_vk_create_pipeline(device, device->pipeline_ggrad_bn_back_f32, "ggrad_bn_back_f32", '
         'ggrad_bn_back_f32_len, ggrad_bn_back_f32_data, "main", 6, 12 * sizeof(uint32_t), {1, 1, 1}, {}, 1);\n'
         '    ggml_vk_create_pipeline(device, device->pipeline_ggrad_bn_stats_parts_f32, "ggrad_bn_stats_parts_f32", '
         'ggrad_bn_stats_parts_f32_len, ggrad_bn_stats_parts_f32_data, "main", 7, 14 * sizeof(uint32_t), {1, 1, 1}, {}, 1);\n'
         '    ggml_vk_create_pipeline(device, device->pipeline_ggrad_bn_stats_join_f32, "ggrad_bn_stats_join_f32", '
         'ggrad_bn_stats_join_f32_len, ggrad_bn_stats_join_f32_data, "main", 7, 14 * sizeof(uint32_t), {256, 1, 1}, {}, 1);\n'
         '    ggml_vk_create_pipeline(device, device->pipeline_ggrad_bn_back_parts_f32, "ggrad_bn_back_parts_f32", '
         'ggrad_bn_back_parts_f32_len, ggrad_bn_back_parts_f32_data, "main", 7, 14 * sizeof(uint32_t), {1, 1, 1}, {}, 1);\n'
         '    ggml_vk_create_pipeline(device, device->pipeline_ggrad_bn_back_apply_f32, "ggrad_bn_back_apply_f32", '
         'ggrad_bn_back_apply_f32_len, ggrad_bn_back_apply_f32_data, "main", 7, 14 * sizeof(uint32_t), {1, 1, 1}, {}, 1);\n'
         '    ggml_vk_create_pipeline(device, device->pipeline_ggrad_pool_f32, "ggrad_pool_f32", '
         'ggrad_pool_f32_len, ggrad_pool_f32_data, "main", 3, 16 * sizeof(uint32_t), {256, 1, 1}, {}, 1);\n'
         '    ggml_vk_create_pipeline(device, device->pipeline_ggrad_pool_back_f32, "ggrad_pool_back_f32", '
         'ggrad_pool_back_f32_len, ggrad_pool_back_f32_data, "main", 3, 16 * sizeof(uint32_t), {256, 1, 1}, {}, 1);\n'
         '    ggml_vk_create_pipeline(device, device->pipeline_ggrad_fold_f32, "ggrad_fold_f32", '
         'ggrad_fold_f32_len, ggrad_fold_f32_data, "main", 2, 16 * sizeof(uint32_t), {256, 1, 1}, {}, 1);\n'
         '    ggml_vk_create_pipeline(device, device->pipeline_ggrad_running_f32, "ggrad_running_f32", '
         'ggrad_running_f32_len, ggrad_running_f32_data, "main", 4, 9 * sizeof(uint32_t), {256, 1, 1}, {}, 1);\n'
         '    ggml_vk_create_pipeline(device, device->pipeline_ggrad_adamw_group_f32, "ggrad_adamw_group_f32", '
         'ggrad_adamw_group_f32_len, ggrad_adamw_group_f32_data, "main", 9, 11 * sizeof(uint32_t), {256, 1, 1}, {}, 1);\n'
         '    ggml_vk_create_pipeline(device, device->pipeline_ggrad_gemm_f32, "ggrad_gemm_f32", '
         'ggrad_gemm_f32_len, ggrad_gemm_f32_data, "main", 4, 19 * sizeof(uint32_t), {1, 1, 1}, {}, 1);\n'
         + "".join(f'    ggml_vk_create_pipeline(device, device->pipeline_ggrad_gemm_wide_f32[{i}], "ggrad_gemm_{tile}_f32", '
                   f'ggrad_gemm_{tile}_f32_len, ggrad_gemm_{tile}_f32_data, "main", 4, 19 * sizeof(uint32_t), {{1, 1, 1}}, {{}}, 1);\n'
                   for i, tile in enumerate(GEMM_WIDE_TILES))
         + "".join(f'    ggml_vk_create_pipeline(device, device->pipeline_ggrad_qmatmul_back[GGML_TYPE_{name.upper()}], '
                   f'"ggrad_qmatmul_back_{name}", ggrad_qmatmul_back_{name}_len, ggrad_qmatmul_back_{name}_data, '
                   f'"main", 3, 7 * sizeof(uint32_t), {{1, 1, 1}}, {{}}, 1);\n' for name in QMATMUL_BACK_TYPES)),
        ("    case GGML_OP_SILU_BACK:\n        ggml_vk_silu_back(ctx, compute_ctx, src0, src1, node);\n\n        break;\n",
         "    case GGML_OP_SILU_BACK:\n        ggml_vk_silu_back(ctx, compute_ctx, src0, src1, node);\n\n        break;\n"
         "    case GGML_OP_GGRAD:\n        ggml_vk_ggrad(ctx, compute_ctx, node);\n\n        break;\n"),
        ("        case GGML_OP_SILU_BACK:\n        case GGML_OP_RMS_NORM_BACK:\n",
         "        case GGML_OP_GGRAD:\n            return ggml_vk_ggrad_supported(op);\n"
         "        case GGML_OP_SILU_BACK:\n        case GGML_OP_RMS_NORM_BACK:\n"),
        # a source written in place is checked and recorded as a write, so that the nodes
        # before it still reading it, and any after it that read it, are synchronized with
        # it (ggrad's graphs read no target of an in-place write after it: the lazy engine
        # runs the write first; this keeps ggml-vulkan's ordering right by itself)
        ("            for (uint32_t j = 0; j < GGML_MAX_SRC; ++j) {\n                if (!cur_node->src[j]) {\n"
         "                    continue;\n                }\n"
         "                if (overlaps_unsynced(cur_node->src[j], ctx->unsynced_nodes_written)) {\n",
         "            for (uint32_t j = 0; j < GGML_MAX_SRC; ++j) {\n                if (!cur_node->src[j]) {\n"
         "                    continue;\n                }\n"
         f"                if (ggml_vk_ggrad_writes_source(cur_node, j) && /* {MARK} */\n"
         "                    overlaps_unsynced(cur_node->src[j], ctx->unsynced_nodes_read)) {\n"
         "                    need_sync = true;\n                    break;\n                }\n"
         "                if (overlaps_unsynced(cur_node->src[j], ctx->unsynced_nodes_written)) {\n"),
        # REPEAT_BACK's lanes (ggrad_repeat_back.comp): its dispatch has lanes threads per output
        ("template<typename PC>\nstatic void ggml_vk_op_f32(",
         VULKAN_REPEAT_BACK_LANES + "template<typename PC>\nstatic void ggml_vk_op_f32("),
        ("                ne = CEIL_DIV(ne, ggml_blck_size(dst->type));\n            }\n            if (ne > 262144) {\n",
         "                ne = CEIL_DIV(ne, ggml_blck_size(dst->type));\n            }\n"
         f"            if (op == GGML_OP_REPEAT_BACK) {{  /* {MARK} */\n"
         "                ne = CEIL_DIV(ne, 512 / ggrad_repeat_back_lanes(src0, dst)) * 512;\n            }\n"
         "            if (ne > 262144) {\n"),
        ("    vk_op_unary_push_constants p = vk_op_unary_push_constants_init(src0, dst, ggml_nelements(dst));\n"
         "    ggml_vk_op_f32(ctx, subctx, src0, nullptr, nullptr, nullptr, dst, GGML_OP_REPEAT_BACK, std::move(p));\n",
         "    vk_op_unary_push_constants p = vk_op_unary_push_constants_init(src0, dst, ggml_nelements(dst));\n"
         f"    p.param1 = (float) ggrad_repeat_back_lanes(src0, dst);  /* {MARK} */\n"
         "    ggml_vk_op_f32(ctx, subctx, src0, nullptr, nullptr, nullptr, dst, GGML_OP_REPEAT_BACK, std::move(p));\n"),
        # split-k counts a batched product's tiles: it split every batch of a (512 x 256) x 2048
        # product 8 ways (5.5 ms on an H100 where the unsplit product takes 0.5 ms), and a
        # split-k buffer past the storage range is an abort
        ("    const uint32_t split_k = ggml_vk_guess_split_k(ctx, ne01, ne11, ne10, disable_split_k, pipeline);\n",
         f"    const uint32_t split_k = ggml_vk_guess_split_k(ctx, ne01, /* {MARK}: the batch's tiles too */\n"
         "        (uint32_t) std::min<int64_t>(ne11 * ne12 * ne13, UINT32_MAX), ne10, disable_split_k, pipeline);\n"),
        ("                ctx->unsynced_nodes_read.push_back(cur_node->src[j]);\n",
         "                ctx->unsynced_nodes_read.push_back(cur_node->src[j]);\n"
         f"                if (ggml_vk_ggrad_writes_source(cur_node, j)) {{  /* {MARK} */\n"
         "                    ctx->unsynced_nodes_written.push_back(cur_node->src[j]);\n                }\n"),
    ])


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    patch(Path(sys.argv[1]))
