// ggrad's kernels on CUDA: GGML_OP_GGRAD, the kernel in op_params[0]; the CPU's
// ggrad_cpu.inc says what each computes. One warp per row of logits.
#include "ggrad.cuh"
#include "ggrad_adamw.h"
#include "ggrad_bn.h"
#include "ggrad_ce.h"
#include "ggrad_cell.h"
#include "ggrad_gemm.h"
#include "ggrad_pool.h"
#include "ggrad_softmax.h"
#include "ggrad_attention.cuh"
#include "convert.cuh"

#include <cublasLt.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

// the row's max and sum of exp(x - max), reduced over the warp in a fixed order
static __device__ __forceinline__ float2 ggrad_row_stats(const float * row, const int C) {
    float m = -INFINITY;
    for (int c = threadIdx.x; c < C; c += WARP_SIZE) {
        m = fmaxf(m, row[c]);
    }
    m = warp_reduce_max(m);
    float s = 0.0f;
    for (int c = threadIdx.x; c < C; c += WARP_SIZE) {
        s += expf(row[c] - m);
    }
    return make_float2(m, warp_reduce_sum(s));
}

static __global__ void ggrad_class_ce_f32(const float * x, const int64_t row_stride, const int32_t * t,
                                          const int64_t t_stride, const float * wc, float * per, const int C,
                                          const int64_t N, const int32_t ignore, const float keep,
                                          const float spread) {
    const int64_t i = blockIdx.x;
    const float * row = x + i*row_stride;
    const int32_t ti = t[i*t_stride];
    if (ti == ignore || ti < 0 || ti >= C) {
        if (threadIdx.x == 0) {
            per[i] = 0.0f;
            per[N + i] = 0.0f;
        }
        return;
    }
    const float2 ms = ggrad_row_stats(row, C);
    const float ls = logf(ms.y);
    float sum = 0.0f;
    if (spread != 0.0f) {
        for (int c = threadIdx.x; c < C; c += WARP_SIZE) {
            const float lp = (row[c] - ms.x) - ls;
            sum += wc ? lp*wc[c] : lp;
        }
        sum = warp_reduce_sum(sum);
    }
    if (threadIdx.x == 0) {
        const float wt = wc ? wc[ti] : 1.0f;
        float loss = ls - (row[ti] - ms.x);
        if (wc) {
            loss = loss*wt;
        }
        if (spread != 0.0f) {
            loss = loss*keep + (-sum)*spread;
        }
        per[i] = loss;
        per[N + i] = wt;
    }
}

static __global__ void ggrad_class_ce_back_f32(const float * x, const int64_t row_stride, const int32_t * t,
                                               const int64_t t_stride, const float * d, const int64_t d_stride,
                                               const float * wc, float * out, const int64_t out_stride, const int C,
                                               const int32_t ignore, const float keep, const float spread) {
    const int64_t i = blockIdx.x;
    const float * row = x + i*row_stride;
    float * o = out + i*out_stride;
    const int32_t ti = t[i*t_stride];
    const float2 ms = ggrad_row_stats(row, C);
    if (ti == ignore || ti < 0 || ti >= C) {  // torch's 0 - softmax * 0: NaN where the softmax is
        for (int c = threadIdx.x; c < C; c += WARP_SIZE) {
            o[c] = 0.0f - expf(row[c] - ms.x)/ms.y*0.0f;
        }
        return;
    }
    float W = (float) C;
    if (wc && spread != 0.0f) {
        float sum = 0.0f;
        for (int c = threadIdx.x; c < C; c += WARP_SIZE) {
            sum += wc[c];
        }
        W = warp_reduce_sum(sum);
    }
    const float inv = 1.0f/ms.y;
    const float di = d[i*d_stride];
    const float g = wc ? di*wc[ti] : di;
    for (int c = threadIdx.x; c < C; c += WARP_SIZE) {
        const float p = expf(row[c] - ms.x)*inv;
        float grad = g*(p - (c == ti ? 1.0f : 0.0f));
        if (spread != 0.0f) {
            grad = grad*keep + di*spread*(W*p - (wc ? wc[c] : 1.0f));
        }
        o[c] = grad;
    }
}

// Adam's per-step constants (ggrad_cpu.inc): round-to-nearest intrinsics, never fused
// (c1, c2 into `corrections`: h + 9, or c itself in place, read before)
static __global__ void ggrad_adam_hyper_f32(const float * c, const float * lr, const float * k, const float * in,
                                            float * h, float * corrections) {
    const float c1 = __fadd_rn(__fmul_rn(c[0], k[0]), in[0]);
    const float c2 = __fadd_rn(__fmul_rn(c[1], k[1]), in[1]);
    h[0] = lr[0]; h[1] = k[0]; h[2] = k[1]; h[3] = k[2]; h[4] = k[3];
    h[5] = __fdiv_rn(lr[0], c1); h[6] = __fsqrt_rn(c2); h[7] = in[0]; h[8] = in[1];
    corrections[0] = c1; corrections[1] = c2;
}

// a sum over the block, the same on every thread; shared holds a value per warp
template <int block_size>
static __device__ __forceinline__ float ggrad_block_sum(float v, float * shared) {
    v = warp_reduce_sum(v);
    if (block_size > WARP_SIZE) {
        const int lane = threadIdx.x % WARP_SIZE;
        __syncthreads();  // the last call's readers are done with shared
        if (lane == 0) {
            shared[threadIdx.x / WARP_SIZE] = v;
        }
        __syncthreads();
        v = warp_reduce_sum(lane < block_size / WARP_SIZE ? shared[lane] : 0.0f);
    }
    return v;
}

// the cross-entropy's reduction (kernel 32; ggrad_cpu.inc): one block sums both rows, the
// quotients rounded as IEEE's (no fast math)
static __global__ void ggrad_class_total_f32(const float * both, const int64_t stride, const int n, const bool mean,
                                             float * out) {
    __shared__ float shared[32];
    float losses = 0.0f;
    float weights = 0.0f;
    for (int i = threadIdx.x; i < n; i += 256) {
        losses += both[i];
        weights += both[stride + i];
    }
    losses = ggrad_block_sum<256>(losses, shared);
    weights = ggrad_block_sum<256>(weights, shared);
    if (threadIdx.x == 0) {
        out[0] = mean ? __fdiv_rn(losses, weights) : losses;
        out[1] = weights;
        out[2] = mean ? __fdiv_rn(1.0f, weights) : 1.0f;
    }
}

// a row's mean and 1/sqrt(variance + eps) over the block: the mean, then the squared deviations
// summed (ggml-cuda's NORM takes the variance as E[x^2] - mean^2)
template <int block_size>
static __device__ __forceinline__ float2 ggrad_row_mean_rstd(const float * xr, const int D, const float eps, float * shared) {
    float sum = 0.0f;
    for (int c = threadIdx.x; c < D; c += block_size) {
        sum += xr[c];
    }
    const float mean = ggrad_block_sum<block_size>(sum, shared)/D;
    float sum2 = 0.0f;
    for (int c = threadIdx.x; c < D; c += block_size) {
        const float v = xr[c] - mean;
        sum2 += v*v;
    }
    return make_float2(mean, 1.0f/sqrtf(ggrad_block_sum<block_size>(sum2, shared)/D + eps));
}

// LayerNorm's gradient through the normalization (ggrad_cpu.inc): one block per row. With a
// weight (kernel 31) the gradient is of xhat * w + b: dx is kernel 4's over g * w, and where gx
// is given it takes the row's g * xhat (the weight's gradient is their sum over rows)
template <int block_size>
static __global__ void ggrad_layer_norm_back_f32(const float * x, const int64_t x_stride, const float * g,
                                                 const int64_t g_stride, const float * w, float * out,
                                                 const int64_t out_stride, float * gx, const int D, const float eps) {
    __shared__ float shared[block_size / WARP_SIZE];
    const int64_t i = blockIdx.x;
    const float * xr = x + i*x_stride;
    const float * gr = g + i*g_stride;
    float * o = out + i*out_stride;
    const float2 stats = ggrad_row_mean_rstd<block_size>(xr, D, eps, shared);
    const float mean = stats.x, rstd = stats.y;
    float sg = 0.0f;
    float sgx = 0.0f;
    for (int c = threadIdx.x; c < D; c += block_size) {
        const float gc = w != nullptr ? __fmul_rn(gr[c], w[c]) : gr[c];
        sg  += gc;
        sgx += gc*((xr[c] - mean)*rstd);
    }
    const float mg  = ggrad_block_sum<block_size>(sg, shared)/D;
    const float mgx = ggrad_block_sum<block_size>(sgx, shared)/D;
    for (int c = threadIdx.x; c < D; c += block_size) {
        const float xh = (xr[c] - mean)*rstd;
        const float gc = w != nullptr ? __fmul_rn(gr[c], w[c]) : gr[c];
        o[c] = rstd*(gc - mg - xh*mgx);
        if (gx != nullptr) {
            gx[i*out_stride + c] = __fmul_rn(gr[c], xh);
        }
    }
}

// LayerNorm with its affine (kernel 30, ggrad_cpu.inc): one block per row, the normalized value,
// its product with the weight and the sum with the bias each rounded apart (the composed NORM,
// MUL, ADD)
template <int block_size, typename dst_t>
static __global__ void ggrad_layer_norm_f32(const float * x, const int64_t x_stride, const float * w, const float * b,
                                            dst_t * out, const int64_t out_stride, const int D, const float eps) {
    __shared__ float shared[block_size / WARP_SIZE];
    const int64_t i = blockIdx.x;
    const float * xr = x + i*x_stride;
    dst_t * o = out + i*out_stride;
    const float2 stats = ggrad_row_mean_rstd<block_size>(xr, D, eps, shared);
    const float mean = stats.x, rstd = stats.y;
    for (int c = threadIdx.x; c < D; c += block_size) {
        float y = __fmul_rn(xr[c] - mean, rstd);
        if (w != nullptr) {
            y = __fmul_rn(y, w[c]);
        }
        o[c] = ggml_cuda_cast<dst_t>(b != nullptr ? __fadd_rn(y, b[c]) : y);  // as CPY converts (set 53)
    }
}

