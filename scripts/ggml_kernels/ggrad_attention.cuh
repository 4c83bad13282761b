// Attention in one kernel each way (GGML_OP_GGRAD 35 and 36, CUDA): softmax(q k^T * scale) v
// for float16 or bfloat16 q, k, v (autocast's), the scores never written. ggrad composes the same
// from two products and set 57's softmax kernels (six batched products and two row kernels
// between them in a step): those are the oracle, and every other backend's path.
//
// A block of 4 warps takes 64 rows (queries forward and for dq, keys for dk and dv), each warp
// 16, and steps through the other side's rows 64 at a time, staged in shared memory in two
// buffers taken in turn (cp.async: the next step's rows copied while this step computes, through
// no registers; one barrier a step). Products on the tensor cores (mma.sync m16n8k16,
// float32 sums, operands through ldmatrix); a warp's scores, probabilities and sums stay in its
// registers in mma's accumulator layout (lane l: rows l/4 and l/4 + 8, columns 2(l%4) and the
// next of each 8), which is the layout of the next product's first operand once rounded.
// - Forward: the running max and sum of each row (the online softmax), the output's float32
//   partial sums rescaled as the max grows; then the output, and each row's log-sum-exp.
// - dk, dv: per key block, over the query blocks, each probability computed again from its row's
//   log-sum-exp (p = 2^(x - lse), float32), dv += p^T dO, dS = p (dP - D) with dP = dO v^T and
//   D = rowsum(dO * out), dk += dS^T q.
// - dq: per query block, over the key blocks, the same p and dS, dq += dS k. Each gradient is
//   written once by one block: no atomics, the same bits every run. Both kinds of block in one
//   launch, after a small kernel that rounds dO and takes D.
// Scores are taken in base 2 (x = q.k * scale * log2(e)) so that a probability is one FMA and one
// ex2.approx (relative error ~2^-22, below float32's sum of 64 terms; the operands round p to 8 or
// 11 bits); the masks are applied only in the steps that a tail or the causal diagonal crosses.
// The probabilities and dS meet the products rounded to the operands' type, as the composed
// path's casts round them; dS is scaled after its products (the composed path scales before
// rounding: the same where the scale is a power of two, 1/sqrt(64)).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

#define GGRAD_ATTN_ROWS 64     // a block's rows, and the other side's rows a step
#define GGRAD_ATTN_THREADS 128 // 4 warps of 16 rows
#define GGRAD_ATTN_LOG2E 1.4426950408889634f
// The blocks a multiprocessor is asked to hold (launch bounds' second argument, which caps the
// registers a thread may take) for heads of 32 and 64; 0 leaves it to ptxas (sm_90, heads of 64: the
// forward 123 registers, 4 blocks; the backward 166, 3). Heads of 128 hold 128 accumulators a
// thread and always leave it. Set at build time to time the kernels each way (session.sh set81p).
#ifndef GGRAD_ATTN_FORWARD_BLOCKS
#define GGRAD_ATTN_FORWARD_BLOCKS 0
#endif
#ifndef GGRAD_ATTN_BACKWARD_BLOCKS
#define GGRAD_ATTN_BACKWARD_BLOCKS 0
#endif
template <int D> constexpr int ggrad_attn_min_blocks(int blocks) { return D > 64 ? 0 : blocks; }

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

// the index of row `row` of (b, h) in the rows' statistics (log-sum-exp, D): in order of b, h, row
static __device__ __forceinline__ int64_t ggrad_attn_stat(const ggrad_attn_shape & s, int b, int h, int row) {
    return ((int64_t) b*s.H + h)*s.L + row;
}

template <int D>
struct ggrad_attn_layout {  // shared memory: (64, D) tiles of q, k, v or dO, rows padded 8 values
    static constexpr int LT = D + 8;  // (ldmatrix's 8 rows of a matrix fall in distinct banks)
    static constexpr int tile = GGRAD_ATTN_ROWS*LT;  // values
    static constexpr size_t forward = 5*tile*2;      // q; k, v twice
    static constexpr size_t backward = 6*tile*2 + 2*GGRAD_ATTN_ROWS*sizeof(float2);  // and each query's statistics twice
};

