#!/usr/bin/env bash
# Set up .venv with ggml-python (CUDA or Vulkan backend where this machine can have it)
# and ggrad installed editable. Idempotent: a second run does nothing costly.
#
#   GGRAD_BACKEND=auto|cuda|vulkan|cpu   auto: the backend installed last; on a fresh .venv,
#                                        cuda when nvcc and an NVIDIA GPU are found, else
#                                        vulkan when apt-get can install as root, else cpu
#   GGRAD_CACHE=~/.cache/ggrad      built wheels and the header work-around live here
#   GGRAD_CUDA_ARCH=90              cuda: the compute capability to build for (default:
#                                   the first GPU's, from nvidia-smi)
#   GGML_NO_BUILD_ISOLATION=1       cuda: build with pip's --no-build-isolation (see
#                                   scripts/build_cuda.sh)
#   GGRAD_PORTABLE=1                vulkan, cpu: a wheel for any x86-64 machine (no
#                                   -march=native), cached beside the native one
set -euo pipefail
shopt -s inherit_errexit

GGML_PYTHON_VERSION=0.0.45
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="$(realpath -m "${GGRAD_CACHE:-$HOME/.cache/ggrad}")"  # absolute: paths are written into wrappers
BACKEND="${GGRAD_BACKEND:-auto}"
PYTHON="${PYTHON:-python3}"
VENV="$ROOT/.venv"
EXTRAS="${GGRAD_EXTRAS:-test}"
mkdir -p "$CACHE"

log() { echo "[bootstrap] $*" >&2; }

can_apt() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; }

# nvcc's path (PATH, else CUDA's default prefix), or nothing
find_nvcc() {
  local p; for p in "$(command -v nvcc || true)" /usr/local/cuda/bin/nvcc; do
    [ -n "$p" ] && [ -x "$p" ] && [ -f "$p" ] && { echo "$p"; return; }
  done; return 0
}
has_nvidia_gpu() { nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }

if [ "$BACKEND" = auto ]; then
  for stamp in "$VENV"/.ggrad-*; do [ -e "$stamp" ] && BACKEND="${stamp##*/.ggrad-}" && BACKEND="${BACKEND%%-*}"; done
fi
if [ "$BACKEND" = auto ]; then
  if [ -n "$(find_nvcc)" ] && has_nvidia_gpu; then BACKEND=cuda
  elif can_apt; then BACKEND=vulkan; else BACKEND=cpu; fi
fi

apt_install() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  if ! can_apt; then
    log "the Vulkan build needs these Debian packages: ${missing[*]}; install them as root, or use GGRAD_BACKEND=cpu"
    exit 1
  fi
  log "apt-get install ${missing[*]}"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# Unpack Debian packages of another suite into DEST without touching the system:
# a private sources list and apt state, `apt-get download`, `dpkg -x`.
#   private_deb SUITE DEST PACKAGE...
private_deb() {
  local suite="$1" dest="$2"; shift 2
  local work; work="$(mktemp -d)"
  local mirror
  mirror="$(grep -h '^URIs:' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1 | awk '{print $2}')"
  mirror="${mirror:-http://deb.debian.org/debian}"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main" >"$work/sources.list"
  mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
  local opts=(-oDir::Etc::SourceList="$work/sources.list" -oDir::Etc::SourceParts=/dev/null
              -oDir::State::Lists="$work/lists" -oDir::Cache="$work/cache")
  apt-get "${opts[@]}" update -qq >/dev/null 2>&1
  local package
  mkdir -p "$dest"
  for package in "$@"; do
    (cd "$work" && apt-get "${opts[@]}" download -qq "$package/$suite" >/dev/null 2>&1)
    dpkg -x "$work/${package}"_*.deb "$dest"
  done
  rm -rf "$work"
}

# Debian 12's Vulkan headers (1.3.239) lack VK_EXT_layer_settings, which ggml 0.15.3
# uses; take libvulkan-dev's headers from Debian 13 into a private folder (with
# GGRAD_GLSLC_SUITE=forky, Debian 14's: VK_KHR_shader_bfloat16 came after Debian 13's 1.4.309,
# and ggml-vulkan looks for bfloat16 matrix cores only where the headers name it).
vulkan_include_dir() {
  local major
  major="$(cut -d. -f1 /etc/debian_version 2>/dev/null || echo 0)"
  if [ "$GLSLC_SUITE" = trixie ] && { [ "$major" -ge 13 ] 2>/dev/null || grep -q VK_EXT_layer_settings /usr/include/vulkan/vulkan_core.h 2>/dev/null; }; then
    echo /usr/include; return
  fi
  local dir="$CACHE/vulkan-headers" suite="$GLSLC_SUITE"
  [ "$suite" = trixie ] || dir="$dir-$suite"
  if [ ! -f "$dir/usr/include/vulkan/vulkan_core.h" ]; then
    log "fetching Debian's $suite Vulkan headers into $dir"
    rm -rf "$dir"
    private_deb "$suite" "$dir" libvulkan-dev
  fi
  echo "$dir/usr/include"
}

