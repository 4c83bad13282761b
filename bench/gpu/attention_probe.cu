// ggrad's fused attention kernels (scripts/ggml_kernels/ggrad_attention.cuh) alone, against a
// float64 reference on the host, and timed at the bf16 transformer block's shape:
//   nvcc -O3 -std=c++17 -arch=sm_90 -I scripts/ggml_kernels bench/gpu/attention_probe.cu -o /tmp/attention_probe
//   /tmp/attention_probe          (bash bench/gpu/session.sh set81p runs it)
//   ncu --kernel-name regex:ggrad_attn /tmp/attention_probe once   (set82p: each kernel's counters)
// q, k, v are read where a self-attention's fused projection puts them ((B, L, 3, H, D) in
// bfloat16); the reference takes the same rounded values, computes in float64 and rounds
// nothing else, so the differences are the kernels' roundings of p and dS (~1e-2 of the
// largest value) or a fault (~1).
#include "ggrad_attention.cuh"
#include "attention_reference.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
    std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); std::exit(1); } } while (0)

// the mean time of 50 back-to-back calls after a warm-up call, and the rate of the products
// that `flops` counts (0: none)
template <typename F>
static void timed_calls(const char * what, double flops, F call) {
    const int reps = 50;
    cudaEvent_t t0, t1;
    CHECK(cudaEventCreate(&t0)); CHECK(cudaEventCreate(&t1));
    call();
    CHECK(cudaEventRecord(t0));
    for (int i = 0; i < reps; ++i) {
        call();
    }
    CHECK(cudaEventRecord(t1)); CHECK(cudaEventSynchronize(t1));
    CHECK(cudaGetLastError());
    float ms; CHECK(cudaEventElapsedTime(&ms, t0, t1));
    std::printf("  %s: %.4f ms a call", what, ms/reps);
    if (flops > 0) {
        std::printf(", %.0f TFLOP/s of its products", flops/(ms/reps*1e-3)/1e12);
    }
    std::printf("\n");
    CHECK(cudaEventDestroy(t0)); CHECK(cudaEventDestroy(t1));
}

template <int D>
static bool run(const Case & c, bool timed) {
    const Inputs<nv_bfloat16> in(c, 1.0f);
    const ggrad_attn_shape s = shape_of(c);
    nv_bfloat16 *dq_in, *dk_in = nullptr, *dv_in = nullptr;
    CHECK(cudaMalloc(&dq_in, in.q.size()*2));
    CHECK(cudaMemcpy(dq_in, in.q.data(), in.q.size()*2, cudaMemcpyHostToDevice));
    if (!c.packed) {
        CHECK(cudaMalloc(&dk_in, in.k.size()*2)); CHECK(cudaMalloc(&dv_in, in.v.size()*2));
        CHECK(cudaMemcpy(dk_in, in.k.data(), in.k.size()*2, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(dv_in, in.v.data(), in.v.size()*2, cudaMemcpyHostToDevice));
    }
    const nv_bfloat16 * q = dq_in;
    const nv_bfloat16 * k = c.packed ? dq_in + c.H*D : dk_in;
    const nv_bfloat16 * v = c.packed ? dq_in + 2*c.H*D : dv_in;
    const int B = c.B, H = c.H, L = c.L, S = c.S;
    float *out, *lse, *g, *dot, *dq, *dk, *dv;
    nv_bfloat16 * g_low;
    const size_t on = (size_t) B*L*H*D, kvn = (size_t) B*S*H*D;
    // lse: room for two floats a row, as the kernels before set 60 kept (an A/B against them)
    CHECK(cudaMalloc(&out, on*4)); CHECK(cudaMalloc(&lse, (size_t) B*H*L*8)); CHECK(cudaMalloc(&g, on*4));
    CHECK(cudaMalloc(&dot, (size_t) B*H*L*4)); CHECK(cudaMalloc(&g_low, on*2));
    CHECK(cudaMalloc(&dq, on*4)); CHECK(cudaMalloc(&dk, kvn*4)); CHECK(cudaMalloc(&dv, kvn*4));
    CHECK(cudaMemcpy(g, in.g.data(), on*4, cudaMemcpyHostToDevice));
    ggrad_attn_forward_launch<D>(q, k, v, out, lse, s, 0);
    CHECK(cudaGetLastError());
    ggrad_attn_backward_launch<D>(q, k, v, out, lse, g, g_low, dot, dq, dk, dv, s, 0);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::vector<float> ho(on), hdq(on), hdk(kvn), hdv(kvn);
    CHECK(cudaMemcpy(ho.data(), out, on*4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hdq.data(), dq, on*4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hdk.data(), dk, kvn*4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hdv.data(), dv, kvn*4, cudaMemcpyDeviceToHost));
    const bool ok = check(c, in, 1.0f, ho, hdq, hdk, hdv);
    if (timed) {
        const double flops = 2.0*B*H*(double) L*S*D*(c.causal ? 0.5 : 1.0);  // of one product
        const int64_t rows = (int64_t) B*H*L;
        // the rows' kernel alone too (every form of the kernels has it): the rest of the backward is
        // its products
        timed_calls("forward", 2*flops, [&] { ggrad_attn_forward_launch<D>(q, k, v, out, lse, s, 0); });
        timed_calls("backward", 5*flops, [&] {
            ggrad_attn_backward_launch<D>(q, k, v, out, lse, g, g_low, dot, dq, dk, dv, s, 0);
        });
        timed_calls("  of which rows (dO rounded, D)", 0, [&] {
            ggrad_attn_back_rows<D, nv_bfloat16><<<(unsigned int) ((rows + 3)/4), 128>>>(g, out, g_low, dot, s);
        });
    }
    cudaFree(dq_in); cudaFree(dk_in); cudaFree(dv_in); cudaFree(out); cudaFree(lse); cudaFree(g); cudaFree(dot);
    cudaFree(g_low); cudaFree(dq); cudaFree(dk); cudaFree(dv);
    return ok;
}

int main(int argc, char ** argv) {
    // "once": the block's case alone, each kernel launched once (for ncu's counters)
    if (argc > 1 && std::string(argv[1]) == "once") {
        return run<64>({32, 8, 256, 256, 64, 0, true}, false) ? 0 : 1;
    }
    bool ok = true;
    ok &= run<64>({32, 8, 256, 256, 64, 0, true}, true);   // the bf16 block's attention
    ok &= run<64>({4, 2, 256, 256, 64, 1, true}, true);
    ok &= run<64>({2, 3, 100, 77, 64, 0, false}, false);   // tails of both sides
    ok &= run<64>({2, 3, 130, 130, 64, 1, true}, false);
    ok &= run<32>({2, 4, 70, 70, 32, 1, true}, false);
    ok &= run<128>({2, 2, 96, 200, 128, 0, false}, true);
    std::printf("%s\n", ok ? "all ok" : "FAILED");
    return ok ? 0 : 1;
}
