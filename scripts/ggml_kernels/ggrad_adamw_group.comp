#version 450
// Adam's update of one or two parameters in one dispatch (GGML_OP_GGRAD kernel 9,
// ADAMW_GROUP; ggrad_cpu.inc says what it computes): an invocation per element of the two,
// element z*131072 + y*256 + x; p, m and v written in place. The update is the statements
// of ggml's OPT_STEP_ADAMW shader in its exact form (patch_ggml_adamw.py, with the IEEE
// division and root of patch_ggml_kernels.py), so a grouped step is an ungrouped one bit for
// bit.

#include "ggrad_ieee.glsl"

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

layout(push_constant) uniform parameter {
    uint n1; uint n2;
    uint h_off;                                       // misalignments, in elements
    uint x1_off; uint g1_off; uint m1_off; uint v1_off;
    uint x2_off; uint g2_off; uint m2_off; uint v2_off;
} p;

layout(binding = 0) readonly buffer Hyper {float params[];};
layout(binding = 1) buffer X1 {float x1[];};
layout(binding = 2) readonly buffer G1 {float g1[];};
layout(binding = 3) buffer M1 {float m1[];};
layout(binding = 4) buffer V1 {float v1[];};
layout(binding = 5) buffer X2 {float x2[];};
layout(binding = 6) readonly buffer G2 {float g2[];};
layout(binding = 7) buffer M2 {float m2[];};
layout(binding = 8) buffer V2 {float v2[];};

void update(inout float x_i, inout float m_i, inout float v_i, const float g_i) {
    const uint h = p.h_off;
    const float w1 = params[h + 7];
    m_i = w1 < 0.5f ? m_i + w1*(g_i - m_i) : g_i - (g_i - m_i)*(1.0f - w1);
    v_i = v_i*params[h + 2] + params[h + 8]*g_i*g_i;
    x_i = x_i*(1.0f - params[h + 0]*params[h + 4]);
    x_i = x_i - params[h + 5]*ggrad_divide(m_i, ggrad_divide(ggrad_sqrt(v_i), params[h + 6]) + params[h + 3]);
}

void main() {
    const uint e = gl_GlobalInvocationID.z * 131072 + gl_GlobalInvocationID.y * 256 + gl_GlobalInvocationID.x;
    if (e < p.n1) {
        float x_i = x1[p.x1_off + e], m_i = m1[p.m1_off + e], v_i = v1[p.v1_off + e];
        update(x_i, m_i, v_i, g1[p.g1_off + e]);
        x1[p.x1_off + e] = x_i; m1[p.m1_off + e] = m_i; v1[p.v1_off + e] = v_i;
    } else if (e - p.n1 < p.n2) {
        const uint i = e - p.n1;
        float x_i = x2[p.x2_off + i], m_i = m2[p.m2_off + i], v_i = v2[p.v2_off + i];
        update(x_i, m_i, v_i, g2[p.g2_off + i]);
        x2[p.x2_off + i] = x_i; m2[p.m2_off + i] = m_i; v2[p.v2_off + i] = v_i;
    }
}
