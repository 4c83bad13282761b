"""ggrad's kernel set: ggml kernels changed where PyTorch's semantics took several nodes
(ggrad issue 25), on every backend a wheel carries (CPU, CUDA, Vulkan).

- RELU keeps NaN and the sign of zero, as torch.relu: `x < 0 ? 0 : x` (ggml: `x > 0 ? x : 0`,
  `fmaxf(x, 0)` or GLSL `max`, which turn NaN into 0). One node where ggrad composed five.
- LEAKY_RELU is torch's `x > 0 ? x : x * slope` (NaN stays NaN; ggml gave 0).
- SILU_BACK takes a mode in op_params[0], set by ggrad only (0, ggml's own, leaves
  SiLU's gradient as it was):
    1: relu's gradient from its output y, torch's threshold_backward: y <= 0 ? 0 : g
       (a NaN output passes g; an inf g where y is 0 gives 0, not inf * 0)
    2: leaky_relu's gradient from its input x, slope in op_params[1] (float bits):
       x > 0 ? g : g * slope
- REPEAT_BACK on CUDA sums each output over its repeats along the outer axes with up to
  32 threads per output and a shared-memory reduction (ggrad sums along the first axis
  with SUM_ROWS) (ggml's kernel walks every repeat in one thread: 72% of a
  transformer block's step on the H200). Its grid is ggml's, so the launch limits in
  ggrad/runtime/launch.py still hold.

ggml-base exports `ggml_ggrad_kernels`, returning KERNELS_VERSION, so ggrad can tell a build
that has these kernels (runtime/backend.py) and composes the old way otherwise.

    python scripts/patch_ggml_kernels.py SOURCE_TREE   (ggml-python's sdist, unpacked)

Idempotent; fails loudly when ggml's source no longer matches what it rewrites.
"""

from __future__ import annotations

import sys
from pathlib import Path

from patch_ggml_adamw import _patch_file as _patch_with_mark

MARK = "ggrad: kernels"
KERNELS_VERSION = 1



def _patch_file(path: Path, edits: list[tuple[str, str]]) -> None:
    _patch_with_mark(path, edits, MARK)


# modes of SILU_BACK, shared with ggrad/functional/elementwise.py
RELU_BACK, LEAKY_RELU_BACK = 1, 2

CUDA_REPEAT_BACK = """template <typename T>
static __global__ void k_repeat_back_rows(
    const T * __restrict__ src, T * __restrict__ dst, const int64_t ne00, const int64_t ne01, const int64_t ne02, const int64_t ne03,
    const size_t s00, const size_t s01, const size_t s02, const size_t s03,
    const int64_t ne0, const int64_t ne1, const int64_t ne2, const int64_t ne3) { /* """ + MARK + """ */
    __shared__ float partial[32][33];
    const int64_t tid0  = int64_t(blockIdx.x)*blockDim.x + threadIdx.x;
    const int64_t tid1  = blockIdx.y;
    const int64_t tid23 = blockIdx.z;
    const int64_t tid2  = tid23 % ne2;
    const int64_t tid3  = tid23 / ne2;
    // the repeats of one output: r0 along its row (inner loop), the rest split between threads
    const int r0 = ne00/ne0, r1 = ne01/ne1, r2 = ne02/ne2;
    const int outer = tid0 < ne0 ? r1*r2*int(ne03/ne3) : 0;
    float sum = 0.0f;
    ggml_cuda_pdl_sync();
    for (int o = threadIdx.y; o < outer; o += blockDim.y) {
        const int k1 = o % r1, k2 = (o / r1) % r2, k3 = o / (r1*r2);
        const T * row = src + (tid3 + k3*ne3)*s03 + (tid2 + k2*ne2)*s02 + (tid1 + k1*ne1)*s01 + tid0*s00;
        for (int k0 = 0; k0 < r0; ++k0) {
            sum += (float) row[k0*ne0*s00];
        }
    }
    partial[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && tid0 < ne0) {
        for (int y = 1; y < blockDim.y; ++y) {
            sum += partial[y][threadIdx.x];
        }
        dst[tid3*ne2*ne1*ne0 + tid2*ne1*ne0 + tid1*ne0 + tid0] = (T) sum;
    }
}

template <typename T>
static void repeat_back_cuda("""