// a backward block's shared memory at heads of D (32, 64 or 128)
static inline size_t ggrad_attn_backward_bytes(int64_t D) {
    return D == 32 ? ggrad_attn_layout<32>::backward : D == 64 ? ggrad_attn_layout<64>::backward : ggrad_attn_layout<128>::backward;
}

template <typename T> static __device__ __forceinline__ T ggrad_attn_round(float x);
template <> __device__ __forceinline__ half ggrad_attn_round<half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ nv_bfloat16 ggrad_attn_round<nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

static __device__ __forceinline__ float ggrad_attn_warp_sum(float x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        x += __shfl_xor_sync(0xffffffff, x, offset, 32);
    }
    return x;
}

// the tensor cores' operands from shared memory (ldmatrix: four 8x8 matrices, lane i giving
// the address of row i%8 of matrix i/8), and their product
static __device__ __forceinline__ void ggrad_ldsm(uint32_t (&r)[4], const void * p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"((uint32_t) __cvta_generic_to_shared(p)));
}

static __device__ __forceinline__ void ggrad_ldsm_t(uint32_t (&r)[4], const void * p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"((uint32_t) __cvta_generic_to_shared(p)));
}

// 2^x (ex2.approx.ftz: 2^-22 relative; 0 for -inf and below 2^-126)
static __device__ __forceinline__ float ggrad_attn_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// copies from global to shared memory that pass no register (cp.async; zeros where !valid, src
// then unread), a thread's copies since the last commit one group; wait: all of the thread's
// groups landed (a barrier after it shows every thread's)
static __device__ __forceinline__ void ggrad_cp16(void * dst, const void * src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"((uint32_t) __cvta_generic_to_shared(dst)), "l"(src), "r"(valid ? 16 : 0));
}
static __device__ __forceinline__ void ggrad_cp4(void * dst, const void * src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                 :: "r"((uint32_t) __cvta_generic_to_shared(dst)), "l"(src), "r"(valid ? 4 : 0));
}
static __device__ __forceinline__ void ggrad_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
static __device__ __forceinline__ void ggrad_cp_wait() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// d (16x8, float32) += a (16x16) b (16x8)
template <typename T>
static __device__ __forceinline__ void ggrad_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void ggrad_mma<nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void ggrad_mma<half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// two floats rounded into one register of the operands' type, the first in its low half
template <typename T> static __device__ __forceinline__ uint32_t ggrad_pack(float lo, float hi);
template <> __device__ __forceinline__ uint32_t ggrad_pack<nv_bfloat16>(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(const uint32_t *) &v;
}
template <> __device__ __forceinline__ uint32_t ggrad_pack<half>(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *(const uint32_t *) &v;
}

// rows [r0, r0 + 64) of a (rows, D) matrix at `src` (row stride `ld` elements, rows on 16 bytes)
// copied to `dst` (row stride LT), zeros past `rows`
template <int D, typename T>
static __device__ __forceinline__ void ggrad_attn_copy(T * dst, const T * src, int64_t ld, int r0, int rows) {
#pragma unroll
    for (int n = 0; n < D/16; ++n) {
        const int i = threadIdx.x + n*GGRAD_ATTN_THREADS, r = i/(D/8), c = (i % (D/8))*8;
        const bool valid = r0 + r < rows;
        ggrad_cp16(dst + r*ggrad_attn_layout<D>::LT + c, valid ? src + (int64_t) (r0 + r)*ld + c : src, valid);
    }
}

// accumulator tiles set to 0
template <int N>
static __device__ __forceinline__ void ggrad_attn_zero(float (&acc)[N][4]) {
#pragma unroll
    for (int n = 0; n < N; ++n) {
        acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    }
}

// q, k and v moved to head h of batch b
template <typename T>
static __device__ __forceinline__ void ggrad_attn_at_head(const T *& q, const T *& k, const T *& v, const ggrad_attn_shape & s,
                                                          int b, int h) {
    q += b*s.q3 + h*s.q2;
    k += b*s.k3 + h*s.k2;
    v += b*s.v3 + h*s.v2;
}

