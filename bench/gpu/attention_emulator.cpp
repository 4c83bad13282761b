// ggrad's fused attention kernels (scripts/ggml_kernels/ggrad_attention.cuh) run on the CPU, each CUDA
// thread an OS thread, against bench/gpu/attention_reference.h's float64 reference: for a machine
// without a GPU (bash bench/gpu/attention_emulate.sh [CASE]; all cases ~2 min on 2 cores).
// ldmatrix, ldmatrix.trans, mma.sync m16n8k16 and shfl_xor are written here from the PTX ISA's
// fragment tables, independently of the kernels' own reasoning; the emulation aborts where a warp
// diverges at one of them, or shared memory is read out of range or misaligned. Shared memory
// starts as NaN (0xff bytes), every output as NaN; cp.async's copies land only at their wait.
// Planted faults (a B operand's column, an A fragment's register order, the query statistics off
// by a column) each gave errors of ~1; a step without its wait aborts, one reading the other
// buffer gives NaN.
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <barrier>
#include <thread>
#include <vector>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <algorithm>
#include <atomic>
#undef __device__
#undef __global__
#undef __forceinline__
#undef __launch_bounds__
#undef __align__
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(x)
#define __CUDA_ARCH__ 900
using std::min;

#define EMU_FAIL(...) do { std::fprintf(stderr, __VA_ARGS__); std::fprintf(stderr, "\n"); std::abort(); } while (0)

thread_local uint3 threadIdx, blockIdx;
thread_local unsigned char * emu_smem;
thread_local size_t emu_smem_bytes;

struct EmuWarp {
    std::barrier<> bar{32};
    const void * addr[32];
    int op[32];
    uint32_t a[32][4], b[32][2];
    float c[32][4];
    float f[32];
};
struct EmuBlock {
    std::barrier<> bar{128};
    EmuWarp warp[4];
};
thread_local EmuBlock * emu_block;
static std::atomic<long> emu_collectives{0};

static inline EmuWarp & W() { return emu_block->warp[threadIdx.x/32]; }
static inline void emu_check_op(int op) {
    EmuWarp & w = W(); const int lane = threadIdx.x % 32;
    w.op[lane] = op; w.bar.arrive_and_wait();
    for (int i = 0; i < 32; ++i) if (w.op[i] != op) EMU_FAIL("warp diverged: lane %d op %d vs %d", i, w.op[i], op);
    w.bar.arrive_and_wait();
}
static inline void __syncthreads() { emu_block->bar.arrive_and_wait(); }
static inline float __shfl_xor_sync(unsigned mask, float x, int off, int width) {
    if (mask != 0xffffffffu || width != 32) EMU_FAIL("shfl args");
    emu_check_op(1);
    EmuWarp & w = W(); const int lane = threadIdx.x % 32;
    w.f[lane] = x; w.bar.arrive_and_wait();
    const float r = w.f[lane ^ off]; w.bar.arrive_and_wait();
    return r;
}
static inline float __fmul_rn(float a, float b) { return a*b; }

static inline void emu_check_smem(const void * p, size_t n, size_t align) {
    const unsigned char * c = (const unsigned char *) p;
    if (c < emu_smem || c + n > emu_smem + emu_smem_bytes) EMU_FAIL("smem access out of range: offset %td + %zu of %zu", c - emu_smem, n, emu_smem_bytes);
    if ((c - emu_smem) % align) EMU_FAIL("smem access misaligned: offset %td", c - emu_smem);
}
// cp.async: a thread's copies held until its wait (cp.async.wait_group 0), and only the committed
// ones done then, so that a tile read before its wait and barrier reads the step before's (or NaN)
struct EmuCopy { void * dst; const void * src; int bytes; };
thread_local std::vector<EmuCopy> emu_copies;
thread_local size_t emu_committed;
static inline void emu_cp(void * dst, const void * src, bool valid, int bytes) {
    emu_check_smem(dst, bytes, bytes);
    if (valid && (uintptr_t) src % bytes) EMU_FAIL("cp.async source misaligned");
    emu_copies.push_back({dst, valid ? src : nullptr, bytes});
}
static inline void ggrad_cp16(void * dst, const void * src, bool valid) { emu_cp(dst, src, valid, 16); }
static inline void ggrad_cp4(void * dst, const void * src, bool valid) { emu_cp(dst, src, valid, 4); }
static inline void ggrad_cp_commit() { emu_committed = emu_copies.size(); }
static inline void ggrad_cp_wait() {
    for (size_t i = 0; i < emu_committed; ++i) {
        const EmuCopy & c = emu_copies[i];
        if (c.src) std::memcpy(c.dst, c.src, c.bytes); else std::memset(c.dst, 0, c.bytes);
    }
    emu_copies.erase(emu_copies.begin(), emu_copies.begin() + emu_committed);
    emu_committed = 0;
}
static inline float2 * emu_f2(float * p) { if ((uintptr_t) p % 8) EMU_FAIL("float2 store misaligned"); return (float2 *) p; }