template <typename dst_t>
static void ggrad_launch_layer_norm(const ggml_tensor * x, const ggml_tensor * dst, dst_t * out, cudaStream_t stream) {
    const float eps = ggml_get_op_params_f32(dst, 1);
    const float * w = dst->src[1] != nullptr ? (const float *) dst->src[1]->data : nullptr;
    const float * b = dst->src[2] != nullptr ? (const float *) dst->src[2]->data : nullptr;
    const int C = (int) x->ne[0];
    const int64_t N = ggml_nrows(x), xs = x->nb[1]/sizeof(float), os = dst->nb[1]/sizeof(dst_t);
    if (C < 1024) {
        ggrad_layer_norm_f32<WARP_SIZE, dst_t><<<N, WARP_SIZE, 0, stream>>>((const float *) x->data, xs, w, b, out, os, C, eps);
    } else {
        ggrad_layer_norm_f32<256, dst_t><<<N, 256, 0, stream>>>((const float *) x->data, xs, w, b, out, os, C, eps);
    }
    CUDA_CHECK(cudaGetLastError());
}

// a float32 product (kernel 6, as the CPU's; ggrad_gemm.h reads the operands' layout): cuBLAS
// on the operands as they lie, a transposed view read with its transpose flag flipped (no
// copy). Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so cuBLAS takes B
// first. Batches of equal strides are one strided-batched call. The bias is added to C's
// rows after the product (the ADD node it replaces: the sum rounded once, after it).
// op_params[3] = 1 lets cuBLAS use TF32 ("high"), else float32 sums ("highest").
// Operands of float16 or bfloat16 (both one type: autocast's; set 46) are multiplied on the
// tensor cores with float32 sums into a float32 C (cublasGemmEx, CUBLAS_COMPUTE_32F): the
// products are exact, so only the order of the sums differs from a float32 product of the
// same values. C goes where dst's strides put it (set 58: ggrad_gemm_c_strides), as cuBLAS's
// leading dimension and batch steps: a product written into its part of a larger tensor.
static __global__ void ggrad_add_rows_f32(float * c, const float * bias, const int64_t n, const int64_t total) {
    const int64_t i = (int64_t) blockIdx.x*blockDim.x + threadIdx.x;
    if (i < total) {
        c[i] += bias[i % n];
    }
}

// an operand's step between C's batches along axis 2, in elements: 0 where it has one batch
// there (broadcast), -1 where its batches repeat (a_r2 > 1: no single step)
static int64_t ggrad_gemm_step(const ggml_tensor * t, const int64_t repeat) {
    return t->ne[2] == 1 ? 0 : repeat == 1 ? (int64_t) (t->nb[2]/ggml_type_size(t->type)) : -1;
}

// each of C's batches (i2, i3) its operands' and its own address, for one batched call over
// pointers (a strided batch needs one step between batches, which heads within rows and
// sequences across them do not share)
static __global__ void ggrad_gemm_batch_pointers(const char * a, const char * b, const char * c, const void ** pa,
        const void ** pb, const void ** pc, const int64_t batches, const int64_t b2, const int64_t a_r2, const int64_t a_r3,
        const int64_t b_r2, const int64_t b_r3, const size_t a_nb2, const size_t a_nb3, const size_t b_nb2,
        const size_t b_nb3, const size_t c_nb2, const size_t c_nb3) {
    const int64_t i = (int64_t) blockIdx.x*blockDim.x + threadIdx.x;
    if (i >= batches) {
        return;
    }
    const int64_t i2 = i % b2, i3 = i / b2;
    pa[i] = a + (i2/a_r2)*a_nb2 + (i3/a_r3)*a_nb3;
    pb[i] = b + (i2/b_r2)*b_nb2 + (i3/b_r3)*b_nb3;
    pc[i] = c + i2*c_nb2 + i3*c_nb3;
}

// the largest power of two, up to 16, that divides an address (cuBLASLt's heuristic assumes 256
// unless told). Capped at 16 as PyTorch's is: the heuristic's choice then depends on the shapes,
// not on where the allocator put the operands (ggml's allocator places them at 128-byte steps)
static uint32_t ggrad_alignment(const void * p) {
    uint32_t a = 16;
    while (a > 1 && (uintptr_t) p % a != 0) {
        a /= 2;
    }
    return a;
}

// C = op(A) op(B) (+ bias) as one cuBLASLt call: set 48's bias in its epilogue (PyTorch's Linear
// does the same), where cublasGemmEx and ggrad_add_rows_f32 were two kernels: the sum rounded,
// then the bias added and rounded, as the ADD node it replaces; set 49's `whole_k` takes the
// first of the heuristic's algorithms that does not split K, so a small product is one kernel
// (cuBLAS split mlp-small's 64 x 64 x 64 products and summed the parts in a second kernel).
// One product, no batches. False where it does not serve (the caller then runs its product
// and adds the bias itself): a bias not 16-byte aligned (the epilogue's loads; its heuristic
// has no preference for it), a bias with a cuBLASLt before CUDA 12.1 (PyTorch keeps its
// epilogue off there for known bugs), no such algorithm, or a failed call.
static bool ggrad_gemm_lt(ggml_backend_cuda_context & ctx, const ggrad_gemm_shape & s, ggml_tensor * dst,
                          const cudaDataType_t type, const cudaDataType_t c_type, const cublasComputeType_t compute,
                          const void * bias, const bool whole_k) {
#if CUDART_VERSION < 12010
    if (bias != nullptr) {
        return false;
    }
#endif
    if (bias != nullptr && (uintptr_t) bias % 16 != 0) {
        return false;
    }
    static cublasLtHandle_t handles[GGML_CUDA_MAX_DEVICES] = {};
    if (handles[ctx.device] == nullptr) {
        CUBLAS_CHECK(cublasLtCreate(&handles[ctx.device]));
    }
    const uint64_t M = s.M, N = s.N, K = s.K;
    const cublasOperation_t op_a = s.ta ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = s.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulDesc_t desc;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof(op_b)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof(op_a)));
    if (bias != nullptr) {
        const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
        if (c_type != CUDA_R_32F) {  // a low D (set 57): the bias stays float32, added before D's rounding
            const cudaDataType_t bias_type = CUDA_R_32F;
            CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
        }
    }
    // column-major, as cuBLAS: C^T (N x M) = op(B)^T op(A)^T, each operand described as it is stored
    cublasLtMatrixLayout_t lb, la, lc;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, type, s.tb ? K : N, s.tb ? N : K, s.b.ld));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, type, s.ta ? M : K, s.ta ? K : M, s.a.ld));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, c_type, N, M, s.c_ld));
    const size_t workspace = 4 << 20;
    const uint32_t align_b = ggrad_alignment(s.b.data), align_a = ggrad_alignment(s.a.data), align_c = ggrad_alignment(dst->data);
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_b, sizeof(align_b)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_a, sizeof(align_a)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof(align_c)));
    if (c_type != CUDA_R_32F) {  // a low D: split K's partial sums added in float32, never in D's type
        const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof(schemes)));
    }
    cublasLtMatmulHeuristicResult_t found[8];
    int count = 0;
    const cublasStatus_t asked = cublasLtMatmulAlgoGetHeuristic(handles[ctx.device], desc, lb, la, lc, lc, pref,
                                                                 whole_k ? 8 : 1, found, &count);
    int chosen = -1;
    for (int i = 0; asked == CUBLAS_STATUS_SUCCESS && i < count && chosen < 0; ++i) {
        int32_t splits = 1;
        size_t written = 0;
        if (!whole_k || (cublasLtMatmulAlgoConfigGetAttribute(&found[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                                               sizeof(splits), &written) == CUBLAS_STATUS_SUCCESS &&
                         splits <= 1)) {
            chosen = i;
        }
    }
    bool done = false;
    if (chosen >= 0) {
        const float alpha = 1.0f, beta = 0.0f;
        const size_t needed = found[chosen].workspaceSize;
        ggml_cuda_pool_alloc<char> scratch(ctx.pool(), needed > 0 ? needed : 1);
        done = cublasLtMatmul(handles[ctx.device], desc, &alpha, s.b.data, lb, s.a.data, la, &beta, dst->data, lc,
                              dst->data, lc, &found[chosen].algo, scratch.get(), needed, ctx.stream()) ==
               CUBLAS_STATUS_SUCCESS;
    }
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lc));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(la));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lb));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(desc));
    return done;
}

// a float32 product's rows plus the bias, rounded to the low result's type (set 57: a low
// result whose bias no cuBLASLt epilogue added; the sum rounded once, as the cast of
// ggrad_add_rows_f32's). Four values a thread where rows come in fours and both ends are aligned
// (set 58: the bf16 block's fused projection's 0.046 -> 0.027 ms on an H100, set77)
template <typename dst_t, bool x4>
static __global__ void ggrad_add_rows_low(const float * c, const float * bias, dst_t * dst, const int64_t n,
                                          const int64_t total) {
    struct alignas(16) float4v { float v[4]; };
    struct alignas(4*sizeof(dst_t)) dst4 { dst_t v[4]; };
    const int64_t i = (x4 ? 4 : 1)*((int64_t) blockIdx.x*blockDim.x + threadIdx.x);
    if (x4 && i + 4 <= total) {
        const float4v a = *(const float4v *) (c + i);
        const float * b = bias + i % n;
        dst4 d;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            d.v[k] = ggml_cuda_cast<dst_t>(a.v[k] + b[k]);
        }
        *(dst4 *) (dst + i) = d;
    } else if (i < total) {
        dst[i] = ggml_cuda_cast<dst_t>(c[i] + bias[i % n]);
    }
}

template <typename dst_t>
static void ggrad_launch_add_rows_low(const float * c, const float * bias, dst_t * dst, const int64_t n,
                                      const int64_t total, cudaStream_t stream) {
    if (n % 4 == 0 && total % 4 == 0 && (uintptr_t) c % 16 == 0 && (uintptr_t) dst % (4*sizeof(dst_t)) == 0) {
        ggrad_add_rows_low<dst_t, true><<<(unsigned int) ((total/4 + 255)/256), 256, 0, stream>>>(c, bias, dst, n, total);
    } else {
        ggrad_add_rows_low<dst_t, false><<<(unsigned int) ((total + 255)/256), 256, 0, stream>>>(c, bias, dst, n, total);
    }
}