// the keys that queries [q0, q0 + 64) see: all, or (causal) those up to the block's last query
static __device__ __forceinline__ int ggrad_attn_key_end(const ggrad_attn_shape & s, int q0) {
    return s.causal ? min(s.S, q0 + GGRAD_ATTN_ROWS) : s.S;
}

// acc[8][4] (16 rows, 64 columns) = a (16, D) b^T: a's rows r0.. of the tile `a`, b's 64 rows the
// tile `b` (both row-major, row stride LT)
template <int D, typename T>
static __device__ __forceinline__ void ggrad_attn_scores(float (&acc)[8][4], const T * a, const T * b) {
    constexpr int LT = ggrad_attn_layout<D>::LT;
    const int lane = threadIdx.x % 32;
    ggrad_attn_zero(acc);
#pragma unroll
    for (int kk = 0; kk < D/16; ++kk) {
        uint32_t fa[4];
        ggrad_ldsm(fa, a + (lane & 15)*LT + 16*kk + 8*(lane >> 4));
#pragma unroll
        for (int n16 = 0; n16 < 4; ++n16) {
            uint32_t fb[4];
            ggrad_ldsm(fb, b + (16*n16 + (lane & 7) + 8*(lane >> 4))*LT + 16*kk + 8*((lane >> 3) & 1));
            ggrad_mma<T>(acc[2*n16], fa, fb[0], fb[1]);
            ggrad_mma<T>(acc[2*n16 + 1], fa, fb[2], fb[3]);
        }
    }
}

// acc[D/8][4] (16 rows, D columns) += p (16, 64; in registers, accumulator layout) @ b (64, D),
// b the row-major tile `b`
template <int D, typename T>
static __device__ __forceinline__ void ggrad_attn_apply(float (&acc)[D/8][4], const float (&p)[8][4], const T * b) {
    constexpr int LT = ggrad_attn_layout<D>::LT;
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        const uint32_t fa[4] = {ggrad_pack<T>(p[2*kk][0], p[2*kk][1]), ggrad_pack<T>(p[2*kk][2], p[2*kk][3]),
                                ggrad_pack<T>(p[2*kk + 1][0], p[2*kk + 1][1]), ggrad_pack<T>(p[2*kk + 1][2], p[2*kk + 1][3])};
#pragma unroll
        for (int n16 = 0; n16 < D/16; ++n16) {
            uint32_t fb[4];
            ggrad_ldsm_t(fb, b + (16*kk + (lane & 15))*LT + 16*n16 + 8*(lane >> 4));
            ggrad_mma<T>(acc[2*n16], fa, fb[0], fb[1]);
            ggrad_mma<T>(acc[2*n16 + 1], fa, fb[2], fb[3]);
        }
    }
}

// the column of element (n, j) of a lane's accumulator tile, and whether it is in the second row
static __device__ __forceinline__ int ggrad_attn_col(int n, int j) {
    return 8*n + 2*(threadIdx.x % 4) + (j & 1);
}

// whether key `key` is hidden from query `row`: past S, or (causal) after it
static __device__ __forceinline__ bool ggrad_attn_masked(const ggrad_attn_shape & s, int key, int row) {
    return key >= s.S || (s.causal && key > row);
}

// whether a mask may apply in the step of keys [k0, k0 + 64) for queries [q0, q0 + 64): whether
// its last key is hidden from its first query
static __device__ __forceinline__ bool ggrad_attn_edge(const ggrad_attn_shape & s, int q0, int k0) {
    return ggrad_attn_masked(s, k0 + GGRAD_ATTN_ROWS - 1, q0);
}

// the scores of a lane's tile of keys k0.. (columns) and queries `rows` made base-2 logits
// (times scale2 = scale * log2(e)); with MASK, -inf for keys past S and (causal) after the row
template <bool MASK>
static __device__ __forceinline__ void ggrad_attn_logits(float (&x)[8][4], float scale2, const ggrad_attn_shape & s, int k0,
                                                         const int (&rows)[2]) {
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int col = k0 + ggrad_attn_col(n, j);
            x[n][j] = MASK && ggrad_attn_masked(s, col, rows[j >> 1]) ? -INFINITY : x[n][j]*scale2;
        }
    }
}

