#!/usr/bin/env bash
# Build llama-cpp-python (llama.cpp itself, the test oracle of issue 16) once, for the CPU
# only, and cache the wheel like scripts/bootstrap.sh caches ggml-python's:
#
#   ~/.cache/ggrad/wheels/llama-cpp-<version>-<flavour>/llama_cpp_python-<version>-*.whl
#
# A second run finds the wheel and builds nothing. Then the wheel is installed into .venv
# (skip with --no-install); the wheel's folder is printed on stdout.
#
#   LLAMA_CPP_SDIST=path.tar.gz   build from this sdist instead of downloading it from PyPI
#   GGRAD_CACHE=~/.cache/ggrad     where the wheels live (as in bootstrap.sh)
#
# The build is portable and small: GGML_NATIVE=OFF with every x86 extension off (baseline
# x86-64; the oracle runs tiny models, speed does not matter), no BLAS, no OpenMP, no GPU
# backend (CUDA, Vulkan, Metal, HIP, SYCL, OpenCL, RPC), no llamafile sgemm; llama.cpp's
# examples, tests, tools, server and app are off, and so is the multimodal library (mtmd,
# LLAVA_BUILD=OFF). llama-cpp-python's CMakeLists forces LLAMA_BUILD_COMMON=ON (llama.cpp's
# "common" helper library, libllama-common.so, which the Python package never loads and which
# takes minutes to compile); the sdist is unpacked and that one line removed, so that
# -DLLAMA_BUILD_COMMON=OFF holds. llama.cpp's own install rules write into the install
# prefix, site-packages itself (site-packages/lib/libggml-base.so, site-packages/include/
# ggml.h, ...), over the files of the same names that ggml-python's wheel installs there;
# CMAKE_INSTALL_LIBDIR/INCLUDEDIR/BINDIR keep them inside the llama_cpp package.
set -euo pipefail
shopt -s inherit_errexit

LLAMA_CPP_VERSION=0.3.36
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${GGRAD_CACHE:-$HOME/.cache/ggrad}"
VENV="$ROOT/.venv"
INSTALL=1
[ "${1:-}" = --no-install ] && INSTALL=0

# Change FLAVOR (cpu-portable-2, ...) whenever CMAKE_ARGS or the CMakeLists edit change, so
# that a wheel cached before is not reused.
FLAVOR="cpu-portable"
CMAKE_ARGS_LLAMA="-DGGML_NATIVE=OFF -DGGML_CPU_ALL_VARIANTS=OFF -DGGML_BACKEND_DL=OFF \
-DGGML_SSE42=OFF -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF -DGGML_BMI2=OFF \
-DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF \
-DGGML_BLAS=OFF -DGGML_OPENMP=OFF -DGGML_LLAMAFILE=OFF -DGGML_CCACHE=OFF \
-DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_HIP=OFF -DGGML_SYCL=OFF \
-DGGML_OPENCL=OFF -DGGML_RPC=OFF \
-DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
-DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_MTMD=OFF -DLLAMA_CURL=OFF \
-DLLAMA_OPENSSL=OFF -DLLAVA_BUILD=OFF \
-DCMAKE_INSTALL_LIBDIR=llama_cpp/lib -DCMAKE_INSTALL_INCLUDEDIR=llama_cpp/include -DCMAKE_INSTALL_BINDIR=llama_cpp/bin"

log() { echo "[build_llama_cpp] $*" >&2; }

# the sdist: LLAMA_CPP_SDIST, else downloaded once from PyPI into the cache (the wheel's
# build and the tokenizer vocabularies below both read it)
sdist_path() {
  if [ -n "${LLAMA_CPP_SDIST:-}" ]; then echo "$LLAMA_CPP_SDIST"; return; fi
  local kept="$CACHE/sdist/llama_cpp_python-$LLAMA_CPP_VERSION.tar.gz"
  if [ ! -f "$kept" ]; then
    rm -rf "$CACHE/sdist.tmp"; mkdir -p "$CACHE/sdist.tmp" "$CACHE/sdist"
    "$VENV/bin/pip" download -q --no-deps --no-binary :all: --no-cache-dir -d "$CACHE/sdist.tmp" \
      "llama-cpp-python==$LLAMA_CPP_VERSION" >&2
    mv "$CACHE/sdist.tmp/llama_cpp_python-$LLAMA_CPP_VERSION.tar.gz" "$kept"; rm -rf "$CACHE/sdist.tmp"
  fi
  echo "$kept"
}