static void ggrad_gemm(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    ggrad_gemm_shape s;
    GGML_ASSERT(ggrad_gemm_plan(dst, &s, true, true));
    const ggml_tensor * A = dst->src[0];
    const ggml_tensor * B = dst->src[1];
    cudaStream_t stream = ctx.stream();
    cublasHandle_t handle = ctx.cublas_handle();
    CUBLAS_CHECK(cublasSetStream(handle, stream));
    // set 57: C in the operands' low type where dst's type asks (the float32 sums rounded once:
    // split K's partial sums never added in C's type); a bias no epilogue adds goes on a float32
    // C first, rounded with it after (`widened`)
    const bool low_out = dst->type != GGML_TYPE_F32;
    const int math = (ggml_get_op_params_i32(dst, 3) ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH) |
                     (low_out ? CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION : 0);
    CUBLAS_CHECK(cublasSetMathMode(handle, (cublasMath_t) math));
    const cublasOperation_t op_a = s.ta ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = s.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int M = (int) s.M, N = (int) s.N, K = (int) s.K, lda = (int) s.a.ld, ldb = (int) s.b.ld, ldc = (int) s.c_ld;
    const float alpha = 1.0f, beta = 0.0f;
    const int64_t step_a = ggrad_gemm_step(A, s.a_r2), step_b = ggrad_gemm_step(B, s.b_r2);
    const bool low = A->type != GGML_TYPE_F32;
    const cudaDataType_t low_type = A->type == GGML_TYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    const cublasComputeType_t compute = !low && ggml_get_op_params_i32(dst, 3) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    // op_params[5]: the bias in cuBLASLt's epilogue; [6]: an algorithm that does not split K
    const bool epilogue = dst->src[2] != nullptr && ggml_get_op_params_i32(dst, 5) == 1;
    const bool whole_k = ggml_get_op_params_i32(dst, 6) == 1;
    // one cuBLASLt call; where no algorithm both adds the bias and keeps K whole, the bias wins
    const void * bias = epilogue ? dst->src[2]->data : nullptr;
    const cudaDataType_t type = low ? low_type : CUDA_R_32F;
    const cudaDataType_t out_type = low_out ? low_type : CUDA_R_32F;
    const bool lt = (epilogue || whole_k) && s.b2*s.b3 == 1 && !(low_out && dst->src[2] != nullptr && !epilogue);
    const bool by_lt = lt && (ggrad_gemm_lt(ctx, s, dst, type, out_type, compute, bias, whole_k) ||
                              (epilogue && whole_k && ggrad_gemm_lt(ctx, s, dst, type, out_type, compute, bias, false)));
    const bool widened = low_out && dst->src[2] != nullptr && !by_lt;
    ggml_cuda_pool_alloc<float> wide(ctx.pool());
    char * c_data = widened ? (char *) wide.alloc(ggml_nelements(dst)) : (char *) dst->data;
    const cudaDataType_t c_type = widened ? CUDA_R_32F : out_type;
    const size_t c_size = c_type == CUDA_R_32F ? sizeof(float) : 2;
    if (by_lt) {
        // made by the one cuBLASLt call
    } else if (s.b3 > 1) {  // batches over two axes (attention's heads and sequences): one call over their pointers
        const int64_t batches = s.b2*s.b3;
        ggml_cuda_pool_alloc<const void *> pointers(ctx.pool(), 3*batches);
        const void ** pa = pointers.get(), ** pb = pa + batches, ** pc = pb + batches;
        ggrad_gemm_batch_pointers<<<(unsigned int) ((batches + 255)/256), 256, 0, stream>>>(
            s.a.data, s.b.data, (const char *) c_data, pa, pb, pc, batches, s.b2, s.a_r2, s.a_r3, s.b_r2, s.b_r3,
            A->nb[2], A->nb[3], B->nb[2], B->nb[3], (size_t) s.c_step2*c_size, (size_t) s.c_step3*c_size);
        CUDA_CHECK(cudaGetLastError());
        CUBLAS_CHECK(cublasGemmBatchedEx(handle, op_b, op_a, N, M, K, &alpha, pb, type, ldb, pa, type, lda, &beta,
                                         (void **) pc, c_type, ldc, (int) batches, compute, CUBLAS_GEMM_DEFAULT));
    } else if (s.b2 > 1 && step_a >= 0 && step_b >= 0) {  // batches along one axis, evenly strided
        if (low) {
            CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle, op_b, op_a, N, M, K, &alpha, s.b.data, low_type, ldb, step_b,
                                                    s.a.data, low_type, lda, step_a, &beta, c_data, c_type, ldc,
                                                    s.c_step2, (int) s.b2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        } else {
            CUBLAS_CHECK(cublasSgemmStridedBatched(handle, op_b, op_a, N, M, K, &alpha, (const float *) s.b.data, ldb, step_b,
                                                   (const float *) s.a.data, lda, step_a, &beta, (float *) c_data, ldc,
                                                   s.c_step2, (int) s.b2));
        }
    } else {
        for (int64_t i2 = 0; i2 < s.b2; ++i2) {
            const char * a = s.a.data + (i2/s.a_r2)*A->nb[2];
            const char * b = s.b.data + (i2/s.b_r2)*B->nb[2];
            char * c = c_data + i2*s.c_step2*c_size;
            if (low) {
                CUBLAS_CHECK(cublasGemmEx(handle, op_b, op_a, N, M, K, &alpha, b, low_type, ldb, a, low_type, lda, &beta,
                                          c, c_type, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            } else {
                CUBLAS_CHECK(cublasSgemm(handle, op_b, op_a, N, M, K, &alpha, (const float *) b, ldb, (const float *) a, lda,
                                         &beta, (float *) c, ldc));
            }
        }
    }
    CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_TF32_TENSOR_OP_MATH));  // ggml's own setting, as it was
    if (dst->src[2] != nullptr && !(by_lt && epilogue)) {
        const int64_t total = ggml_nelements(dst);
        const float * b = (const float *) dst->src[2]->data;
        const unsigned int blocks = (unsigned int) ((total + 255)/256);
        if (!widened) {
            ggrad_add_rows_f32<<<blocks, 256, 0, stream>>>((float *) dst->data, b, s.N, total);
        } else if (dst->type == GGML_TYPE_BF16) {
            ggrad_launch_add_rows_low((const float *) c_data, b, (nv_bfloat16 *) dst->data, s.N, total, stream);
        } else {
            ggrad_launch_add_rows_low((const float *) c_data, b, (half *) dst->data, s.N, total, stream);
        }
        CUDA_CHECK(cudaGetLastError());
    }
}

// Adam's update of one or two parameters in one node (kernel 9, as the CPU's): element for
// element the exact form that scripts/patch_ggml_adamw.py gives ggml's OPT_STEP_ADAMW (the
// same expressions, in the same build: no fast math), P its 9 constants; p, m, v in place
struct ggrad_adamw_part {
    float * x;
    const float * g;
    float * m;
    float * v;
    int64_t n;
};

static ggrad_adamw_part ggrad_adamw_part_of(const ggml_tensor * dst, const int j) {
    if (j >= ggml_get_op_params_i32(dst, 1)) {
        return { nullptr, nullptr, nullptr, nullptr, 0 };
    }
    ggml_tensor * const * t = dst->src + 1 + 4*j;
    return { (float *) t[0]->data, (const float *) t[1]->data, (float *) t[2]->data, (float *) t[3]->data,
             ggml_nelements(t[0]) };
}

static __global__ void ggrad_adamw_group_f32(const ggrad_adamw_part first, const ggrad_adamw_part second,
                                             const float * __restrict__ P) {
    int64_t i = (int64_t) blockIdx.x*blockDim.x + threadIdx.x;
    const bool in_first = i < first.n;
    const ggrad_adamw_part q = in_first ? first : second;
    i -= in_first ? 0 : first.n;
    if (i >= q.n) {
        return;
    }
    float x_i = q.x[i], m_i = q.m[i], v_i = q.v[i];
    const float g_i = q.g[i];
    const float w1 = P[7];
    m_i = w1 < 0.5f ? m_i + w1*(g_i - m_i) : g_i - (g_i - m_i)*(1.0f - w1);
    v_i = v_i*P[2] + P[8]*g_i*g_i;
    x_i = x_i*(1.0f - P[0]*P[4]);
    x_i = x_i - P[5]*(m_i/(sqrtf(v_i)/P[6] + P[3]));
    q.x[i] = x_i;
    q.m[i] = m_i;
    q.v[i] = v_i;
}

static void ggrad_adamw_group(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggrad_adamw_part first = ggrad_adamw_part_of(dst, 0), second = ggrad_adamw_part_of(dst, 1);
    const int64_t total = first.n + second.n;
    if (total == 0) {  // empty parameters: a launch of no blocks is an error
        return;
    }
    ggrad_adamw_group_f32<<<(unsigned int) ((total + 255)/256), 256, 0, ctx.stream()>>>(
        first, second, (const float *) dst->src[0]->data);
    CUDA_CHECK(cudaGetLastError());
}