// ldmatrix .m8n8.x4 .b16: lane i gives the address of row i%8 of matrix i/8; the lane's register j
// holds matrix j's row lane/4, elements 2(lane%4), +1 (.trans: column lane/4 of rows 2(lane%4), +1)
static inline void emu_ldsm(uint32_t (&r)[4], const void * p, bool trans) {
    emu_check_op(trans ? 3 : 2);
    EmuWarp & w = W(); const int lane = threadIdx.x % 32;
    emu_check_smem(p, 16, 16);
    w.addr[lane] = p; w.bar.arrive_and_wait();
    for (int j = 0; j < 4; ++j) {
        uint16_t lo, hi;
        if (!trans) {
            const uint16_t * row = (const uint16_t *) w.addr[8*j + lane/4];
            lo = row[2*(lane % 4)]; hi = row[2*(lane % 4) + 1];
        } else {
            const uint16_t * r0 = (const uint16_t *) w.addr[8*j + 2*(lane % 4)];
            const uint16_t * r1 = (const uint16_t *) w.addr[8*j + 2*(lane % 4) + 1];
            lo = r0[lane/4]; hi = r1[lane/4];
        }
        r[j] = (uint32_t) lo | ((uint32_t) hi << 16);
    }
    w.bar.arrive_and_wait();
}
static inline float ggrad_attn_exp2(float x) { return std::exp2(x); }
static inline void ggrad_ldsm(uint32_t (&r)[4], const void * p) { emu_ldsm(r, p, false); }
static inline void ggrad_ldsm_t(uint32_t (&r)[4], const void * p) { emu_ldsm(r, p, true); }

template <typename T> static inline float emu_tof(uint16_t x);
template <> inline float emu_tof<nv_bfloat16>(uint16_t x) { uint32_t u = (uint32_t) x << 16; float f; std::memcpy(&f, &u, 4); return f; }
template <> inline float emu_tof<half>(uint16_t x) { __half_raw r; r.x = x; return __half2float(__half(r)); }

// mma.m16n8k16 row.col, f32 accumulators (PTX ISA fragment tables): g = lane/4, t = lane%4
// A: a0,a1 (g, 2t+{0,1}); a2,a3 (g+8, 2t+{0,1}); a4,a5 (g, 2t+8+{0,1}); a6,a7 (g+8, 2t+8+{0,1})
// B: b0,b1 (k = 2t+{0,1}, n = g); b2,b3 (k = 2t+8+{0,1}, n = g)
// C/D: c0,c1 (g, 2t+{0,1}); c2,c3 (g+8, 2t+{0,1})
template <typename T>
static inline void ggrad_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    emu_check_op(4);
    EmuWarp & w = W(); const int lane = threadIdx.x % 32;
    for (int i = 0; i < 4; ++i) { w.a[lane][i] = a[i]; w.c[lane][i] = d[i]; }
    w.b[lane][0] = b0; w.b[lane][1] = b1;
    w.bar.arrive_and_wait();
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; ++l) {
        const int g = l/4, t = l % 4;
        for (int i = 0; i < 8; ++i) {
            const uint16_t e = (uint16_t) (w.a[l][i/2] >> (16*(i & 1)));
            const int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
            const int col = 2*t + (i & 1) + (i >= 4 ? 8 : 0);
            A[row][col] = emu_tof<T>(e);
        }
        for (int i = 0; i < 4; ++i) {
            const uint16_t e = (uint16_t) (w.b[l][i/2] >> (16*(i & 1)));
            const int krow = 2*t + (i & 1) + (i >= 2 ? 8 : 0);
            B[krow][g] = emu_tof<T>(e);
        }
        for (int i = 0; i < 4; ++i) C[i < 2 ? g : g + 8][2*t + (i & 1)] = w.c[l][i];
    }
    const int g = lane/4, t = lane % 4;
    for (int i = 0; i < 4; ++i) {
        const int row = i < 2 ? g : g + 8, col = 2*t + (i & 1);
        double s = C[row][col];
        for (int kk = 0; kk < 16; ++kk) s += (double) A[row][kk]*B[kk][col];
        d[i] = (float) s;
    }
    w.bar.arrive_and_wait();
    emu_collectives++;
}

#include GGRAD_ATTN_EMULATED  // ggrad_attention.cuh, its hardware parts swapped (attention_emulate.sh)
#include "attention_reference.h"