def patch(tree: Path) -> None:
    base = next(tree.glob("**/ggml/src/ggml.c"), None)
    if base is None:
        raise SystemExit(f"no ggml/src/ggml.c under {tree}")
    src = base.parent
    _patch_file(base, [
        ("// ggml hardswish\n",
         f"/* {MARK}: tells ggrad which of its kernels this build has (scripts/patch_ggml_kernels.py) */\n"
         f"__attribute__((visibility(\"default\"))) int ggml_ggrad_kernels(void) {{ return {KERNELS_VERSION}; }}\n\n"
         "// ggml hardswish\n"),
    ])
    _patch_file(src / "ggml-cpu" / "unary-ops.cpp", [
        ("static inline float op_relu(float x) {\n    return (x > 0.f) ? x : 0.f;",
         f"static inline float op_relu(float x) {{ /* {MARK}: NaN and -0 kept, as torch */\n    return (x < 0.f) ? 0.f : x;"),
    ])
    _patch_file(src / "ggml-cpu" / "vec.h", [
        ("y[i] = ((x[i] > 0.f) ? x[i] : 0.f) + ns * ((x[i] < 0.0f) ? x[i] : 0.f); }",
         f"y[i] = (x[i] > 0.f) ? x[i] : x[i]*ns; }} /* {MARK} */"),
        ("        y[i] = GGML_CPU_FP32_TO_FP16(((v > 0.f) ? v : 0.f) + ns * ((v < 0.0f) ? v : 0.f));",
         "        y[i] = GGML_CPU_FP32_TO_FP16((v > 0.f) ? v : v*ns);"),
    ])
    _patch_file(src / "ggml-cpu" / "ops.cpp", [
        ("    for (int i1 = ir0; i1 < ir1; i1++) {\n        ggml_vec_silu_backward_f32(nc,",
         f"    const int32_t mode = ggml_get_op_params_i32(dst, 0); /* {MARK}: relu / leaky_relu gradients */\n"
         "    const float slope = ggml_get_op_params_f32(dst, 1);\n"
         "    for (int i1 = ir0; i1 < ir1 && mode != 0; i1++) {\n"
         "        float * d = (float *) ((char *) dst->data + i1*dst->nb[1]);\n"
         "        const float * x = (const float *) ((char *) src1->data + i1*src1->nb[1]);\n"
         "        const float * g = (const float *) ((char *) grad->data + i1*grad->nb[1]);\n"
         f"        if (mode == {RELU_BACK}) {{\n"
         "            for (int k = 0; k < nc; k++) d[k] = x[k] <= 0.f ? 0.f : g[k];\n"
         "        } else {\n"
         "            for (int k = 0; k < nc; k++) d[k] = x[k] > 0.f ? g[k] : g[k]*slope;\n"
         "        }\n"
         "    }\n"
         "    for (int i1 = ir0; i1 < ir1 && mode == 0; i1++) {\n        ggml_vec_silu_backward_f32(nc,"),
    ])
    cuda = src / "ggml-cuda"
    _patch_file(cuda / "unary.cu", [
        ("static __device__ __forceinline__ float op_relu(float x) {\n    return fmaxf(x, 0);",
         f"static __device__ __forceinline__ float op_relu(float x) {{ /* {MARK} */\n    return x < 0.0f ? 0.0f : x;"),
        ("    return fmaxf(x, 0) + fminf(x, 0.0f) * negative_slope;",
         "    return x > 0.0f ? x : x * negative_slope;"),
        ("static __global__ void silu_back_kernel(const T * grad, const T * xf, T * dst, const int k) {",
         "static __global__ void silu_back_kernel(const T * grad, const T * xf, T * dst, const int k,\n"
         "                                        const int mode, const float slope) {"),
        ("    dst[i] = (T)op_silu_back((float)grad[i], (float)xf[i]);",
         "    const float x = (float)xf[i], g = (float)grad[i];\n"
         f"    dst[i] = (T)(mode == {RELU_BACK} ? (x <= 0.0f ? 0.0f : g) : mode == {LEAKY_RELU_BACK} ? (x > 0.0f ? g : g*slope)\n"
         "                                     : op_silu_back(g, x));"),
        ("static void silu_back_cuda(const T * grad, const T * x, T * dst, const int k, cudaStream_t stream) {",
         "static void silu_back_cuda(const T * grad, const T * x, T * dst, const int k, const int mode, const float slope,\n"
         "                           cudaStream_t stream) {"),
        ("(grad, x, dst, k);", "(grad, x, dst, k, mode, slope);"),
        ("        silu_back_cuda((const half *)src0_d, (const half *)src1_d, (half *)dst_d, ggml_nelements(src0), stream);",
         "        silu_back_cuda((const half *)src0_d, (const half *)src1_d, (half *)dst_d, ggml_nelements(src0),\n"
         "                       ggml_get_op_params_i32(dst, 0), ggml_get_op_params_f32(dst, 1), stream);"),
        ("        silu_back_cuda((const float*)src0_d, (const float*)src1_d, (float *)dst_d, ggml_nelements(src0), stream);",
         "        silu_back_cuda((const float*)src0_d, (const float*)src1_d, (float *)dst_d, ggml_nelements(src0),\n"
         "                       ggml_get_op_params_i32(dst, 0), ggml_get_op_params_f32(dst, 1), stream);"),
    ])
    _patch_file(cuda / "binbcast.cu", [
        ("template <typename T>\nstatic void repeat_back_cuda(", CUDA_REPEAT_BACK),
        ("    const dim3 block_dims(WARP_SIZE, 1, 1);\n    const dim3 block_nums((ne0 + WARP_SIZE - 1) / WARP_SIZE, ne1, ne2*ne3);\n"
         "    k_repeat_back<T><<<block_nums, block_dims, 0, stream>>>",
         "    const int64_t outer = (ne01/ne1)*(ne02/ne2)*(ne03/ne3);  /* split between threads along y */\n"
         "    const dim3 block_dims(WARP_SIZE, outer >= 256 ? 32 : outer >= 32 ? 8 : 1, 1);\n"
         "    const dim3 block_nums((ne0 + WARP_SIZE - 1) / WARP_SIZE, ne1, ne2*ne3);\n"
         "    k_repeat_back_rows<T><<<block_nums, block_dims, 0, stream>>>"),
    ])
    vk = src / "ggml-vulkan"
    _patch_file(vk / "vulkan-shaders" / "unary.comp", [
        ("float op_relu(float x) {\n    return max(x, 0.0f);",
         f"float op_relu(float x) {{ // {MARK}\n    return x < 0.0f ? 0.0f : x;"),
        ("    return max(x, 0.0f) + min(x, 0.0f) * p.param1;", "    return x > 0.0f ? x : x * p.param1;"),
    ])
    _patch_file(vk / "vulkan-shaders" / "silu_back.comp", [
        ("    const float xi = float(data_x[i]);",
         f"    const float xi = float(data_x[i]);  // {MARK}: modes in p.param1\n"
         f"    if (p.param1 == {RELU_BACK}.0f) {{\n"
         "        data_d[i] = D_TYPE(xi <= 0.0f ? 0.0f : float(data_g[i]));\n        return;\n    }\n"
         f"    if (p.param1 == {LEAKY_RELU_BACK}.0f) {{\n"
         "        data_d[i] = D_TYPE(xi > 0.0f ? float(data_g[i]) : float(data_g[i]) * p.param2);\n        return;\n    }"),
    ])
    _patch_file(vk / "ggml-vulkan.cpp", [
        ("GGML_OP_SILU_BACK, { (uint32_t)ggml_nelements(src0), 0, 0.0f, 0.0f, 0.0f, 0.0f });",
         "GGML_OP_SILU_BACK, { (uint32_t)ggml_nelements(src0), 0,\n"
         f"        (float)ggml_get_op_params_i32(dst, 0), ggml_get_op_params_f32(dst, 1), 0.0f, 0.0f }}); /* {MARK} */"),
    ])


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    patch(Path(sys.argv[1]))
