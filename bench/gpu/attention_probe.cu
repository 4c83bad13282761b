// ggrad's fused attention kernels (scripts/ggml_kernels/ggrad_attention.cuh) alone, against a
// float64 reference on the host, and timed at the bf16 transformer block's shape:
//   nvcc -O3 -std=c++17 -arch=sm_90 -I scripts/ggml_kernels bench/gpu/attention_probe.cu -o /tmp/attention_probe
//   /tmp/attention_probe          (bash bench/gpu/session.sh attn_probe)
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

static float bf16_round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

template <int D>
static bool run(const Case & c, bool timed) {
    const int B = c.B, H = c.H, L = c.L, S = c.S;
    std::mt19937 rng(1234);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    // q (B, L, H, D) and k, v (B, S, H, D) in one (B, L, 3, H, D) buffer where packed (L == S)
    const int64_t row = c.packed ? 3*H*D : H*D;
    const size_t qn = (size_t) B*L*row, kn = c.packed ? 0 : (size_t) B*S*row;
    std::vector<nv_bfloat16> hq(qn), hk(c.packed ? 0 : kn), hv(c.packed ? 0 : kn);
    for (auto & x : hq) x = __float2bfloat16_rn(normal(rng));
    for (auto & x : hk) x = __float2bfloat16_rn(normal(rng));
    for (auto & x : hv) x = __float2bfloat16_rn(normal(rng));
    std::vector<float> hg((size_t) B*L*H*D);
    for (auto & x : hg) x = normal(rng);
    nv_bfloat16 *dq_in, *dk_in = nullptr, *dv_in = nullptr;
    CHECK(cudaMalloc(&dq_in, qn*2));
    CHECK(cudaMemcpy(dq_in, hq.data(), qn*2, cudaMemcpyHostToDevice));
    if (!c.packed) {
        CHECK(cudaMalloc(&dk_in, kn*2)); CHECK(cudaMalloc(&dv_in, kn*2));
        CHECK(cudaMemcpy(dk_in, hk.data(), kn*2, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(dv_in, hv.data(), kn*2, cudaMemcpyHostToDevice));
    }
    const nv_bfloat16 * q = dq_in;
    const nv_bfloat16 * k = c.packed ? dq_in + H*D : dk_in;
    const nv_bfloat16 * v = c.packed ? dq_in + 2*H*D : dv_in;
    ggrad_attn_shape s{};
    s.L = L; s.S = S; s.H = H; s.B = B;
    s.q1 = row; s.q2 = D; s.q3 = (int64_t) L*row;
    s.k1 = row; s.k2 = D; s.k3 = (int64_t) S*row;
    s.v1 = s.k1; s.v2 = s.k2; s.v3 = s.k3;
    s.o1 = H*D; s.o2 = D; s.o3 = (int64_t) L*H*D;      // out and dq: (B, L, H, D)
    s.dq1 = s.o1; s.dq2 = s.o2; s.dq3 = s.o3;
    s.dk1 = H*D; s.dk2 = D; s.dk3 = (int64_t) S*H*D;   // dk, dv: (B, S, H, D)
    s.g1 = H*D; s.g2 = D; s.g3 = (int64_t) L*H*D;
    s.scale = 1.0f/std::sqrt((float) D);
    s.causal = c.causal;
    float *out, *stats, *g, *dot, *dq, *dk, *dv;
    nv_bfloat16 * g_low;
    const size_t on = (size_t) B*L*H*D, kvn = (size_t) B*S*H*D;
    CHECK(cudaMalloc(&out, on*4)); CHECK(cudaMalloc(&stats, (size_t) B*H*L*8)); CHECK(cudaMalloc(&g, on*4));
    CHECK(cudaMalloc(&dot, (size_t) B*H*L*4)); CHECK(cudaMalloc(&g_low, on*2));
    CHECK(cudaMalloc(&dq, on*4)); CHECK(cudaMalloc(&dk, kvn*4)); CHECK(cudaMalloc(&dv, kvn*4));
    CHECK(cudaMemcpy(g, hg.data(), on*4, cudaMemcpyHostToDevice));
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
    double e[4] = {0, 0, 0, 0};
    bool finite = true;
    for (int b : {0, B - 1}) for (int h = 0; h < H; ++h) {
        std::vector<float> rq((size_t) L*D), rk((size_t) S*D), rv((size_t) S*D), rg((size_t) L*D);
        for (int i = 0; i < L; ++i) for (int d = 0; d < D; ++d) {
            rq[i*D + d] = __bfloat162float(hq[(size_t) b*s.q3 + i*s.q1 + h*D + d]);
            rg[i*D + d] = bf16_round(hg[(size_t) b*s.g3 + i*s.g1 + h*D + d]);  // the kernels' dO in the products
        }
        for (int j = 0; j < S; ++j) for (int d = 0; d < D; ++d) {
            rk[j*D + d] = __bfloat162float(c.packed ? hq[(size_t) b*s.k3 + j*s.k1 + H*D + h*D + d] : hk[(size_t) b*s.k3 + j*s.k1 + h*D + d]);
            rv[j*D + d] = __bfloat162float(c.packed ? hq[(size_t) b*s.v3 + j*s.v1 + 2*H*D + h*D + d] : hv[(size_t) b*s.v3 + j*s.v1 + h*D + d]);
        }
        std::vector<double> ro, rdq, rdk, rdv;
        reference(c, rq, rk, rv, rg, ro, rdq, rdk, rdv, s.scale);
        double big;
        e[0] = std::max(e[0], worst(ro, ho.data() + b*s.o3 + h*D, L, D, s.o1, big));
        e[1] = std::max(e[1], worst(rdq, hdq.data() + b*s.o3 + h*D, L, D, s.o1, big));
        e[2] = std::max(e[2], worst(rdk, hdk.data() + b*s.dk3 + h*D, S, D, s.dk1, big));
        e[3] = std::max(e[3], worst(rdv, hdv.data() + b*s.dk3 + h*D, S, D, s.dk1, big));
    }
    for (float x : ho) finite = finite && std::isfinite(x);
    for (float x : hdq) finite = finite && std::isfinite(x);
    const bool ok = finite && e[0] < 2e-2 && e[1] < 3e-2 && e[2] < 3e-2 && e[3] < 2e-2;
    std::printf("B %d H %d L %d S %d D %d causal %d packed %d: largest error / largest value: out %.2e dq %.2e dk %.2e dv %.2e%s -> %s\n",
                B, H, L, S, D, c.causal, c.packed, e[0], e[1], e[2], e[3], finite ? "" : " (not finite)", ok ? "ok" : "FAIL");
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
