// ggrad's ADAMW_GROUP kernel (GGML_OP_GGRAD 9; ggrad_cpu.inc says what it computes) and
// ADAM_HYPER (3), the 9 constants it reads: the nodes the backends run.
#pragma once

// the ADAM_HYPER node's sources: bias corrections (2), lr (1), constants (4), 1 - betas (2),
// contiguous f32, from src0 (11 out) or after the 9 constants' own buffer (9 out, a view of
// src0: in place, set 55)
static inline int ggrad_adam_hyper_first(const ggml_tensor * op) {
    return ggml_nelements(op) == 9 ? 1 : 0;
}

static inline bool ggrad_adam_hyper_supported(const ggml_tensor * op) {
    static const int64_t sizes[4] = {2, 1, 4, 2};
    if (op->type != GGML_TYPE_F32 || !ggml_is_contiguous(op) || (ggml_nelements(op) != 9 && ggml_nelements(op) != 11) ||
        (ggml_nelements(op) == 9 && (op->src[0] == NULL || op->view_src != op->src[0]))) {
        return false;
    }
    for (int i = 0; i < 4; ++i) {
        const ggml_tensor * t = op->src[ggrad_adam_hyper_first(op) + i];
        if (t == NULL || t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t) || ggml_nelements(t) != sizes[i]) {
            return false;
        }
    }
    return true;
}

// which ADAMW_GROUP nodes the kernels run: the 9 constants, and 1 or 2 parameters of
// contiguous f32 (p, g, m, v of one size)
static inline bool ggrad_adamw_group_supported(const ggml_tensor * op) {
    const int count = ggml_get_op_params_i32(op, 1);
    if (count < 1 || 1 + 4*count > GGML_MAX_SRC || op->src[0] == NULL || op->src[0]->type != GGML_TYPE_F32 ||
        ggml_nelements(op->src[0]) != 9 || !ggml_is_contiguous(op->src[0])) {
        return false;
    }
    for (int i = 1; i < 1 + 4*count; ++i) {
        const ggml_tensor * t = op->src[i];
        if (t == NULL || t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t) ||
            ggml_nelements(t) != ggml_nelements(op->src[1 + 4*((i - 1)/4)])) {
            return false;
        }
    }
    return true;
}