# Debian 12's lavapipe (Mesa 22.3.6) corrupts the heap while compiling some of ggml's
# shaders (seen: a matmul-vector pipeline after a scale; reproduced with plain ggml).
# Mesa 25 from bookworm-backports does not: unpack its lavapipe into a private folder
# (nothing on the system changes); tests point the Vulkan loader at it.
private_lavapipe() {
  local dir="$CACHE/lavapipe" version
  version="$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || echo 0)"
  if [ "${version%%.*}" -ge 25 ] 2>/dev/null || [ ! -f /etc/debian_version ]; then return; fi
  [ -f "$dir/lvp_icd.json" ] && return
  log "fetching Mesa 25 lavapipe from bookworm-backports into $dir"
  rm -rf "$dir.tmp"
  private_deb bookworm-backports "$dir.tmp/root" mesa-vulkan-drivers
  local lib; lib="$(find "$dir.tmp/root" -name libvulkan_lvp.so | head -1)"
  lib="$dir${lib#"$dir.tmp"}"
  printf '{"file_format_version": "1.0.0", "ICD": {"library_path": "%s", "api_version": "1.3.0"}}\n' "$lib" >"$dir.tmp/lvp_icd.json"
  rm -rf "$dir"; mv "$dir.tmp" "$dir"
}

# ggml-vulkan's cooperative-matrix shaders (a GPU's matrix cores: KHR_cooperative_matrix,
# NV_cooperative_matrix2) need a glslc that knows the extensions; Debian 12's (shaderc
# 2023.2) does not, and then every GPU reports "matrix cores: none" (issue 29). Debian 13's
# glslc (2025.2) does, but needs glibc 2.38: it runs here under its own C library, unpacked
# into a private folder with its libraries and called through that library's loader.
# GGRAD_GLSLC_SUITE=forky takes Debian 14's (shaderc 2026.4, glibc 2.43), which also knows
# GL_EXT_bfloat16: ggml then builds its bfloat16 matrix-core shaders, which a driver with
# VK_KHR_shader_bfloat16 runs (NVIDIA's R580); the default stays Debian 13's, a stable
# release (forky's packages move). Prints the glslc to build with.
GLSLC_SUITE="${GGRAD_GLSLC_SUITE:-trixie}"
coopmat_glslc() {
  local probe="$CACHE/coopmat-probe-$GLSLC_SUITE.comp" bf16=""
  [ "$GLSLC_SUITE" = trixie ] || bf16='#extension GL_EXT_bfloat16 : require\n'
  printf "#version 460\n#extension GL_KHR_cooperative_matrix : require\n#extension GL_NV_cooperative_matrix2 : require\n${bf16}void main() {}\n" >"$probe"
  if [ "$GLSLC_SUITE" = trixie ] && glslc -o /dev/null -fshader-stage=compute --target-env=vulkan1.3 "$probe" 2>/dev/null; then
    command -v glslc; return
  fi
  local dir="$CACHE/glslc-$GLSLC_SUITE"
  if [ ! -x "$dir/glslc" ]; then
    log "fetching Debian's $GLSLC_SUITE glslc (cooperative-matrix shaders) into $dir"
    rm -rf "$dir.tmp"
    private_deb "$GLSLC_SUITE" "$dir.tmp/root" glslc libshaderc1 libc6 libstdc++6 libgcc-s1
    local loader libs
    loader="$(find "$dir.tmp/root/usr/lib" -name 'ld-linux*.so.*' | head -1)"
    libs="$(dirname "$loader")"
    cat >"$dir.tmp/glslc" <<WRAPPER
#!/bin/sh
# Debian's $GLSLC_SUITE glslc under its own C library (bootstrap.sh: coopmat_glslc)
exec "$dir${loader#"$dir.tmp"}" --library-path "$dir${libs#"$dir.tmp"}" "$dir/root/usr/bin/glslc" "\$@"
WRAPPER
    chmod +x "$dir.tmp/glslc"
    rm -rf "$dir"; mv "$dir.tmp" "$dir"
  fi
  if ! "$dir/glslc" -o /dev/null -fshader-stage=compute --target-env=vulkan1.3 "$probe" >&2; then
    log "Debian's $GLSLC_SUITE glslc in $dir does not compile the shaders' extensions"; exit 1
  fi
  echo "$dir/glslc"
}