// a quantized weight's product gradient, g @ W (kernel 17, as the CPU's): W's rows converted
// to float32 a chunk at a time into pool scratch (ggml's own dequantizers), each chunk's
// product added by cuBLAS in float32 (no TF32: the forward product is GGML_PREC_F32)
static void ggrad_qmatmul_back(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * w = dst->src[0];
    const ggml_tensor * g = dst->src[1];
    const int64_t in = w->ne[0], out = w->ne[1], T = g->ne[1];
    const int64_t chunk = std::min<int64_t>(out, std::max<int64_t>(1, (int64_t) (16 << 20)/(4*in)));
    const to_fp32_cuda_t to_fp32 = ggml_get_to_fp32_cuda(w->type);
    cudaStream_t stream = ctx.stream();
    cublasHandle_t handle = ctx.cublas_handle();
    ggml_cuda_pool_alloc<float> rows(ctx.pool(), chunk*in);
    CUBLAS_CHECK(cublasSetStream(handle, stream));
    CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
    for (int64_t o0 = 0; o0 < out; o0 += chunk) {
        const int64_t n = std::min(chunk, out - o0);
        to_fp32((const char *) w->data + o0*w->nb[1], rows.get(), n*in, stream);
        // column-major: dst (in x T) += rows (in x n) * g[:, o0:o0+n] (n x T, leading dim g's row stride)
        const float alpha = 1.0f, beta = o0 > 0 ? 1.0f : 0.0f;
        CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, (int) in, (int) T, (int) n, &alpha, rows.get(),
                                 (int) in, (const float *) g->data + o0, (int) (g->nb[1]/sizeof(float)), &beta,
                                 (float *) dst->data, (int) in));
    }
}

// rows of a quantized table read to float32 (kernel 24: an embedding's lookup; ggml-cuda's
// GET_ROWS lacks the K-quants): src0 the table (row length, rows), contiguous; src1 the row
// indices i32 (T), contiguous and in range (ggrad checks them first); dst f32 (row length, T).
// The rows' blocks are gathered into pool scratch (a block per row), then converted by
// ggml's own dequantizer in one call.
static __global__ void ggrad_gather_blocks(const char * table, const int32_t * ids, char * out, const size_t row_bytes) {
    const char * src = table + (size_t) ids[blockIdx.x]*row_bytes;
    char * dst = out + (size_t) blockIdx.x*row_bytes;
    for (size_t i = threadIdx.x; i < row_bytes; i += blockDim.x) {
        dst[i] = src[i];
    }
}

static void ggrad_qrows(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * w = dst->src[0];
    const ggml_tensor * ids = dst->src[1];
    const int64_t T = ggml_nelements(ids);
    const size_t row_bytes = ggml_row_size(w->type, w->ne[0]);
    cudaStream_t stream = ctx.stream();
    ggml_cuda_pool_alloc<char> blocks(ctx.pool(), row_bytes*T);
    ggrad_gather_blocks<<<(unsigned int) T, 256, 0, stream>>>((const char *) w->data, (const int32_t *) ids->data,
                                                                blocks.get(), row_bytes);
    CUDA_CHECK(cudaGetLastError());
    ggml_get_to_fp32_cuda(w->type)(blocks.get(), (float *) dst->data, w->ne[0]*T, stream);
}

static bool ggrad_qrows_supported(const ggml_tensor * op) {
    const ggml_tensor * w = op->src[0];
    const ggml_tensor * ids = op->src[1];
    return w != nullptr && ids != nullptr && ggml_is_quantized(w->type) && ggml_get_to_fp32_cuda(w->type) != nullptr &&
           ggml_is_contiguous(w) && ggml_nrows(w) == w->ne[1] && ids->type == GGML_TYPE_I32 && ggml_is_contiguous(ids) &&
           op->type == GGML_TYPE_F32 && ggml_is_contiguous(op) && op->ne[0] == w->ne[0] &&
           ggml_nelements(op) == w->ne[0]*ggml_nelements(ids) && ggml_nelements(ids) < INT32_MAX;
}

static bool ggrad_qmatmul_back_supported(const ggml_tensor * op) {
    const ggml_tensor * w = op->src[0];
    const ggml_tensor * g = op->src[1];
    return w != nullptr && g != nullptr && ggml_is_quantized(w->type) && ggml_get_to_fp32_cuda(w->type) != nullptr &&
           ggml_is_contiguous(w) && g->type == GGML_TYPE_F32 && g->nb[0] == sizeof(float) &&
           g->nb[1] % sizeof(float) == 0 && op->type == GGML_TYPE_F32 && ggml_is_contiguous(op) &&
           ggml_nrows(w) == w->ne[1] && ggml_nrows(g) == g->ne[1] && ggml_nrows(op) == op->ne[1] &&
           g->ne[0] == w->ne[1] && op->ne[0] == w->ne[0] && op->ne[1] == g->ne[1] &&
           std::max(std::max(w->ne[0], w->ne[1]), g->ne[1]) < INT32_MAX;
}

// batch normalization in training (ggrad_cpu.inc says what each kernel computes). Channel c's
// values are the rows of S at (n*C + c)*S. The statistics and the gradient split each channel
// into parts of at least 4096 values, a block each, then join the parts' sums: a block per
// channel left most of the GPU idle where channels are few and large (a ResNet's first
// layers: 64 channels of 131072 values).
struct ggrad_bn_split {
    int parts;      // blocks per channel
    int64_t chunk;  // values per part (the last parts may hold fewer, or none)
};

static ggrad_bn_split ggrad_bn_split_of(const ggrad_bn_dims d) {
    const int64_t count = d.S*d.N;
    const int64_t fill = std::max<int64_t>(1, (2048 + d.C - 1)/d.C);  // about 2048 blocks in all
    const int parts = (int) std::min<int64_t>(std::min<int64_t>((count + 4095)/4096, fill), 256);
    return { parts, (count + parts - 1)/parts };
}

static __device__ __forceinline__ int64_t ggrad_bn_part_size(const ggrad_bn_split sp, const int64_t count, const int p) {
    const int64_t left = count - p*sp.chunk;
    return left < 0 ? 0 : left < sp.chunk ? left : sp.chunk;
}

// a block's walk over its part of channel c, 256 values a step, with no division per value
struct ggrad_bn_walk {
    int64_t k, end;
    int n, s;
    const int S, C, c, dn, ds;

    __device__ ggrad_bn_walk(const ggrad_bn_dims d, const ggrad_bn_split sp, const int c, const int p)
        : k(p*sp.chunk + threadIdx.x), end(p*sp.chunk + ggrad_bn_part_size(sp, d.S*d.N, p)), n((int) (k / d.S)),
          s((int) (k % d.S)), S((int) d.S), C((int) d.C), c(c), dn(256 / S), ds(256 % S) {}

    __device__ __forceinline__ bool more() const { return k < end; }
    __device__ __forceinline__ int at() const { return (n*C + c)*S + s; }
    __device__ __forceinline__ void next() {
        k += 256;
        n += dn;
        s += ds;
        if (s >= S) {
            s -= S;
            ++n;
        }
    }
};

// each part's mean and sum of squared deviations from it (two passes over the part)
static __global__ void ggrad_bn_stats_part_f32(const ggrad_bn_dims d, const ggrad_bn_split sp, const float * x,
                                               float * part) {
    __shared__ float shared[256 / WARP_SIZE];
    const int c = blockIdx.x / sp.parts, p = blockIdx.x % sp.parts;
    const int64_t size = ggrad_bn_part_size(sp, d.S*d.N, p);
    float sum = 0.0f;
    for (ggrad_bn_walk w(d, sp, c, p); w.more(); w.next()) {
        sum += x[w.at()];
    }
    const float mean = ggrad_block_sum<256>(sum, shared)/(size > 0 ? size : 1);
    float squares = 0.0f;
    for (ggrad_bn_walk w(d, sp, c, p); w.more(); w.next()) {
        const float v = x[w.at()] - mean;
        squares += v*v;
    }
    squares = ggrad_block_sum<256>(squares, shared);
    if (threadIdx.x == 0) {
        part[blockIdx.x] = mean;
        part[gridDim.x + blockIdx.x] = squares;
    }
}

// a thread per channel joins its parts (Chan's pairwise update, in double): mean, variance
static __global__ void ggrad_bn_stats_join_f32(const ggrad_bn_dims d, const ggrad_bn_split sp, const float * part,
                                               float * out) {
    const int64_t c = (int64_t) blockIdx.x*blockDim.x + threadIdx.x;
    if (c >= d.C) {
        return;
    }
    const int64_t count = d.S*d.N;
    const float * means = part + c*sp.parts;
    const float * squares = means + d.C*sp.parts;
    double sum = 0.0;
    for (int p = 0; p < sp.parts; ++p) {
        sum += (double) means[p]*ggrad_bn_part_size(sp, count, p);
    }
    const double mean = sum/count;
    double deviations = 0.0;
    for (int p = 0; p < sp.parts; ++p) {
        const double off = means[p] - mean;
        deviations += squares[p] + off*off*ggrad_bn_part_size(sp, count, p);
    }
    out[c] = (float) mean;
    out[d.C + c] = (float) (deviations/count);
}

static __global__ void ggrad_bn_apply_f32(const ggrad_bn_dims d, const float * x, const float * mean, const float * var,
                                          const float * w, const float * b, float * y) {
    const int i = blockIdx.x*blockDim.x + threadIdx.x;  // the sizes fit int32 (ggrad_bn_supported)
    if (i >= (int) (d.S*d.C*d.N)) {
        return;
    }
    const int c = (i / (int) d.S) % (int) d.C;
    const float v = __fdiv_rn(x[i] - mean[c], sqrtf(var[c] + d.eps));
    const float scaled = w ? __fmul_rn(v, w[c]) : v;
    y[i] = b ? scaled + b[c] : scaled;
}

// each part's sums of the gradient and of the gradient times the normalized input
static __global__ void ggrad_bn_back_part_f32(const ggrad_bn_dims d, const ggrad_bn_split sp, const float * x,
                                              const float * g, const float * mean, const float * var, float * part) {
    __shared__ float shared[256 / WARP_SIZE];
    const int c = blockIdx.x / sp.parts, p = blockIdx.x % sp.parts;
    const float m = mean[c], s = sqrtf(var[c] + d.eps);
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (ggrad_bn_walk w(d, sp, c, p); w.more(); w.next()) {
        const int at = w.at();
        sum_g += g[at];
        sum_gx += g[at]*__fdiv_rn(x[at] - m, s);
    }
    sum_g = ggrad_block_sum<256>(sum_g, shared);
    sum_gx = ggrad_block_sum<256>(sum_gx, shared);
    if (threadIdx.x == 0) {
        part[blockIdx.x] = sum_g;
        part[gridDim.x + blockIdx.x] = sum_gx;
    }
}

