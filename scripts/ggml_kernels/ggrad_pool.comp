#version 450
// torch's max pooling (GGML_OP_GGRAD kernel 10) and, with BACK, its gradient (kernel 11) on
// Vulkan; ggrad_pool.h says what each computes (the same window arithmetic, in GLSL). An
// invocation per output (forward) or per input element (BACK: the gradients of the windows
// whose maximum it is, gathered in the windows' order: no atomics); element
// z*131072 + y*256 + x.

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

layout(push_constant) uniform parameter {
    int kw; int kh; int sw; int sh; int pw; int ph; int dw; int dh; int ow; int oh;
    int w; int h; uint planes;
    uint x_off; uint g_off; uint d_off;               // misalignment, in elements
} p;

layout(binding = 0) readonly buffer X {float x_[];};
layout(binding = 1) readonly buffer Gr {float g_[];};
layout(binding = 2) writeonly buffer D {float d_[];};

// a window's in-bounds taps along one axis: the first, and one past the last
ivec2 span(int o, int s, int pad, int k, int dil, int n) {
    int t0 = o*s - pad;
    const int end = min(t0 + (k - 1)*dil + 1, n);
    while (t0 < 0) {
        t0 += dil;
    }
    return ivec2(t0, end);
}

// window (oy, ox) of the plane at `base`: its maximum and its index in the plane (-1: no tap)
int window(uint base, int oy, int ox, out float best) {
    const ivec2 ys = span(oy, p.sh, p.ph, p.kh, p.dh, p.h), xs = span(ox, p.sw, p.pw, p.kw, p.dw, p.w);
    best = uintBitsToFloat(0xff800000u);  // -inf
    int at = (ys.x < ys.y && xs.x < xs.y) ? ys.x*p.w + xs.x : -1;
    for (int y = ys.x; y < ys.y; y += p.dh) {
        for (int x = xs.x; x < xs.y; x += p.dw) {
            const float v = x_[base + uint(y*p.w + x)];
            if (v > best || isnan(v)) {
                best = v;
                at = y*p.w + x;
            }
        }
    }
    return at;
}

void main() {
    const uint i = gl_GlobalInvocationID.z * 131072 + gl_GlobalInvocationID.y * 256 + gl_GlobalInvocationID.x;
    const uint plane_size = uint(p.w*p.h);
#ifndef BACK
    const uint outputs = uint(p.ow*p.oh);
    if (i >= outputs*p.planes) {
        return;
    }
    const uint plane = i / outputs, o = i % outputs;
    float best;
    window(p.x_off + plane*plane_size, int(o) / p.ow, int(o) % p.ow, best);
    d_[p.d_off + i] = best;
#else
    if (i >= plane_size*p.planes) {
        return;
    }
    const uint plane = i / plane_size;
    const int e = int(i % plane_size), y = e / p.w, x = e % p.w;
    const int lo_y = y + p.ph - (p.kh - 1)*p.dh, lo_x = x + p.pw - (p.kw - 1)*p.dw;
    const int oy0 = lo_y <= 0 ? 0 : (lo_y + p.sh - 1)/p.sh, ox0 = lo_x <= 0 ? 0 : (lo_x + p.sw - 1)/p.sw;
    const int oy1 = min((y + p.ph)/p.sh, p.oh - 1), ox1 = min((x + p.pw)/p.sw, p.ow - 1);
    const uint base = p.x_off + plane*plane_size, grads = p.g_off + plane*uint(p.ow*p.oh);
    float sum = 0.0f;
    for (int oy = oy0; oy <= oy1; ++oy) {
        if ((y + p.ph - oy*p.sh) % p.dh != 0) {
            continue;
        }
        for (int ox = ox0; ox <= ox1; ++ox) {
            float best;
            if ((x + p.pw - ox*p.sw) % p.dw == 0 && window(base, oy, ox, best) == e) {
                sum += g_[grads + uint(oy*p.ow + ox)];
            }
        }
    }
    d_[p.d_off + i] = sum;
#endif
}