# The CPU backend's speed, measured on bench/train_step.py's mlp-mnist step (2 cores):
# llamafile's tinyBLAS for float32 matmuls (ggml leaves it off when built on its own):
# ~14 -> ~8.5 ms; -fno-math-errno lets the compiler vectorise sqrtf (the AdamW kernel went
# from 0.9 to 0.13 ms per step; errno is never read).
CPU_ARGS="-DGGML_LLAMAFILE=ON;-DCMAKE_C_FLAGS=-fno-math-errno;-DCMAKE_CXX_FLAGS=-fno-math-errno"
FLAVOR_SUFFIX="llamafile-noerrno"
# GGRAD_PORTABLE=1: a wheel for other x86-64 machines (the GPU host: bench/gpu/h200.sh),
# without -march=native
if [ "${GGRAD_PORTABLE:-0}" = 1 ]; then TARGET=portable; CPU_ARGS="$CPU_ARGS;-DGGML_NATIVE=OFF"; else TARGET=native; fi

# Every wheel is built from ggml-python's sdist patched by scripts/patch_ggml_adamw.py
# (ggml's AdamW kernel with PyTorch's exact update, ggrad's default Adam) and
# scripts/patch_ggml_kernels.py (ggrad's kernel set); the suffix names the patches and
# hashes their sources, so a wheel cached before any edit to them is not reused.
PATCH_SUFFIX="adamw2-kernels60-$(cat "$ROOT"/scripts/patch_ggml_*.py "$ROOT"/scripts/ggml_kernels/* | sha256sum | cut -c1-8)"

build_wheel() {
  local flavor="$1" args="$2"
  local out="$CACHE/wheels/$flavor"
  if ls "$out"/ggml_python-$GGML_PYTHON_VERSION-*.whl >/dev/null 2>&1; then
    echo "$out"; return
  fi
  log "building ggml-python $GGML_PYTHON_VERSION ($flavor): a few minutes"
  rm -rf "$out.tmp"; mkdir -p "$out.tmp/sdist" "$out.tmp/src"
  "$VENV/bin/pip" download -q --no-deps --no-binary :all: --no-cache-dir -d "$out.tmp/sdist" \
    "ggml-python==$GGML_PYTHON_VERSION" >&2
  tar xzf "$out.tmp/sdist/ggml_python-$GGML_PYTHON_VERSION.tar.gz" -C "$out.tmp/src" --strip-components=1
  "$VENV/bin/python" "$ROOT/scripts/patch_ggml_adamw.py" "$out.tmp/src"
  "$VENV/bin/python" "$ROOT/scripts/patch_ggml_kernels.py" "$out.tmp/src"
  CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$VENV/bin/pip" wheel -q --no-deps --no-cache-dir -w "$out.tmp" \
    "$out.tmp/src" --config-settings=cmake.args="$args" >&2
  rm -rf "$out.tmp/sdist" "$out.tmp/src" "$out"; mv "$out.tmp" "$out"
  echo "$out"
}

# The CUDA wheel: ggml-cuda patched so that float32 products follow
# ggrad.set_float32_matmul_precision (scripts/patch_ggml_cuda.py), CUDA graphs on, built
# for one GPU architecture (scripts/build_cuda.sh). Bump CUDA_SUFFIX when the patch
# changes, so that a wheel cached before is not reused.
CUDA_SUFFIX="prec-$PATCH_SUFFIX"

no_nvcc() {
  log "GGRAD_BACKEND=cuda builds ggml with nvcc, which is neither in PATH nor in /usr/local/cuda/bin."
  log "Install NVIDIA's CUDA toolkit (nvcc and cuBLAS: the cuda-toolkit package from"
  log "https://developer.nvidia.com/cuda-downloads, or Debian's nvidia-cuda-toolkit) and the"
  log "NVIDIA driver, or use GGRAD_BACKEND=vulkan or cpu. Nothing was changed."
  exit 1
}