template <typename F>
static void emu_launch(dim3 grid, size_t smem_bytes, F kernel) {
    for (unsigned z = 0; z < grid.z; ++z) for (unsigned y = 0; y < grid.y; ++y) for (unsigned x = 0; x < grid.x; ++x) {
        EmuBlock * blk = new EmuBlock;
        std::vector<unsigned char> smem(smem_bytes + 128, 0xff);  // NaN in bf16/f16: stale reads show
        unsigned char * base = smem.data() + (128 - (uintptr_t) smem.data() % 128) % 128;
        std::vector<std::thread> th;
        for (unsigned t = 0; t < 128; ++t) {
            th.emplace_back([=] {
                threadIdx = make_uint3(t, 0, 0); blockIdx = make_uint3(x, y, z);
                emu_block = blk; emu_smem = base; emu_smem_bytes = smem_bytes;
                kernel();
                if (!emu_copies.empty()) EMU_FAIL("a thread ended with cp.async copies never waited for");
            });
        }
        for (auto & t : th) t.join();
        delete blk;
    }
}

template <int D, typename T>
static void ggrad_attn_forward_launch(const T * q, const T * k, const T * v, float * out, float * lse, const ggrad_attn_shape & s) {
    const size_t bytes = ggrad_attn_layout<D>::forward;
    emu_launch(dim3((s.L + 63)/64, s.H, s.B), bytes, [=] { ggrad_attn_forward<D, T>(q, k, v, out, lse, s); });
}
template <int D, typename T>
static void ggrad_attn_backward_launch(const T * q, const T * k, const T * v, const float * out, const float * lse,
                                       const float * g, T * g_low, float * dot, float * dq, float * dk, float * dv,
                                       const ggrad_attn_shape & s) {
    const int64_t rows = (int64_t) s.B*s.H*s.L;
    emu_launch(dim3((unsigned) ((rows + 3)/4), 1, 1), 0, [=] { ggrad_attn_back_rows<D, T>(g, out, g_low, dot, s); });
    const size_t bytes = ggrad_attn_layout<D>::backward;
    const int kv_blocks = (s.S + 63)/64;
    emu_launch(dim3(kv_blocks + (s.L + 63)/64, s.H, s.B), bytes,
               [=] { ggrad_attn_backward<D, T>(q, k, v, g_low, lse, dot, dq, dk, dv, s, kv_blocks); });
}

template <int D, typename T>
static bool run(const Case & c, float qscale = 1.0f) {
    const Inputs<T> in(c, qscale);
    const ggrad_attn_shape s = shape_of(c);
    const T * q = in.q.data();
    const T * k = c.packed ? in.q.data() + c.H*D : in.k.data();
    const T * v = c.packed ? in.q.data() + 2*c.H*D : in.v.data();
    const size_t on = (size_t) c.B*c.L*c.H*D, kvn = (size_t) c.B*c.S*c.H*D, rows = (size_t) c.B*c.H*c.L;
    const float NaN = std::nanf("");
    std::vector<float> out(on, NaN), lse(rows, NaN), dot(rows, NaN), dq(on, NaN), dk(kvn, NaN), dv(kvn, NaN);
    std::vector<T> g_low(on);
    ggrad_attn_forward_launch<D, T>(q, k, v, out.data(), lse.data(), s);
    ggrad_attn_backward_launch<D, T>(q, k, v, out.data(), lse.data(), in.g.data(), g_low.data(), dot.data(), dq.data(),
                                     dk.data(), dv.data(), s);
    return check(c, in, qscale, out, dq, dk, dv);
}

// the cases: the probe's, f16, causal with more keys than queries, 3x larger scores, one query,
// whole blocks
static bool run_case(int which) {
    switch (which) {
        case 0: return run<64, nv_bfloat16>({2, 3, 100, 77, 64, 0, false});
        case 1: return run<64, nv_bfloat16>({2, 3, 130, 130, 64, 1, true});
        case 2: return run<32, nv_bfloat16>({2, 4, 70, 70, 32, 1, true});
        case 3: return run<128, nv_bfloat16>({2, 2, 96, 200, 128, 0, false});
        case 4: return run<64, nv_bfloat16>({1, 2, 256, 256, 64, 1, true});
        case 5: return run<64, half>({2, 2, 100, 77, 64, 0, false});
        case 6: return run<128, nv_bfloat16>({1, 1, 200, 96, 128, 1, false});
        case 7: return run<64, nv_bfloat16>({1, 2, 130, 130, 64, 1, true}, 3.0f);
        case 8: return run<32, nv_bfloat16>({1, 2, 70, 200, 32, 1, false});
        case 9: return run<32, half>({1, 1, 1, 1, 32, 1, false});
        case 10: return run<64, nv_bfloat16>({1, 1, 64, 64, 64, 0, false});
        case 11: return run<64, half>({1, 2, 192, 128, 64, 0, false});  // no tails: the steps without masks
        default: std::printf("no case %d (0-11)\n", which); return false;
    }
}

// the cases named on the command line, or every one
int main(int argc, char ** argv) {
    bool ok = true;
    for (int i = 1; i < argc; ++i) {
        ok &= run_case(std::atoi(argv[i]));
    }
    for (int which = 0; argc == 1 && which <= 11; ++which) {
        ok &= run_case(which);
    }
    std::printf("%s\n", ok ? "all ok" : "FAILED");
    return ok ? 0 : 1;
}