out="$CACHE/wheels/llama-cpp-$LLAMA_CPP_VERSION-$FLAVOR"
if ls "$out"/llama_cpp_python-$LLAMA_CPP_VERSION-*.whl >/dev/null 2>&1; then
  log "cached: $out"
else
  [ -x "$VENV/bin/pip" ] || { log "no $VENV: run scripts/bootstrap.sh (make setup) first"; exit 1; }
  log "building llama-cpp-python $LLAMA_CPP_VERSION ($FLAVOR) with $(nproc) jobs: several minutes"
  rm -rf "$out.tmp"; mkdir -p "$out.tmp"
  sdist="$(sdist_path)"
  mkdir -p "$out.tmp/src"
  tar xzf "$sdist" -C "$out.tmp/src" --strip-components=1
  force='set(LLAMA_BUILD_COMMON ON CACHE BOOL "Build llama.cpp common library" FORCE)'
  grep -qF "$force" "$out.tmp/src/CMakeLists.txt" \
    || { log "the sdist's CMakeLists.txt no longer forces LLAMA_BUILD_COMMON as expected: update this script"; exit 1; }
  grep -vF "$force" "$out.tmp/src/CMakeLists.txt" >"$out.tmp/CMakeLists.txt"
  mv "$out.tmp/CMakeLists.txt" "$out.tmp/src/CMakeLists.txt"
  start=$(date +%s)
  CMAKE_ARGS="$CMAKE_ARGS_LLAMA" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "$VENV/bin/pip" wheel -q --no-deps --no-cache-dir -w "$out.tmp" "$out.tmp/src" \
    --config-settings=cmake.verbose=false >&2
  log "built in $(( $(date +%s) - start )) s"
  rm -rf "$out.tmp/src" "$out"; mv "$out.tmp" "$out"
fi

# llama.cpp's tokenizer test vocabularies (vocab-only GGUF files with their .inp texts and
# .out ids, from the sdist's models/), the oracle of ggrad's GGUF tokenizer tests
vocab="$CACHE/llama-cpp-vocab-$LLAMA_CPP_VERSION"
if [ ! -f "$vocab/.complete" ]; then
  rm -rf "$vocab.tmp"; mkdir -p "$vocab.tmp"
  tar xzf "$(sdist_path)" -C "$vocab.tmp" --strip-components=4 --wildcards \
    "*/vendor/llama.cpp/models/ggml-vocab-llama-spm.gguf*" "*/vendor/llama.cpp/models/ggml-vocab-phi-3.gguf*" \
    "*/vendor/llama.cpp/models/ggml-vocab-gpt-2.gguf*" "*/vendor/llama.cpp/models/ggml-vocab-qwen2.gguf*" \
    "*/vendor/llama.cpp/models/ggml-vocab-llama-bpe.gguf*"
  rm -rf "$vocab"; touch "$vocab.tmp/.complete"; mv "$vocab.tmp" "$vocab"
  log "kept llama.cpp's test vocabularies in $vocab"
fi

if [ "$INSTALL" = 1 ]; then
  wheel="$(ls "$out"/llama_cpp_python-$LLAMA_CPP_VERSION-*.whl)"
  stamp="$(sha256sum "$wheel" | cut -c1-64)"
  if [ "$(cat "$VENV/.llama-cpp-wheel" 2>/dev/null)" != "$stamp" ] \
     || ! "$VENV/bin/python" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$LLAMA_CPP_VERSION')" 2>/dev/null; then
    log "installing $(basename "$wheel") ($FLAVOR) into $VENV"
    "$VENV/bin/pip" install -q --force-reinstall --no-deps "$wheel" >&2
    "$VENV/bin/pip" install -q "$wheel" >&2   # its few dependencies (diskcache, jinja2), numpy untouched
    echo "$stamp" >"$VENV/.llama-cpp-wheel"
  fi
fi
echo "$out"
