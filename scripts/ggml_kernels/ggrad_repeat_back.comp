#version 450

// ggrad: kernels: ggml-vulkan's REPEAT_BACK (repeat_back.comp, which this file replaces) with
// `lanes` threads per output (p.param1: 1, 4, 16 or 64, ggrad_repeat_back_lanes in
// ggml-vulkan.cpp): lane l sums repeats l, l + lanes, ... of its output (along the outer
// axes, each repeat's row segment inner) into four sums, so that four loads are in flight
// (one sum waited on each load: 89 us for a bias gradient over 8192 rows of 512 on an
// H100), then the first lane adds the others' sums in lane order. ggml's shader summed
// every repeat in one thread: 3 ms for that gradient (one workgroup).

#include "types.glsl"
#include "generic_unary_head.glsl"

layout(local_size_x = 512, local_size_y = 1, local_size_z = 1) in;

shared float partial[512];

// repeat o of output (i10, i11, i12, i13): its row segment's sum
float repeat_sum(const uint o, const uint i10, const uint i11, const uint i12, const uint i13,
                 const uint r0, const uint r1, const uint r2) {
    const uint k1 = o % r1, k2 = (o / r1) % r2, k3 = o / (r1 * r2);
    const uint row = get_aoffset() + (i13 + k3*p.ne13)*p.nb03 + (i12 + k2*p.ne12)*p.nb02 + (i11 + k1*p.ne11)*p.nb01;
    float sum = 0.0f;
    for (uint k0 = 0u; k0 < r0; ++k0) {
        sum += float(data_a[row + (i10 + k0*p.ne10)*p.nb00]);
    }
    return sum;
}

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
        float acc1 = 0.0f, acc2 = 0.0f, acc3 = 0.0f;
        uint o = lane;
        for (; o + 3u*lanes < outer; o += 4u*lanes) {
            acc  += repeat_sum(o, i10, i11, i12, i13, r0, r1, r2);
            acc1 += repeat_sum(o + lanes, i10, i11, i12, i13, r0, r1, r2);
            acc2 += repeat_sum(o + 2u*lanes, i10, i11, i12, i13, r0, r1, r2);
            acc3 += repeat_sum(o + 3u*lanes, i10, i11, i12, i13, r0, r1, r2);
        }
        for (; o < outer; o += lanes) {
            acc += repeat_sum(o, i10, i11, i12, i13, r0, r1, r2);
        }
        acc = (acc + acc1) + (acc2 + acc3);
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
