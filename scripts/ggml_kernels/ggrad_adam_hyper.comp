#version 450
// Adam's per-step constants on Vulkan (GGML_OP_GGRAD kernel 3; the CPU's ggrad_cpu.inc says
// what it computes). `precise`: each operation rounded on its own, as the composed form.

layout(local_size_x = 1, local_size_y = 1, local_size_z = 1) in;

layout(push_constant) uniform parameter { uint c_off; uint lr_off; uint k_off; uint in_off; uint h_off; } p;

layout(binding = 0) readonly buffer Cs {float c[];};
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
    h[p.h_off + 5] = rate / c1;
    h[p.h_off + 6] = sqrt(c2);
    h[p.h_off + 7] = inflow[p.in_off];
    h[p.h_off + 8] = inflow[p.in_off + 1];
    h[p.h_off + 9] = c1;
    h[p.h_off + 10] = c2;
}
