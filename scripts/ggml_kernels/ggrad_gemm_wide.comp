#version 450
#extension GL_EXT_control_flow_attributes : enable
// ggrad's GEMM on Vulkan for large products (GGML_OP_GGRAD kernel 6 with op_params[4] naming
// the tile, set 48): TM x TN tiles of C (TM, TN each 64 or 128, not both 64: that tile is
// ggrad_gemm.comp's), a workgroup of 256 invocations, (TM/16) x (TN/16) outputs an
// invocation. Against the 64x64 tile each value read from shared memory feeds up to twice
// the multiply-adds, shared memory is read as vec4 (rows and columns of an invocation lie
// in runs of four, 64 apart), and the next slice of the operands is loaded into registers
// while the current one is multiplied. The same sums as ggrad_gemm.comp, in k order, fma by
// fma: both shaders give the same bits (on the H100's driver and lavapipe; neither declares
// its sums precise), except a sum that comes to -0 where K is 8 past a multiple of 16 (the
// 64x64 shader's zero padding then adds +0).

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

const uint DEPTH = 8;
const uint GM = TM / 64, GN = TN / 64;              // an invocation's runs of four rows, of four columns
const uint LA = TM * DEPTH / 256, LB = TN * DEPTH / 256;  // values an invocation loads a slice
// [k][rows / 4]: one vec4 more a row keeps the stores of a transposed load off one bank
shared vec4 tile_a[DEPTH][TM / 4 + 1];
shared vec4 tile_b[DEPTH][TN / 4 + 1];

void main() {
    const uint lid = gl_LocalInvocationID.x;
    const uint m0 = gl_WorkGroupID.y * TM, n0 = gl_WorkGroupID.x * TN;
    const uint z = gl_WorkGroupID.z, i2 = z % p.b2, i3 = z / p.b2;
    const uint a_base = p.a_off + (i2 / p.a_r2) * p.a_s2 + (i3 / p.a_r3) * p.a_s3;
    const uint b_base = p.b_off + (i2 / p.b_r2) * p.b_s2 + (i3 / p.b_r3) * p.b_s3;
    const bool ta = (p.flags & 1u) != 0u, tb = (p.flags & 2u) != 0u;
    const uint tx = lid % 16u, ty = lid / 16u;
    float acc[GM * 4][GN * 4];
    [[unroll]] for (uint i = 0; i < GM * 4; ++i) {
        [[unroll]] for (uint j = 0; j < GN * 4; ++j) {
            acc[i][j] = 0.0f;
        }
    }
    // where this invocation's loads land in the tiles: neighbours read neighbouring floats
    uint am[LA], ak[LA], bn[LB], bk[LB];
    [[unroll]] for (uint r = 0; r < LA; ++r) {
        const uint e = lid + 256u * r;
        am[r] = ta ? e % TM : e / DEPTH;
        ak[r] = ta ? e / TM : e % DEPTH;
    }
    [[unroll]] for (uint r = 0; r < LB; ++r) {
        const uint e = lid + 256u * r;
        bn[r] = tb ? e / DEPTH : e % TN;
        bk[r] = tb ? e % DEPTH : e / TN;
    }
    float ra[LA], rb[LB];
    [[unroll]] for (uint r = 0; r < LA; ++r) {
        const uint m = m0 + am[r], k = ak[r];
        ra[r] = m < p.M && k < p.K ? a_[a_base + (ta ? k * p.lda + m : m * p.lda + k)] : 0.0f;
    }
    [[unroll]] for (uint r = 0; r < LB; ++r) {
        const uint n = n0 + bn[r], k = bk[r];
        rb[r] = n < p.N && k < p.K ? b_[b_base + (tb ? n * p.ldb + k : k * p.ldb + n)] : 0.0f;
    }
    for (uint k0 = 0; k0 < p.K; k0 += DEPTH) {
        [[unroll]] for (uint r = 0; r < LA; ++r) {
            tile_a[ak[r]][am[r] / 4u][am[r] % 4u] = ra[r];
        }
        [[unroll]] for (uint r = 0; r < LB; ++r) {
            tile_b[bk[r]][bn[r] / 4u][bn[r] % 4u] = rb[r];
        }
        barrier();
        const uint k1 = k0 + DEPTH;
        if (k1 < p.K) {  // the next slice, in flight while this one is multiplied
            [[unroll]] for (uint r = 0; r < LA; ++r) {
                const uint m = m0 + am[r], k = k1 + ak[r];
                ra[r] = m < p.M && k < p.K ? a_[a_base + (ta ? k * p.lda + m : m * p.lda + k)] : 0.0f;
            }
            [[unroll]] for (uint r = 0; r < LB; ++r) {
                const uint n = n0 + bn[r], k = k1 + bk[r];
                rb[r] = n < p.N && k < p.K ? b_[b_base + (tb ? n * p.ldb + k : k * p.ldb + n)] : 0.0f;
            }
        }
        [[unroll]] for (uint k = 0; k < DEPTH; ++k) {
            vec4 av[GM], bv[GN];
            [[unroll]] for (uint g = 0; g < GM; ++g) {
                av[g] = tile_a[k][g * 16u + ty];
            }
            [[unroll]] for (uint g = 0; g < GN; ++g) {
                bv[g] = tile_b[k][g * 16u + tx];
            }
            [[unroll]] for (uint i = 0; i < GM * 4; ++i) {
                [[unroll]] for (uint j = 0; j < GN * 4; ++j) {
                    acc[i][j] = fma(av[i / 4u][i % 4u], bv[j / 4u][j % 4u], acc[i][j]);
                }
            }
        }
        barrier();
    }
    const uint c_base = p.c_off + z * p.M * p.N;
    [[unroll]] for (uint i = 0; i < GM * 4; ++i) {
        const uint m = m0 + (i / 4u) * 64u + ty * 4u + i % 4u;
        [[unroll]] for (uint j = 0; j < GN * 4; ++j) {
            const uint n = n0 + (j / 4u) * 64u + tx * 4u + j % 4u;
            if (m < p.M && n < p.N) {
                // the bias after the product, as the ADD node it replaces: rounded once, after
                c_[c_base + m * p.N + n] = (p.flags & 4u) != 0u ? acc[i][j] + bias_[p.bias_off + n] : acc[i][j];
            }
        }
    }
}
