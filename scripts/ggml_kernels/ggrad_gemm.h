// ggrad's GEMM kernel (GGML_OP_GGRAD 6; ggrad_cpu.inc says what it computes): how its
// operands lie and the product's sizes, which the CPU (OpenBLAS) and CUDA (cuBLAS) share.
// Row-major terms throughout: a ggml (ne0, ne1) matrix is ne1 rows of ne0.
#pragma once

// a matrix operand as BLAS reads it: the stored matrix's rows, columns and row stride
// (elements), and whether it is the transpose of the logical one. float32, or float16 and
// bfloat16 where the backend multiplies those (`low_types`: CUDA's cuBLAS, autocast's operands)
struct ggrad_gemm_operand {
    const char * data;
    int64_t rows, cols, ld;
    bool flipped;
};

static inline bool ggrad_gemm_layout(const ggml_tensor * t, ggrad_gemm_operand * o, const bool low_types) {
    if (t->type != GGML_TYPE_F32 && !(low_types && (t->type == GGML_TYPE_F16 || t->type == GGML_TYPE_BF16))) {
        return false;
    }
    const int64_t f = (int64_t) ggml_type_size(t->type);
    o->data = (const char *) t->data;
    if (t->nb[0] == (size_t) f || t->ne[0] == 1) {
        o->flipped = false;
        o->rows = t->ne[1];
        o->cols = t->ne[0];
        o->ld = t->ne[1] > 1 ? (int64_t) t->nb[1]/f : t->ne[0];
        return t->nb[1] % f == 0 && o->ld >= o->cols;
    }
    if (t->nb[1] == (size_t) f || t->ne[1] == 1) {
        o->flipped = true;
        o->rows = t->ne[0];
        o->cols = t->ne[1];
        o->ld = (int64_t) t->nb[0]/f;
        return t->nb[0] % f == 0 && o->ld >= o->cols;
    }
    return false;
}

// the product's sizes: M, N, K and the batches, or false where the operands do not fit
struct ggrad_gemm_shape {
    ggrad_gemm_operand a, b;
    bool ta, tb;
    int64_t M, N, K, b2, b3;
    int64_t a_r2, a_r3, b_r2, b_r3;  // C's batches per batch of A and of B (broadcast)
    int64_t c_ld, c_step2, c_step3;  // C's row stride and its batches' steps, in its elements
};

// C's strides: packed where dst is contiguous (ne (N, M*b2*b3) or (N, M, b2, b3)); else, where
// the backend writes strided results (`strided_c`, CUDA: set 58), dst is (N, M, b2, b3) with
// rows of N contiguous at any stride, each batch where its strides put it (a product written
// straight into its place in a larger tensor: attention's heads joined or merged)
static inline bool ggrad_gemm_c_strides(const ggml_tensor * dst, ggrad_gemm_shape * s, const bool strided_c) {
    const int64_t f = (int64_t) ggml_type_size(dst->type);
    if (ggml_is_contiguous(dst)) {
        s->c_ld = s->N;
        s->c_step2 = s->M*s->N;
        s->c_step3 = s->b2*s->M*s->N;
        return dst->ne[0] == s->N && dst->ne[1]*dst->ne[2]*dst->ne[3] == s->M*s->b2*s->b3 &&
               (dst->ne[2]*dst->ne[3] == 1 || (dst->ne[1] == s->M && dst->ne[2] == s->b2 && dst->ne[3] == s->b3));
    }
    if (!strided_c || dst->src[2] != NULL || dst->ne[0] != s->N || dst->ne[1] != s->M || dst->ne[2] != s->b2 ||
        dst->ne[3] != s->b3 || dst->nb[0] != (size_t) f || dst->nb[1] % f != 0 || dst->nb[2] % f != 0 ||
        dst->nb[3] % f != 0) {
        return false;
    }
    s->c_ld = (int64_t) (dst->nb[1]/f);
    s->c_step2 = (int64_t) (dst->nb[2]/f);
    s->c_step3 = (int64_t) (dst->nb[3]/f);
    return s->c_ld >= s->N;
}

static inline bool ggrad_gemm_plan(const ggml_tensor * dst, ggrad_gemm_shape * s, const bool low_types = false,
                                   const bool strided_c = false) {
    const ggml_tensor * A = dst->src[0];
    const ggml_tensor * B = dst->src[1];
    if (A == NULL || B == NULL || A->type != B->type || !ggrad_gemm_layout(A, &s->a, low_types) ||
        !ggrad_gemm_layout(B, &s->b, low_types)) {
        return false;
    }
    const bool ta = ggml_get_op_params_i32(dst, 1) != 0;
    const bool tb = ggml_get_op_params_i32(dst, 2) != 0;
    s->ta = ta != s->a.flipped;
    s->tb = tb != s->b.flipped;
    s->M = ta ? A->ne[0] : A->ne[1];
    s->K = ta ? A->ne[1] : A->ne[0];
    s->N = tb ? B->ne[1] : B->ne[0];
    const int64_t kb = tb ? B->ne[0] : B->ne[1];
    s->b2 = A->ne[2] > B->ne[2] ? A->ne[2] : B->ne[2];
    s->b3 = A->ne[3] > B->ne[3] ? A->ne[3] : B->ne[3];
    if (kb != s->K || s->b2 % A->ne[2] != 0 || s->b2 % B->ne[2] != 0 || s->b3 % A->ne[3] != 0 ||
        s->b3 % B->ne[3] != 0 || (dst->type != GGML_TYPE_F32 && !(low_types && dst->type == A->type)) ||
        !ggrad_gemm_c_strides(dst, s, strided_c)) {
        return false;
    }
    const ggml_tensor * bias = dst->src[2];  // optional: added to every row of C (a linear layer's)
    if (bias != NULL && (bias->type != GGML_TYPE_F32 || !ggml_is_contiguous(bias) || ggml_nelements(bias) != s->N)) {
        return false;
    }
    s->a_r2 = s->b2/A->ne[2];
    s->a_r3 = s->b3/A->ne[3];
    s->b_r2 = s->b2/B->ne[2];
    s->b_r3 = s->b3/B->ne[3];
    // batches of A's rows over one B (a sequence through a linear layer) are one product
    // when A's rows run on evenly across them: (b2*b3*M) x K, B packed once
    if (B->ne[2] == 1 && B->ne[3] == 1 && !s->ta && !s->a.flipped &&
        A->nb[2] == A->ne[1]*A->nb[1] && A->nb[3] == A->ne[2]*A->nb[2] &&
        (int64_t) (A->nb[1]/ggml_type_size(A->type)) >= s->a.cols &&
        s->c_step2 == s->M*s->c_ld && s->c_step3 == s->b2*s->c_step2) {  // and C's rows run on so too
        s->a.ld = (int64_t) (A->nb[1]/ggml_type_size(A->type));  // the row stride, also where A has one row a batch
        s->M *= s->b2*s->b3;
        s->b2 = s->b3 = 1;
    }
    const int64_t limit = INT32_MAX;
    return s->M < limit && s->N < limit && s->K < limit && s->a.ld < limit && s->b.ld < limit && s->c_ld < limit;
}
