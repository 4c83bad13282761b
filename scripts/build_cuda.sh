#!/usr/bin/env bash
# Build a CUDA wheel of ggml-python 0.0.45 on a GPU host (no registry needed).
#   bash bench/gpu/build_cuda.sh SDIST OUT_DIR [CUDA_ARCH]
# SDIST may be an unpacked source folder. Optional environment: GGML_BUILD_DIR (keep the
# CMake build tree there, to relink a variant in seconds), SHIM_DIR (where the shim goes;
# a fresh temporary folder by default), GGML_CMAKE_EXTRA (more CMake args, ';'-separated),
# GGML_EXPORT_ALL=1 (leave out the version script below: reproduces issue 11).
# ggml-python 0.0.45 binds ggml_backend_cuda_allreduce_tensor when CUDA is on, which
# ggml 0.15.3 declares but never defines: `import ggml` fails. A CMake project include
# adds a one-function C file defining it (returning false) to the ggml-cuda target; no
# source is patched. GGML_CUDA_GRAPHS=ON replays a graph as one CUDA graph (ggml's
# default is off; a small node then costs ~9 us instead of ~2).
# A version script makes each library export only ggml's API (issue 11): built on the GPU
# host, libggml-base/-cpu/-cuda carry their own static copy of libstdc++ and exported it
# (typeinfo, __gxx_personality_v0, std::locale, iostreams) with its STB_GNU_UNIQUE facet
# ids, which are shared process-wide even under RTLD_LOCAL. A C++ library loaded after
# them (torch, scipy, matplotlib) then mixed two libstdc++ copies: `import numpy; import
# ggml; import torch` aborted in std::locale::~locale() (free(): invalid pointer).
set -euo pipefail
SDIST="${1:?sdist path}"
OUT="${2:?output folder}"
ARCH="${3:-90}"
SHIM="${SHIM_DIR:-$(mktemp -d)}"
mkdir -p "$SHIM"
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
BUILD_DIR_ARG=()
[ -n "${GGML_BUILD_DIR:-}" ] && BUILD_DIR_ARG=(--config-settings=build-dir="$GGML_BUILD_DIR")
CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" python3 -m pip wheel -q --no-build-isolation --no-deps -w "$OUT" "$SDIST" \
  --config-settings=cmake.args="$ARGS" "${BUILD_DIR_ARG[@]}"
ls -la "$OUT"
# what the libraries export beside ggml's API (libstdc++'s own symbols, where the map is left out)
CHECK="$(mktemp -d)"
python3 -m zipfile -e "$(ls -t "$OUT"/ggml_python-*.whl | head -1)" "$CHECK" >/dev/null
for f in "$CHECK"/ggml/lib/*.so; do
  echo "$(basename "$f"): $(nm -D --defined-only "$f" | grep -vic 'ggml\|gguf\|quantize\|iq[23]xs\|llamafile') exported symbols outside ggml's API"
done
rm -rf "$CHECK"
