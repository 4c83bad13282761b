#version 450
// A quantized product's gradient on Vulkan (GGML_OP_GGRAD kernel 17, as the CPU's and CUDA's):
// g @ W, W (n_out rows of n_in values, in ggml's blocks) read in its blocks, never whole in
// float32. An invocation makes two outputs of a row (the pair ggml's dequantize gives, as
// in get_rows_quant.comp) for 16 rows of g: a workgroup covers 512 of a row's n_in values,
// the rows of W in order (sums in W's row order), g's values for 16 of W's rows at a time
// through shared memory. Compiled once per block type (DATA_A_*, vulkan-shaders-gen).

#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_control_flow_attributes : require

#include "types.glsl"

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

layout(push_constant) uniform parameter {
    uint n_in; uint n_out; uint T;
    uint w_row;                                       // W's row stride, in blocks
    uint g_row;                                       // g's row stride, in floats (a row: n_out values)
    uint g_off; uint d_off;                           // misalignment, in elements
} p;

layout(binding = 0) readonly buffer A {A_TYPE data_a[];};
#if defined(A_TYPE_PACKED16)
layout(binding = 0) readonly buffer A_PACKED16 {A_TYPE_PACKED16 data_a_packed16[];};
#endif
#if defined(A_TYPE_PACKED32)
layout(binding = 0) readonly buffer A_PACKED32 {A_TYPE_PACKED32 data_a_packed32[];};
#endif
layout(binding = 1) readonly buffer G {float data_g[];};
layout(binding = 2) writeonly buffer D {float data_d[];};

#include "dequant_funcs.glsl"

const uint TOKENS = 16;  // rows of g (and of the result) a workgroup makes
const uint DEPTH = 16;   // rows of W a step takes, their g values in shared memory
shared float g_tile[DEPTH][TOKENS];

void main() {
#ifdef NEEDS_INIT_IQ_SHMEM
    init_iq_shmem(gl_WorkGroupSize);
#endif
    const uint lid = gl_LocalInvocationID.x;
    const uint i00 = (gl_WorkGroupID.x * 256 + lid) * 2;
    const uint t0 = gl_WorkGroupID.y * TOKENS;
    const bool in_row = i00 < p.n_in;
    const uint iqs = (i00 % QUANT_K) / QUANT_R;       // the pair's place in its block
    const uint iybs = i00 - i00 % QUANT_K;            // the block's first value in the row
    const uint y_offset = QUANT_R == 1 ? 1 : QUANT_K / 2;
    float first[TOKENS], second[TOKENS];
    [[unroll]] for (uint t = 0; t < TOKENS; ++t) {
        first[t] = 0.0f;
        second[t] = 0.0f;
    }
    for (uint o0 = 0; o0 < p.n_out; o0 += DEPTH) {
        const uint r = lid % DEPTH, t = lid / DEPTH;   // 256 invocations: one value of g each
        g_tile[r][t] = o0 + r < p.n_out && t0 + t < p.T ? data_g[p.g_off + (t0 + t) * p.g_row + o0 + r] : 0.0f;
        barrier();
        if (in_row) {
            const uint rows = min(DEPTH, p.n_out - o0);
            for (uint k = 0; k < rows; ++k) {
                const uint ib = (o0 + k) * p.w_row + i00 / QUANT_K;
                vec2 w = dequantize(ib, iqs, 0);
                const vec2 dm = get_dm(ib, 0);
                w = w * dm.x + dm.y;
                [[unroll]] for (uint t = 0; t < TOKENS; ++t) {
                    first[t] = fma(g_tile[k][t], w.x, first[t]);
                    second[t] = fma(g_tile[k][t], w.y, second[t]);
                }
            }
        }
        barrier();
    }
    if (!in_row) {
        return;
    }
    [[unroll]] for (uint t = 0; t < TOKENS; ++t) {
        if (t0 + t < p.T) {
            const uint row = p.d_off + (t0 + t) * p.n_in + iybs + iqs;
            data_d[row] = first[t];
            data_d[row + y_offset] = second[t];
        }
    }
}
