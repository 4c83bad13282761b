#version 450
// ggrad's GEMM on Vulkan (GGML_OP_GGRAD kernel 6; ggrad_gemm.h reads the operands' layout, as
// for the CPU's and CUDA's): row-major C = op(A) op(B), plus a bias on every row where given,
// float32 sums in k order. A transposed view is read in place, so a product's gradient
// needs no transposed copies (ggml's mul_mat reads its operands along their first axis
// only). A workgroup of 256 makes a 64x64 tile of C, 4x4 outputs an invocation; C's batch
// is the workgroup's z.

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

layout(push_constant) uniform parameter {
    uint M; uint N; uint K; uint lda; uint ldb;
    uint flags;                                       // 1: A read transposed, 2: B, 4: a bias
    uint b2;                                          // C's batches along axis 2
    uint a_r2; uint a_r3; uint b_r2; uint b_r3;       // C's batches per batch of A and of B
    uint a_s2; uint a_s3; uint b_s2; uint b_s3;       // A's and B's batch steps, in floats
    uint a_off; uint b_off; uint c_off; uint bias_off;  // misalignment, in elements
} p;

layout(binding = 0) readonly buffer A {float a_[];};
layout(binding = 1) readonly buffer B {float b_[];};
layout(binding = 2) readonly buffer Bias {float bias_[];};
layout(binding = 3) writeonly buffer C {float c_[];};

const uint TILE = 64;
const uint DEPTH = 16;
shared float tile_a[DEPTH][TILE + 1];  // [k][m]
shared float tile_b[DEPTH][TILE + 1];  // [k][n]

void main() {
    const uint lid = gl_LocalInvocationID.x;
    const uint m0 = gl_WorkGroupID.y * TILE, n0 = gl_WorkGroupID.x * TILE;
    const uint z = gl_WorkGroupID.z, i2 = z % p.b2, i3 = z / p.b2;
    const uint a_base = p.a_off + (i2 / p.a_r2) * p.a_s2 + (i3 / p.a_r3) * p.a_s3;
    const uint b_base = p.b_off + (i2 / p.b_r2) * p.b_s2 + (i3 / p.b_r3) * p.b_s3;
    const bool ta = (p.flags & 1u) != 0u, tb = (p.flags & 2u) != 0u;
    const uint tx = lid % 16u, ty = lid / 16u;
    float acc[4][4];
    for (uint i = 0; i < 4; ++i) {
        for (uint j = 0; j < 4; ++j) {
            acc[i][j] = 0.0f;
        }
    }
    for (uint k0 = 0; k0 < p.K; k0 += DEPTH) {
        // each invocation loads 4 of each tile's 1024 values; neighbours read neighbouring floats
        for (uint r = 0; r < 4; ++r) {
            const uint e = lid + 256u * r;
            const uint am = ta ? e % TILE : e / DEPTH, ak = ta ? e / TILE : e % DEPTH;
            const uint m = m0 + am, k = k0 + ak;
            tile_a[ak][am] = m < p.M && k < p.K ? a_[a_base + (ta ? k * p.lda + m : m * p.lda + k)] : 0.0f;
            const uint bn = tb ? e / DEPTH : e % TILE, bk = tb ? e % DEPTH : e / TILE;
            const uint n = n0 + bn, kb = k0 + bk;
            tile_b[bk][bn] = n < p.N && kb < p.K ? b_[b_base + (tb ? n * p.ldb + kb : kb * p.ldb + n)] : 0.0f;
        }
        barrier();
        for (uint k = 0; k < DEPTH; ++k) {
            float av[4], bv[4];
            for (uint i = 0; i < 4; ++i) {
                av[i] = tile_a[k][ty * 4u + i];
                bv[i] = tile_b[k][tx * 4u + i];
            }
            for (uint i = 0; i < 4; ++i) {
                for (uint j = 0; j < 4; ++j) {
                    acc[i][j] = fma(av[i], bv[j], acc[i][j]);
                }
            }
        }
        barrier();
    }
    const uint c_base = p.c_off + z * p.M * p.N;
    for (uint i = 0; i < 4; ++i) {
        const uint m = m0 + ty * 4u + i;
        for (uint j = 0; j < 4; ++j) {
            const uint n = n0 + tx * 4u + j;
            if (m < p.M && n < p.N) {
                // the bias after the product, as the ADD node it replaces: rounded once, after
                c_[c_base + m * p.N + n] = (p.flags & 4u) != 0u ? acc[i][j] + bias_[p.bias_off + n] : acc[i][j];
            }
        }
    }
}
