// ggrad's ADAMW_GROUP kernel (GGML_OP_GGRAD 9; ggrad_cpu.inc says what it computes): the
// nodes the CPU and CUDA run.
#pragma once

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