build_cuda_wheel() {
  local flavor="$1" arch="$2" nvcc="$3"
  local out="$CACHE/wheels/$flavor"
  if ls "$out"/ggml_python-$GGML_PYTHON_VERSION-*.whl >/dev/null 2>&1; then
    echo "$out"; return
  fi
  [ -n "$nvcc" ] || no_nvcc
  log "building ggml-python $GGML_PYTHON_VERSION ($flavor) with $nvcc: several minutes"
  rm -rf "$out.tmp"; mkdir -p "$out.tmp/sdist"
  "$VENV/bin/pip" download -q --no-deps --no-binary :all: --no-cache-dir -d "$out.tmp/sdist" \
    "ggml-python==$GGML_PYTHON_VERSION" >&2
  PYTHON="$VENV/bin/python" PATH="$(dirname "$nvcc"):$PATH" bash "$ROOT/scripts/build_cuda.sh" \
    "$out.tmp/sdist/ggml_python-$GGML_PYTHON_VERSION.tar.gz" "$out.tmp" "$arch" >&2
  rm -rf "$out.tmp/sdist" "$out"; mv "$out.tmp" "$out"
  echo "$out"
}

if [ "$BACKEND" = cuda ]; then
  # before anything else: without nvcc and no wheel cached, fail having changed nothing
  nvcc="$(find_nvcc)"
  arch="${GGRAD_CUDA_ARCH:-}"
  if [ -z "$arch" ]; then
    if [ -n "$nvcc" ] || has_nvidia_gpu; then arch="$(bash "$ROOT/scripts/build_cuda.sh" --detect-arch)"; else arch=90; fi
  fi
  flavor="cuda-sm$arch-$CUDA_SUFFIX"
  if [ -z "$nvcc" ] && ! ls "$CACHE/wheels/$flavor"/ggml_python-*.whl >/dev/null 2>&1; then no_nvcc; fi
fi

[ -x "$VENV/bin/python" ] || { log "creating $VENV"; "$PYTHON" -m venv "$VENV"; }

case "$BACKEND" in
  cuda)
    wheels="$(build_cuda_wheel "$flavor" "$arch" "$nvcc")"
    ;;
  vulkan)
    apt_install glslc libvulkan-dev spirv-headers mesa-vulkan-drivers vulkan-tools
    inc="$(vulkan_include_dir)"
    private_lavapipe
    glslc="$(coopmat_glslc)"
    flavor="vulkan-$TARGET-coopmat$([ "$GLSLC_SUITE" = trixie ] || echo "-$GLSLC_SUITE")-$FLAVOR_SUFFIX-$PATCH_SUFFIX"
    wheels="$(build_wheel "$flavor" "-DGGML_VULKAN=ON;-DVulkan_INCLUDE_DIR=$inc;-DVulkan_GLSLC_EXECUTABLE=$glslc;$CPU_ARGS")"
    ;;
  cpu)
    flavor="cpu-$TARGET-$FLAVOR_SUFFIX-$PATCH_SUFFIX"
    wheels="$(build_wheel "$flavor" "$CPU_ARGS")"
    ;;
  *) log "unknown GGRAD_BACKEND=$BACKEND (auto, cuda, vulkan or cpu)"; exit 2 ;;
esac

stamp="$VENV/.ggrad-$flavor"
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
  log "installing ggml-python ($BACKEND) and ggrad[$EXTRAS] into $VENV"
  rm -f "$VENV"/.ggrad-*
  "$VENV/bin/pip" install -q --force-reinstall --no-deps "$wheels"/ggml_python-*.whl
  "$VENV/bin/pip" install -q --find-links "$wheels" -e "$ROOT[$EXTRAS]"
  if [ "$BACKEND" = cuda ] && ! "$VENV/bin/python" -c "import ggml" >/dev/null; then
    log "ggml's CUDA build does not load (above); its libraries need the CUDA toolkit's runtime"
    log "libraries (libcudart, libcublas) where the loader finds them: an ldconfig entry, or"
    log "LD_LIBRARY_PATH (for a toolkit in /usr/local/cuda: /usr/local/cuda/lib64)"
    exit 1
  fi
  touch "$stamp"
fi
# llama.cpp itself, the oracle of tests/test_llama_cpp.py: built once (about 2.5 minutes on
# 2 cores) into the same cache; installing it again is a no-op (a stamp in the venv)
case ",$EXTRAS," in *,test,*) bash "$ROOT/scripts/build_llama_cpp.sh" >/dev/null ;; esac
log "ready: backend $BACKEND"
