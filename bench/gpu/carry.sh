#!/usr/bin/env bash
# The git-ignored folders a device call carries for bench/gpu/h200.sh, made on a fresh
# machine (each call names them: carry [".wheels", ".whl", ".gl"]):
#   .whl     wheels the GPU host lacks (gguf, pytest-xdist and its execnet, tensorboardX)
#   .wheels  ggml-python's sdist (the host builds its CUDA wheel from it)
#   .gl      the Vulkan loader packages (the device tool's README)
#   bash bench/gpu/carry.sh          # ~1 min
#   bash bench/gpu/carry.sh vulkan   # also a GGML_NATIVE=OFF Vulkan wheel into .wheels (~7 min;
#                                    # the native one is reinstalled after)
#   GGRAD_GLSLC_SUITE=forky bash bench/gpu/carry.sh vulkan   # its shaders by Debian 14's glslc:
#                                    # bfloat16 matrix cores (scripts/bootstrap.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl .wheels .gl /tmp/amd64/partial
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  gguf==0.17.1 pytest-xdist==3.6.1 execnet==2.1.1 tensorboardX==2.6.2.2
python3 -m pip download -q --no-deps --no-binary :all: -d .wheels ggml-python==0.0.45
apt=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64)
apt-get "${apt[@]}" update >/dev/null
(cd .gl && apt-get "${apt[@]}" download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
if [ "${1:-}" = vulkan ]; then
  rm -f .wheels/ggml_python-*.whl
  GGRAD_PORTABLE=1 GGRAD_BACKEND=vulkan bash scripts/bootstrap.sh
  suffix=$(ROOT=$PWD; eval "echo $(sed -n 's/^PATCH_SUFFIX=//p' scripts/bootstrap.sh)")  # it hashes the patches
  suite="${GGRAD_GLSLC_SUITE:-trixie}"
  shaders="coopmat$([ "$suite" = trixie ] || echo "-$suite")"
  flavor=$(sed -n 's/^FLAVOR_SUFFIX="\(.*\)"/\1/p' scripts/bootstrap.sh)
  cp "${GGRAD_CACHE:-$HOME/.cache/ggrad}"/wheels/vulkan-portable-"$shaders-$flavor-$suffix"/ggml_python-*.whl .wheels/
  bash scripts/bootstrap.sh
fi
ls -la .whl .wheels .gl
