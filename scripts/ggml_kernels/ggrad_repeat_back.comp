#version 450

// ggrad: kernels: ggml-vulkan's REPEAT_BACK (repeat_back.comp, which this file replaces) with
// `lanes` threads per output (p.param1: 1, 4, 16 or 64, ggrad_repeat_back_lanes in
// ggml-vulkan.cpp): lane l sums repeats l, l + lanes, ... of its output (along the outer
// axes, each repeat's row segment inner), then the first lane adds the others' sums in lane
// order. ggml's shader summed every repeat in one thread: a bias gradient over 8192 rows of
// 512 took 3 ms on an H100 (one workgroup). With one lane the order is ggml's.

#include "types.glsl"
#include "generic_unary_head.glsl"

layout(local_size_x = 512, local_size_y = 1, local_size_z = 1) in;

shared float partial[512];

void main() {
    const uint lanes = uint(p.param1);
    const uint width = 512u / lanes;  // outputs of one workgroup, consecutive: coalesced reads
    const uint local = gl_LocalInvocationID.x;
    const uint lane = local / width;
    // the dispatch is 512 threads wide along x (ggml_vk_op_f32): get_idx() / 512 numbers the workgroup
    const uint idx = (get_idx() / 512u) * width + local % width;

    float acc = 0.0f;
    uint d_idx = 0u;
    if (idx < p.ne) {
        const uint i13 = fastdiv(idx, p.ne1_012mp, fastdiv_L(p.ne1_Ls, 0));
        const uint i13_offset = i13 * p.ne12*p.ne11*p.ne10;
        const uint i12 = fastdiv(idx - i13_offset, p.ne1_01mp, fastdiv_L(p.ne1_Ls, 1));
        const uint i12_offset = i12*p.ne11*p.ne10;
        const uint i11 = fastdiv(idx - i13_offset - i12_offset, p.ne1_0mp, fastdiv_L(p.ne1_Ls, 2));
        const uint i10 = idx - i13_offset - i12_offset - i11*p.ne10;
        d_idx = i13*p.nb13 + i12*p.nb12 + i11*p.nb11 + i10*p.nb10;

        const uint r0 = p.ne00 / p.ne10, r1 = p.ne01 / p.ne11, r2 = p.ne02 / p.ne12;
        const uint outer = r1 * r2 * (p.ne03 / p.ne13);
        for (uint o = lane; o < outer; o += lanes) {
            const uint k1 = o % r1, k2 = (o / r1) % r2, k3 = o / (r1 * r2);
            const uint row = (i13 + k3*p.ne13)*p.nb03 + (i12 + k2*p.ne12)*p.nb02 + (i11 + k1*p.ne11)*p.nb01;
            for (uint k0 = 0u; k0 < r0; ++k0) {
                acc += float(data_a[row + (i10 + k0*p.ne10)*p.nb00]);
            }
        }
    }
    partial[local] = acc;
    barrier();
    if (lane == 0u && idx < p.ne) {
        for (uint l = 1u; l < lanes; ++l) {
            acc += partial[local + l*width];
        }
        data_d[get_doffset() + d_idx] = D_TYPE(acc);
    }
}
