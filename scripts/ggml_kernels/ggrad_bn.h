// ggrad's batch-normalization kernels (GGML_OP_GGRAD 20, 21, 22; ggrad_cpu.inc says what
// each computes): their sizes and the supports check the CPU and Vulkan share.
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