// the input's gradient over a part; every block of a channel adds the channel's parts in
// the same order, so all see the same sums. The first part's block writes them out too.
static __global__ void ggrad_bn_back_apply_f32(const ggrad_bn_dims d, const ggrad_bn_split sp, const float * x,
                                               const float * g, const float * mean, const float * var,
                                               const float * w, const float * part, float * out) {
    const int c = blockIdx.x / sp.parts, p = blockIdx.x % sp.parts;
    const int64_t count = d.S*d.N, n = d.S*d.C*d.N;
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (int q = 0; q < sp.parts; ++q) {
        sum_g += part[c*sp.parts + q];
        sum_gx += part[gridDim.x + c*sp.parts + q];
    }
    const float m = mean[c], s = sqrtf(var[c] + d.eps), wc = w ? w[c] : 1.0f;
    const float mean_dy = (sum_g/count)*wc, mean_dyx = (sum_gx/count)*wc;
    for (ggrad_bn_walk walk(d, sp, c, p); walk.more(); walk.next()) {
        const int at = walk.at();
        const float xhat = __fdiv_rn(x[at] - m, s);
        out[at] = __fdiv_rn(__fsub_rn(__fmul_rn(g[at], wc), mean_dy) - __fmul_rn(xhat, mean_dyx), s);
    }
    if (p == 0 && threadIdx.x == 0) {
        out[n + c] = sum_gx;
        out[n + d.C + c] = sum_g;
    }
}

static void ggrad_bn(ggml_backend_cuda_context & ctx, ggml_tensor * dst, const int kernel) {
    const ggrad_bn_dims d = ggrad_bn_dims_of(dst);
    const float * src[5];
    for (int i = 0; i < 5; ++i) {
        src[i] = dst->src[i] ? (const float *) dst->src[i]->data : nullptr;
    }
    float * out = (float *) dst->data;
    cudaStream_t stream = ctx.stream();
    if (kernel == 21) {
        const int blocks = (int) ((d.S*d.C*d.N + 255)/256);
        ggrad_bn_apply_f32<<<blocks, 256, 0, stream>>>(d, src[0], src[1], src[2], src[3], src[4], out);
        CUDA_CHECK(cudaGetLastError());
        return;
    }
    const ggrad_bn_split sp = ggrad_bn_split_of(d);
    const int blocks = (int) (d.C*sp.parts);
    ggml_cuda_pool_alloc<float> part(ctx.pool(), 2*(size_t) blocks);
    if (kernel == 20) {
        ggrad_bn_stats_part_f32<<<blocks, 256, 0, stream>>>(d, sp, src[0], part.get());
        ggrad_bn_stats_join_f32<<<(int) ((d.C + 255)/256), 256, 0, stream>>>(d, sp, part.get(), out);
    } else {
        ggrad_bn_back_part_f32<<<blocks, 256, 0, stream>>>(d, sp, src[0], src[1], src[2], src[3], part.get());
        ggrad_bn_back_apply_f32<<<blocks, 256, 0, stream>>>(d, sp, src[0], src[1], src[2], src[3], src[4], part.get(),
                                                            out);
    }
    CUDA_CHECK(cudaGetLastError());
}

// torch's max pooling (ggrad_pool.h): a thread per output; its gradient a thread per input
// element, gathered from the windows whose maximum it is
static __global__ void ggrad_max_pool_f32(const ggrad_pool_geometry g, const float * x, float * y) {
    const int64_t i = (int64_t) blockIdx.x*blockDim.x + threadIdx.x, outputs = (int64_t) g.ow*g.oh;
    if (i < outputs*g.planes) {
        float best;
        ggrad_pool_window(x + (i / outputs)*g.w*g.h, g, (i % outputs) / g.ow, (i % outputs) % g.ow, &best);
        y[i] = best;
    }
}

static __global__ void ggrad_max_pool_back_f32(const ggrad_pool_geometry g, const float * grad, const float * x,
                                               float * dx) {
    const int64_t i = (int64_t) blockIdx.x*blockDim.x + threadIdx.x, size = g.w*g.h;
    if (i < size*g.planes) {
        const int64_t plane = i / size, e = i % size;
        dx[i] = ggrad_pool_gather(x + plane*size, grad + plane*g.ow*g.oh, g, e / g.w, e % g.w);
    }
}

// the window fold (ggrad_pool.h): a thread per image element
static __global__ void ggrad_fold_f32(const ggrad_fold_geometry g, const float * cols, float * dst, const int64_t n) {
    const int64_t i = (int64_t) blockIdx.x*blockDim.x + threadIdx.x;
    if (i < n) {
        dst[i] = ggrad_fold_gather(cols, g, i);
    }
}

// a running statistic moved toward the batch's (kernel 25, ggrad_bn.h): a thread per
// channel; the products and the sum rounded apart (no fused multiply-add), as the composed
// SCALE, SCALE, ADD
static __global__ void ggrad_running_stat_f32(const float * running, const float * stats, float * moved,
                                              int32_t * counter, const float keep, const float take, const int64_t n) {
    const int64_t c = (int64_t) blockIdx.x*blockDim.x + threadIdx.x;
    if (c < n) {
        moved[c] = __fadd_rn(__fmul_rn(running[c], keep), __fmul_rn(stats[c], take));
    }
    if (counter != nullptr && c == 0) {  // BatchNorm's num_batches_tracked (set 47)
        counter[0] += 1;
    }
}

static void ggrad_max_pool(ggml_backend_cuda_context & ctx, ggml_tensor * dst, const bool back) {
    const ggml_tensor * x = dst->src[back ? 1 : 0];
    const ggrad_pool_geometry g = ggrad_pool_geometry_of(dst, x);
    const int blocks = (int) ((ggml_nelements(dst) + 255)/256);
    if (back) {
        ggrad_max_pool_back_f32<<<blocks, 256, 0, ctx.stream()>>>(g, (const float *) dst->src[0]->data,
                                                                  (const float *) x->data, (float *) dst->data);
    } else {
        ggrad_max_pool_f32<<<blocks, 256, 0, ctx.stream()>>>(g, (const float *) x->data, (float *) dst->data);
    }
    CUDA_CHECK(cudaGetLastError());
}

// a recurrent layer's time step and its gradient (ggrad_cell.h), a thread per state element
static __global__ void ggrad_cell_f32(const ggrad_cell_dims d, const float * xg, const float * hw, const float * bias,
                                      const float * s0, float * rec) {
    const int64_t e = (int64_t) blockIdx.x*blockDim.x + threadIdx.x;
    if (e < d.B*d.H) {
        ggrad_cell_forward(d, e, xg, hw, bias, s0, rec);
    }
}

static __global__ void ggrad_cell_back_f32(const ggrad_cell_dims d, const float * rec, const float * grad,
                                           const float * dh_after, const float * s0, const bool last, float * out) {
    const int64_t e = (int64_t) blockIdx.x*blockDim.x + threadIdx.x;
    if (e < d.B*d.H) {
        ggrad_cell_backward(d, e, rec, grad, dh_after, s0, last, out);
    }
}

static void ggrad_cell(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggrad_cell_dims d = ggrad_cell_dims_of(dst);
    const int blocks = (int) ((d.B*d.H + 255)/256);
    const float * src3 = dst->src[3] ? (const float *) dst->src[3]->data : nullptr;
    if (ggml_get_op_params_i32(dst, 0) == 18) {
        ggrad_cell_f32<<<blocks, 256, 0, ctx.stream()>>>(d, (const float *) dst->src[1]->data,
            (const float *) dst->src[2]->data, src3, (const float *) dst->src[4]->data, (float *) dst->data);
    } else {
        ggrad_cell_back_f32<<<blocks, 256, 0, ctx.stream()>>>(d, (const float *) dst->src[1]->data,
            (const float *) dst->src[2]->data, src3, (const float *) dst->src[4]->data, dst->src[0] == nullptr,
            (float *) dst->data);
    }
    CUDA_CHECK(cudaGetLastError());
}

static bool ggrad_attention_supported(const ggml_tensor * op);  // below, with its launcher

bool ggml_cuda_ggrad_supported(const ggml_tensor * op) {
    const int kernel = ggml_get_op_params_i32(op, 0);
    if (kernel == 18 || kernel == 19) {
        return ggrad_cell_supported(op);
    }
    if (kernel >= 20 && kernel <= 22) {
        return ggrad_bn_supported(op);  // the sizes fit int32: so do the blocks (C*parts, near C + 2048)
    }
    if (kernel == 25) {
        return ggrad_running_stat_supported(op);
    }
    if (kernel == 10 || kernel == 11) {
        return ggrad_max_pool_supported(op) && (ggml_nelements(op) + 255)/256 <= INT32_MAX;
    }
    if (kernel == 23) {
        return ggrad_fold_supported(op);
    }
    if (kernel == 17) {
        return ggrad_qmatmul_back_supported(op);
    }
    if (kernel == 6) {  // cuBLAS refuses empty sizes (a leading dimension of 0)
        ggrad_gemm_shape s;
        return ggrad_gemm_plan(op, &s, true, true) && s.M > 0 && s.N > 0 && s.K > 0;
    }
    if (kernel == 9) {  // at most two parameters: ggrad_adamw_part_of reads two
        return ggrad_adamw_group_supported(op) && ggml_get_op_params_i32(op, 1) <= 2;
    }
    if (kernel == 24) {
        return ggrad_qrows_supported(op);
    }
    if (kernel == 30 || kernel == 31) {
        return ggrad_layer_norm_supported(op);  // ggrad_bn.h
    }
    if (kernel == 32) {
        return ggrad_class_total_supported(op);  // ggrad_ce.h
    }
    if (kernel == 33 || kernel == 34) {
        return ggrad_softmax_supported(op, 32*WARP_SIZE);  // ggrad_softmax.h: a row in a warp's registers
    }
    if (kernel == 35 || kernel == 36) {
        return ggrad_attention_supported(op);
    }
    if (kernel == 4) {
        return op->src[0]->type == GGML_TYPE_F32 && op->src[1]->type == GGML_TYPE_F32 &&
               op->src[0]->nb[0] == sizeof(float) && op->src[1]->nb[0] == sizeof(float) &&
               ggml_are_same_shape(op->src[0], op->src[1]) && ggml_is_contiguous_rows(op);
    }
    if (kernel == 3) {
        return ggrad_adam_hyper_supported(op);  // ggrad_adamw.h
    }
    if (kernel != 1 && kernel != 2) {
        return false;
    }
    const ggml_tensor * w = op->src[kernel == 1 ? 2 : 3];
    return op->src[0]->type == GGML_TYPE_F32 && op->src[1]->type == GGML_TYPE_I32 &&
           op->src[0]->nb[0] == sizeof(float) && (w == nullptr || ggml_is_contiguous(w));
}

