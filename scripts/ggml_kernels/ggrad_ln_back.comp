#version 450
// LayerNorm's gradient through the normalization on Vulkan (GGML_OP_GGRAD kernel 4; the
// CPU's ggrad_cpu.inc says what it computes). One workgroup per row.

layout(local_size_x = 64, local_size_y = 1, local_size_z = 1) in;

layout(push_constant) uniform parameter {
    uint D; uint R;
    uint x_stride; uint g_stride; uint o_stride;   // in elements
    uint x_off; uint g_off; uint o_off;            // misalignment, in elements
    float eps;
} p;

layout(binding = 0) readonly buffer X {float data_x[];};
layout(binding = 1) readonly buffer G {float data_g[];};
layout(binding = 2) writeonly buffer O {float data_o[];};

shared float red[64];

float reduce_sum(float v) {
    const uint tid = gl_LocalInvocationID.x;
    red[tid] = v;
    barrier();
    for (uint s = 32; s > 0; s >>= 1) {
        if (tid < s) {
            red[tid] += red[tid + s];
        }
        barrier();
    }
    const float r = red[0];
    barrier();
    return r;
}

void main() {
    const uint row = gl_WorkGroupID.z * 262144 + gl_WorkGroupID.y * 512 + gl_WorkGroupID.x;
    const uint tid = gl_LocalInvocationID.x;
    if (row >= p.R) {
        return;
    }
    const uint x0 = p.x_off + row * p.x_stride;
    const uint g0 = p.g_off + row * p.g_stride;
    const uint o0 = p.o_off + row * p.o_stride;
    float sum = 0.0;
    for (uint c = tid; c < p.D; c += 64) {
        sum += data_x[x0 + c];
    }
    const float mean = reduce_sum(sum) / float(p.D);
    float sum2 = 0.0;
    for (uint c = tid; c < p.D; c += 64) {
        const float v = data_x[x0 + c] - mean;
        sum2 += v * v;
    }
    const float rstd = 1.0 / sqrt(reduce_sum(sum2) / float(p.D) + p.eps);
    float sg = 0.0;
    float sgx = 0.0;
    for (uint c = tid; c < p.D; c += 64) {
        const float xh = (data_x[x0 + c] - mean) * rstd;
        sg += data_g[g0 + c];
        sgx += data_g[g0 + c] * xh;
    }
    const float mg = reduce_sum(sg) / float(p.D);
    const float mgx = reduce_sum(sgx) / float(p.D);
    for (uint c = tid; c < p.D; c += 64) {
        const float xh = (data_x[x0 + c] - mean) * rstd;
        data_o[o0 + c] = rstd * (data_g[g0 + c] - mg - xh * mgx);
    }
}