// the keys [k0, k0 + 64) and their values copied to the step's buffers of ks and vs
template <int D, typename T>
static __device__ __forceinline__ void ggrad_attn_copy_keys(T * ks, T * vs, const T * k, const T * v, const ggrad_attn_shape & s,
                                                            int k0) {
    ggrad_attn_copy<D>(ks, k, s.k1, k0, s.S);
    ggrad_attn_copy<D>(vs, v, s.v1, k0, s.S);
    ggrad_cp_commit();
}

// a step's start: its tiles (copied in the step before) landed and seen by every thread, and every
// warp done with the step before, whose buffers the next copies overwrite
static __device__ __forceinline__ void ggrad_attn_step() {
    ggrad_cp_wait();
    __syncthreads();
}

// q (L, D), k, v (S, D) per (b, h); out: the output (float32, strides o) and at `lse` each row's
// log-sum-exp of its base-2 scores. A lane's rows: row0 = its warp's first + lane/4, and row0 + 8.
template <int D, typename T>
static __global__ void __launch_bounds__(GGRAD_ATTN_THREADS, ggrad_attn_min_blocks<D>(GGRAD_ATTN_FORWARD_BLOCKS))
ggrad_attn_forward(const T * q, const T * k, const T * v, float * out, float * lse, const ggrad_attn_shape s) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    using Lay = ggrad_attn_layout<D>;
    extern __shared__ __align__(128) unsigned char smem[];
    T * qs = (T *) smem;
    T * ks = qs + Lay::tile;      // two buffers of keys, then two of values
    T * vs = ks + 2*Lay::tile;

    const int q0 = blockIdx.x*GGRAD_ATTN_ROWS, h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x/32, lane = threadIdx.x % 32, r0 = 16*warp;
    const int rows[2] = {q0 + r0 + lane/4, q0 + r0 + lane/4 + 8};
    ggrad_attn_at_head(q, k, v, s, b, h);
    ggrad_attn_copy<D>(qs, q, s.q1, q0, s.L);
    ggrad_attn_copy_keys<D>(ks, vs, k, v, s, 0);
    float o[D/8][4];
    ggrad_attn_zero(o);
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // l: this lane's columns' part
    const float scale2 = s.scale*GGRAD_ATTN_LOG2E;
    const int kend = ggrad_attn_key_end(s, q0);
    for (int k0 = 0, buf = 0; k0 < kend; k0 += GGRAD_ATTN_ROWS, buf ^= 1) {
        ggrad_attn_step();
        if (k0 + GGRAD_ATTN_ROWS < kend) {
            ggrad_attn_copy_keys<D>(ks + (buf ^ 1)*Lay::tile, vs + (buf ^ 1)*Lay::tile, k, v, s, k0 + GGRAD_ATTN_ROWS);
        }
        float p[8][4];
        ggrad_attn_scores<D>(p, qs + r0*Lay::LT, ks + buf*Lay::tile);
        // rows past L need no mask: their output is not written
        if (ggrad_attn_edge(s, q0, k0)) {
            ggrad_attn_logits<true>(p, scale2, s, k0, rows);
        } else {
            ggrad_attn_logits<false>(p, scale2, s, k0, rows);
        }
        float top[2] = {m[0], m[1]};
#pragma unroll
        for (int n = 0; n < 8; ++n) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                top[j >> 1] = fmaxf(top[j >> 1], p[n][j]);
            }
        }
        // every row sees key 0: top is finite from the first step on, and 2^(-inf - top) = 0
        float alpha[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            top[i] = fmaxf(top[i], __shfl_xor_sync(0xffffffff, top[i], 1, 32));
            top[i] = fmaxf(top[i], __shfl_xor_sync(0xffffffff, top[i], 2, 32));
            alpha[i] = ggrad_attn_exp2(m[i] - top[i]);
            m[i] = top[i];
            l[i] *= alpha[i];
        }
