#version 450
// An LSTM's time step (GGML_OP_GGRAD kernel 18) and, with BACK, its gradient (kernel 19) on
// Vulkan, one invocation per state element; the CPU's ggrad_cpu.inc says what each computes.
// sigmoid and tanh as ggml-vulkan's unary shaders compute them (the composed form's values).

layout(local_size_x = 256, local_size_y = 1, local_size_z = 1) in;

layout(push_constant) uniform parameter {
    uint H; uint T; uint B;
    int t; int tp;                                   // this step, the step before (-1: c0)
    uint has_3;                                      // binding 3 holds b_hh (forward), dh (BACK)
    uint has_0;                                      // BACK: binding 0 holds the dc of the step after
    uint off0; uint off1; uint off2; uint off3; uint off4;  // misalignment, in elements
} p;

layout(binding = 0) buffer Out {float out_[];};
layout(binding = 1) readonly buffer In1 {float in1[];};
layout(binding = 2) readonly buffer In2 {float in2[];};
layout(binding = 3) readonly buffer In3 {float in3[];};
layout(binding = 4) readonly buffer C0 {float c0[];};

float sigmoid(float x) {
    return 1.0f / (1.0f + exp(-x));
}

float tanh_(float x) {
    return 1.0f - 2.0f / (exp(2.0f*x) + 1.0f);
}

void main() {
    const uint e = gl_GlobalInvocationID.x;
    if (e >= p.B*p.H) {
        return;
    }
    const uint H = p.H, b = e / H, j = e % H, plane = H*p.T*p.B;
    const uint at = (b*p.T + uint(p.t))*H + j;
    const uint before = p.tp < 0 ? 0u : (b*p.T + uint(p.tp))*H + j;
#ifndef BACK
    // in1 proj (4H, T, B), in2 h_prev W_hh^T (4H, B), in3 b_hh (4H); out_ the record
    const uint x = p.off1 + (b*p.T + uint(p.t))*4*H + j, r = p.off2 + b*4*H + j;
    precise float pre[4];
    for (uint k = 0; k < 4; ++k) {
        precise float hk = p.has_3 != 0 ? in2[r + k*H] + in3[p.off3 + k*H + j] : in2[r + k*H];
        pre[k] = in1[x + k*H] + hk;
    }
    const float i = sigmoid(pre[0]), f = sigmoid(pre[1]), g = tanh_(pre[2]), o = sigmoid(pre[3]);
    const float cp = p.tp < 0 ? c0[p.off4 + b*H + j] : out_[p.off0 + plane + before];
    precise float kept = f*cp;
    precise float added = i*g;
    precise float c = kept + added;
    out_[p.off0 + at] = o*tanh_(c);
    out_[p.off0 + plane + at] = c;
    out_[p.off0 + 2*plane + at] = i;
    out_[p.off0 + 3*plane + at] = f;
    out_[p.off0 + 4*plane + at] = g;
    out_[p.off0 + 5*plane + at] = o;
#else
    // in1 the record, in2 its gradient, in3 dh from the step after (H, B); out_ the gradient
    // of proj (4H, T, B), then the dc reaching the step before (H, B)
    const uint rec = p.off1, grad = p.off2, acc = p.off0 + 4*plane + b*H + j;
    precise float dh = p.has_3 != 0 ? in2[grad + at] + in3[p.off3 + b*H + j] : in2[grad + at];
    const float c = in1[rec + plane + at], i = in1[rec + 2*plane + at], f = in1[rec + 3*plane + at];
    const float g = in1[rec + 4*plane + at], o = in1[rec + 5*plane + at];
    const float tc = tanh_(c);
    precise float through_h = (dh*o)*(1.0f - tc*tc);
    precise float dc = (p.has_0 != 0 ? in2[grad + plane + at] + out_[acc] : in2[grad + plane + at]) + through_h;
    const float cp = p.tp < 0 ? c0[p.off4 + b*H + j] : in1[rec + plane + before];
    precise float di = dc*g, df = dc*cp, dg = dc*i, d_o = dh*tc;
    const uint d = p.off0 + (b*p.T + uint(p.t))*4*H + j;
    out_[d] = (di*i)*(1.0f - i);
    out_[d + H] = (df*f)*(1.0f - f);
    out_[d + 2*H] = dg*(1.0f - g*g);
    out_[d + 3*H] = (d_o*o)*(1.0f - o);
    out_[acc] = dc*f;
#endif
}
