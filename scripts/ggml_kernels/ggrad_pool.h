// ggrad's max-pooling kernels (GGML_OP_GGRAD 10, 11), the window fold (23) and the geometry
// its convolution kernels share: the window arithmetic the CPU (ggrad_cpu.inc) and CUDA
// (ggrad.cu) run and the supports checks they and Vulkan (ggrad_pool.comp, ggrad_fold.comp:
// the same in GLSL) ask.
//
// torch's max pooling over planes of W x H: src0 x f32 (W, H, planes...), contiguous;
// op_params [1..10] kw, kh, sw, sh, pw, ph, dw, dh, ow, oh. A window's taps are its
// in-bounds ones (padding is never read); its maximum is found as torch's CPU kernel finds
// it: from -inf, a tap is taken when it is larger or NaN, so a window's index is its last
// NaN, else its first maximum, else (every tap -inf) its first tap. Kernel 10: dst f32
// (ow*oh, planes), each window's maximum. Kernel 11, its gradient: src0 g f32 (ow*oh,
// planes), contiguous; src1 x as the forward's; dst f32 (w*h, planes): each window's
// gradient added at its maximum (overlapping windows add up, in the windows' order).
#pragma once

#ifdef __CUDACC__
#define GGRAD_POOL_FN static __host__ __device__ __forceinline__
#else
#define GGRAD_POOL_FN static inline
#endif

typedef struct {
    int kw, kh, sw, sh, pw, ph, dw, dh, ow, oh;
    int64_t w, h, planes;
} ggrad_pool_geometry;

static inline ggrad_pool_geometry ggrad_pool_geometry_of(const ggml_tensor * op, const ggml_tensor * x) {
    const int32_t * p = (const int32_t *) op->op_params + 1;
    ggrad_pool_geometry g = {p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], 0, 0, 0};
    g.w = x->ne[0];
    g.h = x->ne[1];
    g.planes = ggml_nelements(x)/(g.w*g.h);
    return g;
}

// a window's in-bounds taps along one axis: the first, and one past the last
GGRAD_POOL_FN void ggrad_pool_span(int64_t o, int s, int p, int k, int d, int64_t n, int64_t * first, int64_t * end) {
    int64_t t0 = o*s - p;
    const int64_t last = t0 + (int64_t) (k - 1)*d + 1;
    *end = last < n ? last : n;
    while (t0 < 0) {
        t0 += d;
    }
    *first = t0;
}

// a tap's value and index, taken over the window's so far where it is larger or NaN
GGRAD_POOL_FN void ggrad_pool_take(float v, int64_t at, float * best, int64_t * index) {
    const bool take = (v > *best) | (v != v);
    *best = take ? v : *best;
    *index = take ? at : *index;
}

// window (oy, ox) of a plane: its maximum into *best and its index in the plane (-1 where it
// has no tap inside: torch's argument checks rule that out), taps in row-major order
GGRAD_POOL_FN int64_t ggrad_pool_window(const float * plane, const ggrad_pool_geometry g, int64_t oy, int64_t ox,
                                        float * best) {
    int64_t y0, y1, x0, x1;
    ggrad_pool_span(oy, g.sh, g.ph, g.kh, g.dh, g.h, &y0, &y1);
    ggrad_pool_span(ox, g.sw, g.pw, g.kw, g.dw, g.w, &x0, &x1);
    *best = -INFINITY;
    int64_t at = (y0 < y1 && x0 < x1) ? y0*g.w + x0 : -1;
    for (int64_t y = y0; y < y1; y += g.dh) {
        for (int64_t x = x0; x < x1; x += g.dw) {
            ggrad_pool_take(plane[y*g.w + x], y*g.w + x, best, &at);
        }
    }
    return at;
}

// element (y, x) of a plane's gradient, gathered: the gradients of the windows whose
// maximum it is, added in the windows' order
GGRAD_POOL_FN float ggrad_pool_gather(const float * plane, const float * grad, const ggrad_pool_geometry g,
                                      int64_t y, int64_t x) {
    const int64_t lo_y = y + g.ph - (int64_t) (g.kh - 1)*g.dh, lo_x = x + g.pw - (int64_t) (g.kw - 1)*g.dw;
    const int64_t oy0 = lo_y <= 0 ? 0 : (lo_y + g.sh - 1)/g.sh, ox0 = lo_x <= 0 ? 0 : (lo_x + g.sw - 1)/g.sw;
    const int64_t oy1 = (y + g.ph)/g.sh < g.oh - 1 ? (y + g.ph)/g.sh : g.oh - 1;
    const int64_t ox1 = (x + g.pw)/g.sw < g.ow - 1 ? (x + g.pw)/g.sw : g.ow - 1;
    float sum = 0.0f;
    for (int64_t oy = oy0; oy <= oy1; ++oy) {
        if ((y + g.ph - oy*g.sh) % g.dh != 0) {
            continue;
        }
        for (int64_t ox = ox0; ox <= ox1; ++ox) {
            float best;
            if ((x + g.pw - ox*g.sw) % g.dw == 0 && ggrad_pool_window(plane, g, oy, ox, &best) == y*g.w + x) {
                sum += grad[oy*g.ow + ox];
            }
        }
    }
    return sum;
}

