#version 450
// The window fold (GGML_OP_GGRAD kernel 23; ggrad_pool.h says what it computes): an
// invocation per image element, gathering the column entries that read it in tap order;
// element z*131072 + y*256 + x.

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

layout(push_constant) uniform parameter {
    int kh; int kw; int sh; int sw; int ph; int pw; int dh; int dw;
    int w; int h; int c; int ow; int oh; uint n;
    uint cols_off; uint d_off;                        // misalignment, in elements
} p;

layout(binding = 0) readonly buffer Cols {float cols[];};
layout(binding = 1) writeonly buffer D {float d_[];};

void main() {
    const uint i = gl_GlobalInvocationID.z * 131072 + gl_GlobalInvocationID.y * 256 + gl_GlobalInvocationID.x;
    const uint plane = uint(p.w*p.h);
    if (i >= plane*uint(p.c)*p.n) {
        return;
    }
    const int x = int(i % uint(p.w)), y = int((i / uint(p.w)) % uint(p.h)), c = int((i / plane) % uint(p.c));
    const uint n = i / (plane*uint(p.c));
    const uint width = uint(p.c*p.kh*p.kw);
    float sum = 0.0f;
    for (int ky = 0; ky < p.kh; ++ky) {
        const int ty = y + p.ph - ky*p.dh;
        if (ty < 0 || ty % p.sh != 0 || ty/p.sh >= p.oh) {
            continue;
        }
        for (int kx = 0; kx < p.kw; ++kx) {
            const int tx = x + p.pw - kx*p.dw;
            if (tx < 0 || tx % p.sw != 0 || tx/p.sw >= p.ow) {
                continue;
            }
            sum += cols[p.cols_off + ((n*uint(p.oh) + uint(ty/p.sh))*uint(p.ow) + uint(tx/p.sw))*width
                        + uint((c*p.kh + ky)*p.kw + kx)];
        }
    }
    d_[p.d_off + i] = sum;
}
