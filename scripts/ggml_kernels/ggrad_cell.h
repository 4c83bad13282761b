// ggrad's recurrent kernels, one time step of a layer per node: GGML_OP_GGRAD kernels 18
// (a step) and 19 (its gradient). The CPU (ggrad_cpu.inc) and CUDA (ggrad.cu) run these
// element functions; Vulkan's shader (ggrad_cell.comp) computes the same; all three ask
// ggrad_cell_supported. op_params [1] t, [2] the step before (-1: the first step, which
// starts from the initial state), [3..5] H, T, B, [6] the cell: 0 LSTM (torch's gates i, f,
// g, o), 1 GRU (r, z, n), 2 RNN with tanh, 3 RNN with relu.
//
// A layer's record (the steps' dst) is K planes of H*T*B, the row of step t of sequence b at
// (b*T + t)*H in each: LSTM h, c, sigmoid(i), sigmoid(f), tanh(g), sigmoid(o) (K = 6); GRU
// h, r, z, n and hn = h W_hn^T + b_hn (K = 5); RNN h (K = 1). A step after the first writes
// in place over src0, the record so far, so a layer's steps share one buffer.
//   src1 proj f32 (G, T, B), G = 4H, 3H or H: x W_ih^T + b_ih of every step
//   src2 hw f32 (G, B): this step's h_prev W_hh^T; src3 b_hh f32 (G) or NULL
//   src4 the initial state (H, B): c0 (LSTM), h0 (GRU; an RNN reads it only back)
// Each value as the composed cell rounds it: x + (hw + b), 1/(1 + expf(-x)), tanhf.
//
// The gradient (dst of 19): proj's gradient (G, T, B); a GRU's next the gradient of the
// step's h W_hh^T + b_hh (G, T, B) (an LSTM's and an RNN's is proj's); then (LSTM: the c,
// GRU: the h) gradient that reaches the step before other than through h W_hh^T (H, B),
// which the next node (the step before) reads and overwrites. In place over src0 (the
// gradients of the steps after) where there is one; the first node, the layer's last step,
// starts from none.
//   src1 the forward record; src2 the gradient of that record (its h plane, and an LSTM's c
//   plane, are read); src3 the gradient reaching h through the step after's h W_hh^T (H, B)
//   or NULL; src4 the initial state (H, B)
// Each gradient as torch's rules give it: sigmoid's g y (1 - y), tanh's g (1 - y^2), relu's
// y <= 0 ? 0 : g.
#pragma once

#ifdef __CUDACC__
#define GGRAD_CELL_FN static __host__ __device__ __forceinline__
#else
#define GGRAD_CELL_FN static inline
#endif

struct ggrad_cell_dims {
    int64_t H, T, B;
    int32_t t, tp;  // the step, the step before (-1: none)
    int mode;
};

static inline ggrad_cell_dims ggrad_cell_dims_of(const ggml_tensor * op) {
    const int32_t * p = (const int32_t *) op->op_params;
    return { p[3], p[4], p[5], p[1], p[2], p[6] };
}

// the gates of each cell (proj's width over H) and the planes of its record
GGRAD_CELL_FN int64_t ggrad_cell_gates(int mode) {
    return mode == 0 ? 4 : mode == 1 ? 3 : 1;
}

GGRAD_CELL_FN int64_t ggrad_cell_planes(int mode) {
    return mode == 0 ? 6 : mode == 1 ? 5 : 1;
}

// the elements of the gradient: proj's, a GRU's of h W_hh^T + b_hh, the state accumulator
GGRAD_CELL_FN int64_t ggrad_cell_gradient_size(const ggrad_cell_dims d) {
    const int64_t n = ggrad_cell_gates(d.mode)*d.H*d.T*d.B;
    return (d.mode == 1 ? 2*n : n) + (d.mode <= 1 ? d.H*d.B : 0);
}

GGRAD_CELL_FN float ggrad_cell_sigmoid(float x) {
    return 1.0f/(1.0f + expf(-x));
}

// element e (of B*H) of step d.t
GGRAD_CELL_FN void ggrad_cell_forward(const ggrad_cell_dims d, const int64_t e, const float * xg, const float * hw,
                                      const float * bias, const float * s0, float * rec) {
    const int64_t H = d.H, plane = H*d.T*d.B, G = ggrad_cell_gates(d.mode)*H;
    const int64_t b = e / H, j = e % H, at = (b*d.T + d.t)*H + j, before = (b*d.T + d.tp)*H + j;
    const float * x = xg + (b*d.T + d.t)*G + j;
    float hk[4];  // h W_hh^T + b_hh of each gate
    for (int k = 0; k*H < G; ++k) {
        hk[k] = bias ? hw[b*G + k*H + j] + bias[k*H + j] : hw[b*G + k*H + j];
    }
    if (d.mode == 0) {
        const float i = ggrad_cell_sigmoid(x[0] + hk[0]), f = ggrad_cell_sigmoid(x[H] + hk[1]);
        const float g = tanhf(x[2*H] + hk[2]), o = ggrad_cell_sigmoid(x[3*H] + hk[3]);
        const float cp = d.tp < 0 ? s0[b*H + j] : rec[plane + before];
        const float kept = f*cp, added = i*g;
        const float c = kept + added;
        rec[at] = o*tanhf(c);
        rec[plane + at] = c;
        rec[2*plane + at] = i;
        rec[3*plane + at] = f;
        rec[4*plane + at] = g;
        rec[5*plane + at] = o;
    } else if (d.mode == 1) {
        const float r = ggrad_cell_sigmoid(x[0] + hk[0]), z = ggrad_cell_sigmoid(x[H] + hk[1]);
        const float gated = r*hk[2];
        const float n = tanhf(x[2*H] + gated);
        const float hp = d.tp < 0 ? s0[b*H + j] : rec[before];
        const float moved = z*(hp - n);
        rec[at] = n + moved;
        rec[plane + at] = r;
        rec[2*plane + at] = z;
        rec[3*plane + at] = n;
        rec[4*plane + at] = hk[2];
    } else {
        const float pre = x[0] + hk[0];
        rec[at] = d.mode == 2 ? tanhf(pre) : pre < 0.0f ? 0.0f : pre;
    }
}