#pragma unroll
        for (int n = 0; n < 8; ++n) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                p[n][j] = ggrad_attn_exp2(p[n][j] - top[j >> 1]);
                l[j >> 1] += p[n][j];
            }
        }
#pragma unroll
        for (int n = 0; n < D/8; ++n) {
            o[n][0] *= alpha[0];
            o[n][1] *= alpha[0];
            o[n][2] *= alpha[1];
            o[n][3] *= alpha[1];
        }
        ggrad_attn_apply<D>(o, p, vs + buf*Lay::tile);
    }
    float inv[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        l[i] += __shfl_xor_sync(0xffffffff, l[i], 1, 32);
        l[i] += __shfl_xor_sync(0xffffffff, l[i], 2, 32);
        inv[i] = 1.0f / l[i];
    }
    out += b*s.o3 + h*s.o2;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        if (rows[i] < s.L) {
            float * orow = out + (int64_t) rows[i]*s.o1;
#pragma unroll
            for (int n = 0; n < D/8; ++n) {
                *(float2 *) (orow + ggrad_attn_col(n, 0)) =
                    make_float2(__fmul_rn(o[n][2*i], inv[i]), __fmul_rn(o[n][2*i + 1], inv[i]));
            }
            if (lane % 4 == 0) {
                lse[ggrad_attn_stat(s, b, h, rows[i])] = m[i] + log2f(l[i]);
            }
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

// a probability computed again from its score x (unscaled) and its row's log-sum-exp of base-2
// scores
static __device__ __forceinline__ float ggrad_attn_prob(float x, float scale2, float lse) {
    return ggrad_attn_exp2(fmaf(x, scale2, -lse));
}

// the statistics of query row `row` (its log-sum-exp and D), zeros past L
static __device__ __forceinline__ float2 ggrad_attn_row_stats(const float * lse, const float * dot, const ggrad_attn_shape & s,
                                                              int b, int h, int row) {
    if (row >= s.L) {
        return make_float2(0.0f, 0.0f);
    }
    const int64_t i = ggrad_attn_stat(s, b, h, row);
    return make_float2(lse[i], dot[i]);
}

// back_kv's p^T from its tile S^T in place (keys `keys` the rows, queries q0.. the columns, their
// statistics at st); with MASK, 0 for queries past L, keys past S and (causal) keys after the query
template <bool MASK>
static __device__ __forceinline__ void ggrad_attn_kv_p(float (&pt)[8][4], const float2 * st, float scale2, const ggrad_attn_shape & s,
                                                       int q0, const int (&keys)[2]) {
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int c = ggrad_attn_col(n, j), row = q0 + c, key = keys[j >> 1];
            const bool masked = MASK && (row >= s.L || ggrad_attn_masked(s, key, row));
            pt[n][j] = masked ? 0.0f : ggrad_attn_prob(pt[n][j], scale2, st[c].x);
        }
    }
}

// back_kv's dS^T = p^T (dP^T - D) in place of its tile dP^T (0 where p is)
static __device__ __forceinline__ void ggrad_attn_kv_ds(float (&dst)[8][4], const float (&pt)[8][4], const float2 * st) {
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            dst[n][j] = pt[n][j]*(dst[n][j] - st[ggrad_attn_col(n, j)].y);
        }
    }
}

// back_q's dS = p (dP - D) from its tiles S (ds: queries `rows` the rows, keys k0.. the columns)
// and dP, the rows' statistics rs (log-sum-exp, D); with MASK, 0 for keys past S and (causal)
// after the row (rows past L are not written)
template <bool MASK>
static __device__ __forceinline__ void ggrad_attn_q_ds(float (&ds)[8][4], const float (&dp)[8][4], const float2 (&rs)[2],
                                                       float scale2, const ggrad_attn_shape & s, int k0, const int (&rows)[2]) {
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int key = k0 + ggrad_attn_col(n, j);
            const float2 r = rs[j >> 1];
            const float p = ggrad_attn_prob(ds[n][j], scale2, r.x);
            ds[n][j] = MASK && ggrad_attn_masked(s, key, rows[j >> 1]) ? 0.0f : p*(dp[n][j] - r.y);
        }
    }
}

