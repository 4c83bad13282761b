// ggrad's kernels on CUDA: GGML_OP_GGRAD (scripts/patch_ggml_kernels.py copies this file)
#pragma once
#include "common.cuh"

void ggml_cuda_op_ggrad(ggml_backend_cuda_context & ctx, ggml_tensor * dst);
bool ggml_cuda_ggrad_supported(const ggml_tensor * op);
