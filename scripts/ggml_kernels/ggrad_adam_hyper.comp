#version 450
// Adam's per-step constants on Vulkan (GGML_OP_GGRAD kernel 3; the CPU's ggrad_cpu.inc says
// what it computes). `precise`: each operation rounded on its own, as the composed form; the
// quotient and root IEEE's (ggrad_ieee.glsl: NVIDIA's driver rounds them through reciprocals).
// `in_place` (set 55): c1, c2 go over the corrections (read first), h holds the 9 constants.

#include "ggrad_ieee.glsl"

layout(local_size_x = 1, local_size_y = 1, local_size_z = 1) in;

layout(push_constant) uniform parameter { uint c_off; uint lr_off; uint k_off; uint in_off; uint h_off; uint in_place; } p;

layout(binding = 0) buffer Cs {float c[];};
layout(binding = 1) readonly buffer Lr {float lr[];};
layout(binding = 2) readonly buffer K {float k[];};
layout(binding = 3) readonly buffer In {float inflow[];};
layout(binding = 4) writeonly buffer H {float h[];};

void main() {
    precise float decayed1 = c[p.c_off] * k[p.k_off];
    precise float decayed2 = c[p.c_off + 1] * k[p.k_off + 1];
    precise float c1 = decayed1 + inflow[p.in_off];
    precise float c2 = decayed2 + inflow[p.in_off + 1];
    const float rate = lr[p.lr_off];
    h[p.h_off + 0] = rate;
    h[p.h_off + 1] = k[p.k_off];
    h[p.h_off + 2] = k[p.k_off + 1];
    h[p.h_off + 3] = k[p.k_off + 2];
    h[p.h_off + 4] = k[p.k_off + 3];
    h[p.h_off + 5] = ggrad_divide(rate, c1);
    h[p.h_off + 6] = ggrad_sqrt(c2);
    h[p.h_off + 7] = inflow[p.in_off];
    h[p.h_off + 8] = inflow[p.in_off + 1];
    if (p.in_place != 0) {
        c[p.c_off] = c1;
        c[p.c_off + 1] = c2;
    } else {
        h[p.h_off + 9] = c1;
        h[p.h_off + 10] = c2;
    }
}
