// The float64 reference of ggrad's fused attention kernels (scripts/ggml_kernels/ggrad_attention.cuh)
// for one (batch, head), shared by bench/gpu/attention_probe.cu (the kernels on a GPU) and
// bench/gpu/attention_emulator.cpp (the same kernels emulated on the CPU).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
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

