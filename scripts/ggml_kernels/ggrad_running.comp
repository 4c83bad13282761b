#version 450
// A running statistic moved toward the batch's (GGML_OP_GGRAD kernel 25; ggrad_bn.h says
// what it computes): an invocation per channel, element z*131072 + y*256 + x. `precise`
// keeps each product rounded apart from the sum (the composed SCALE, SCALE, ADD). With
// `count`, invocation 0 counts an int32 up by one (BatchNorm's num_batches_tracked: set 47).
// d may be running itself (in place: each channel is read before it is written).

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

layout(push_constant) uniform parameter {
    uint n; uint offset;
    float keep; float take;
    uint r_off; uint s_off; uint d_off;               // misalignment, in elements
    uint count; uint c_off;
} p;

layout(binding = 0) readonly buffer Running {float running[];};
layout(binding = 1) readonly buffer Stats {float stats[];};
layout(binding = 2) writeonly buffer D {float d[];};
layout(binding = 3) buffer Counter {int counter[];};

void main() {
    const uint c = gl_GlobalInvocationID.z * 131072 + gl_GlobalInvocationID.y * 256 + gl_GlobalInvocationID.x;
    if (c >= p.n) {
        return;
    }
    precise float kept = running[p.r_off + c] * p.keep;
    precise float taken = stats[p.s_off + p.offset + c] * p.take;
    precise float moved = kept + taken;
    d[p.d_off + c] = moved;
    if (p.count != 0 && c == 0) {
        counter[p.c_off] += 1;
    }
}
