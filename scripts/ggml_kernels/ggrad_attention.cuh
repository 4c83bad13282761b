// Attention in one kernel each way (GGML_OP_GGRAD 35 and 36, CUDA): softmax(q k^T * scale) v
// for float16 or bfloat16 q, k, v (autocast's), the scores never written. ggrad composes the same
// from two products and set 57's softmax kernels (six batched products and two row kernels
// between them in a step): those are the oracle, and every other backend's path.
//
// A block of 4 warps takes 64 rows (queries forward and for dq, keys for dk and dv), each warp
// 16, and steps through the other side's rows 64 at a time, staged in shared memory; products
// on the tensor cores (wmma, 16x16x16, float32 sums), the softmax's arithmetic in float32 by the
// warp's lanes, 2 columns a lane a row.
// - Forward: the running max and sum of each row (the online softmax), the output's float32
//   partial sums rescaled as the max grows; then the output, and each row's max and 1/sum.
// - dk, dv: per key block, over the query blocks, each probability computed again from its row's
//   max and 1/sum as the forward normalised it (exp(x - max) * (1/sum), float32), dv += p^T dO,
//   dS = p (dP - D) with dP = dO v^T and D = rowsum(dO * out), dk += dS^T q.
// - dq: per query block, over the key blocks, the same p and dS, dq += dS k. Each gradient is
//   written once by one block: no atomics, the same bits every run.
// The probabilities and dS meet the products rounded to the operands' type, as the composed
// path's casts round them; dS is scaled after its products (the composed path scales before
// rounding: the same where the scale is a power of two, 1/sqrt(64)).
#pragma once

#include <mma.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

#define GGRAD_ATTN_ROWS 64     // a block's rows, and the other side's rows a step
#define GGRAD_ATTN_THREADS 128 // 4 warps of 16 rows

// strides in elements; columns (the head dimension) contiguous
struct ggrad_attn_shape {
    int L, S, H, B;                 // queries, keys, heads, batches
    int64_t q1, q2, q3;             // q: row, head, batch
    int64_t k1, k2, k3;
    int64_t v1, v2, v3;
    int64_t o1, o2, o3;             // the output (float32)
    int64_t dq1, dq2, dq3;          // the backward's dq (float32)
    int64_t dk1, dk2, dk3;          // its dk and dv (float32)
    int64_t g1, g2, g3;             // the backward's dO (float32)
    float scale;
    int causal;                     // key j masked for query i where j > i (top-left, torch's)
};

// the rows' statistics (max, 1/sum) of (b, h, row): in order of b, h, row
static __device__ __forceinline__ int64_t ggrad_attn_stat(const ggrad_attn_shape & s, int b, int h, int row) {
    return 2*(((int64_t) b*s.H + h)*s.L + row);
}

template <int D>
struct ggrad_attn_layout {  // shared memory: 16-bit tiles padded 8 values, float tiles 4
    static constexpr int LT = D + 8;                  // a (64, D) tile of q, k, v or dO
    static constexpr int LP = GGRAD_ATTN_ROWS + 8;    // a (64, 64) tile of p or dS
    static constexpr int LF = (D > GGRAD_ATTN_ROWS ? D : GGRAD_ATTN_ROWS) + 4;  // a float tile
    static constexpr size_t tile = (size_t) GGRAD_ATTN_ROWS*LT*2;
    static constexpr size_t ptile = (size_t) GGRAD_ATTN_ROWS*LP*2;
    static constexpr size_t ftile = (size_t) GGRAD_ATTN_ROWS*LF*4;
    static constexpr size_t forward = 3*tile + ptile + 2*ftile;
    static constexpr size_t backward = 4*tile + 2*ptile + 2*ftile + GGRAD_ATTN_ROWS*sizeof(float3);
};

