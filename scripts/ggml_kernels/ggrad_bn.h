// ggrad's normalization kernels (GGML_OP_GGRAD 20-22 and 25-29, batch norm's; 30 and 31,
// LayerNorm's; ggrad_cpu.inc says what each computes): their sizes and the supports checks
// the backends share.
#pragma once

struct ggrad_bn_dims {
    int64_t S, C, N;
    float eps;
};

static inline ggrad_bn_dims ggrad_bn_dims_of(const ggml_tensor * op) {
    const int32_t * p = (const int32_t *) op->op_params;
    const float * f = (const float *) op->op_params;
    return { p[1], p[2], p[3], f[4] };
}

// contiguous f32 of the sizes the parameters say
static inline bool ggrad_bn_supported(const ggml_tensor * op) {
    const int kernel = ((const int32_t *) op->op_params)[0];
    const ggrad_bn_dims d = ggrad_bn_dims_of(op);
    if (kernel < 20 || kernel > 22 || d.S < 1 || d.C < 1 || d.N < 1 || d.S*d.C*d.N > INT32_MAX || op->type != GGML_TYPE_F32 ||
        !ggml_is_contiguous(op)) {
        return false;
    }
    const int64_t n = d.S*d.C*d.N;
    const int64_t size = kernel == 20 ? 2*d.C : kernel == 21 ? n : n + 2*d.C;
    // the elements of src0..src4: 0 for none, negative for one that may be absent
    const int64_t want[3][5] = {
        { n, 0, 0, 0, 0 }, { n, d.C, d.C, -d.C, -d.C }, { n, n, d.C, d.C, -d.C },
    };
    if (ggml_nelements(op) != size) {
        return false;
    }
    for (int i = 0; i < 5; ++i) {
        const int64_t k = want[kernel - 20][i];
        const ggml_tensor * x = op->src[i];
        if (x == NULL ? k > 0 : k == 0 || x->type != GGML_TYPE_F32 || !ggml_is_contiguous(x) ||
                                 ggml_nelements(x) != (k < 0 ? -k : k)) {
            return false;
        }
    }
    return true;
}


// kernels 26-29: BATCH_STATS and BATCH_NORM_BACK with each channel's S*N values split into P
// parts (op_params[5]) of ceil(S*N/P), for backends that give a part a workgroup (Vulkan):
// 26 x -> each part's mean, then each part's sum of squared deviations from it (C*P each,
//    part q of channel c at c*P + q); 27 those -> the channel's mean and biased variance (2C,
//    as BATCH_STATS); 28 x, g, mean, var -> each part's sum(g), then sum(g xhat) (C*P each);
//    29 x, g, mean, var, [weight], the parts' sums -> what BATCH_NORM_BACK computes.
static inline int64_t ggrad_bn_parts_of(const ggml_tensor * op) {
    return ((const int32_t *) op->op_params)[5];
}

static inline bool ggrad_bn_split_supported(const ggml_tensor * op) {
    const int kernel = ((const int32_t *) op->op_params)[0];
    const ggrad_bn_dims d = ggrad_bn_dims_of(op);
    const int64_t P = ggrad_bn_parts_of(op);
    if (kernel < 26 || kernel > 29 || d.S < 1 || d.C < 1 || d.N < 1 || P < 1 || P > d.S*d.N ||
        d.S*d.C*d.N > INT32_MAX || d.C*P > INT32_MAX || op->type != GGML_TYPE_F32 || !ggml_is_contiguous(op)) {
        return false;
    }
    const int64_t n = d.S*d.C*d.N, parts = 2*d.C*P;
    const int64_t size = kernel == 27 ? 2*d.C : kernel == 29 ? n + 2*d.C : parts;
    // the elements of src0..src5: 0 for none, negative for one that may be absent
    const int64_t want[4][6] = {
        { n, 0, 0, 0, 0, 0 }, { parts, 0, 0, 0, 0, 0 }, { n, n, d.C, d.C, 0, 0 }, { n, n, d.C, d.C, -d.C, parts },
    };
    if (ggml_nelements(op) != size) {
        return false;
    }
    for (int i = 0; i < 6; ++i) {
        const int64_t k = want[kernel - 26][i];
        const ggml_tensor * x = op->src[i];
        if (x == NULL ? k > 0 : k == 0 || x->type != GGML_TYPE_F32 || !ggml_is_contiguous(x) ||
                                 ggml_nelements(x) != (k < 0 ? -k : k)) {
            return false;
        }
    }
    return true;
}

