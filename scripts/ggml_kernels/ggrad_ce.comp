#version 450
// ggrad's class-target cross-entropy on Vulkan (GGML_OP_GGRAD kernels 1 and 2; the CPU's
// ggrad_cpu.inc says what they compute). One workgroup per row of logits; BACK selects
// the gradient. scripts/patch_ggml_kernels.py copies this file into ggml's shaders.

layout(local_size_x = 64, local_size_y = 1, local_size_z = 1) in;

layout(push_constant) uniform parameter {
    uint C; uint N;
    uint x_stride; uint t_stride; uint d_stride; uint o_stride;      // in elements
    uint x_off; uint t_off; uint d_off; uint w_off; uint o_off;      // misalignment, in elements
    int ignore_index; float keep; float spread; uint has_w;
} p;

layout(binding = 0) readonly buffer X {float data_x[];};
layout(binding = 1) readonly buffer T {int data_t[];};
#ifdef BACK
layout(binding = 2) readonly buffer D {float data_d[];};
layout(binding = 3) readonly buffer W {float data_w[];};
layout(binding = 4) writeonly buffer O {float data_o[];};
#else
layout(binding = 2) readonly buffer W {float data_w[];};
layout(binding = 3) writeonly buffer O {float data_o[];};
#endif

shared float red[64];

// fixed-order tree reductions over the workgroup
float reduce_max(float v) {
    const uint tid = gl_LocalInvocationID.x;
    red[tid] = v;
    barrier();
    for (uint s = 32; s > 0; s >>= 1) {
        if (tid < s) {
            red[tid] = max(red[tid], red[tid + s]);
        }
        barrier();
    }
    const float r = red[0];
    barrier();
    return r;
}

float reduce_sum(float v) {
    const uint tid = gl_LocalInvocationID.x;
    red[tid] = v;
    barrier();
    for (uint s = 32; s > 0; s >>= 1) {
        if (tid < s) {
            red[tid] += red[tid + s];
        }
        barrier();
    }
    const float r = red[0];
    barrier();
    return r;
}

float weight(uint c) {
    return p.has_w != 0 ? data_w[p.w_off + c] : 1.0;
}

void main() {
    const uint row = gl_WorkGroupID.z * 262144 + gl_WorkGroupID.y * 512 + gl_WorkGroupID.x;
    const uint tid = gl_LocalInvocationID.x;
    if (row >= p.N) {
        return;
    }
    const uint x0 = p.x_off + row * p.x_stride;
    const int t = data_t[p.t_off + row * p.t_stride];
    const bool kept = t != p.ignore_index && t >= 0 && t < int(p.C);
#ifndef BACK
    if (!kept) {
        if (tid == 0) {
            data_o[p.o_off + row] = 0.0;
            data_o[p.o_off + p.N + row] = 0.0;
        }
        return;
    }
#endif
    float m = -1.0 / 0.0;
    for (uint c = tid; c < p.C; c += 64) {
        m = max(m, data_x[x0 + c]);
    }
    m = reduce_max(m);
    // a row holding NaN or +inf (or only -inf) has a NaN softmax, as torch's; found from the
    // bits, since drivers may clamp exp's argument or drop NaN in max (lavapipe does both)
    float bad = 0.0;
    for (uint c = tid; c < p.C; c += 64) {
        const uint bits = floatBitsToUint(data_x[x0 + c]);
        if ((bits & 0x7fffffffu) > 0x7f800000u || bits == 0x7f800000u) {
            bad = 1.0;
        }
    }
    const bool poisoned = reduce_max(bad) > 0.0 || floatBitsToUint(m) == 0xff800000u;
    const float qnan = uintBitsToFloat(0x7fc00000u);
    float s = 0.0;
    for (uint c = tid; c < p.C; c += 64) {
        s += exp(data_x[x0 + c] - m);
    }
    s = reduce_sum(s);
    const uint ti = uint(t);
#ifdef BACK
    const uint o0 = p.o_off + row * p.o_stride;
    if (!kept || poisoned) {  // torch's 0 - softmax * 0 where ignored: NaN where the softmax is
        for (uint c = tid; c < p.C; c += 64) {
            data_o[o0 + c] = poisoned ? qnan : 0.0;
        }
        return;
    }
    float W = float(p.C);
    if (p.has_w != 0 && p.spread != 0.0) {
        float sw = 0.0;
        for (uint c = tid; c < p.C; c += 64) {
            sw += data_w[p.w_off + c];
        }
        W = reduce_sum(sw);
    }
    const float inv = 1.0 / s;
    const float di = data_d[p.d_off + row * p.d_stride];
    const float g = p.has_w != 0 ? di * weight(ti) : di;
    for (uint c = tid; c < p.C; c += 64) {
        const float q = exp(data_x[x0 + c] - m) * inv;
        float grad = g * (q - (c == ti ? 1.0 : 0.0));
        if (p.spread != 0.0) {
            grad = grad * p.keep + di * p.spread * (W * q - weight(c));
        }
        data_o[o0 + c] = grad;
    }
#else
    const float ls = log(s);
    float total = 0.0;
    if (p.spread != 0.0) {
        for (uint c = tid; c < p.C; c += 64) {
            const float lp = (data_x[x0 + c] - m) - ls;
            total += p.has_w != 0 ? lp * data_w[p.w_off + c] : lp;
        }
        total = reduce_sum(total);
    }
    if (tid == 0) {
        const float wt = weight(ti);
        float loss = ls - (data_x[x0 + ti] - m);
        if (p.has_w != 0) {
            loss = loss * wt;
        }
        if (p.spread != 0.0) {
            loss = loss * p.keep + (-total) * p.spread;
        }
        data_o[p.o_off + row] = poisoned ? qnan : loss;
        data_o[p.o_off + p.N + row] = wt;
    }
#endif
}