// rows [r0, r0 + 64) of a (rows, D) matrix at `src` (row stride `ld` elements, rows on 16
// bytes) into a thread's registers, 8 values a load, zeros past `rows`: all loads in flight
// before the first is used; then from there into `dst` (row stride LT)
template <int D, typename T>
static __device__ __forceinline__ void ggrad_attn_fetch(uint4 (&reg)[D/16], const T * src, int64_t ld, int r0, int rows) {
#pragma unroll
    for (int n = 0; n < D/16; ++n) {
        const int i = threadIdx.x + n*GGRAD_ATTN_THREADS, r = i/(D/8), c = (i % (D/8))*8;
        reg[n] = r0 + r < rows ? *(const uint4 *) (src + (int64_t) (r0 + r)*ld + c) : make_uint4(0, 0, 0, 0);
    }
}

template <int D, typename T>
static __device__ __forceinline__ void ggrad_attn_stash(T * dst, const uint4 (&reg)[D/16]) {
#pragma unroll
    for (int n = 0; n < D/16; ++n) {
        const int i = threadIdx.x + n*GGRAD_ATTN_THREADS, r = i/(D/8), c = (i % (D/8))*8;
        *(uint4 *) (dst + r*ggrad_attn_layout<D>::LT + c) = reg[n];
    }
}

template <int D, typename T>
static __device__ __forceinline__ void ggrad_attn_load(T * dst, const T * src, int64_t ld, int r0, int rows) {
    uint4 reg[D/16];
    ggrad_attn_fetch<D>(reg, src, ld, r0, rows);
    ggrad_attn_stash<D>(dst, reg);
}

template <typename T> static __device__ __forceinline__ T ggrad_attn_round(float x);
template <> __device__ __forceinline__ half ggrad_attn_round<half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ nv_bfloat16 ggrad_attn_round<nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

static __device__ __forceinline__ float ggrad_attn_warp_max(float x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, offset, 32));
    }
    return x;
}

static __device__ __forceinline__ float ggrad_attn_warp_sum(float x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        x += __shfl_xor_sync(0xffffffff, x, offset, 32);
    }
    return x;
}

namespace ggrad_wmma = nvcuda::wmma;
template <typename T, typename layout>
using ggrad_frag_a = ggrad_wmma::fragment<ggrad_wmma::matrix_a, 16, 16, 16, T, layout>;
template <typename T, typename layout>
using ggrad_frag_b = ggrad_wmma::fragment<ggrad_wmma::matrix_b, 16, 16, 16, T, layout>;
using ggrad_frag_c = ggrad_wmma::fragment<ggrad_wmma::accumulator, 16, 16, 16, float>;

// a warp's (16, 64) = its 16 rows of `a` (16, K) @ b^T, where b is (64, K) row-major in shared
// memory (b^T read column-major): into the float tile `out` at its rows
template <int K, typename T>
static __device__ __forceinline__ void ggrad_attn_product_nt(float * out, int ldo, const T * a, int lda, const T * b, int ldb) {
    ggrad_frag_a<T, ggrad_wmma::row_major> fa[K/16];
#pragma unroll
    for (int k = 0; k < K/16; ++k) {
        ggrad_wmma::load_matrix_sync(fa[k], a + 16*k, lda);
    }
#pragma unroll
    for (int n = 0; n < GGRAD_ATTN_ROWS/16; ++n) {
        ggrad_frag_c acc;
        ggrad_wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int k = 0; k < K/16; ++k) {
            ggrad_frag_b<T, ggrad_wmma::col_major> fb;
            ggrad_wmma::load_matrix_sync(fb, b + (int64_t) 16*n*ldb + 16*k, ldb);
            ggrad_wmma::mma_sync(acc, fa[k], fb, acc);
        }
        ggrad_wmma::store_matrix_sync(out + 16*n, acc, ldo, ggrad_wmma::mem_row_major);
    }
}

// acc[D/16] += a (16, 64) row-major @ b (64, D) row-major, both in shared memory
template <int D, typename T>
static __device__ __forceinline__ void ggrad_attn_product_nn(ggrad_frag_c * acc, const T * a, int lda, const T * b, int ldb) {
#pragma unroll
    for (int k = 0; k < GGRAD_ATTN_ROWS/16; ++k) {
        ggrad_frag_a<T, ggrad_wmma::row_major> fa;
        ggrad_wmma::load_matrix_sync(fa, a + 16*k, lda);
#pragma unroll
        for (int n = 0; n < D/16; ++n) {
            ggrad_frag_b<T, ggrad_wmma::row_major> fb;
            ggrad_wmma::load_matrix_sync(fb, b + (int64_t) 16*k*ldb + 16*n, ldb);
            ggrad_wmma::mma_sync(acc[n], fa, fb, acc[n]);
        }
    }
}

