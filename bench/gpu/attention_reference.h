// What bench/gpu/attention_probe.cu (ggrad's fused attention kernels on a GPU) and
// bench/gpu/attention_emulator.cpp (the same kernels emulated on the CPU) share: a case's inputs,
// its shape for the kernels, and their results against a float64 reference. Included after the
// kernels (scripts/ggml_kernels/ggrad_attention.cuh: ggrad_attn_shape).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <type_traits>
#include <vector>

struct Case { int B, H, L, S, D; int causal; bool packed; };

// reference of one (b, h): out (L, D), dq (L, D), dk, dv (S, D)
static void reference(const Case & c, const std::vector<float> & q, const std::vector<float> & k,
                      const std::vector<float> & v, const std::vector<float> & g, std::vector<double> & out,
                      std::vector<double> & dq, std::vector<double> & dk, std::vector<double> & dv, double scale) {
    const int L = c.L, S = c.S, D = c.D;
    std::vector<double> p((size_t) L*S), dp((size_t) L*S);
    out.assign((size_t) L*D, 0); dq.assign((size_t) L*D, 0); dk.assign((size_t) S*D, 0); dv.assign((size_t) S*D, 0);
    for (int i = 0; i < L; ++i) {
        double top = -INFINITY;
        for (int j = 0; j < S; ++j) {
            double x = 0;
            for (int d = 0; d < D; ++d) x += (double) q[i*D + d]*k[j*D + d];
            x = (c.causal && j > i) ? -INFINITY : x*scale;
            p[(size_t) i*S + j] = x;
            top = std::max(top, x);
        }
        double sum = 0;
        for (int j = 0; j < S; ++j) sum += p[(size_t) i*S + j] = std::exp(p[(size_t) i*S + j] - top);
        for (int j = 0; j < S; ++j) p[(size_t) i*S + j] /= sum;
        for (int j = 0; j < S; ++j)
            for (int d = 0; d < D; ++d) out[i*D + d] += p[(size_t) i*S + j]*v[j*D + d];
    }
    for (int i = 0; i < L; ++i) {
        double dot = 0;
        for (int j = 0; j < S; ++j) {
            double x = 0;
            for (int d = 0; d < D; ++d) x += (double) g[i*D + d]*v[j*D + d];
            dp[(size_t) i*S + j] = x;
            dot += x*p[(size_t) i*S + j];
        }
        for (int j = 0; j < S; ++j) {
            const double pij = p[(size_t) i*S + j], ds = pij*(dp[(size_t) i*S + j] - dot)*scale;
            for (int d = 0; d < D; ++d) {
                dv[j*D + d] += pij*g[i*D + d];
                dq[i*D + d] += ds*k[j*D + d];
                dk[j*D + d] += ds*q[i*D + d];
            }
        }
    }
}

static double worst(const std::vector<double> & ref, const float * got, int rows, int D, int64_t ld, double & scale_out) {
    double err = 0, big = 0;
    for (int r = 0; r < rows; ++r)
        for (int d = 0; d < D; ++d) {
            err = std::max(err, std::fabs(ref[(size_t) r*D + d] - got[(int64_t) r*ld + d]));
            big = std::max(big, std::fabs(ref[(size_t) r*D + d]));
        }
    scale_out = big;
    return big > 0 ? err/big : err;  // all zeros (one query's dq and dk): the error itself
}

template <typename T> static float tof(T x);
template <> float tof<nv_bfloat16>(nv_bfloat16 x) { return __bfloat162float(x); }
template <> float tof<half>(half x) { return __half2float(x); }
template <typename T> static T fromf(float x);
template <> nv_bfloat16 fromf<nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> half fromf<half>(float x) { return __float2half_rn(x); }
template <typename T> static float lowround(float x) { return tof<T>(fromf<T>(x)); }

// a case's random inputs on the host: q (B, L, H, D) and k, v (B, S, H, D), in one (B, L, 3, H, D)
// buffer where packed (L == S), as a fused projection lays them; dO (B, L, H, D) in float32
template <typename T>
struct Inputs {
    std::vector<T> q, k, v;
    std::vector<float> g;
    Inputs(const Case & c, float qscale) {
        std::mt19937 rng(1234);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        const int64_t row = (c.packed ? 3 : 1)*c.H*c.D;
        q.resize((size_t) c.B*c.L*row);
        k.resize(c.packed ? 0 : (size_t) c.B*c.S*row);
        v.resize(k.size());
        for (auto & x : q) x = fromf<T>(normal(rng)*qscale);
        for (auto & x : k) x = fromf<T>(normal(rng)*qscale);
        for (auto & x : v) x = fromf<T>(normal(rng));
        g.resize((size_t) c.B*c.L*c.H*c.D);
        for (auto & x : g) x = normal(rng);
    }
};

