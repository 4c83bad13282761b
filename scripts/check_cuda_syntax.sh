#!/usr/bin/env bash
# Compile-check ggrad's CUDA kernels (scripts/ggml_kernels/ggrad.cu, inside ggml-cuda's
# patched tree) on a machine without a GPU or nvcc: clang-14 in CUDA mode, syntax only
# (host and device code), against CUDA 11.8's headers from PyPI's nvidia-*-cu11 wheels.
# Not a build: it catches what the compiler catches (names, types, signatures), nothing that
# runs. The GPU host still builds and tests (bench/gpu/h200.sh cuda).
#
#   bash scripts/check_cuda_syntax.sh      # ~1 min the first time (downloads ~700 MB), then seconds
#
# Verified 2026-12-05: a clean ggrad.cu passes; a syntax error fails. Why these versions:
# clang-14's CUDA wrapper needs the texture templates CUDA 12 removed, and its sm_80
# intrinsics lack __reduce_add_sync, so the check compiles for sm_75; CUDA 11.8's
# host_defines.h makes __noinline__ an attribute that breaks libstdc++ 12 under clang,
# so the cached copy defines it empty.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${GGRAD_CACHE:-$HOME/.cache/ggrad}"
VENV="$ROOT/.venv"
TK="$CACHE/cuda-syntax-11.8"
log() { echo "[check_cuda_syntax] $*" >&2; }

command -v clang++-14 >/dev/null || { log "installing clang-14"; DEBIAN_FRONTEND=noninteractive apt-get install -y -q clang-14 >/dev/null; }
if [ ! -f "$TK/.complete" ]; then
  log "fetching CUDA 11.8 headers (nvidia-*-cu11 wheels) into $TK"
  rm -rf "$TK.tmp"; mkdir -p "$TK.tmp/wheels" "$TK.tmp/include" "$TK.tmp/bin" "$TK.tmp/lib64"
  "$VENV/bin/pip" download -q --no-deps --only-binary :all: -d "$TK.tmp/wheels" "nvidia-cuda-runtime-cu11==11.8.89" \
    "nvidia-cublas-cu11==11.11.3.6" "nvidia-curand-cu11==10.3.0.86" "nvidia-cuda-nvcc-cu11==11.8.89" >&2
  "$VENV/bin/python" - "$TK.tmp" <<'EOF'
import glob, os, shutil, sys, zipfile
out = sys.argv[1]
for wheel in glob.glob(os.path.join(out, "wheels", "*.whl")):
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            parts = name.split("/")
            if "include" in parts:
                dest = os.path.join(out, "include", *parts[parts.index("include") + 1:])
            elif "nvvm" in parts:
                dest = os.path.join(out, "nvvm", *parts[parts.index("nvvm") + 1:])
            else:
                continue
            if name.endswith("/"):
                continue
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with z.open(name) as src, open(dest, "wb") as dst:
                shutil.copyfileobj(src, dst)
path = os.path.join(out, "include", "crt", "host_defines.h")
text = open(path).read()
old = "#define __noinline__ \\\n        __attribute__((noinline))"
assert old in text, "host_defines.h changed: update scripts/check_cuda_syntax.sh"
open(path, "w").write(text.replace(old, "#define __noinline__"))
EOF
  echo "CUDA Version 11.8.89" >"$TK.tmp/version.txt"
  rm -rf "$TK.tmp/wheels" "$TK"; touch "$TK.tmp/.complete"; mv "$TK.tmp" "$TK"
fi

src="$(mktemp -d)"
trap 'rm -rf "$src"' EXIT
sdist="$(ls "$ROOT"/.wheels/ggml_python-*.tar.gz 2>/dev/null | head -1)"
if [ -z "$sdist" ]; then
  "$VENV/bin/pip" download -q --no-deps --no-binary :all: -d "$src" ggml-python==0.0.45 >&2
  sdist="$src/ggml_python-0.0.45.tar.gz"
fi
tar xzf "$sdist" -C "$src"
tree="$(ls -d "$src"/ggml_python-*/ | head -1)"
"$VENV/bin/python" "$ROOT/scripts/patch_ggml_adamw.py" "$tree" >/dev/null
"$VENV/bin/python" "$ROOT/scripts/patch_ggml_kernels.py" "$tree" >/dev/null
cd "$tree/vendor/ggml/src"
clang++-14 -x cuda --cuda-path="$TK" --cuda-gpu-arch=sm_75 -fsyntax-only -std=c++17 -Wno-unknown-cuda-version \
  -I. -I../include -Iggml-cuda ggml-cuda/ggrad.cu ggml-cuda/binbcast.cu ggml-cuda/cpy.cu ggml-cuda/im2col.cu ggml-cuda/softmax.cu ggml-cuda/unary.cu ggml-cuda/ggml-cuda.cu
log "ggml-cuda/ggrad.cu, binbcast.cu (REPEAT_BACK), cpy.cu (casts, rows), im2col.cu (rows), softmax.cu (rows), unary.cu (four a thread), ggml-cuda.cu (dispatch): no compile errors (syntax and types, host and device)"
