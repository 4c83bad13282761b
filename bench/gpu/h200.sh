#!/usr/bin/env bash
# What ran on the H200 host for docs/performance.md (device tool; no registry there).
#   bash bench/gpu/h200.sh vulkan   # tests + benchmarks on ggml's Vulkan backend
#   bash bench/gpu/h200.sh cuda     # build the CUDA wheel (scripts/build_cuda.sh), tests + benchmarks
#   (a second argument `tests-only` stops after the tests, `bench-only` skips them)
# Expects, carried: .wheels/ (the sdist; a GGML_NATIVE=OFF Vulkan wheel built on Debian 12),
# .whl/ (pytest's wheels), .gl/ (Vulkan loader debs): bench/gpu/carry.sh [vulkan] makes them.
set -uo pipefail
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
mode="$1"; shift || true
case "$mode" in
  vulkan)
    for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/ggml-vulkan .wheels/ggml_python-*.whl
    ;;
  cuda)
    t0=$(date +%s)
    # no registry here: pip builds with the host's scikit-build-core and cmake
    # keyed by the patches: a warm host may hold one built from older ones. The wheel (90 MB)
    # is too large to come back under $OUT: a call within 30 s of the last reuses it
    wheel=/tmp/cudawheel-$(cat scripts/patch_ggml_*.py scripts/ggml_kernels/* | md5sum | cut -c1-8)
    ls $wheel/ggml_python-*.whl >/dev/null 2>&1 || GGML_NO_BUILD_ISOLATION=1 bash scripts/build_cuda.sh .wheels/ggml_python-0.0.45.tar.gz $wheel > /tmp/build.log 2>&1 || { cp /tmp/build.log "$OUT/"; tail -30 /tmp/build.log; exit 1; }
    echo "cuda wheel ready after $(( $(date +%s) - t0 )) s"
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/ggml-cuda $wheel/ggml_python-*.whl
    ;;
esac
export PYTHONPATH=/tmp/ggml-$mode:/tmp/site:src
export GGRAD_UNVERIFIED_KERNELS=1  # try the kernels not yet run on such a device (runtime/kernels.py UNVERIFIED)
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
python3 -m ggrad info 2>&1 | grep -v "^ggrad.ggml"  # devices, Vulkan matrix cores and shader families
# scikit-learn is not on the GPU host: its tests and the digits run stay on the CPU machines
skip=$(python3 -c "import sklearn" 2>/dev/null || echo "--ignore=tests/test_sklearn.py --ignore=tests/test_train.py")
# TESTS: the test files to run (default: all); each step is time-boxed so that a device
# call's 10 minutes always bring back the build, the tests and the benchmarks that ran
if [ "${1:-}" != bench-only ]; then
  # --capture=sys: a ggml assert's message (C's stderr) reaches the log before the abort
  timeout "${TEST_SECONDS:-300}" python3 -m pytest -v ${TEST_WORKERS:+-n $TEST_WORKERS --dist loadfile} -p no:cacheprovider --capture=sys -rfE --tb=short ${PYTEST_ARGS:-} $skip ${TESTS:-tests} \
    -k "$mode or not (cpu or vulkan or cuda)" 2>&1 | tee "$OUT/tests-$mode.txt" | tail -15
  tested=${PIPESTATUS[0]}
fi
[ "${1:-}" = tests-only ] && exit "${tested:-0}"
# BENCHES: the names below to run (default: all), e.g. BENCHES="train-high cnn lora"
bench() { local name="$1" seconds="$2"; shift 2
  [ -n "${BENCHES:-}" ] && [[ " $BENCHES " != *" $name "* ]] && return
  timeout "$seconds" python3 "$@" 2>&1 | grep -v "graph warmup" | tee "$OUT/$name-$mode.txt"; }
blocks="--blocks ${BLOCKS:-15}"  # timed blocks of train_step.py (fewer: a shorter run)
graph=--cuda-graph  # PyTorch runs on CUDA beside either backend: its CUDA graph is the bar
# issue 13's rows: ggrad "high" (TF32 allowed) against PyTorch with TF32, bf16 autocast on
# both sides, the transformer block, Adam's bandwidth
# WITHOUT="GEMM ADAMW_GROUP": also ggrad with those kernels refused, in the same process (an A/B)
without=${WITHOUT:+--without $WITHOUT}
# SYNCHRONOUS=1: also ggrad with every graph compute waiting for the device (runtime/streams.py)
without="$without ${SYNCHRONOUS:+--synchronous}"
bench train-high 100 bench/train_step.py --device "$mode" --torch-device cuda --precision high \
  --models mlp-small mlp-mnist mlp-large $graph $blocks $without
# BLOCK_PRECISION=medium: the block with Vulkan's matrix cores on (ggrad turns them off below "medium")
bench block-bf16 80 bench/train_step.py --device "$mode" --torch-device cuda --precision "${BLOCK_PRECISION:-high}" --amp bf16 \
  --models block $graph $blocks $without
# issue 28's rows: the 2-conv cnn and the ResNet-18 layout, against PyTorch eager and its
# CUDA graph (fp32 "highest"), then the ResNet in bf16 autocast
bench cnn 100 bench/train_step.py --device "$mode" --torch-device cuda --models cnn resnet $graph --blocks 3 --steps 10 $without
bench cnn-high 100 bench/train_step.py --device "$mode" --torch-device cuda --precision high --models cnn resnet \
  $graph --blocks 3 --steps 10 $without
bench resnet-bf16 80 bench/train_step.py --device "$mode" --torch-device cuda --precision high --amp bf16 \
  --models resnet $graph --blocks 3 --steps 10
bench train-bf16 80 bench/train_step.py --device "$mode" --torch-device cuda --precision high --amp bf16 \
  --models mlp-mnist mlp-large $graph $blocks
bench adam 60 -X faulthandler bench/adam_only.py --device "$mode" --torch-device cuda --sizes 1e6 1e8
bench word-lm 60 bench/word_lm.py --device "$mode" --torch-device cuda --blocks 5   # the LSTM language model
# issue 31's row: LoRA over a 100M-parameter Q4_K llama, tokens/s beside PyTorch on the float weights
# (CUDA's quantized backward is kernel set 22's, untested on a device when written: LORA_DTYPE=q8_0
# reads rows with ggml's GET_ROWS instead, if it fails)
bench lora 120 bench/lora_tokens.py --device "$mode" --torch-device cuda --blocks 5 --steps 3 --dtype "${LORA_DTYPE:-q4_k}"
# ggml-vulkan's own GPU time per op (GGML_VK_PERF_LOGGER: timestamps around each node,
# summed over 10 graph computes): where a Vulkan step's time goes, e.g. BENCHES="vk-perf-mlp vk-perf-block vk-perf-resnet"
if [ "$mode" = vulkan ]; then
  GGML_VK_PERF_LOGGER=1 GGML_VK_PERF_LOGGER_FREQUENCY=10 bench vk-perf-mlp 60 bench/train_step.py --device vulkan \
    --torch-device cuda --precision high --models mlp-large --blocks 1 --steps 20 --warmup 2
  GGML_VK_PERF_LOGGER=1 GGML_VK_PERF_LOGGER_FREQUENCY=10 bench vk-perf-block 90 bench/train_step.py --device vulkan \
    --torch-device cuda --precision high --amp bf16 --models block --blocks 1 --steps 20 --warmup 2
  GGML_VK_PERF_LOGGER=1 GGML_VK_PERF_LOGGER_FREQUENCY=10 bench vk-perf-resnet 90 bench/train_step.py --device vulkan \
    --torch-device cuda --models resnet --blocks 1 --steps 10 --warmup 1
fi
bench train-highest 80 bench/train_step.py --device "$mode" --torch-device cuda --models mlp-small mlp-mnist mlp-large \
  --eager $graph $blocks
