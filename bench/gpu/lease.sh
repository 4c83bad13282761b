#!/usr/bin/env bash
# One device lease's three calls, each within the tool's 10 minutes, results packed into one
# file under $OUT (the tool brings back at most 8 files). Prepare here first:
#   GGRAD_GLSLC_SUITE=forky bash bench/gpu/carry.sh vulkan    # the Vulkan wheel (~8 min)
# then call, back to back (a machine idle for 30 s is given back, and the CUDA wheel with it):
#   bash bench/gpu/lease.sh tests     carry [".wheels", ".whl", ".gl"]: Vulkan tests while
#                                     the CUDA wheel builds, then CUDA's kernel tests
#   bash bench/gpu/lease.sh vulkan    Vulkan benchmarks, quiet; ggrad's Vulkan GEMM A/B, LoRA (set 41)
#   bash bench/gpu/lease.sh cuda      CUDA benchmarks (the bf16 block with and without set 43's casts)
#                                     and kernel profiles
set -uo pipefail
phase="$1"
R=/tmp/lease-$phase; mkdir -p "$R"; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
# the CUDA wheel where h200.sh looks for it (keyed by the patches); a machine given back loses it
cuda_wheel() {
  local w=/tmp/cudawheel-$(cat scripts/patch_ggml_*.py scripts/ggml_kernels/* | md5sum | cut -c1-8)
  ls $w/*.whl >/dev/null 2>&1 || GGML_NO_BUILD_ISOLATION=1 bash scripts/build_cuda.sh .wheels/ggml_python-0.0.45.tar.gz \
    $w > "$R/build.log" 2>&1
  echo "CUDA wheel: rc $? at $(el) s" > "$R/build.done"
}
case "$phase" in
  tests)
    cuda_wheel &
    OUT=$R/v1 TESTS="tests/test_amp.py tests/test_kernels.py tests/test_quantized.py" TEST_WORKERS=4 TEST_SECONDS=180 bash bench/gpu/h200.sh vulkan tests-only
    left=$(( 330 - $(el) )); [ $left -gt 60 ] && OUT=$R/v2 TEST_WORKERS=8 TEST_SECONDS=$left bash bench/gpu/h200.sh vulkan tests-only
    while [ ! -f "$R/build.done" ] && [ "$(el)" -lt 420 ]; do sleep 5; done
    cat "$R/build.done" 2>/dev/null || echo "CUDA build not done at $(el) s"
    [ -f "$R/build.done" ] && OUT=$R/c1 TESTS="tests/test_kernels.py tests/test_amp.py tests/test_quantized.py" TEST_WORKERS=6 \
      TEST_SECONDS=$(( 500 - $(el) )) bash bench/gpu/h200.sh cuda tests-only ;;
  vulkan)
    OUT=$R/medium BLOCKS=5 BLOCK_PRECISION=medium BENCHES="block-bf16" timeout 90 bash bench/gpu/h200.sh vulkan bench-only
    # the GEMM shader (every float32 product below "medium") against ggml's products, same process
    OUT=$R/rest BLOCKS=5 WITHOUT=GEMM BENCHES="train-high" timeout 110 bash bench/gpu/h200.sh vulkan bench-only
    OUT=$R/rest2 BLOCKS=5 BENCHES="lora cnn adam" \
      timeout $(( 450 - $(el) )) bash bench/gpu/h200.sh vulkan bench-only ;;
  cuda)
    cuda_wheel  # at once where the tests phase built it on this machine; ~5 min on a fresh one
    OUT=$R/block BLOCKS=5 BENCHES="block-bf16" WITHOUT=cast_x4 timeout 90 bash bench/gpu/h200.sh cuda bench-only
    left=$(( 330 - $(el) )); [ $left -lt 60 ] && left=60  # the benchmarks shrink where the wheel was built here
    OUT=$R/bench BLOCKS=5 BENCHES="train-high cnn-high train-highest" timeout $left bash bench/gpu/h200.sh cuda bench-only
    export PYTHONPATH=/tmp/ggml-cuda:/tmp/site:src GGRAD_UNVERIFIED_KERNELS=1
    # kernel by kernel (PDL on and off gave the same times at set 42: one run now)
    timeout 70 python3 bench/profile_step.py --device cuda --model block --block-batch 32 --amp bf16 --kernels \
      > "$R/profile-block.txt" 2>&1
    left=$(( 450 - $(el) ))
    [ $left -gt 30 ] && timeout $left python3 bench/profile_step.py --device cuda --model resnet --kernels > "$R/profile-resnet.txt" 2>&1 ;;
  *) echo "usage: bash bench/gpu/lease.sh tests|vulkan|cuda"; exit 2 ;;
esac
echo "$phase done at $(el) s"
tar czf "${OUT:-/tmp/out}/lease-$phase.tgz" -C "$R" .