// q (L, D), k, v (S, D) per (b, h); out: the output (float32, strides o) and at `stats` each
// row's max and 1/sum. The softmax's lanes: lane l takes row l/2 of the warp's 16, columns
// l%2, l%2 + 2, ... (32 of 64), its partner lane the others.
template <int D, typename T>
static __global__ void __launch_bounds__(GGRAD_ATTN_THREADS)
ggrad_attn_forward(const T * q, const T * k, const T * v, float * out, float * stats, const ggrad_attn_shape s) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    using Lay = ggrad_attn_layout<D>;
    extern __shared__ __align__(128) unsigned char smem[];
    T * qs = (T *) smem;
    T * ks = qs + GGRAD_ATTN_ROWS*Lay::LT;
    T * vs = ks + GGRAD_ATTN_ROWS*Lay::LT;
    T * ps = vs + GGRAD_ATTN_ROWS*Lay::LT;
    float * ss = (float *) (ps + GGRAD_ATTN_ROWS*Lay::LP);
    float * os = ss + GGRAD_ATTN_ROWS*Lay::LF;

    const int q0 = blockIdx.x*GGRAD_ATTN_ROWS, h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x/32, lane = threadIdx.x % 32, r0 = 16*warp;
    const int r = lane >> 1, half = lane & 1, row = q0 + r0 + r;
    q += b*s.q3 + h*s.q2;
    k += b*s.k3 + h*s.k2;
    v += b*s.v3 + h*s.v2;
    uint4 kr[D/16], vr[D/16];
    ggrad_attn_fetch<D>(kr, k, s.k1, 0, s.S);
    ggrad_attn_fetch<D>(vr, v, s.v1, 0, s.S);
    ggrad_attn_load<D>(qs, q, s.q1, q0, s.L);
    float * srow = ss + (r0 + r)*Lay::LF;
    float * orow = os + (r0 + r)*Lay::LF;
    T * prow = ps + (r0 + r)*Lay::LP;
    for (int c = half; c < D; c += 2) {
        orow[c] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const int kend = s.causal ? min(s.S, q0 + GGRAD_ATTN_ROWS) : s.S;
    for (int k0 = 0; k0 < kend; k0 += GGRAD_ATTN_ROWS) {
        __syncthreads();  // the step before is done with ks, vs
        ggrad_attn_stash<D>(ks, kr);
        ggrad_attn_stash<D>(vs, vr);
        __syncthreads();
        if (k0 + GGRAD_ATTN_ROWS < kend) {  // the next keys' loads in flight through this step
            ggrad_attn_fetch<D>(kr, k, s.k1, k0 + GGRAD_ATTN_ROWS, s.S);
            ggrad_attn_fetch<D>(vr, v, s.v1, k0 + GGRAD_ATTN_ROWS, s.S);
        }
        ggrad_attn_product_nt<D>(ss + r0*Lay::LF, Lay::LF, qs + r0*Lay::LT, Lay::LT, ks, Lay::LT);
        __syncwarp();
        float x[GGRAD_ATTN_ROWS/2];
        float top = m;
#pragma unroll
        for (int j = 0; j < GGRAD_ATTN_ROWS/2; ++j) {
            const int col = k0 + half + 2*j;
            const bool masked = col >= s.S || (s.causal && col > row);
            x[j] = masked ? -INFINITY : srow[half + 2*j]*s.scale;
            top = fmaxf(top, x[j]);
        }
        top = fmaxf(top, __shfl_xor_sync(0xffffffff, top, 1, 32));
        const float alpha = m == -INFINITY ? 0.0f : expf(m - top);
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < GGRAD_ATTN_ROWS/2; ++j) {
            const float p = x[j] == -INFINITY ? 0.0f : expf(x[j] - top);
            sum += p;
            prow[half + 2*j] = ggrad_attn_round<T>(p);
        }
        sum += __shfl_xor_sync(0xffffffff, sum, 1, 32);
        l = l*alpha + sum;
        m = top;
#pragma unroll
        for (int c = half; c < D; c += 2) {
            orow[c] *= alpha;
        }
        __syncwarp();
        ggrad_frag_c acc[D/16];
#pragma unroll
        for (int n = 0; n < D/16; ++n) {
            ggrad_wmma::load_matrix_sync(acc[n], os + r0*Lay::LF + 16*n, Lay::LF, ggrad_wmma::mem_row_major);
        }
        ggrad_attn_product_nn<D>(acc, ps + r0*Lay::LP, Lay::LP, vs, Lay::LT);
#pragma unroll
        for (int n = 0; n < D/16; ++n) {
            ggrad_wmma::store_matrix_sync(os + r0*Lay::LF + 16*n, acc[n], Lay::LF, ggrad_wmma::mem_row_major);
        }
        __syncwarp();
    }
    if (row < s.L) {
        const float inv = 1.0f / l;
        float * o = out + b*s.o3 + h*s.o2 + (int64_t) row*s.o1;
#pragma unroll
        for (int c = half; c < D; c += 2) {
            o[c] = __fmul_rn(orow[c], inv);
        }
        if (half == 0) {
            stats[ggrad_attn_stat(s, b, h, row)] = m;
            stats[ggrad_attn_stat(s, b, h, row) + 1] = inv;
        }
    }
