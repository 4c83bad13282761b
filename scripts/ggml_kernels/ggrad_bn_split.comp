#version 450
// Batch normalization's statistics and gradient with each channel split into P parts
// (GGML_OP_GGRAD kernels 26-29; ggrad_bn.h says what each computes): one workgroup per
// part, row z*262144 + y*512 + x = c*P + part, for STATS_PARTS and BACK_PARTS (each part's
// sums) and BACK_APPLY (the input's gradient over a part); STATS_JOIN an invocation per
// channel, element z*131072 + y*256 + x. One workgroup per channel (ggrad_bn.comp) left a
// GPU mostly idle where channels are few and large (a ResNet's first layers).

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

layout(push_constant) uniform parameter {
    uint S; uint C; uint N; uint P; uint chunk;
    float eps;
    uint has_w;
    uint off0; uint off1; uint off2; uint off3; uint off4; uint off5; uint off_d;  // misalignment, in elements
} p;

layout(binding = 0) readonly buffer In0 {float in0[];};
layout(binding = 1) readonly buffer In1 {float in1[];};
layout(binding = 2) readonly buffer In2 {float in2[];};
layout(binding = 3) readonly buffer In3 {float in3[];};
layout(binding = 4) readonly buffer In4 {float in4[];};
layout(binding = 5) writeonly buffer D {float d[];};
layout(binding = 6) readonly buffer In5 {float in5[];};

shared float red[256];
shared float red2[256];

// the sums of a and b over the workgroup, in a fixed order
vec2 reduce2(float a, float b) {
    const uint tid = gl_LocalInvocationID.x;
    red[tid] = a;
    red2[tid] = b;
    barrier();
    for (uint s = 128; s > 0; s >>= 1) {
        if (tid < s) {
            red[tid] += red[tid + s];
            red2[tid] += red2[tid + s];
        }
        barrier();
    }
    const vec2 r = vec2(red[0], red2[0]);
    barrier();
    return r;
}

// the values part q holds (the last parts may hold fewer, or none)
uint part_size(uint q) {
    const uint count = p.S * p.N;
    return q * p.chunk >= count ? 0 : min(p.chunk, count - q * p.chunk);
}

// a workgroup's walk over its part of channel c, 256 values a step, with no division per value
uint walk_k, walk_end, walk_n, walk_s;

void walk_start(uint c, uint q) {
    walk_k = q * p.chunk + gl_LocalInvocationID.x;
    walk_end = q * p.chunk + part_size(q);
    walk_n = walk_k / p.S;
    walk_s = walk_k % p.S;
}

uint walk_at(uint c) {
    return (walk_n * p.C + c) * p.S + walk_s;
}

void walk_next() {
    walk_k += 256;
    walk_n += 256 / p.S;
    walk_s += 256 % p.S;
    if (walk_s >= p.S) {
        walk_s -= p.S;
        walk_n += 1;
    }
}

void main() {
#if defined(STATS_JOIN)  // in0: the parts' means, then their squared deviations (C*P each)
    const uint c = gl_GlobalInvocationID.z * 131072 + gl_GlobalInvocationID.y * 256 + gl_GlobalInvocationID.x;
    if (c >= p.C) {
        return;
    }
    const float count = float(p.S * p.N);
    float sum = 0.0f;
    for (uint q = 0; q < p.P; ++q) {
        sum += in0[p.off0 + c * p.P + q] * float(part_size(q));
    }
    const float mean = sum / count;
    float deviations = 0.0f;
    for (uint q = 0; q < p.P; ++q) {
        const float off = in0[p.off0 + c * p.P + q] - mean;
        deviations += in0[p.off0 + p.C * p.P + c * p.P + q] + off * off * float(part_size(q));
    }
    d[p.off_d + c] = mean;
    d[p.off_d + p.C + c] = deviations / count;
#else
    const uint row = gl_WorkGroupID.z * 262144 + gl_WorkGroupID.y * 512 + gl_WorkGroupID.x;
    if (row >= p.C * p.P) {
        return;
    }
    const uint c = row / p.P, q = row % p.P;
    const uint tid = gl_LocalInvocationID.x;
#if defined(STATS_PARTS)  // in0 x
    const float size = float(max(part_size(q), 1));
    float sum = 0.0f;
    for (walk_start(c, q); walk_k < walk_end; walk_next()) {
        sum += in0[p.off0 + walk_at(c)];
    }
    const float mean = reduce2(sum, 0.0f).x / size;
    float squares = 0.0f;
    for (walk_start(c, q); walk_k < walk_end; walk_next()) {
        const float v = in0[p.off0 + walk_at(c)] - mean;
        squares += v * v;
    }
    squares = reduce2(squares, 0.0f).x;
    if (tid == 0) {
        d[p.off_d + row] = mean;
        d[p.off_d + p.C * p.P + row] = squares;
    }
#else  // BACK_PARTS and BACK_APPLY: in0 x, in1 g, in2 mean, in3 var, in4 weight, in5 the parts' sums
    const float m = in2[p.off2 + c], s = sqrt(in3[p.off3 + c] + p.eps);
#if defined(BACK_PARTS)
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (walk_start(c, q); walk_k < walk_end; walk_next()) {
        const uint at = walk_at(c);
        const float g = in1[p.off1 + at];
        sum_g += g;
        sum_gx += g * ((in0[p.off0 + at] - m) / s);
    }
    const vec2 sums = reduce2(sum_g, sum_gx);
    if (tid == 0) {
        d[p.off_d + row] = sums.x;
        d[p.off_d + p.C * p.P + row] = sums.y;
    }
#else  // BACK_APPLY: every workgroup of a channel adds its parts in one order, so all see the same sums
    const float wc = p.has_w != 0 ? in4[p.off4 + c] : 1.0f;
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (uint k = 0; k < p.P; ++k) {
        sum_g += in5[p.off5 + c * p.P + k];
        sum_gx += in5[p.off5 + p.C * p.P + c * p.P + k];
    }
    const float fcount = float(p.S * p.N);
    const float mean_dy = (sum_g / fcount) * wc, mean_dyx = (sum_gx / fcount) * wc;
    for (walk_start(c, q); walk_k < walk_end; walk_next()) {
        const uint at = walk_at(c);
        precise float xhat = (in0[p.off0 + at] - m) / s;
        precise float v = (in1[p.off1 + at] * wc - mean_dy) - xhat * mean_dyx;
        d[p.off_d + at] = v / s;
    }
    if (q == 0 && tid == 0) {
        const uint n = p.S * p.C * p.N;
        d[p.off_d + n + c] = sum_gx;
        d[p.off_d + n + p.C + c] = sum_g;
    }
#endif
#endif
#endif
}
