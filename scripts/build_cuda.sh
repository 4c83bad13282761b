#!/usr/bin/env bash
# Build a CUDA wheel of ggml-python 0.0.45 from its sdist (`make cuda` runs it through
# scripts/bootstrap.sh; bench/gpu/h200.sh runs it on the GPU host, which has no registry).
#   bash scripts/build_cuda.sh SDIST OUT_DIR [CUDA_ARCH]
#   bash scripts/build_cuda.sh --detect-arch      # print the CUDA_ARCH it would use
# SDIST: the .tar.gz, or an unpacked source folder (left untouched: it is copied). It is
# unpacked into a temporary folder and patched there by patch_ggml_adamw.py (the exact
# AdamW kernel), patch_ggml_kernels.py (ggrad's kernel set, issue 25) and
# patch_ggml_cuda.py (float32 products honour the node's precision, issue 13) before building.
# CUDA_ARCH: one compute capability (90, 89, 120, 90a...); by default the first GPU's, from
# nvidia-smi, else 90 with a warning. nvcc: from PATH, else /usr/local/cuda/bin.
# Optional environment: PYTHON (the python whose pip builds; python3 by default),
# GGML_NO_BUILD_ISOLATION=1 (pip's --no-build-isolation, for a host with no package
# registry: scikit-build-core and cmake must then be installed for PYTHON),
# GGML_BUILD_DIR (keep the CMake build tree there, to relink a variant in seconds),
# GGML_SRC_DIR (where the patched source goes; kept, and reused as is when it exists:
# delete it to unpack afresh; defaults to GGML_BUILD_DIR-src when GGML_BUILD_DIR is set,
# as CMake refuses a build tree whose source folder moved, else a temporary folder),
# SHIM_DIR (where the shim goes; a temporary folder by default), GGML_CMAKE_EXTRA (more
# CMake args, ';'-separated), GGML_EXPORT_ALL=1 (leave out the version script below:
# reproduces issue 11).
# ggml-python 0.0.45 binds ggml_backend_cuda_allreduce_tensor when CUDA is on, which
# ggml 0.15.3 declares but never defines: `import ggml` fails. A CMake project include
# adds a one-function C file defining it (returning false) to the ggml-cuda target.
# GGML_CUDA_GRAPHS=ON replays a graph as one CUDA graph (ggml's default is off; a small
# node then costs ~9 us instead of ~2).
# A version script makes each library export only ggml's API (issue 11): built on the GPU
# host, libggml-base/-cpu/-cuda carry their own static copy of libstdc++ and exported it
# (typeinfo, __gxx_personality_v0, std::locale, iostreams) with its STB_GNU_UNIQUE facet
# ids, which are shared process-wide even under RTLD_LOCAL. A C++ library loaded after
# them (torch, scipy, matplotlib) then mixed two libstdc++ copies: `import numpy; import
# ggml; import torch` aborted in std::locale::~locale() (free(): invalid pointer).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PYTHON="${PYTHON:-python3}"
warn() { echo "[build_cuda] $*" >&2; }

# The first GPU's compute capability as CMake wants it ("9.0" -> "90"), else 90.
detect_arch() {
  local cap
  cap="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .\r')" || cap=""
  if [[ "$cap" =~ ^[0-9]+$ ]]; then echo "$cap"; return; fi
  warn "warning: nvidia-smi reports no GPU here; building for compute capability 9.0 (sm_90)." \
       "Pass CUDA_ARCH (or GGRAD_CUDA_ARCH to bootstrap.sh) to build for another GPU."
  echo 90
}
if [ "${1:-}" = --detect-arch ]; then detect_arch; exit 0; fi

SDIST="${1:?sdist path}"
OUT="${2:?output folder}"
mkdir -p "$OUT"; OUT="$(cd "$OUT" && pwd)"
ARCH="${3:-$(detect_arch)}"
[[ "$ARCH" =~ ^[0-9]+[a-z]?$ ]] || { warn "CUDA_ARCH=$ARCH: give one compute capability, e.g. 90"; exit 2; }

NVCC=""
for p in "$(command -v nvcc || true)" /usr/local/cuda/bin/nvcc; do
  [ -n "$p" ] && [ -x "$p" ] && [ -f "$p" ] && { NVCC="$p"; break; }
done
if [ -z "$NVCC" ]; then
  warn "nvcc not found (PATH, /usr/local/cuda/bin): install NVIDIA's CUDA toolkit"; exit 1
fi
export PATH="$(dirname "$NVCC"):$PATH" CUDACXX="${CUDACXX:-$NVCC}"