static void ggrad_move_running_stat(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggrad_running_stat r = ggrad_running_stat_of(dst);
    const int64_t n = ggml_nelements(dst);
    ggrad_running_stat_f32<<<(unsigned int) ((n + 255)/256), 256, 0, ctx.stream()>>>(
        (const float *) dst->src[0]->data, (const float *) dst->src[1]->data + r.offset, (float *) dst->data,
        dst->src[2] != nullptr ? (int32_t *) dst->src[2]->data : nullptr, r.keep, r.take, n);
    CUDA_CHECK(cudaGetLastError());
}

// the window fold a block per band of image rows (image n, rows y0..y0+R-1) and chunk of
// channels (asked for with op_params[12] = 1): the column rows the band reads are staged in
// shared memory whole (for each column position, the chunk's C*KH*KW-contiguous entries: loads
// along the columns' rows, stores to consecutive banks), then each image value sums its
// entries in ggrad_fold_gather's order (the same bits). Set 44 staged one image row's third of
// three column rows, a tap at a time with its stores eleven to a bank (an H100's ResNet-18
// step: 3.7 ms in 19 folds); a band of R rows reads (R + KH - 1)/R of the columns.
#define GGRAD_FOLD_TILE_FLOATS (48*1024/4)
#define GGRAD_FOLD_LOADS 8
template <int SH, int SW>  // the strides where known when compiled (1, 2), else 0: a tap's test divides by them
static __global__ void ggrad_fold_rows_f32(const ggrad_fold_geometry g, const float * __restrict__ cols,
                                           float * __restrict__ dst, const int chunk, const int band,
                                           const int pitch) {
    extern __shared__ float staged[];  // [column row of the band][ow][pitch >= channel of the chunk, tap]
    const int sh = SH > 0 ? SH : g.sh, sw = SW > 0 ? SW : g.sw;
    const int bands = ((int) g.h + band - 1)/band;
    const int n = blockIdx.x / bands, y0 = (blockIdx.x - n*bands)*band, y1 = min(y0 + band, (int) g.h);
    const int c0 = blockIdx.y*chunk, cc = min(chunk, (int) g.c - c0);
    const int ow_n = (int) g.ow, taps = g.kh*g.kw, segment = cc*taps;
    const int lo = y0 + g.ph - (g.kh - 1)*g.dh, hi = y1 - 1 + g.ph;  // the taps' reach, in padded rows
    const int t0 = lo <= 0 ? 0 : (lo + sh - 1)/sh, t1 = hi < 0 ? 0 : min((int) g.oh, hi/sh + 1);
    const int64_t width = g.c*taps;
    const float * src = cols + ((int64_t) n*g.oh + t0)*ow_n*width + (int64_t) c0*taps;
    // element i of the staging loop is (q = i / segment, e = i % segment), q = r*ow_n + ow:
    // advanced by the block's size without dividing; GGRAD_FOLD_LOADS loads in flight a
    // thread before their stores (one at a time kept an H100's memory a quarter busy)
    const int total = max(t1 - t0, 0)*ow_n*segment;
    const int step_q = blockDim.x / segment, step_e = blockDim.x - step_q*segment;
    int q = threadIdx.x / segment, e = threadIdx.x - q*segment;
    for (int i = threadIdx.x; i < total; i += GGRAD_FOLD_LOADS*blockDim.x) {
        float value[GGRAD_FOLD_LOADS];
        int at[GGRAD_FOLD_LOADS];
#pragma unroll
        for (int k = 0; k < GGRAD_FOLD_LOADS; ++k) {
            at[k] = i + k*(int) blockDim.x < total ? q*pitch + e : -1;
            value[k] = at[k] >= 0 ? src[(int64_t) q*width + e] : 0.0f;
            q += step_q;
            e += step_e;
            if (e >= segment) {
                e -= segment;
                ++q;
            }
        }
#pragma unroll
        for (int k = 0; k < GGRAD_FOLD_LOADS; ++k) {
            if (at[k] >= 0) {
                staged[at[k]] = value[k];
            }
        }
    }
    __syncthreads();
    // image value t is (x = t % w, k = t / w), k = c*rows + its row in the band: x and k advance
    // by the block's size without dividing (divisions by runtime values in this loop and the
    // taps' tests made set 45's first fold as slow as set 44's: ~0.6 TB/s on an H200)
    const int rows = y1 - y0, w = (int) g.w;
    const int step_x = blockDim.x % w, step_k = blockDim.x / w;
    int x = threadIdx.x % w, k = threadIdx.x / w;
    for (int t = threadIdx.x; t < cc*rows*w; t += blockDim.x) {  // x, then row, then channel
        const int c = k / rows, y = y0 + k - c*rows;
        float sum = 0.0f;
        for (int ky = 0; ky < g.kh; ++ky) {
            const int ty = y + g.ph - ky*g.dh;
            if (ty < 0 || ty % sh != 0 || ty/sh >= g.oh) {
                continue;
            }
            const float * line = staged + (ty/sh - t0)*ow_n*pitch + c*taps + ky*g.kw;
            for (int kx = 0; kx < g.kw; ++kx) {
                const int tx = x + g.pw - kx*g.dw;
                if (tx < 0 || tx % sw != 0 || tx/sw >= g.ow) {
                    continue;
                }
                sum += line[(tx/sw)*pitch + kx];
            }
        }
        dst[(((int64_t) n*g.c + c0 + c)*g.h + y)*g.w + x] = sum;
        x += step_x;
        k += step_k;
        if (x >= w) {
            x -= w;
            ++k;
        }
    }
}

// the band and channel chunk of ggrad_fold_rows_f32: the tallest band (up to 8 rows) whose
// staging holds 4 channels (all, if fewer), else a row and what fits; false where not one
// channel of one row's column rows fits in shared memory, or the counters would pass 32 bits
static bool ggrad_fold_rows(ggml_backend_cuda_context & ctx, ggml_tensor * dst, const ggrad_fold_geometry & g) {
    const int64_t taps = (int64_t) g.kh*g.kw;
    if (g.oh < 1 || g.ow < 1 || g.n*g.h > INT_MAX || g.c*g.w*8 > INT_MAX - 1024 || g.c*taps > INT_MAX) {
        return false;
    }
    for (int band = 8; band >= 1; band /= 2) {
        const int64_t rows = std::min(g.oh, (band - 1 + (int64_t) (g.kh - 1)*g.dh)/g.sh + 1);
        const int64_t per_position = GGRAD_FOLD_TILE_FLOATS/(rows*g.ow);  // floats of pitch that fit
        const int64_t most = std::min(g.c, per_position >= 1 ? (per_position - 1)/taps : 0);
        if (most < 1 || (most < std::min<int64_t>(g.c, 4) && band > 1)) {
            continue;
        }
        const int64_t chunks = (g.c + most - 1)/most, chunk = (g.c + chunks - 1)/chunks;
        const int64_t pitch = chunk*taps | 1;  // odd: a warp's values of consecutive x in distinct banks
        const int64_t blocks = g.n*((g.h + band - 1)/band);
        if (chunks > 65535 || blocks > INT_MAX) {
            return false;
        }
        auto kernel = g.sh == 1 && g.sw == 1 ? ggrad_fold_rows_f32<1, 1> : g.sh == 2 && g.sw == 2 ? ggrad_fold_rows_f32<2, 2>
                                                                                             : ggrad_fold_rows_f32<0, 0>;
        kernel<<<dim3((unsigned int) blocks, (unsigned int) chunks), 256, rows*g.ow*pitch*sizeof(float), ctx.stream()>>>(
            g, (const float *) dst->src[0]->data, (float *) dst->data, (int) chunk, band, (int) pitch);
        CUDA_CHECK(cudaGetLastError());
        return true;
    }
    return false;
}

static void ggrad_fold(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggrad_fold_geometry g = ggrad_fold_geometry_of(dst);
    if (ggml_get_op_params_i32(dst, 12) == 1 && ggrad_fold_rows(ctx, dst, g)) {
        return;
    }
    const int64_t n = ggml_nelements(dst);
    ggrad_fold_f32<<<(int) ((n + 255)/256), 256, 0, ctx.stream()>>>(g, (const float *) dst->src[0]->data,
                                                                      (float *) dst->data, n);
    CUDA_CHECK(cudaGetLastError());
}

// attention's softmax under autocast (kernels 33 and 34, ggrad_softmax.h): a warp a row, the row
// in registers (as SOFT_MAX's softmax_rows, set 50). x*scale + mask rounded apart, no fused
// multiply-add, in both: the gradient computes each float32 probability again, the same bits.
struct ggrad_softmax_shape {
    int ncols;
    int64_t nrows, ne01, ne02, mne2, mne3;
    size_t nb11, nb12, nb13;
    float scale;
};

static __device__ __forceinline__ float ggrad_mask_value(const float * m, const int col) { return m[col]; }
static __device__ __forceinline__ float ggrad_mask_value(const half * m, const int col) { return __half2float(m[col]); }

template <typename M>
static __device__ __forceinline__ float ggrad_softmax_input(const float x, const M * m, const int col, const float scale) {
    const float scaled = __fmul_rn(x, scale);
    return m == nullptr ? scaled : __fadd_rn(scaled, ggrad_mask_value(m, col));
}

