#!/usr/bin/env bash
# ggrad's fused attention kernels on the CPU (bench/gpu/attention_emulator.cpp): the kernel file's
# hardware parts (its ldmatrix/mma/cp.async helpers, the launchers, dynamic shared memory, float2
# stores) swapped for the emulator's checked ones, then compiled with g++ against the CUDA
# toolkit's headers (cuda_bf16.h, cuda_fp16.h: host conversions only).
#   bash bench/gpu/attention_emulate.sh        # every case (~2 min on 2 cores)
#   bash bench/gpu/attention_emulate.sh 1 5    # cases 1 and 5 (attention_emulator.cpp's run_case)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
if [ -z "${CUDA_INCLUDE:-}" ]; then  # the newest toolkit installed
  for dir in /usr/local/cuda/include $(ls -d /usr/local/cuda-*/include 2>/dev/null | sort -rV); do
    [ -f "$dir/cuda_bf16.h" ] && { CUDA_INCLUDE=$dir; break; }
  done
fi
[ -f "${CUDA_INCLUDE:-}/cuda_bf16.h" ] || { echo "no CUDA toolkit headers found (set CUDA_INCLUDE)" >&2; exit 2; }
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
python3 - "$ROOT/scripts/ggml_kernels/ggrad_attention.cuh" "$WORK/attention_emulated.inc" <<'PY'
import re, sys
s = open(sys.argv[1]).read()
start = s.index("// the tensor cores' operands from shared memory")
end = s.index("// two floats rounded into one register")
s = s[:start] + s[end:]  # the emulator defines ggrad_ldsm, ggrad_ldsm_t, ggrad_mma, ggrad_cp* and ggrad_attn_exp2
s = s[:s.index("// the launches (stream")]  # and the launchers
swaps = [(r"extern __shared__ __align__\(128\) unsigned char smem\[\];", "unsigned char * smem = emu_smem;"),
         (r"\*\(float2 \*\) \(", "*emu_f2(")]
for pattern, repl in swaps:
    s, n = re.subn(pattern, repl, s)
    if n == 0:
        sys.exit(f"attention_emulate.sh: {pattern!r} no longer matches ggrad_attention.cuh: update the swaps")
open(sys.argv[2], "w").write(s)
PY
g++ -O2 -std=c++20 -pthread -w -I "$CUDA_INCLUDE" -I "$ROOT/bench/gpu" \
  -DGGRAD_ATTN_EMULATED="\"$WORK/attention_emulated.inc\"" "$ROOT/bench/gpu/attention_emulator.cpp" -o "$WORK/emulator"
"$WORK/emulator" "$@"