CLEAN=()   # temporary folders, removed on exit
trap 'rm -rf ${CLEAN[@]+"${CLEAN[@]}"}' EXIT
temp() { TMP="$(mktemp -d)"; CLEAN+=("$TMP"); }
if [ -n "${GGML_SRC_DIR:-}" ]; then SRC="$GGML_SRC_DIR"
elif [ -n "${GGML_BUILD_DIR:-}" ]; then SRC="${GGML_BUILD_DIR%/}-src"
else temp; SRC="$TMP"; fi
mkdir -p "$SRC"; SRC="$(cd "$SRC" && pwd)"
if [ -z "$(ls -A "$SRC")" ]; then
  if [ -d "$SDIST" ]; then cp -a "$SDIST"/. "$SRC"/
  else tar xzf "$SDIST" -C "$SRC" --strip-components=1; fi
fi
"$PYTHON" "$HERE/patch_ggml_cuda.py" "$SRC"
"$PYTHON" "$HERE/patch_ggml_adamw.py" "$SRC"
"$PYTHON" "$HERE/patch_ggml_kernels.py" "$SRC"

if [ -n "${SHIM_DIR:-}" ]; then SHIM="$SHIM_DIR"; mkdir -p "$SHIM"; else temp; SHIM="$TMP"; fi
cat >"$SHIM/allreduce_shim.c" <<'C'
#include <stdbool.h>
#include <stddef.h>
struct ggml_tensor;
bool ggml_backend_cuda_allreduce_tensor(void ** backends, struct ggml_tensor ** tensors, size_t n) {
    (void) backends; (void) tensors; (void) n;
    return false;
}
C
cat >"$SHIM/shim.cmake" <<CMAKE
cmake_language(DEFER DIRECTORY \${CMAKE_SOURCE_DIR} CALL target_sources ggml-cuda PRIVATE "$SHIM/allreduce_shim.c")
CMAKE
if [ "${GGML_EXPORT_ALL:-0}" != 1 ]; then
  cat >"$SHIM/ggml_exports.map" <<'MAP'
{ global: *ggml*; *gguf*; quantize*; dequantize*; iq2xs*; iq3xs*; llamafile*; local: *; };
MAP
  echo "add_link_options(\"LINKER:--version-script=$SHIM/ggml_exports.map\")" >>"$SHIM/shim.cmake"
fi
ARGS="-DGGML_CUDA=ON;-DCMAKE_CUDA_ARCHITECTURES=$ARCH;-DGGML_NATIVE=OFF;-DGGML_CUDA_GRAPHS=ON;-DCMAKE_PROJECT_INCLUDE=$SHIM/shim.cmake"
[ -n "${GGML_CMAKE_EXTRA:-}" ] && ARGS="$ARGS;$GGML_CMAKE_EXTRA"
PIP_ARGS=()
[ "${GGML_NO_BUILD_ISOLATION:-0}" = 1 ] && PIP_ARGS+=(--no-build-isolation)
[ -n "${GGML_BUILD_DIR:-}" ] && PIP_ARGS+=(--config-settings=build-dir="$GGML_BUILD_DIR")
warn "building for CUDA_ARCH=$ARCH with $NVCC ($("$NVCC" --version | grep -o 'release [0-9.]*' || true))"
CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$PYTHON" -m pip wheel -q --no-deps -w "$OUT" "$SRC" \
  --config-settings=cmake.args="$ARGS" ${PIP_ARGS[@]+"${PIP_ARGS[@]}"}
ls -la "$OUT"
# what the libraries export beside ggml's API (libstdc++'s own symbols, where the map is left out)
temp; CHECK="$TMP"
"$PYTHON" -m zipfile -e "$(ls -t "$OUT"/ggml_python-*.whl | head -1)" "$CHECK" >/dev/null
for f in "$CHECK"/ggml/lib/*.so; do
  echo "$(basename "$f"): $(nm -D --defined-only "$f" | grep -vic 'ggml\|gguf\|quantize\|iq[23]xs\|llamafile') exported symbols outside ggml's API"
done
# the precision patch is in (ggrad looks for this symbol)
if ! grep -q ggml_backend_cuda_ggrad_f32_precision <<<"$(nm -D --defined-only "$CHECK"/ggml/lib/libggml-cuda.so)"; then
  warn "libggml-cuda.so lacks ggml_backend_cuda_ggrad_f32_precision: patch_ggml_cuda.py did not take"; exit 1
fi
if ! grep -q ggml_ggrad_adamw_exact <<<"$(nm -D --defined-only "$CHECK"/ggml/lib/libggml-base.so)"; then
  warn "libggml-base.so lacks ggml_ggrad_adamw_exact: patch_ggml_adamw.py did not take"; exit 1
fi
if ! grep -q ggml_ggrad_kernels <<<"$(nm -D --defined-only "$CHECK"/ggml/lib/libggml-base.so)"; then
  warn "libggml-base.so lacks ggml_ggrad_kernels: patch_ggml_kernels.py did not take"; exit 1
fi
