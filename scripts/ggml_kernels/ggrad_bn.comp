#version 450
// Batch normalization in training on Vulkan (GGML_OP_GGRAD kernels 20, 21, 22; the CPU's
// ggrad_cpu.inc says what each computes): STATS and BACK one workgroup per channel, sums in
// float over a fixed tree; APPLY one workgroup per row (n, c) of S positions.

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

layout(push_constant) uniform parameter {
    uint S; uint C; uint N;
    float eps;
    uint has_w; uint has_b;
    uint off0; uint off1; uint off2; uint off3; uint off4; uint off_d;  // misalignment, in elements
} p;

layout(binding = 0) readonly buffer In0 {float in0[];};
layout(binding = 1) readonly buffer In1 {float in1[];};
layout(binding = 2) readonly buffer In2 {float in2[];};
layout(binding = 3) readonly buffer In3 {float in3[];};
layout(binding = 4) readonly buffer In4 {float in4[];};
layout(binding = 5) writeonly buffer D {float d[];};

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

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint S = p.S, C = p.C, N = p.N;
#if defined(APPLY)
    const uint row = gl_WorkGroupID.z * 262144 + gl_WorkGroupID.y * 512 + gl_WorkGroupID.x;
    if (row >= C*N) {
        return;
    }
    const uint c = row % C;
    const float m = in1[p.off1 + c], s = sqrt(in2[p.off2 + c] + p.eps);
    for (uint i = tid; i < S; i += 256) {
        precise float v = (in0[p.off0 + row*S + i] - m) / s;
        precise float scaled = p.has_w != 0 ? v * in3[p.off3 + c] : v;
        d[p.off_d + row*S + i] = p.has_b != 0 ? scaled + in4[p.off4 + c] : scaled;
    }
#else
    const uint c = gl_WorkGroupID.z * 262144 + gl_WorkGroupID.y * 512 + gl_WorkGroupID.x;
    if (c >= C) {
        return;
    }
    const uint count = S*N;
    const float fcount = float(count);
#if defined(STATS)
    float sum = 0.0f;
    for (uint k = tid; k < count; k += 256) {
        sum += in0[p.off0 + ((k / S)*C + c)*S + k % S];
    }
    const float mean = reduce2(sum, 0.0f).x / fcount;
    float squares = 0.0f;
    for (uint k = tid; k < count; k += 256) {
        const float v = in0[p.off0 + ((k / S)*C + c)*S + k % S] - mean;
        squares += v*v;
    }
    const float var = reduce2(squares, 0.0f).x / fcount;
    if (tid == 0) {
        d[p.off_d + c] = mean;
        d[p.off_d + C + c] = var;
    }
#else  // BACK: in0 x, in1 g, in2 mean, in3 var, in4 weight
    const float m = in2[p.off2 + c], s = sqrt(in3[p.off3 + c] + p.eps), wc = p.has_w != 0 ? in4[p.off4 + c] : 1.0f;
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (uint k = tid; k < count; k += 256) {
        const uint at = ((k / S)*C + c)*S + k % S;
        const float g = in1[p.off1 + at];
        sum_g += g;
        sum_gx += g * ((in0[p.off0 + at] - m) / s);
    }
    const vec2 sums = reduce2(sum_g, sum_gx);
    const float mean_dy = (sums.x / fcount) * wc, mean_dyx = (sums.y / fcount) * wc;
    for (uint k = tid; k < count; k += 256) {
        const uint at = ((k / S)*C + c)*S + k % S;
        precise float xhat = (in0[p.off0 + at] - m) / s;
        precise float v = (in1[p.off1 + at] * wc - mean_dy) - xhat * mean_dyx;
        d[p.off_d + at] = v / s;
    }
    if (tid == 0) {
        d[p.off_d + S*C*N + c] = sums.y;
        d[p.off_d + S*C*N + C + c] = sums.x;
    }
#endif
#endif
}