// element e (of B*H) of step d.t's gradient; `last`: no step after wrote the accumulator
GGRAD_CELL_FN void ggrad_cell_backward(const ggrad_cell_dims d, const int64_t e, const float * rec, const float * grad,
                                       const float * dh_after, const float * s0, const bool last, float * out) {
    const int64_t H = d.H, plane = H*d.T*d.B, G = ggrad_cell_gates(d.mode)*H;
    const int64_t b = e / H, j = e % H, at = (b*d.T + d.t)*H + j, before = (b*d.T + d.tp)*H + j;
    float * acc = out + (d.mode == 1 ? 2 : 1)*G*d.T*d.B + b*H + j;
    float * dg = out + (b*d.T + d.t)*G + j;
    const float dh = dh_after ? grad[at] + dh_after[b*H + j] : grad[at];
    if (d.mode == 0) {
        const float c = rec[plane + at], i = rec[2*plane + at], f = rec[3*plane + at];
        const float g = rec[4*plane + at], o = rec[5*plane + at];
        const float tc = tanhf(c);
        const float through_h = (dh*o)*(1.0f - tc*tc);
        const float dc = (last ? grad[plane + at] : grad[plane + at] + *acc) + through_h;
        const float cp = d.tp < 0 ? s0[b*H + j] : rec[plane + before];
        const float di = dc*g, df = dc*cp, dgg = dc*i, d_o = dh*tc;
        dg[0] = (di*i)*(1.0f - i);
        dg[H] = (df*f)*(1.0f - f);
        dg[2*H] = dgg*(1.0f - g*g);
        dg[3*H] = (d_o*o)*(1.0f - o);
        *acc = dc*f;
    } else if (d.mode == 1) {
        const float dht = last ? dh : dh + *acc;
        const float r = rec[plane + at], z = rec[2*plane + at], n = rec[3*plane + at], hn = rec[4*plane + at];
        const float hp = d.tp < 0 ? s0[b*H + j] : rec[before];
        const float zdh = z*dht;
        const float dn = dht - zdh, dz = dht*(hp - n);
        const float dn_pre = dn*(1.0f - n*n);
        const float dr = dn_pre*hn;
        float * dhw = dg + G*d.T*d.B;
        dg[0] = dhw[0] = (dr*r)*(1.0f - r);
        dg[H] = dhw[H] = (dz*z)*(1.0f - z);
        dg[2*H] = dn_pre;
        dhw[2*H] = dn_pre*r;
        *acc = zdh;
    } else {
        const float h = rec[at];
        dg[0] = d.mode == 2 ? dh*(1.0f - h*h) : h <= 0.0f ? 0.0f : dh;
    }
}

// contiguous f32 of the sizes the parameters say (src0 and src3 may be absent), every index
// within int32 (Vulkan's)
static inline bool ggrad_cell_supported(const ggml_tensor * op) {
    const bool back = ((const int32_t *) op->op_params)[0] == 19;
    const ggrad_cell_dims d = ggrad_cell_dims_of(op);
    if (d.H < 1 || d.T < 1 || d.B < 1 || d.t < 0 || d.t >= d.T || d.tp < -1 || d.tp >= d.T || d.tp == d.t ||
        d.mode < 0 || d.mode > 3) {
        return false;
    }
    const int64_t n = d.H*d.T*d.B, K = ggrad_cell_planes(d.mode)*n, G = ggrad_cell_gates(d.mode)*d.H;
    const int64_t size = back ? ggrad_cell_gradient_size(d) : K;
    const int64_t want[5] = { size, back ? K : G*d.T*d.B, back ? K : G*d.B, back ? d.H*d.B : G, d.H*d.B };
    if (op->type != GGML_TYPE_F32 || ggml_nelements(op) != size || !ggml_is_contiguous(op) || K > INT32_MAX ||
        size > INT32_MAX) {
        return false;
    }
    for (int i = 0; i < 5; ++i) {
        const ggml_tensor * x = op->src[i];
        if (x == NULL ? i != 0 && i != 3
                      : x->type != GGML_TYPE_F32 || !ggml_is_contiguous(x) || ggml_nelements(x) != want[i]) {
            return false;
        }
    }
    return true;
}
