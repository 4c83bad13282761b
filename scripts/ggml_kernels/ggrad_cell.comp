#version 450
// A recurrent layer's time step (GGML_OP_GGRAD kernel 18) and, with BACK, its gradient
// (kernel 19) on Vulkan, one invocation per state element; the CPU's ggrad_cpu.inc says what
// each computes (cells: 0 LSTM, 1 GRU, 2 RNN tanh, 3 RNN relu); element z*131072 + y*256 + x
// (devices cap the workgroups along x at 65535). sigmoid and tanh as
// ggml-vulkan's unary shaders compute them (the composed cell's values); relu's sign tests
// on the float's bits (ggrad_ieee.glsl).

#include "ggrad_ieee.glsl"

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

layout(push_constant) uniform parameter {
    uint H; uint T; uint B;
    int t; int tp;                                   // this step, the step before (-1: the first)
    int mode;
    uint has_3;                                      // binding 3 holds b_hh (forward), dh (BACK)
    uint has_0;                                      // BACK: the steps after wrote the accumulator
    uint off0; uint off1; uint off2; uint off3; uint off4;  // misalignment, in elements
} p;

layout(binding = 0) buffer Out {float out_[];};
layout(binding = 1) readonly buffer In1 {float in1[];};
layout(binding = 2) readonly buffer In2 {float in2[];};
layout(binding = 3) readonly buffer In3 {float in3[];};
layout(binding = 4) readonly buffer S0 {float s0[];};

float sigmoid(float x) {
    return 1.0f / (1.0f + exp(-x));
}

float tanh_(float x) {
    return 1.0f - 2.0f / (exp(2.0f*x) + 1.0f);
}

void main() {
    const uint e = gl_GlobalInvocationID.z * 131072 + gl_GlobalInvocationID.y * 256 + gl_GlobalInvocationID.x;
    if (e >= p.B*p.H) {
        return;
    }
    const uint H = p.H, b = e / H, j = e % H, plane = H*p.T*p.B;
    const uint G = (p.mode == 0 ? 4u : p.mode == 1 ? 3u : 1u)*H;
    const uint at = (b*p.T + uint(p.t))*H + j;
    const uint before = p.tp < 0 ? 0u : (b*p.T + uint(p.tp))*H + j;
    const uint state = p.off4 + b*H + j;
#ifndef BACK
    // in1 proj (G, T, B), in2 h_prev W_hh^T (G, B), in3 b_hh (G); out_ the record
    const uint x = p.off1 + (b*p.T + uint(p.t))*G + j;
    const uint rec = p.off0;
    precise float hk[4];
    for (uint k = 0; k*H < G; ++k) {
        hk[k] = p.has_3 != 0 ? in2[p.off2 + b*G + k*H + j] + in3[p.off3 + k*H + j] : in2[p.off2 + b*G + k*H + j];
    }
    if (p.mode == 0) {
        precise float pi = in1[x] + hk[0], pf = in1[x + H] + hk[1], pg = in1[x + 2*H] + hk[2];
        precise float po = in1[x + 3*H] + hk[3];
        const float i = sigmoid(pi), f = sigmoid(pf), g = tanh_(pg), o = sigmoid(po);
        const float cp = p.tp < 0 ? s0[state] : out_[rec + plane + before];
        precise float kept = f*cp;
        precise float added = i*g;
        precise float c = kept + added;
        out_[rec + at] = o*tanh_(c);
        out_[rec + plane + at] = c;
        out_[rec + 2*plane + at] = i;
        out_[rec + 3*plane + at] = f;
        out_[rec + 4*plane + at] = g;
        out_[rec + 5*plane + at] = o;
    } else if (p.mode == 1) {
        precise float pr = in1[x] + hk[0], pz = in1[x + H] + hk[1];
        const float r = sigmoid(pr), z = sigmoid(pz);
        precise float gated = r*hk[2];
        precise float pn = in1[x + 2*H] + gated;
        const float n = tanh_(pn);
        const float hp = p.tp < 0 ? s0[state] : out_[rec + before];
        precise float moved = z*(hp - n);
        out_[rec + at] = n + moved;
        out_[rec + plane + at] = r;
        out_[rec + 2*plane + at] = z;
        out_[rec + 3*plane + at] = n;
        out_[rec + 4*plane + at] = hk[2];
    } else {
        precise float pre = in1[x] + hk[0];
        out_[rec + at] = p.mode == 2 ? tanh_(pre) : ggrad_negative(pre) ? 0.0f : pre;
    }
#else
    // in1 the record, in2 its gradient, in3 dh through the step after's product (H, B); out_
    // the gradient of proj (G, T, B), a GRU's of h W_hh^T + b_hh (G, T, B), then the
    // accumulator (H, B) of the state gradient that reaches the step before otherwise
    const uint rec = p.off1, grad = p.off2;
    const uint acc = p.off0 + (p.mode == 1 ? 2u : 1u)*G*p.T*p.B + b*H + j;
    const uint d = p.off0 + (b*p.T + uint(p.t))*G + j;
    precise float dh = p.has_3 != 0 ? in2[grad + at] + in3[p.off3 + b*H + j] : in2[grad + at];
    if (p.mode == 0) {
        const float c = in1[rec + plane + at], i = in1[rec + 2*plane + at], f = in1[rec + 3*plane + at];
        const float g = in1[rec + 4*plane + at], o = in1[rec + 5*plane + at];
        const float tc = tanh_(c);
        precise float through_h = (dh*o)*(1.0f - tc*tc);
        precise float dc = (p.has_0 != 0 ? in2[grad + plane + at] + out_[acc] : in2[grad + plane + at]) + through_h;
        const float cp = p.tp < 0 ? s0[state] : in1[rec + plane + before];
        precise float di = dc*g, df = dc*cp, dg = dc*i, d_o = dh*tc;
        out_[d] = (di*i)*(1.0f - i);
        out_[d + H] = (df*f)*(1.0f - f);
        out_[d + 2*H] = dg*(1.0f - g*g);
        out_[d + 3*H] = (d_o*o)*(1.0f - o);
        out_[acc] = dc*f;
    } else if (p.mode == 1) {
        precise float dht = p.has_0 != 0 ? dh + out_[acc] : dh;
        const float r = in1[rec + plane + at], z = in1[rec + 2*plane + at], n = in1[rec + 3*plane + at];
        const float hn = in1[rec + 4*plane + at];
        const float hp = p.tp < 0 ? s0[state] : in1[rec + before];
        precise float zdh = z*dht;
        precise float dn = dht - zdh, dz = dht*(hp - n);
        precise float dn_pre = dn*(1.0f - n*n);
        precise float dr = dn_pre*hn;
        precise float dr_pre = (dr*r)*(1.0f - r), dz_pre = (dz*z)*(1.0f - z);
        const uint dw = d + G*p.T*p.B;
        out_[d] = dr_pre;
        out_[d + H] = dz_pre;
        out_[d + 2*H] = dn_pre;
        out_[dw] = dr_pre;
        out_[dw + H] = dz_pre;
        out_[dw + 2*H] = dn_pre*r;
        out_[acc] = zdh;
    } else {
        const float h = in1[rec + at];
        out_[d] = p.mode == 2 ? dh*(1.0f - h*h) : ggrad_at_most_zero(h) ? 0.0f : dh;
    }
#endif
}