static inline bool ggrad_max_pool_supported(const ggml_tensor * op) {
    const int kernel = ((const int32_t *) op->op_params)[0];
    const ggml_tensor * x = op->src[kernel == 10 ? 0 : 1];
    if (x == NULL || x->type != GGML_TYPE_F32 || op->type != GGML_TYPE_F32 || !ggml_is_contiguous(x) ||
        !ggml_is_contiguous(op)) {
        return false;
    }
    const ggrad_pool_geometry g = ggrad_pool_geometry_of(op, x);
    if (g.kw < 1 || g.kh < 1 || g.sw < 1 || g.sh < 1 || g.dw < 1 || g.dh < 1 || g.pw < 0 || g.ph < 0 ||
        g.ow < 1 || g.oh < 1) {
        return false;
    }
    if (kernel == 10) {
        return op->ne[0] == (int64_t) g.ow*g.oh && op->ne[1] == g.planes;
    }
    const ggml_tensor * grad = op->src[0];
    return grad->type == GGML_TYPE_F32 && ggml_is_contiguous(grad) && grad->ne[0] == (int64_t) g.ow*g.oh &&
           ggml_nelements(grad) == (int64_t) g.ow*g.oh*g.planes && op->ne[0] == g.w*g.h && op->ne[1] == g.planes;
}

// Kernel 23, the window fold: the adjoint of ggml's IM2COL in its windows layout, for the
// backends without IM2COL_BACK (Vulkan, CUDA). src0 the columns f32 (C*KH*KW, OW, OH, N),
// contiguous; op_params [1..8] kh, kw, sh, sw, ph, pw, dh, dw, [9..11] W, H, C; dst f32
// (W*H, C*N): each image element the sum of the column entries that read it, in tap order
// (the order the composed fold adds them).
typedef struct {
    int kh, kw, sh, sw, ph, pw, dh, dw;
    int64_t w, h, c, ow, oh, n;
} ggrad_fold_geometry;

static inline ggrad_fold_geometry ggrad_fold_geometry_of(const ggml_tensor * op) {
    const int32_t * p = (const int32_t *) op->op_params + 1;
    const ggml_tensor * cols = op->src[0];
    return { p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], cols->ne[1], cols->ne[2], cols->ne[3] };
}

GGRAD_POOL_FN float ggrad_fold_gather(const float * cols, const ggrad_fold_geometry g, const int64_t i) {
    const int64_t x = i % g.w, y = (i / g.w) % g.h, c = (i / (g.w*g.h)) % g.c, n = i / (g.w*g.h*g.c);
    const int64_t width = g.c*g.kh*g.kw;
    float sum = 0.0f;
    for (int ky = 0; ky < g.kh; ++ky) {
        const int64_t ty = y + g.ph - (int64_t) ky*g.dh;
        if (ty < 0 || ty % g.sh != 0 || ty/g.sh >= g.oh) {
            continue;
        }
        for (int kx = 0; kx < g.kw; ++kx) {
            const int64_t tx = x + g.pw - (int64_t) kx*g.dw;
            if (tx < 0 || tx % g.sw != 0 || tx/g.sw >= g.ow) {
                continue;
            }
            sum += cols[((n*g.oh + ty/g.sh)*g.ow + tx/g.sw)*width + (c*g.kh + ky)*g.kw + kx];
        }
    }
    return sum;
}

static inline bool ggrad_fold_supported(const ggml_tensor * op) {
    const ggml_tensor * cols = op->src[0];
    if (cols == NULL || cols->type != GGML_TYPE_F32 || op->type != GGML_TYPE_F32 || !ggml_is_contiguous(cols) ||
        !ggml_is_contiguous(op)) {
        return false;
    }
    const ggrad_fold_geometry g = ggrad_fold_geometry_of(op);
    return g.kh >= 1 && g.kw >= 1 && g.sh >= 1 && g.sw >= 1 && g.dh >= 1 && g.dw >= 1 && g.ph >= 0 && g.pw >= 0 &&
           g.w >= 1 && g.h >= 1 && g.c >= 1 && cols->ne[0] == g.c*g.kh*g.kw &&
           ggml_nelements(op) == g.w*g.h*g.c*g.n && ggml_nelements(op) < INT32_MAX && ggml_nelements(cols) < INT32_MAX;
}