// acc (16 rows, D columns) written at `dst` (row stride ld) times `scale`, rows from `row0` (the
// lane's first; its second 8 on) below `rows`
template <int D>
static __device__ __forceinline__ void ggrad_attn_write(float * dst, int64_t ld, const float (&acc)[D/8][4], int row0, int rows,
                                                        float scale) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        if (row0 + 8*i < rows) {
            float * r = dst + (int64_t) (row0 + 8*i)*ld;
#pragma unroll
            for (int n = 0; n < D/8; ++n) {
                *(float2 *) (r + ggrad_attn_col(n, 0)) = make_float2(acc[n][2*i]*scale, acc[n][2*i + 1]*scale);
            }
        }
    }
}

// the queries [q0, q0 + 64) (none past L: zeros), their rows of dO and their statistics
// (log-sum-exp, D) copied to a step's buffers; one group with the copies before it
template <int D, typename T>
static __device__ __forceinline__ void ggrad_attn_copy_queries(T * qs, T * gs, float2 * st, const T * q, const T * g_low,
                                                               const float * lse, const float * dot, const ggrad_attn_shape & s,
                                                               int b, int h, int q0) {
    ggrad_attn_copy<D>(qs, q, s.q1, q0, s.L);
    ggrad_attn_copy<D>(gs, g_low, D, q0, s.L);
    if (threadIdx.x < GGRAD_ATTN_ROWS) {
        const bool valid = q0 + (int) threadIdx.x < s.L;
        const int64_t i = valid ? ggrad_attn_stat(s, b, h, q0 + threadIdx.x) : 0;
        ggrad_cp4(&st[threadIdx.x].x, lse + i, valid);
        ggrad_cp4(&st[threadIdx.x].y, dot + i, valid);
    }
    ggrad_cp_commit();
}

// dk and dv of keys [64 kb, 64 kb + 64) of (b, h) (a block), both written at the strides dk. A
// warp's 16 keys are the rows of its S^T and dP^T tiles, the block's 64 queries their columns.
template <int D, typename T>
static __device__ __forceinline__ void ggrad_attn_back_kv(const T * q, const T * k, const T * v, const T * g_low, const float * lse,
                                                          const float * dot, float * dk, float * dv, const ggrad_attn_shape & s,
                                                          int kb) {
    using Lay = ggrad_attn_layout<D>;
    extern __shared__ __align__(128) unsigned char smem[];
    T * ks = (T *) smem;
    T * vs = ks + Lay::tile;
    T * qs = vs + Lay::tile;                          // two buffers of queries, two of dO, two of
    T * gs = qs + 2*Lay::tile;                        // the queries' statistics
    float2 * qstats = (float2 *) (gs + 2*Lay::tile);

    const int k0 = kb*GGRAD_ATTN_ROWS, h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x/32, lane = threadIdx.x % 32, r0 = 16*warp;
    const int keys[2] = {k0 + r0 + lane/4, k0 + r0 + lane/4 + 8};
    ggrad_attn_at_head(q, k, v, s, b, h);
    g_low += ((int64_t) b*s.H + h)*s.L*D;
    // causal: the queries before this block's first key see none of its keys
    const int qstart = s.causal ? k0 : 0;
    const float scale2 = s.scale*GGRAD_ATTN_LOG2E;
    if (qstart < s.L) {
        ggrad_attn_copy<D>(ks, k, s.k1, k0, s.S);
        ggrad_attn_copy<D>(vs, v, s.v1, k0, s.S);
        ggrad_attn_copy_queries<D>(qs, gs, qstats, q, g_low, lse, dot, s, b, h, qstart);
    }
    float dk_acc[D/8][4], dv_acc[D/8][4];
    ggrad_attn_zero(dk_acc);
    ggrad_attn_zero(dv_acc);
    for (int q0 = qstart, buf = 0; q0 < s.L; q0 += GGRAD_ATTN_ROWS, buf ^= 1) {
        ggrad_attn_step();
        if (q0 + GGRAD_ATTN_ROWS < s.L) {
            ggrad_attn_copy_queries<D>(qs + (buf ^ 1)*Lay::tile, gs + (buf ^ 1)*Lay::tile, qstats + (buf ^ 1)*GGRAD_ATTN_ROWS,
                                       q, g_low, lse, dot, s, b, h, q0 + GGRAD_ATTN_ROWS);
        }
        // one score tile at a time beside p^T (dv's product before dP^T): 168 registers at heads of
        // 64 where both tiles at once took 235
        const T * qb = qs + buf*Lay::tile;
        const T * gb = gs + buf*Lay::tile;
        const float2 * st = qstats + buf*GGRAD_ATTN_ROWS;
        float pt[8][4], dst_[8][4];
        ggrad_attn_scores<D>(pt, ks + r0*Lay::LT, qb);    // S^T = k q^T
        if (q0 + GGRAD_ATTN_ROWS > s.L || ggrad_attn_edge(s, q0, k0)) {
            ggrad_attn_kv_p<true>(pt, st, scale2, s, q0, keys);
        } else {
            ggrad_attn_kv_p<false>(pt, st, scale2, s, q0, keys);
        }
        ggrad_attn_apply<D>(dv_acc, pt, gb);              // dv += p^T dO
        ggrad_attn_scores<D>(dst_, vs + r0*Lay::LT, gb);  // dP^T = v dO^T
        ggrad_attn_kv_ds(dst_, pt, st);
        ggrad_attn_apply<D>(dk_acc, dst_, qb);            // dk += dS^T q
    }
    ggrad_attn_write<D>(dk + b*s.dk3 + h*s.dk2, s.dk1, dk_acc, keys[0], s.S, s.scale);
    ggrad_attn_write<D>(dv + b*s.dk3 + h*s.dk2, s.dk1, dv_acc, keys[0], s.S, 1.0f);
}