// the kernels' shape of a case laid out as Inputs lays it; out and dq (B, L, H, D), dk and dv (B, S, H, D)
static ggrad_attn_shape shape_of(const Case & c) {
    const int H = c.H, D = c.D;
    const int64_t row = (c.packed ? 3 : 1)*H*D;
    ggrad_attn_shape s{};
    s.L = c.L; s.S = c.S; s.H = H; s.B = c.B;
    s.q1 = row; s.q2 = D; s.q3 = (int64_t) c.L*row;
    s.k1 = row; s.k2 = D; s.k3 = (int64_t) c.S*row;
    s.v1 = s.k1; s.v2 = s.k2; s.v3 = s.k3;
    s.o1 = H*D; s.o2 = D; s.o3 = (int64_t) c.L*H*D;
    s.dq1 = s.o1; s.dq2 = s.o2; s.dq3 = s.o3;
    s.dk1 = H*D; s.dk2 = D; s.dk3 = (int64_t) c.S*H*D;
    s.g1 = H*D; s.g2 = D; s.g3 = (int64_t) c.L*H*D;
    s.scale = 1.0f/std::sqrt((float) D);
    s.causal = c.causal;
    return s;
}

// the kernels' results (host copies) against the reference over the first and last batch's heads,
// each output's largest error over its largest value, printed; whether all are within tolerance and finite
template <typename T>
static bool check(const Case & c, const Inputs<T> & in, float qscale, const std::vector<float> & out,
                  const std::vector<float> & dq, const std::vector<float> & dk, const std::vector<float> & dv) {
    const ggrad_attn_shape s = shape_of(c);
    const int H = c.H, L = c.L, S = c.S, D = c.D;
    double e[4] = {0, 0, 0, 0};
    for (int b : {0, c.B - 1}) for (int h = 0; h < H; ++h) {
        std::vector<float> rq((size_t) L*D), rk((size_t) S*D), rv((size_t) S*D), rg((size_t) L*D);
        for (int i = 0; i < L; ++i) for (int d = 0; d < D; ++d) {
            rq[i*D + d] = tof<T>(in.q[(size_t) b*s.q3 + i*s.q1 + h*D + d]);
            rg[i*D + d] = lowround<T>(in.g[(size_t) b*s.g3 + i*s.g1 + h*D + d]);  // the kernels' dO in the products
        }
        for (int j = 0; j < S; ++j) for (int d = 0; d < D; ++d) {
            const size_t at = (size_t) b*s.k3 + j*s.k1 + h*D + d;
            rk[j*D + d] = tof<T>(c.packed ? in.q[at + H*D] : in.k[at]);
            rv[j*D + d] = tof<T>(c.packed ? in.q[at + 2*H*D] : in.v[at]);
        }
        std::vector<double> ro, rdq, rdk, rdv;
        reference(c, rq, rk, rv, rg, ro, rdq, rdk, rdv, s.scale);
        double big;
        e[0] = std::max(e[0], worst(ro, out.data() + b*s.o3 + h*D, L, D, s.o1, big));
        e[1] = std::max(e[1], worst(rdq, dq.data() + b*s.dq3 + h*D, L, D, s.dq1, big));
        e[2] = std::max(e[2], worst(rdk, dk.data() + b*s.dk3 + h*D, S, D, s.dk1, big));
        e[3] = std::max(e[3], worst(rdv, dv.data() + b*s.dk3 + h*D, S, D, s.dk1, big));
    }
    bool finite = true;
    for (const std::vector<float> * t : {&out, &dq, &dk, &dv}) {
        for (float x : *t) finite = finite && std::isfinite(x);
    }
    const bool ok = finite && e[0] < 2e-2 && e[1] < 3e-2 && e[2] < 3e-2 && e[3] < 2e-2;
    std::printf("%s B %d H %d L %d S %d D %d causal %d packed %d qscale %g: out %.2e dq %.2e dk %.2e dv %.2e%s -> %s\n",
                std::is_same<T, half>::value ? "f16 " : "bf16", c.B, H, L, S, D, c.causal, c.packed, qscale,
                e[0], e[1], e[2], e[3], finite ? "" : " (not finite)", ok ? "ok" : "FAIL");
    std::fflush(stdout);
    return ok;
}

