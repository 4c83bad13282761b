// ggrad's class-target cross-entropy reduction (GGML_OP_GGRAD 32; ggrad_cpu.inc says what it
// computes): the nodes the CPU, CUDA and Vulkan run.
#pragma once

// kernel 1's output, (N, 2) contiguous f32 (the losses' row, the weights' row), into 3 f32;
// N indexes as an int32 (the CPU's ggml_vec_sum_f32 takes an int)
static inline bool ggrad_class_total_supported(const ggml_tensor * op) {
    const ggml_tensor * both = op->src[0];
    return both != NULL && both->type == GGML_TYPE_F32 && ggml_is_contiguous(both) && ggml_nrows(both) == 2 &&
           both->ne[1] == 2 && both->ne[0] <= INT32_MAX && op->type == GGML_TYPE_F32 && ggml_nelements(op) == 3;
}