#endif
}

// before the backward: dO in the operands' type, contiguous (L, D) per (b, h), and each row's
// D = sum(dO * out) in float32; a warp a row
template <int D, typename T>
static __global__ void ggrad_attn_back_rows(const float * g, const float * out, T * g_low, float * dot, const ggrad_attn_shape s) {
    const int64_t row = (int64_t) blockIdx.x*4 + threadIdx.x/32;
    const int lane = threadIdx.x % 32;
    if (row >= (int64_t) s.B*s.H*s.L) {
        return;
    }
    const int i = (int) (row % s.L), h = (int) ((row/s.L) % s.H), b = (int) (row/((int64_t) s.L*s.H));
    const float * gr = g + b*s.g3 + h*s.g2 + i*s.g1;
    const float * orow = out + b*s.o3 + h*s.o2 + i*s.o1;
    float sum = 0.0f;
    for (int c = lane; c < D; c += 32) {
        sum += gr[c]*orow[c];
        g_low[row*D + c] = ggrad_attn_round<T>(gr[c]);
    }
    sum = ggrad_attn_warp_sum(sum);
    if (lane == 0) {
        dot[row] = sum;
    }
}

// a probability computed again as the forward normalised it, and dS = p (dP - D); 0 where masked
static __device__ __forceinline__ float2 ggrad_attn_p_ds(float x, float dp, float top, float inv, float dot, bool masked) {
    if (masked) {
        return make_float2(0.0f, 0.0f);
    }
    const float p = __fmul_rn(expf(x - top), inv);
    return make_float2(p, p*(dp - dot));
}

// the three statistics of query row `row` (its max, 1/sum and D), zeros past L
static __device__ __forceinline__ float3 ggrad_attn_row_stats(const float * stats, const float * dot, const ggrad_attn_shape & s,
                                                              int b, int h, int row) {
    if (row >= s.L) {
        return make_float3(0.0f, 0.0f, 0.0f);
    }
    const int64_t i = ggrad_attn_stat(s, b, h, row);
    return make_float3(stats[i], stats[i + 1], dot[((int64_t) b*s.H + h)*s.L + row]);
}

