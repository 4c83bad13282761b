// Attention's softmax under autocast (GGML_OP_GGRAD 33 and 34; ggrad_cpu.inc says what each
// computes): the layout both kernels share and the checks the CPU and CUDA run.
//
// Kernel 33 writes softmax(x * scale + mask) of each row of x in the low type (float16 or
// bfloat16), as a cast of the float32 softmax would round it, and after the R rows of
// probabilities each row's max and 1/sum (two floats, at the first 16-byte boundary past them):
// kernel 34, the gradient, computes each float32 probability again from them, the same
// arithmetic as the forward, and never reads a float32 probability a forward kept.
#pragma once

// the byte offset of the rows' statistics in kernel 33's output: past R rows of `cols` values of
// `size` bytes, at a 16-byte boundary
static inline size_t ggrad_softmax_stats_offset(const int64_t rows, const int64_t cols, const size_t size) {
    return ((size_t) (rows*cols)*size + 15)/16*16;
}

// whether `mask` (none, or float32 / float16 of x's row length, at least x's rows, broadcast over
// x's batches as ggml's SOFT_MAX broadcasts it) suits x
static inline bool ggrad_softmax_mask_fits(const ggml_tensor * x, const ggml_tensor * mask) {
    return mask == NULL || ((mask->type == GGML_TYPE_F32 || mask->type == GGML_TYPE_F16) &&
                            mask->nb[0] == ggml_type_size(mask->type) && mask->ne[0] == x->ne[0] &&
                            mask->ne[1] >= x->ne[1] && x->ne[2] % mask->ne[2] == 0 && x->ne[3] % mask->ne[3] == 0);
}

// 33: x (S, L, H, B) f32 contiguous, mask or NULL; scale -> (S, rows) of f16/bf16 holding the
// probabilities and the statistics. 34: x, mask or NULL, the probabilities' gradient g (x's
// shape, f32 contiguous), 33's output; scale -> (S, R) of f32, f16 or bf16. Rows of at most
// `max_cols` (CUDA keeps a row in a warp's registers).
static inline bool ggrad_softmax_supported(const ggml_tensor * op, const int64_t max_cols) {
    const int kernel = ((const int32_t *) op->op_params)[0];
    const ggml_tensor * x = op->src[0];
    if ((kernel != 33 && kernel != 34) || x == NULL || x->type != GGML_TYPE_F32 || !ggml_is_contiguous(x) ||
        x->ne[0] < 1 || x->ne[0] > max_cols || !ggrad_softmax_mask_fits(x, op->src[1]) || op->ne[0] != x->ne[0] ||
        !ggml_is_contiguous(op) || op->ne[2] != 1 || op->ne[3] != 1) {
        return false;
    }
    const int64_t rows = ggml_nrows(x);
    const bool low = op->type == GGML_TYPE_F16 || op->type == GGML_TYPE_BF16;
    if (kernel == 33) {
        return low && (size_t) ggml_nbytes(op) >= ggrad_softmax_stats_offset(rows, x->ne[0], ggml_type_size(op->type)) +
                                                   2*rows*sizeof(float);
    }
    const ggml_tensor * g = op->src[2];
    const ggml_tensor * probs = op->src[3];
    return (low || op->type == GGML_TYPE_F32) && op->ne[1] == rows && g != NULL && g->type == GGML_TYPE_F32 &&
           ggml_is_contiguous(g) && ggml_are_same_shape(x, g) && probs != NULL &&
           (probs->type == GGML_TYPE_F16 || probs->type == GGML_TYPE_BF16) && ggml_is_contiguous(probs) &&
           probs->ne[0] == x->ne[0] &&
           (size_t) ggml_nbytes(probs) >= ggrad_softmax_stats_offset(rows, x->ne[0], ggml_type_size(probs->type)) +
                                          2*rows*sizeof(float);
}

// the mask's row for x's row `row` (as ggml's SOFT_MAX: its row i01, its batches broadcast)
static inline const char * ggrad_softmax_mask_row(const ggml_tensor * x, const ggml_tensor * mask, const int64_t row) {
    const int64_t i01 = row % x->ne[1], i02 = (row/x->ne[1]) % x->ne[2], i03 = row/(x->ne[1]*x->ne[2]);
    return (const char *) mask->data + i01*mask->nb[1] + (i02 % mask->ne[2])*mask->nb[2] + (i03 % mask->ne[3])*mask->nb[3];
}