// dq of queries [64 qb, 64 qb + 64) of (b, h) (a block), written at the strides dq; a lane's rows
// as the forward's
template <int D, typename T>
static __device__ __forceinline__ void ggrad_attn_back_q(const T * q, const T * k, const T * v, const T * g_low, const float * lse,
                                                         const float * dot, float * dq, const ggrad_attn_shape & s, int qb) {
    using Lay = ggrad_attn_layout<D>;
    extern __shared__ __align__(128) unsigned char smem[];
    T * qs = (T *) smem;
    T * gs = qs + Lay::tile;
    T * ks = gs + Lay::tile;      // two buffers of keys, then two of values
    T * vs = ks + 2*Lay::tile;

    const int q0 = qb*GGRAD_ATTN_ROWS, h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x/32, lane = threadIdx.x % 32, r0 = 16*warp;
    const int rows[2] = {q0 + r0 + lane/4, q0 + r0 + lane/4 + 8};
    ggrad_attn_at_head(q, k, v, s, b, h);
    ggrad_attn_copy<D>(qs, q, s.q1, q0, s.L);
    ggrad_attn_copy<D>(gs, g_low + ((int64_t) b*s.H + h)*s.L*D, D, q0, s.L);
    ggrad_attn_copy_keys<D>(ks, vs, k, v, s, 0);
    const float2 rs[2] = {ggrad_attn_row_stats(lse, dot, s, b, h, rows[0]), ggrad_attn_row_stats(lse, dot, s, b, h, rows[1])};
    const float scale2 = s.scale*GGRAD_ATTN_LOG2E;
    float acc[D/8][4];
    ggrad_attn_zero(acc);
    const int kend = ggrad_attn_key_end(s, q0);
    for (int k0 = 0, buf = 0; k0 < kend; k0 += GGRAD_ATTN_ROWS, buf ^= 1) {
        ggrad_attn_step();
        if (k0 + GGRAD_ATTN_ROWS < kend) {
            ggrad_attn_copy_keys<D>(ks + (buf ^ 1)*Lay::tile, vs + (buf ^ 1)*Lay::tile, k, v, s, k0 + GGRAD_ATTN_ROWS);
        }
        float ds[8][4], dp[8][4];
        ggrad_attn_scores<D>(ds, qs + r0*Lay::LT, ks + buf*Lay::tile);  // S = q k^T
        ggrad_attn_scores<D>(dp, gs + r0*Lay::LT, vs + buf*Lay::tile);  // dP = dO v^T
        if (ggrad_attn_edge(s, q0, k0)) {
            ggrad_attn_q_ds<true>(ds, dp, rs, scale2, s, k0, rows);
        } else {
            ggrad_attn_q_ds<false>(ds, dp, rs, scale2, s, k0, rows);
        }
        ggrad_attn_apply<D>(acc, ds, ks + buf*Lay::tile);  // dq += dS k
    }
    ggrad_attn_write<D>(dq + b*s.dq3 + h*s.dq2, s.dq1, acc, rows[0], s.L, s.scale);
}