template <typename M>
static __device__ __forceinline__ const M * ggrad_softmax_mask_of(const M * mask, const int64_t row, const ggrad_softmax_shape & s) {
    if (mask == nullptr) {
        return nullptr;
    }
    const int64_t i01 = row % s.ne01, i02 = (row/s.ne01) % s.ne02, i03 = row/(s.ne01*s.ne02);
    return (const M *) ((const char *) mask + i01*s.nb11 + (i02 % s.mne2)*s.nb12 + (i03 % s.mne3)*s.nb13);
}

template <int per_lane, typename M, typename dst_t>
static __global__ void ggrad_softmax_low_rows(const float * x, const M * mask, dst_t * dst, float * stats,
                                              const ggrad_softmax_shape s) {
    const int64_t row = (int64_t) blockIdx.x*blockDim.y + threadIdx.y;
    if (row >= s.nrows) {
        return;
    }
    const int lane = threadIdx.x;
    const M * m = ggrad_softmax_mask_of(mask, row, s);
    x += row*s.ncols;
    dst += row*s.ncols;
    float v[per_lane];
    float top = -INFINITY;
#pragma unroll
    for (int i = 0; i < per_lane; ++i) {
        const int col = lane + i*WARP_SIZE;
        v[i] = col < s.ncols ? ggrad_softmax_input(x[col], m, col, s.scale) : -INFINITY;
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
    const float inv = 1.0f / sum;
#pragma unroll
    for (int i = 0; i < per_lane; ++i) {
        const int col = lane + i*WARP_SIZE;
        if (col < s.ncols) {
            dst[col] = ggml_cuda_cast<dst_t>(__fmul_rn(v[i], inv));  // as CPY converts the float32 softmax
        }
    }
    if (lane == 0) {
        stats[2*row] = top;
        stats[2*row + 1] = inv;
    }
}

template <int per_lane, typename M, typename dst_t>
static __global__ void ggrad_softmax_low_back_rows(const float * x, const M * mask, const float * g, const float * stats,
                                                   dst_t * dst, const ggrad_softmax_shape s) {
    const int64_t row = (int64_t) blockIdx.x*blockDim.y + threadIdx.y;
    if (row >= s.nrows) {
        return;
    }
    const int lane = threadIdx.x;
    const M * m = ggrad_softmax_mask_of(mask, row, s);
    x += row*s.ncols;
    g += row*s.ncols;
    dst += row*s.ncols;
    const float top = stats[2*row], inv = stats[2*row + 1];
    float p[per_lane], gv[per_lane];
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < per_lane; ++i) {
        const int col = lane + i*WARP_SIZE;
        p[i] = 0.0f;
        gv[i] = 0.0f;
        if (col < s.ncols) {
            p[i] = __fmul_rn(expf(ggrad_softmax_input(x[col], m, col, s.scale) - top), inv);
            gv[i] = g[col];
            dot += p[i]*gv[i];
        }
    }
    dot = warp_reduce_sum(dot);
#pragma unroll
    for (int i = 0; i < per_lane; ++i) {
        const int col = lane + i*WARP_SIZE;
        if (col < s.ncols) {
            dst[col] = ggml_cuda_cast<dst_t>(__fmul_rn(__fmul_rn(gv[i] - dot, p[i]), s.scale));
        }
    }
}

template <int per_lane, typename M, typename dst_t>
static void ggrad_softmax_low_launch(const ggml_tensor * dst, const M * mask, dst_t * out, const ggrad_softmax_shape & s,
                                     cudaStream_t stream) {
    const ggml_tensor * x = dst->src[0];
    const dim3 threads(WARP_SIZE, 4, 1);
    const unsigned int blocks = (unsigned int) ((s.nrows + 3)/4);
    if (ggml_get_op_params_i32(dst, 0) == 33) {
        float * stats = (float *) ((char *) dst->data + ggrad_softmax_stats_offset(s.nrows, s.ncols, sizeof(dst_t)));
        ggrad_softmax_low_rows<per_lane, M, dst_t><<<blocks, threads, 0, stream>>>((const float *) x->data, mask, out, stats, s);
    } else {
        const ggml_tensor * probs = dst->src[3];
        const float * stats = (const float *) ((const char *) probs->data +
                                               ggrad_softmax_stats_offset(s.nrows, s.ncols, ggml_type_size(probs->type)));
        ggrad_softmax_low_back_rows<per_lane, M, dst_t><<<blocks, threads, 0, stream>>>(
            (const float *) x->data, mask, (const float *) dst->src[2]->data, stats, out, s);
    }
    CUDA_CHECK(cudaGetLastError());
}

template <typename M, typename dst_t>
static void ggrad_softmax_low_typed(const ggml_tensor * dst, const M * mask, const ggrad_softmax_shape & s, cudaStream_t stream) {
    dst_t * out = (dst_t *) dst->data;
    const int lanes = (s.ncols + WARP_SIZE - 1)/WARP_SIZE;  // at most 32: ggrad_softmax_supported
    if (lanes <= 1) {
        ggrad_softmax_low_launch<1>(dst, mask, out, s, stream);
    } else if (lanes <= 2) {
        ggrad_softmax_low_launch<2>(dst, mask, out, s, stream);
    } else if (lanes <= 4) {
        ggrad_softmax_low_launch<4>(dst, mask, out, s, stream);
    } else if (lanes <= 8) {
        ggrad_softmax_low_launch<8>(dst, mask, out, s, stream);
    } else if (lanes <= 16) {
        ggrad_softmax_low_launch<16>(dst, mask, out, s, stream);
    } else {
        ggrad_softmax_low_launch<32>(dst, mask, out, s, stream);
    }
}

template <typename M>
static void ggrad_softmax_low_masked(const ggml_tensor * dst, const M * mask, const ggrad_softmax_shape & s, cudaStream_t stream) {
    if (dst->type == GGML_TYPE_BF16) {
        ggrad_softmax_low_typed<M, nv_bfloat16>(dst, mask, s, stream);
    } else if (dst->type == GGML_TYPE_F16) {
        ggrad_softmax_low_typed<M, half>(dst, mask, s, stream);
    } else {
        ggrad_softmax_low_typed<M, float>(dst, mask, s, stream);  // kernel 34's float32 gradient
    }
}

static void ggrad_softmax_low(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * x = dst->src[0];
    const ggml_tensor * mask = dst->src[1];
    ggrad_softmax_shape s;
    s.ncols = (int) x->ne[0];
    s.nrows = ggml_nrows(x);
    s.ne01 = x->ne[1];
    s.ne02 = x->ne[2];
    s.mne2 = mask != nullptr ? mask->ne[2] : 1;
    s.mne3 = mask != nullptr ? mask->ne[3] : 1;
    s.nb11 = mask != nullptr ? mask->nb[1] : 0;
    s.nb12 = mask != nullptr ? mask->nb[2] : 0;
    s.nb13 = mask != nullptr ? mask->nb[3] : 0;
    s.scale = ggml_get_op_params_f32(dst, 1);
    if (mask != nullptr && mask->type == GGML_TYPE_F16) {
        ggrad_softmax_low_masked(dst, (const half *) mask->data, s, ctx.stream());
    } else {
        ggrad_softmax_low_masked(dst, mask != nullptr ? (const float *) mask->data : nullptr, s, ctx.stream());
    }
}

// 35: q (D, L, H, B), k, v (D, S, H, B) of float16 or bfloat16 (views: contiguous rows on 16
// bytes); scale, causal -> the output (B, L, H, D) in float32, then each row's log-sum-exp of its
// base-2 scores (B, H, L). 36: q, k, v, 35's node, the output's gradient (D, L, H, B) float32 (any strides,
// contiguous rows); scale, causal, packed -> dq, dk, dv in float32: packed (L == S), each row's
// three gradients side by side, (B, L, 3, H, D), as a fused projection's gradient lays them;
// else (B, H, L, D) then (B, H, S, D) twice. ggrad_attention.cuh computes.
static bool ggrad_attention_view_fits(const ggml_tensor * t, const ggml_tensor * q) {
    return t != nullptr && t->type == q->type && t->nb[0] == 2 && t->ne[0] == q->ne[0] && t->ne[2] == q->ne[2] &&
           t->ne[3] == q->ne[3] && t->nb[1] % 16 == 0 && t->nb[2] % 16 == 0 && t->nb[3] % 16 == 0 &&
           t->view_offs % 16 == 0;
}

static bool ggrad_attention_supported(const ggml_tensor * op) {
    const int kernel = ggml_get_op_params_i32(op, 0);
    const ggml_tensor * q = op->src[0];
    const int cc = ggml_cuda_info().devices[ggml_cuda_get_device()].cc;
    if (!GGML_CUDA_CC_IS_NVIDIA(cc) || cc < GGML_CUDA_CC_AMPERE || q == nullptr ||
        (q->type != GGML_TYPE_BF16 && q->type != GGML_TYPE_F16) || (q->ne[0] != 32 && q->ne[0] != 64 && q->ne[0] != 128) ||
        !ggrad_attention_view_fits(q, q) || !ggrad_attention_view_fits(op->src[1], q) ||
        !ggrad_attention_view_fits(op->src[2], q) || op->src[1]->ne[1] != op->src[2]->ne[1] ||
        op->type != GGML_TYPE_F32 || !ggml_is_contiguous(op) || q->ne[1] < 1 || op->src[1]->ne[1] < 1 ||
        q->ne[1] > INT32_MAX/2 || op->src[1]->ne[1] > INT32_MAX/2 || q->ne[2] > 65535 || q->ne[3] > 65535) {
        return false;
    }
    const int64_t D = q->ne[0], L = q->ne[1], H = q->ne[2], B = q->ne[3], S = op->src[1]->ne[1];
    // both ways or neither (a forward run here needs its gradient): the backward's blocks take the
    // most shared memory, 103 KB at heads of 128, past what sm_86/89/120 give a block (99 KB)
    if (ggrad_attn_backward_bytes(D) > ggml_cuda_info().devices[ggml_cuda_get_device()].smpbo) {
        return false;
    }
    const size_t forward_bytes = (size_t) (B*L*H*D + B*H*L)*sizeof(float);  // the output, each row's log-sum-exp
    if (kernel == 35) {
        return ggml_nbytes(op) >= forward_bytes;
    }
    const ggml_tensor * fwd = op->src[3];
    const ggml_tensor * g = op->src[4];
    const bool packed = ggml_get_op_params_i32(op, 3) != 0;
    return fwd != nullptr && fwd->op == op->op && ggml_get_op_params_i32(fwd, 0) == 35 && fwd->src[0] == q &&
           ggml_nbytes(fwd) >= forward_bytes && g != nullptr && g->type == GGML_TYPE_F32 &&
           g->nb[0] == sizeof(float) && g->ne[0] == D && g->ne[1] == L && g->ne[2] == H && g->ne[3] == B &&
           (!packed || L == S) && ggml_nbytes(op) >= (size_t) (B*L*H*D + 2*B*H*S*D)*sizeof(float);
}

