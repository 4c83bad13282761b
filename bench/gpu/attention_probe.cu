// ggrad's fused attention kernels (scripts/ggml_kernels/ggrad_attention.cuh) alone, against a
// float64 reference on the host, and timed at the bf16 transformer block's shape:
//   nvcc -O3 -std=c++17 -arch=sm_90 -I scripts/ggml_kernels bench/gpu/attention_probe.cu -o /tmp/attention_probe
//   /tmp/attention_probe          (bash bench/gpu/session.sh set81 runs it)
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
#include <vector>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
    std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); std::exit(1); } } while (0)

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
    float *out, *stats, *g, *dot, *dq, *dk, *dv;
    nv_bfloat16 * g_low;
    const size_t on = (size_t) B*L*H*D, kvn = (size_t) B*S*H*D;
    CHECK(cudaMalloc(&out, on*4)); CHECK(cudaMalloc(&stats, (size_t) B*H*L*8)); CHECK(cudaMalloc(&g, on*4));
    CHECK(cudaMalloc(&dot, (size_t) B*H*L*4)); CHECK(cudaMalloc(&g_low, on*2));
    CHECK(cudaMalloc(&dq, on*4)); CHECK(cudaMalloc(&dk, kvn*4)); CHECK(cudaMalloc(&dv, kvn*4));
    CHECK(cudaMemcpy(g, in.g.data(), on*4, cudaMemcpyHostToDevice));
    ggrad_attn_forward_launch<D>(q, k, v, out, stats, s, 0);
    CHECK(cudaGetLastError());
    ggrad_attn_backward_launch<D>(q, k, v, out, stats, g, g_low, dot, dq, dk, dv, s, 0);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::vector<float> ho(on), hdq(on), hdk(kvn), hdv(kvn);
    CHECK(cudaMemcpy(ho.data(), out, on*4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hdq.data(), dq, on*4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hdk.data(), dk, kvn*4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hdv.data(), dv, kvn*4, cudaMemcpyDeviceToHost));
    const bool ok = check(c, in, 1.0f, ho, hdq, hdk, hdv);
    if (timed) {
        cudaEvent_t t0, t1;
        CHECK(cudaEventCreate(&t0)); CHECK(cudaEventCreate(&t1));
        for (int pass = 0; pass < 2; ++pass) {
            const int reps = 50;
            CHECK(cudaEventRecord(t0));
            for (int i = 0; i < reps; ++i) {
                if (pass == 0) ggrad_attn_forward_launch<D>(q, k, v, out, stats, s, 0);
                else ggrad_attn_backward_launch<D>(q, k, v, out, stats, g, g_low, dot, dq, dk, dv, s, 0);
            }
            CHECK(cudaEventRecord(t1)); CHECK(cudaEventSynchronize(t1));
            float ms; CHECK(cudaEventElapsedTime(&ms, t0, t1));
            const double flops = (pass == 0 ? 2.0 : 5.0)*2.0*B*H*(double) L*S*D*(c.causal ? 0.5 : 1.0);
            std::printf("  %s: %.4f ms a call, %.0f TFLOP/s (of the composed path's products)\n",
                        pass == 0 ? "forward" : "backward", ms/reps, flops/(ms/reps*1e-3)/1e12);
        }
    }
    cudaFree(dq_in); cudaFree(dk_in); cudaFree(dv_in); cudaFree(out); cudaFree(stats); cudaFree(g); cudaFree(dot);
    cudaFree(g_low); cudaFree(dq); cudaFree(dk); cudaFree(dv);
    return ok;
}

int main() {
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
