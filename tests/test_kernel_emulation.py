"""ggrad's CUDA attention kernels (kernel sets 59-60, scripts/ggml_kernels/ggrad_attention.cuh) on a
machine without a GPU: bench/gpu/attention_emulate.sh runs the kernel code on the CPU, its
tensor-core instructions (ldmatrix, mma.sync) and warp shuffles emulated from the PTX ISA's
fragment tables, and compares it with a float64 reference. A wrong fragment layout, operand
or mask gives errors of ~1; the emulator also stops on a warp diverging at a collective, on
shared memory read out of range or misaligned, and on a cp.async copy never waited for (its
copies land only at their wait, so a tile read too early reads NaN). The GPU runs the same kernels in
test_kernels' attention test (CUDA) and bench/gpu/attention_probe.cu."""

import glob
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _cuda_headers() -> bool:
    return any(Path(d, "cuda_bf16.h").is_file() for d in ["/usr/local/cuda/include", *glob.glob("/usr/local/cuda-*/include")])


@pytest.mark.skipif(shutil.which("g++") is None or not _cuda_headers(),
                    reason="no g++ or no CUDA toolkit headers (cuda_bf16.h) for the attention emulator")
def test_attention_kernels_emulated_on_the_cpu_equal_float64():
    """Four cases: bfloat16, causal, a fused projection's layout, 130 queries (two blocks and a
    tail); float16 with 100 queries against 77 keys; one query and one key; whole blocks (192
    queries, 128 keys: every step without masks)."""
    proc = subprocess.run(["bash", str(ROOT / "bench/gpu/attention_emulate.sh"), "1", "5", "9", "11"], capture_output=True,
                          text=True, timeout=600)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines and lines[-1] == "all ok", proc.stdout + proc.stderr
    assert sum(line.endswith("-> ok") for line in lines) == 4, proc.stdout