template <int D, typename T>
static void ggrad_attention_typed(ggml_backend_cuda_context & ctx, ggml_tensor * dst, const ggrad_attn_shape & s) {
    const T * q = (const T *) dst->src[0]->data;
    const T * k = (const T *) dst->src[1]->data;
    const T * v = (const T *) dst->src[2]->data;
    const int64_t outputs = (int64_t) s.B*s.L*s.H*D;
    if (ggml_get_op_params_i32(dst, 0) == 35) {
        ggrad_attn_forward_launch<D>(q, k, v, (float *) dst->data, (float *) dst->data + outputs, s, ctx.stream());
    } else {
        const float * fwd = (const float *) dst->src[3]->data;
        ggml_cuda_pool_alloc<T> g_low(ctx.pool(), outputs);
        ggml_cuda_pool_alloc<float> dot(ctx.pool(), (int64_t) s.B*s.H*s.L);
        const bool packed = ggml_get_op_params_i32(dst, 3) != 0;
        float * dq = (float *) dst->data;
        float * dk = packed ? dq + s.H*D : dq + outputs;
        float * dv = packed ? dq + 2*s.H*D : dk + (int64_t) s.B*s.H*s.S*D;
        ggrad_attn_backward_launch<D>(q, k, v, fwd, fwd + outputs, (const float *) dst->src[4]->data, g_low.get(), dot.get(),
                                      dq, dk, dv, s, ctx.stream());
    }
    CUDA_CHECK(cudaGetLastError());
}

template <typename T>
static void ggrad_attention_of(ggml_backend_cuda_context & ctx, ggml_tensor * dst, const ggrad_attn_shape & s, const int64_t D) {
    if (D == 32) {
        ggrad_attention_typed<32, T>(ctx, dst, s);
    } else if (D == 64) {
        ggrad_attention_typed<64, T>(ctx, dst, s);
    } else {
        ggrad_attention_typed<128, T>(ctx, dst, s);
    }
}

static void ggrad_attention(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * q = dst->src[0];
    const ggml_tensor * k = dst->src[1];
    const ggml_tensor * v = dst->src[2];
    const int64_t D = q->ne[0];
    ggrad_attn_shape s;
    s.L = (int) q->ne[1];
    s.S = (int) k->ne[1];
    s.H = (int) q->ne[2];
    s.B = (int) q->ne[3];
    s.q1 = q->nb[1]/2; s.q2 = q->nb[2]/2; s.q3 = q->nb[3]/2;
    s.k1 = k->nb[1]/2; s.k2 = k->nb[2]/2; s.k3 = k->nb[3]/2;
    s.v1 = v->nb[1]/2; s.v2 = v->nb[2]/2; s.v3 = v->nb[3]/2;
    s.o1 = s.H*D; s.o2 = D; s.o3 = (int64_t) s.L*s.H*D;  // (B, L, H, D)
    if (ggml_get_op_params_i32(dst, 3) != 0) {           // (B, L, 3, H, D)
        s.dq1 = 3*s.H*D; s.dq2 = D; s.dq3 = (int64_t) s.L*3*s.H*D;
        s.dk1 = s.dq1; s.dk2 = s.dq2; s.dk3 = s.dq3;
    } else {                                             // (B, H, L, D), (B, H, S, D)
        s.dq1 = D; s.dq2 = (int64_t) s.L*D; s.dq3 = (int64_t) s.H*s.L*D;
        s.dk1 = D; s.dk2 = (int64_t) s.S*D; s.dk3 = (int64_t) s.H*s.S*D;
    }
    if (ggml_get_op_params_i32(dst, 0) == 36) {
        const ggml_tensor * g = dst->src[4];
        s.g1 = g->nb[1]/4; s.g2 = g->nb[2]/4; s.g3 = g->nb[3]/4;
    } else {
        s.g1 = s.g2 = s.g3 = 0;
    }
    s.scale = ggml_get_op_params_f32(dst, 1);
    s.causal = ggml_get_op_params_i32(dst, 2);
    if (q->type == GGML_TYPE_BF16) {
        ggrad_attention_of<nv_bfloat16>(ctx, dst, s, D);
    } else {
        ggrad_attention_of<half>(ctx, dst, s, D);
    }
}

void ggml_cuda_op_ggrad(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const int kernel = ggml_get_op_params_i32(dst, 0);
    switch (kernel) {  // the kernels with launchers of their own; the rows kernels follow
        case 6:  ggrad_gemm(ctx, dst); return;
        case 9:  ggrad_adamw_group(ctx, dst); return;
        case 10:
        case 11: ggrad_max_pool(ctx, dst, kernel == 11); return;
        case 17: ggrad_qmatmul_back(ctx, dst); return;
        case 18:
        case 19: ggrad_cell(ctx, dst); return;  // src0 may be absent
        case 20:
        case 21:
        case 22: ggrad_bn(ctx, dst, kernel); return;
        case 23: ggrad_fold(ctx, dst); return;
        case 24: ggrad_qrows(ctx, dst); return;
        case 25: ggrad_move_running_stat(ctx, dst); return;
        case 33:
        case 34: ggrad_softmax_low(ctx, dst); return;
        case 35:
        case 36: ggrad_attention(ctx, dst); return;
        default: break;
    }
    const ggml_tensor * x = dst->src[0];
    const ggml_tensor * t = dst->src[1];
    const int32_t ignore = ggml_get_op_params_i32(dst, 1);
    const float keep   = ggml_get_op_params_f32(dst, 2);
    const float spread = ggml_get_op_params_f32(dst, 3);
    const int C = (int) x->ne[0];
    const int64_t N = ggml_nrows(x);
    cudaStream_t stream = ctx.stream();
    if (kernel == 3) {
        const int first = ggrad_adam_hyper_first(dst);  // 1: in place (ggrad_adamw.h)
        float * c = (float *) dst->src[first]->data;
        ggrad_adam_hyper_f32<<<1, 1, 0, stream>>>(c, (const float *) dst->src[first + 1]->data,
                                                  (const float *) dst->src[first + 2]->data,
                                                  (const float *) dst->src[first + 3]->data, (float *) dst->data,
                                                  first == 1 ? c : (float *) dst->data + 9);
        CUDA_CHECK(cudaGetLastError());
        return;
    }
    if (kernel == 32) {
        ggrad_class_total_f32<<<1, 256, 0, stream>>>((const float *) x->data, x->nb[1]/sizeof(float), (int) x->ne[0],
                                                     ggml_get_op_params_i32(dst, 1) != 0, (float *) dst->data);
        CUDA_CHECK(cudaGetLastError());
        return;
    }
    if (kernel == 4 || kernel == 31) {
        const ggml_tensor * g = dst->src[1];
        const float eps = ggml_get_op_params_f32(dst, 1);
        const float * w = kernel == 31 ? (const float *) dst->src[2]->data : nullptr;
        float * gx = kernel == 31 && ggml_get_op_params_i32(dst, 2) == 1 ? (float *) dst->data + N*(dst->nb[1]/sizeof(float)) : nullptr;
        const int64_t xs = x->nb[1]/sizeof(float), gs = g->nb[1]/sizeof(float), os = dst->nb[1]/sizeof(float);
        if (C < 1024) {
            ggrad_layer_norm_back_f32<WARP_SIZE><<<N, WARP_SIZE, 0, stream>>>(
                (const float *) x->data, xs, (const float *) g->data, gs, w, (float *) dst->data, os, gx, C, eps);
        } else {
            ggrad_layer_norm_back_f32<256><<<N, 256, 0, stream>>>(
                (const float *) x->data, xs, (const float *) g->data, gs, w, (float *) dst->data, os, gx, C, eps);
        }
        CUDA_CHECK(cudaGetLastError());
        return;
    }
    if (kernel == 30) {
        if (dst->type == GGML_TYPE_BF16) {
            ggrad_launch_layer_norm(x, dst, (nv_bfloat16 *) dst->data, stream);
        } else if (dst->type == GGML_TYPE_F16) {
            ggrad_launch_layer_norm(x, dst, (half *) dst->data, stream);
        } else {
            ggrad_launch_layer_norm(x, dst, (float *) dst->data, stream);
        }
        return;
    }
    const dim3 blocks(N, 1, 1);
    const dim3 threads(WARP_SIZE, 1, 1);
    if (kernel == 1) {
        const float * wc = dst->src[2] ? (const float *) dst->src[2]->data : nullptr;
        ggrad_class_ce_f32<<<blocks, threads, 0, stream>>>(
            (const float *) x->data, x->nb[1]/sizeof(float), (const int32_t *) t->data, t->nb[0]/sizeof(int32_t), wc,
            (float *) dst->data, C, N, ignore, keep, spread);
    } else {
        const ggml_tensor * d = dst->src[2];
        const float * wc = dst->src[3] ? (const float *) dst->src[3]->data : nullptr;
        ggrad_class_ce_back_f32<<<blocks, threads, 0, stream>>>(
            (const float *) x->data, x->nb[1]/sizeof(float), (const int32_t *) t->data, t->nb[0]/sizeof(int32_t),
            (const float *) d->data, d->nb[0]/sizeof(float), wc, (float *) dst->data, dst->nb[1]/sizeof(float), C,
            ignore, keep, spread);
    }
    CUDA_CHECK(cudaGetLastError());
}