// dk and dv: a block per 64 keys of (b, h), both written at the strides dk. Lanes as the forward's,
// over the warp's 16 keys (rows of S^T) and the block's 64 queries
template <int D, typename T>
static __global__ void __launch_bounds__(GGRAD_ATTN_THREADS)
ggrad_attn_back_kv(const T * q, const T * k, const T * v, const T * g_low, const float * stats, const float * dot,
                   float * dk, float * dv, const ggrad_attn_shape s) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    using Lay = ggrad_attn_layout<D>;
    extern __shared__ __align__(128) unsigned char smem[];
    T * ks = (T *) smem;
    T * vs = ks + GGRAD_ATTN_ROWS*Lay::LT;
    T * qs = vs + GGRAD_ATTN_ROWS*Lay::LT;
    T * gs = qs + GGRAD_ATTN_ROWS*Lay::LT;
    T * pt = gs + GGRAD_ATTN_ROWS*Lay::LT;
    T * dst_ = pt + GGRAD_ATTN_ROWS*Lay::LP;
    float * sf = (float *) (dst_ + GGRAD_ATTN_ROWS*Lay::LP);
    float * dpf = sf + GGRAD_ATTN_ROWS*Lay::LF;
    float3 * rows = (float3 *) (dpf + GGRAD_ATTN_ROWS*Lay::LF);

    const int k0 = blockIdx.x*GGRAD_ATTN_ROWS, h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x/32, lane = threadIdx.x % 32, r0 = 16*warp;
    const int r = lane >> 1, half = lane & 1, key = k0 + r0 + r;
    q += b*s.q3 + h*s.q2;
    k += b*s.k3 + h*s.k2;
    v += b*s.v3 + h*s.v2;
    g_low += ((int64_t) b*s.H + h)*s.L*D;
    // causal: the queries before this block's first key see none of its keys
    const int qstart = s.causal ? k0 : 0;
    uint4 qr[D/16], gr[D/16];
    float3 st = make_float3(0.0f, 0.0f, 0.0f);
    if (qstart < s.L) {
        ggrad_attn_fetch<D>(qr, q, s.q1, qstart, s.L);
        ggrad_attn_fetch<D>(gr, g_low, D, qstart, s.L);
        if (threadIdx.x < GGRAD_ATTN_ROWS) {
            st = ggrad_attn_row_stats(stats, dot, s, b, h, qstart + threadIdx.x);
        }
    }
    ggrad_attn_load<D>(ks, k, s.k1, k0, s.S);
    ggrad_attn_load<D>(vs, v, s.v1, k0, s.S);
    ggrad_frag_c dk_acc[D/16], dv_acc[D/16];
#pragma unroll
    for (int n = 0; n < D/16; ++n) {
        ggrad_wmma::fill_fragment(dk_acc[n], 0.0f);
        ggrad_wmma::fill_fragment(dv_acc[n], 0.0f);
    }
    const float * srow = sf + (r0 + r)*Lay::LF;
    const float * dprow = dpf + (r0 + r)*Lay::LF;
    for (int q0 = qstart; q0 < s.L; q0 += GGRAD_ATTN_ROWS) {
        __syncthreads();
        ggrad_attn_stash<D>(qs, qr);
        ggrad_attn_stash<D>(gs, gr);
        if (threadIdx.x < GGRAD_ATTN_ROWS) {
            rows[threadIdx.x] = st;
        }
        __syncthreads();
        if (q0 + GGRAD_ATTN_ROWS < s.L) {
            ggrad_attn_fetch<D>(qr, q, s.q1, q0 + GGRAD_ATTN_ROWS, s.L);
            ggrad_attn_fetch<D>(gr, g_low, D, q0 + GGRAD_ATTN_ROWS, s.L);
            if (threadIdx.x < GGRAD_ATTN_ROWS) {
                st = ggrad_attn_row_stats(stats, dot, s, b, h, q0 + GGRAD_ATTN_ROWS + threadIdx.x);
            }
        }
        // the warp's 16 keys against the block's 64 queries: S^T = k q^T, dP^T = v dO^T
        ggrad_attn_product_nt<D>(sf + r0*Lay::LF, Lay::LF, ks + r0*Lay::LT, Lay::LT, qs, Lay::LT);
        ggrad_attn_product_nt<D>(dpf + r0*Lay::LF, Lay::LF, vs + r0*Lay::LT, Lay::LT, gs, Lay::LT);
        __syncwarp();
#pragma unroll
        for (int j = 0; j < GGRAD_ATTN_ROWS/2; ++j) {
            const int c = half + 2*j, row = q0 + c;
            const bool masked = row >= s.L || key >= s.S || (s.causal && key > row);
            const float3 rs = rows[c];
            const float2 pd = ggrad_attn_p_ds(srow[c]*s.scale, dprow[c], rs.x, rs.y, rs.z, masked);
            pt[(r0 + r)*Lay::LP + c] = ggrad_attn_round<T>(pd.x);
            dst_[(r0 + r)*Lay::LP + c] = ggrad_attn_round<T>(pd.y);
        }
        __syncwarp();
        ggrad_attn_product_nn<D>(dv_acc, pt + r0*Lay::LP, Lay::LP, gs, Lay::LT);
        ggrad_attn_product_nn<D>(dk_acc, dst_ + r0*Lay::LP, Lay::LP, qs, Lay::LT);
    }
    // through the warp's float rows: dk scaled, then both written at their strides