// the backward's blocks in one launch: the first kv_blocks of x take 64 keys each (dk, dv), the
// rest 64 queries each (dq), so that the two kinds share the multiprocessors' last wave (at the
// block's shape 2 x 1024 blocks, 3 a multiprocessor: 6 waves as two launches, 5.2 as one)
template <int D, typename T>
static __global__ void __launch_bounds__(GGRAD_ATTN_THREADS, ggrad_attn_min_blocks<D>(GGRAD_ATTN_BACKWARD_BLOCKS))
ggrad_attn_backward(const T * q, const T * k, const T * v, const T * g_low, const float * lse, const float * dot, float * dq,
                    float * dk, float * dv, const ggrad_attn_shape s, int kv_blocks) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if ((int) blockIdx.x < kv_blocks) {
        ggrad_attn_back_kv<D>(q, k, v, g_low, lse, dot, dk, dv, s, blockIdx.x);
    } else {
        ggrad_attn_back_q<D>(q, k, v, g_low, lse, dot, dq, s, blockIdx.x - kv_blocks);
    }
#endif
}

// the launches (stream `stream`): forward into out and lse; backward from the forward's out, lse and
// dO `g` into dq, dk and dv, with scratch for dO in T (B*H*L*D) and D (B*H*L)
template <int D, typename T>
static void ggrad_attn_forward_launch(const T * q, const T * k, const T * v, float * out, float * lse,
                                      const ggrad_attn_shape & s, cudaStream_t stream) {
    const size_t bytes = ggrad_attn_layout<D>::forward;
    cudaFuncSetAttribute(ggrad_attn_forward<D, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) bytes);
    const dim3 grid((s.L + GGRAD_ATTN_ROWS - 1)/GGRAD_ATTN_ROWS, s.H, s.B);
    ggrad_attn_forward<D, T><<<grid, GGRAD_ATTN_THREADS, bytes, stream>>>(q, k, v, out, lse, s);
}

template <int D, typename T>
static void ggrad_attn_backward_launch(const T * q, const T * k, const T * v, const float * out, const float * lse,
                                       const float * g, T * g_low, float * dot, float * dq, float * dk, float * dv,
                                       const ggrad_attn_shape & s, cudaStream_t stream) {
    const int64_t rows = (int64_t) s.B*s.H*s.L;
    ggrad_attn_back_rows<D, T><<<(unsigned int) ((rows + 3)/4), 128, 0, stream>>>(g, out, g_low, dot, s);
    const size_t bytes = ggrad_attn_layout<D>::backward;
    cudaFuncSetAttribute(ggrad_attn_backward<D, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int) bytes);
    const int kv_blocks = (s.S + GGRAD_ATTN_ROWS - 1)/GGRAD_ATTN_ROWS, q_blocks = (s.L + GGRAD_ATTN_ROWS - 1)/GGRAD_ATTN_ROWS;
    ggrad_attn_backward<D, T><<<dim3(kv_blocks + q_blocks, s.H, s.B), GGRAD_ATTN_THREADS, bytes, stream>>>(
        q, k, v, g_low, lse, dot, dq, dk, dv, s, kv_blocks);
}