// kernel 25: a running statistic moved toward the batch's. src0 the running buffer (C
// floats), src1 the statistics (BATCH_STATS' 2C: the means, then the variances); dst (C) =
// src0[c]*keep + src1[offset + c]*take, each product and the sum rounded to float32 apart:
// the composed SCALE, SCALE, ADD, bit for bit. (Not in place: ggrad stores it into the
// buffer, so a BatchNorm met twice in one graph chains its updates as the composed form did.)
struct ggrad_running_stat {
    int64_t offset;
    float keep, take;
};

static inline ggrad_running_stat ggrad_running_stat_of(const ggml_tensor * op) {
    const int32_t * p = (const int32_t *) op->op_params;
    const float * f = (const float *) op->op_params;
    return { p[1], f[2], f[3] };
}

static inline bool ggrad_running_stat_supported(const ggml_tensor * op) {
    const ggml_tensor * running = op->src[0];
    const ggml_tensor * stats = op->src[1];
    if (running == NULL || stats == NULL || running->type != GGML_TYPE_F32 || stats->type != GGML_TYPE_F32 ||
        op->type != GGML_TYPE_F32 || !ggml_is_contiguous(running) || !ggml_is_contiguous(stats) ||
        !ggml_is_contiguous(op)) {
        return false;
    }
    const ggml_tensor * counter = op->src[2];  // optional (set 47): BatchNorm's num_batches_tracked, counted up by one
    if (counter != NULL && (counter->type != GGML_TYPE_I32 || ggml_nelements(counter) != 1)) {
        return false;
    }
    const int64_t n = ggml_nelements(running);
    const int64_t offset = ggrad_running_stat_of(op).offset;
    return ggml_nelements(op) == n && offset >= 0 && offset + n <= ggml_nelements(stats) && n <= INT32_MAX;
}

// LayerNorm with its affine (30) and its gradient through the weight (31): float32 rows, each
// contiguous, of at most INT32_MAX values, in a matrix (D, R); the weight and the bias (30's
// may be absent, 31's weight may not) D contiguous values; 30's output float32, float16 or
// bfloat16 (set 53); 31's gradient x's shape, its output (D, R), or (D, 2R) where op_params[2]
// = 1 asks for the weight's terms too
static inline bool ggrad_layer_norm_supported(const ggml_tensor * op) {
    const int kernel = ((const int32_t *) op->op_params)[0];
    const ggml_tensor * x = op->src[0];
    const bool terms = kernel == 31 && ((const int32_t *) op->op_params)[2] == 1;
    if ((kernel != 30 && kernel != 31) || x == NULL || x->type != GGML_TYPE_F32 || x->nb[0] != sizeof(float) ||
        x->ne[2] != 1 || x->ne[3] != 1 || x->ne[0] > INT32_MAX ||
        (op->type != GGML_TYPE_F32 && (kernel == 31 || (op->type != GGML_TYPE_F16 && op->type != GGML_TYPE_BF16))) ||
        !ggml_is_contiguous_rows(op) || op->ne[0] != x->ne[0] || op->ne[1] != (terms ? 2 : 1)*x->ne[1] ||
        op->ne[2] != 1 || op->ne[3] != 1) {
        return false;
    }
    const ggml_tensor * g = op->src[1];
    if (kernel == 31 && (g == NULL || g->type != GGML_TYPE_F32 || g->nb[0] != sizeof(float) ||
                         !ggml_are_same_shape(x, g) || op->src[2] == NULL)) {
        return false;
    }
    for (int i = kernel == 31 ? 2 : 1; i < 3; ++i) {
        const ggml_tensor * t = op->src[i];
        if (t != NULL && (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t) || ggml_nelements(t) != x->ne[0])) {
            return false;
        }
    }
    return true;
}