#pragma unroll
    for (int pass = 0; pass < 2; ++pass) {
        __syncwarp();
#pragma unroll
        for (int n = 0; n < D/16; ++n) {
            ggrad_wmma::store_matrix_sync(sf + r0*Lay::LF + 16*n, pass == 0 ? dk_acc[n] : dv_acc[n], Lay::LF,
                                          ggrad_wmma::mem_row_major);
        }
        __syncwarp();
        if (key < s.S) {
            float * dst = (pass == 0 ? dk : dv) + b*s.dk3 + h*s.dk2 + (int64_t) key*s.dk1;
#pragma unroll
            for (int c = half; c < D; c += 2) {
                dst[c] = pass == 0 ? srow[c]*s.scale : srow[c];
            }
        }
    }
#endif
}

// dq: a block per 64 queries of (b, h), written at the strides dq; lanes as the forward's
template <int D, typename T>
static __global__ void __launch_bounds__(GGRAD_ATTN_THREADS)
ggrad_attn_back_q(const T * q, const T * k, const T * v, const T * g_low, const float * stats, const float * dot,
                  float * dq, const ggrad_attn_shape s) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    using Lay = ggrad_attn_layout<D>;
    extern __shared__ __align__(128) unsigned char smem[];
    T * qs = (T *) smem;
    T * gs = qs + GGRAD_ATTN_ROWS*Lay::LT;
    T * ks = gs + GGRAD_ATTN_ROWS*Lay::LT;
    T * vs = ks + GGRAD_ATTN_ROWS*Lay::LT;
    T * dss = vs + GGRAD_ATTN_ROWS*Lay::LT;
    float * sf = (float *) (dss + 2*GGRAD_ATTN_ROWS*Lay::LP);  // the kv kernel's layout: a p tile unused
    float * dpf = sf + GGRAD_ATTN_ROWS*Lay::LF;

    const int q0 = blockIdx.x*GGRAD_ATTN_ROWS, h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x/32, lane = threadIdx.x % 32, r0 = 16*warp;
    const int r = lane >> 1, half = lane & 1, row = q0 + r0 + r;
    q += b*s.q3 + h*s.q2;
    k += b*s.k3 + h*s.k2;
    v += b*s.v3 + h*s.v2;
    uint4 kr[D/16], vr[D/16];
    ggrad_attn_fetch<D>(kr, k, s.k1, 0, s.S);
    ggrad_attn_fetch<D>(vr, v, s.v1, 0, s.S);
    ggrad_attn_load<D>(qs, q, s.q1, q0, s.L);
    ggrad_attn_load<D>(gs, g_low + ((int64_t) b*s.H + h)*s.L*D, D, q0, s.L);
    const float3 rs = ggrad_attn_row_stats(stats, dot, s, b, h, row);
    ggrad_frag_c acc[D/16];
