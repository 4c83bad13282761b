#version 450
// The class-target cross-entropy's reduction on Vulkan (GGML_OP_GGRAD kernel 32; the CPU's
// ggrad_cpu.inc says what it computes): one workgroup sums both rows of kernel 1's output in a
// fixed order; the quotients are IEEE's (ggrad_ieee.glsl). scripts/patch_ggml_kernels.py
// copies this file into ggml's shaders.

#include "ggrad_ieee.glsl"

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

layout(push_constant) uniform parameter { uint n; uint stride; uint b_off; uint o_off; uint mean; } p;

layout(binding = 0) readonly buffer Both {float both[];};
layout(binding = 1) writeonly buffer O {float o[];};

shared float losses[256];
shared float weights[256];

void main() {
    const uint tid = gl_LocalInvocationID.x;
    float l = 0.0;
    float w = 0.0;
    for (uint i = tid; i < p.n; i += 256) {
        l += both[p.b_off + i];
        w += both[p.b_off + p.stride + i];
    }
    losses[tid] = l;
    weights[tid] = w;
    barrier();
    for (uint s = 128; s > 0; s >>= 1) {
        if (tid < s) {
            losses[tid] += losses[tid + s];
            weights[tid] += weights[tid + s];
        }
        barrier();
    }
    if (tid == 0) {
        const float total = losses[0];
        const float sum = weights[0];
        o[p.o_off] = p.mean != 0 ? ggrad_divide(total, sum) : total;
        o[p.o_off + 1] = sum;
        o[p.o_off + 2] = p.mean != 0 ? ggrad_divide(1.0, sum) : 1.0;
    }
}
