"""Make ggml-cuda honour float32 matmul precision per product (ggrad issue 13).

ggml-cuda runs every float32 product in TF32: it sets CUBLAS_TF32_TENSOR_OP_MATH on its
cuBLAS handles and its own small-batch kernels (mmf) use TF32 tensor-core instructions.
PyTorch's default ("highest") is full float32. After this patch a MUL_MAT or OUT_PROD
node whose op_params[0] is GGML_PREC_F32 runs in float32 (cuBLAS's default math, no
mmf for float32 sources); GGML_PREC_DEFAULT keeps ggml's TF32. Low-precision products
(autocast) marked GGML_PREC_F32 write float32 sums, as on the other backends: ggml-cuda's
single-matrix path rounded a BF16 product's result to BF16 always, and ran an F16 one
marked F32 as a float32 SGEMM (no tensor cores). The precision is a node
parameter, so ggml's CUDA-graph reuse recaptures when it changes. The library exports
`ggml_backend_cuda_ggrad_f32_precision` so ggrad can tell a patched build. ggml-cuda is
also built without -use_fast_math (correctly rounded division, expf, tanhf).

    python scripts/patch_ggml_cuda.py SOURCE_TREE   (ggml-python's sdist, unpacked)

Idempotent; fails loudly when ggml's source no longer matches what it rewrites.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

MARK = "ggrad: float32 precision"
FAST_MATH_MARK = "ggrad: IEEE division and transcendentals, no -use_fast_math"
MATH = ("CUBLAS_CHECK(cublasSetMathMode({handle}, dst->op_params[0] == GGML_PREC_F32 ? "
        "CUBLAS_DEFAULT_MATH : CUBLAS_TF32_TENSOR_OP_MATH)); /* " + MARK + " */")
MARKER_FUNCTION = f"""
/* {MARK}: tells ggrad this build honours GGML_PREC_F32 on float32 products */
extern "C" __attribute__((visibility("default"))) int ggml_backend_cuda_ggrad_f32_precision(void) {{ return 1; }}
"""


def _set_math_after_streams(text: str, pattern: str, expected: int, where: str) -> str:
    """After each cublasSetStream, set the handle's math mode from the node's precision."""
    def add(match: re.Match) -> str:
        return match.group(0) + "\n        " + MATH.format(handle=match.group("handle"))
    text, count = re.subn(pattern, add, text)
    if count != expected:
        raise SystemExit(f"{where}: expected {expected} cublasSetStream calls, found {count}")
    return text


def _replace_once(text: str, old: str, new: str, where: str) -> str:
    if text.count(old) != 1:
        raise SystemExit(f"{where}: expected one {old!r}, found {text.count(old)}")
    return text.replace(old, new)


def _precise_math(cmake: Path) -> None:
    """Build without -use_fast_math: its approximate division, expf and tanhf put an LSTM's
    gradients 4e-4 off PyTorch's (issue 25), and x / y off the correctly rounded quotient
    that the CPU and Vulkan compute."""
    text = cmake.read_text()
    if FAST_MATH_MARK in text:
        return
    cmake.write_text(_replace_once(text, "set(CUDA_FLAGS -use_fast_math -extended-lambda)",
                                   f"set(CUDA_FLAGS -extended-lambda)  # {FAST_MATH_MARK}", cmake.name))


def patch(tree: Path) -> None:
    cuda = next(tree.glob("**/ggml-cuda/ggml-cuda.cu"), None)
    if cuda is None:
        raise SystemExit(f"no ggml-cuda/ggml-cuda.cu under {tree}")
    out_prod = cuda.parent / "out-prod.cu"
    main, outer = cuda.read_text(), out_prod.read_text()
    _precise_math(cuda.parent / "CMakeLists.txt")
    if MARK in main:
        return
    main = _set_math_after_streams(
        main, r"CUBLAS_CHECK\(cublasSetStream\((?P<handle>ctx\.cublas_handle\([^)]*\)), [^)]*\)\);", 4, cuda.name)
    main = _replace_once(
        main, "bool use_mul_mat_f     = !ggml_is_quantized(src0->type)",
        "bool use_mul_mat_f     = !ggml_is_quantized(src0->type)"
        " && !(src0->type == GGML_TYPE_F32 && dst->op_params[0] == GGML_PREC_F32)", cuda.name)
    # a BF16 product marked F32: cuBLAS writes the float32 result itself (no BF16 rounding)
    main = _replace_once(
        main, "        ggml_cuda_pool_alloc<nv_bfloat16> dst_bf16(ctx.pool(id), row_diff*src1_ncols);",
        "        const bool f32_out = dst->op_params[0] == GGML_PREC_F32; /* " + MARK + " */\n"
        "        ggml_cuda_pool_alloc<nv_bfloat16> dst_bf16(ctx.pool(id));\n"
        "        if (!f32_out) {\n            dst_bf16.alloc(row_diff*src1_ncols);\n        }", cuda.name)
    main = _replace_once(
        main, "                    &beta_f32,   dst_bf16.get(), CUDA_R_16BF, ldc,",
        "                    &beta_f32,   f32_out ? (void *) dst_dd_i : (void *) dst_bf16.get(),"
        " f32_out ? CUDA_R_32F : CUDA_R_16BF, ldc,", cuda.name)
    main = _replace_once(
        main, "        const to_fp32_cuda_t to_fp32_cuda = ggml_get_to_fp32_cuda(GGML_TYPE_BF16);\n"
              "        to_fp32_cuda(dst_bf16.get(), dst_dd_i, row_diff*src1_ncols, stream);",
        "        if (!f32_out) {\n"
        "            const to_fp32_cuda_t to_fp32_cuda = ggml_get_to_fp32_cuda(GGML_TYPE_BF16);\n"
        "            to_fp32_cuda(dst_bf16.get(), dst_dd_i, row_diff*src1_ncols, stream);\n        }", cuda.name)
    # an F16 product marked F32: F16 inputs on tensor cores, float32 sums and result
    main = _replace_once(
        main, "        row_diff == src0->ne[1] &&\n        dst->op_params[0] == GGML_PREC_DEFAULT;",
        "        row_diff == src0->ne[1] &&\n"
        "        (dst->op_params[0] == GGML_PREC_DEFAULT || src0->type == GGML_TYPE_F16); /* " + MARK + " */", cuda.name)
    main = _replace_once(
        main, "                                        || force_compute_type.fp32))",
        "                                        || force_compute_type.fp32\n"
        "                                        || dst->op_params[0] == GGML_PREC_F32))", cuda.name)
    main += MARKER_FUNCTION
    outer = _set_math_after_streams(
        outer, r"CUBLAS_CHECK\(cublasSetStream\((?P<handle>handle), stream\)\);", 1, out_prod.name)
    cuda.write_text(main)
    out_prod.write_text(outer)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    patch(Path(sys.argv[1]))