#pragma unroll
    for (int n = 0; n < D/16; ++n) {
        ggrad_wmma::fill_fragment(acc[n], 0.0f);
    }
    const float * srow = sf + (r0 + r)*Lay::LF;
    const float * dprow = dpf + (r0 + r)*Lay::LF;
    const int kend = s.causal ? min(s.S, q0 + GGRAD_ATTN_ROWS) : s.S;
    for (int k0 = 0; k0 < kend; k0 += GGRAD_ATTN_ROWS) {
        __syncthreads();
        ggrad_attn_stash<D>(ks, kr);
        ggrad_attn_stash<D>(vs, vr);
        __syncthreads();
        if (k0 + GGRAD_ATTN_ROWS < kend) {
            ggrad_attn_fetch<D>(kr, k, s.k1, k0 + GGRAD_ATTN_ROWS, s.S);
            ggrad_attn_fetch<D>(vr, v, s.v1, k0 + GGRAD_ATTN_ROWS, s.S);
        }
        ggrad_attn_product_nt<D>(sf + r0*Lay::LF, Lay::LF, qs + r0*Lay::LT, Lay::LT, ks, Lay::LT);
        ggrad_attn_product_nt<D>(dpf + r0*Lay::LF, Lay::LF, gs + r0*Lay::LT, Lay::LT, vs, Lay::LT);
        __syncwarp();
#pragma unroll
        for (int j = 0; j < GGRAD_ATTN_ROWS/2; ++j) {
            const int c = half + 2*j, key = k0 + c;
            const bool masked = row >= s.L || key >= s.S || (s.causal && key > row);
            const float2 pd = ggrad_attn_p_ds(srow[c]*s.scale, dprow[c], rs.x, rs.y, rs.z, masked);
            dss[(r0 + r)*Lay::LP + c] = ggrad_attn_round<T>(pd.y);
        }
        __syncwarp();
        ggrad_attn_product_nn<D>(acc, dss + r0*Lay::LP, Lay::LP, ks, Lay::LT);
    }
    __syncwarp();
#pragma unroll
    for (int n = 0; n < D/16; ++n) {
        ggrad_wmma::store_matrix_sync(sf + r0*Lay::LF + 16*n, acc[n], Lay::LF, ggrad_wmma::mem_row_major);
    }
    __syncwarp();
    if (row < s.L) {
        float * o = dq + b*s.dq3 + h*s.dq2 + (int64_t) row*s.dq1;
#pragma unroll
        for (int c = half; c < D; c += 2) {
            o[c] = srow[c]*s.scale;
        }
    }
#endif
}

// the launches (stream `stream`): forward into out/stats; backward from the forward's out/stats and
// dO `g` into dq, dk and dv, with scratch for dO in T (B*H*L*D) and D (B*H*L)
template <int D, typename T>
static void ggrad_attn_forward_launch(const T * q, const T * k, const T * v, float * out, float * stats,
                                      const ggrad_attn_shape & s, cudaStream_t stream) {
    const size_t bytes = ggrad_attn_layout<D>::forward;
    cudaFuncSetAttribute(ggrad_attn_forward<D, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) bytes);
    const dim3 grid((s.L + GGRAD_ATTN_ROWS - 1)/GGRAD_ATTN_ROWS, s.H, s.B);
    ggrad_attn_forward<D, T><<<grid, GGRAD_ATTN_THREADS, bytes, stream>>>(q, k, v, out, stats, s);
}

template <int D, typename T>
static void ggrad_attn_backward_launch(const T * q, const T * k, const T * v, const float * out, const float * stats,
                                       const float * g, T * g_low, float * dot, float * dq, float * dk, float * dv,
                                       const ggrad_attn_shape & s, cudaStream_t stream) {
    const int64_t rows = (int64_t) s.B*s.H*s.L;
    ggrad_attn_back_rows<D, T><<<(unsigned int) ((rows + 3)/4), 128, 0, stream>>>(g, out, g_low, dot, s);
    const size_t bytes = ggrad_attn_layout<D>::backward;
    cudaFuncSetAttribute(ggrad_attn_back_kv<D, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) bytes);
    cudaFuncSetAttribute(ggrad_attn_back_q<D, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) bytes);
    const dim3 kv_grid((s.S + GGRAD_ATTN_ROWS - 1)/GGRAD_ATTN_ROWS, s.H, s.B);
    ggrad_attn_back_kv<D, T><<<kv_grid, GGRAD_ATTN_THREADS, bytes, stream>>>(q, k, v, g_low, stats, dot, dk, dv, s);
    const dim3 q_grid((s.L + GGRAD_ATTN_ROWS - 1)/GGRAD_ATTN_ROWS, s.H, s.B);
    ggrad_attn_back_q<D, T><<<q_grid, GGRAD_ATTN_THREADS, bytes, stream>>>(q, k, v, g_low, stats, dot, dq, s);
}
