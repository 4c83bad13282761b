#!/usr/bin/env bash
# Two device calls back to back (carry [".wheels", ".whl", ".gl"]; a machine idle for 30 s is
# given back, and the CUDA wheel with it). Each result is written under $OUT as it finishes.
#   bash bench/gpu/session.sh vulkan   the CUDA wheel builds in the background while the Vulkan
#                                      questions run; returns once the wheel is built
#     lora.txt / ops-lora.txt          the LoRA q4_0/q5_1 failure on NVIDIA Vulkan (vulkan_probe.sh's first items)
#     conv-gemm.txt                    cnn and ResNet, ggrad's GEMM shader against ggml's mul_mat (Vulkan)
#   bash bench/gpu/session.sh cuda     sets 43-44's CUDA variants checked and timed
#     tests-cuda.txt                   the casts (cast_x4) and convolutions (im2col_rows) against torch
#     conv-cuda.txt                    cnn and ResNet at "high" with and without im2col_rows and fold_rows, same process
#     block-cuda.txt                   the bf16 block with and without cast_x4
#     host-path-cuda.txt               mlp-small at "high": queued, waited for, host path alone (bench/gpu/host_path.py)
#     profile-mlp-small.txt            its CUDA kernels
#     kernels-cuda.txt                 test_kernels on CUDA with every unverified variant on
#   bash bench/gpu/session.sh lean     one call of ~330 s on a fresh machine: Vulkan's quantized
#                                      tests (LoRA, gguf), the Vulkan cnn/ResNet, CUDA's small MLPs;
#                                      then (~160 s more) CUDA profiles of the ResNet and the bf16 block
#   bash bench/gpu/session.sh set45    ~480 s: set 45 (fold by bands, rows copies) and ops.cont's
#                                      transposes tested on CUDA, then timed with and without
#   bash bench/gpu/session.sh set45c   ~540 s: the fold without divisions (CUDA), the ResNet at "high" (with
#                                      and without fold_rows), "highest" and bf16,
#                                      and where the bf16 block's step goes now
#   bash bench/gpu/session.sh set46    ~580 s: set 46's autocast GEMM (gemm_low) tested on CUDA, the bf16
#                                      block and ResNet timed with and without it, the block's profile;
#                                      Vulkan's mlp-large at "medium" while the wheel builds
#   bash bench/gpu/session.sh set46b   ~300 s: the GEMM's batches over two axes in one call (CUDA), tested, the
#                                      bf16 and float32 blocks and the bf16 ResNet timed, the bf16 block's profile
#   bash bench/gpu/session.sh set46c   ~240 s: IM2COL's bfloat16 columns (im2col_low) tested on CUDA, the bf16
#                                      ResNet timed with and without them
#   bash bench/gpu/session.sh set47    ~560 s: set 47's small products (gemm_small) and the input gradients as
#                                      convolutions tested on CUDA, the MLPs, cnn, ResNet and bf16 block timed
#                                      with and without them; Vulkan's cnn and ResNet with them while it builds
#   bash bench/gpu/session.sh set47b   ~500 s: BatchNorm's bookkeeping in place (running_count) tested on CUDA,
#                                      the ResNet timed with and without it (and the input gradients as
#                                      convolutions), its bf16 profile, the cnn
#   bash bench/gpu/session.sh set47c   ~420 s: set 47 on the Vulkan device (its wheel carried in .wheels: batch
#                                      norm's bookkeeping tested and timed), then CUDA's im2col_x4 tested and
#                                      the ResNet timed with and without it
#   bash bench/gpu/session.sh set47d   ~400 s: CUDA's row sums as products timed (the bf16 block, mlp-large); the
#                                      Vulkan ResNet's and mlp-large's ("medium") steps op by op while it builds
#   bash bench/gpu/session.sh set47e   ~290 s: the ResNet (bf16 and "high") with every layer's product per image
#                                      against the rows layout for the deep layers
#   bash bench/gpu/session.sh set48    ~420 s: set 48's wide GEMM tiles on the Vulkan device (its wheel carried in
#                                      .wheels): tested, each product shape timed every way
#                                      (bench/gpu/vulkan_gemm.py), the cnn, ResNet and MLPs with and without
#                                      them, the ResNet op by op
#   bash bench/gpu/session.sh set48b   ~450 s (~200 s after set48 on a warm machine): CUDA's bias in cuBLASLt's
#                                      epilogue tested, the bf16 block and the MLPs timed with and without
#                                      it, the block's kernels with programmatic dependent launch off and on
#   bash bench/gpu/session.sh set48c   ~400 s: Vulkan's products in parts up to 63 tiles tested and timed (cnn,
#                                      ResNet, the weight gradients' shapes), mlp-large's products at
#                                      "medium"; CUDA's bias epilogue on the bf16 block's large products;
#                                      the Vulkan ResNet again
#   bash bench/gpu/session.sh set48d   ~560 s: set 48's rows for issues 25, 28, 29: Vulkan's mlp-large at "medium"
#                                      (timed, op by op), CUDA's ResNet, cnn, MLPs and bf16 block at
#                                      "high", "highest" and bf16, Adam alone
#   bash bench/gpu/session.sh set48e   ~100 s: Vulkan's MLPs at "medium", batches on the device against uploaded
#   bash bench/gpu/session.sh set48f   ~300 s: every Vulkan test of the suite on the device
#   bash bench/gpu/session.sh set48g   ~80 s: the cross-entropy tests on the Vulkan device (its gradient's stride 0)
#   bash bench/gpu/session.sh set49    ~450 s: the optimizer's kept step tested on CUDA and the Vulkan device, Adam
#                                      alone timed on both; the cross-entropy gradient's stride 0 tested on CUDA,
#                                      the MLPs at "high" with and without it
#   bash bench/gpu/session.sh set49b   ~560 s: set 49's products without split K tested on CUDA and the MLPs timed
#                                      with and without them, the bias epilogue on every product, the block;
#                                      the kept step's and capture's tests on the Vulkan device
#   bash bench/gpu/session.sh set49c   ~500 s: set 49 as it lands tested on CUDA; issue 25's MLP rows in two
#                                      processes and with a second copy of the step, Adam alone, the bf16 block
#   bash bench/gpu/session.sh set49d   ~320 s: the tree as it lands tested on CUDA and the Vulkan device, the MLPs
#                                      at "high" and Adam once more
#   bash bench/gpu/session.sh set49e   ~450 s: cuBLASLt's alignment capped at 16, tested on CUDA (capture's eager
#                                      and compiled steps bit for bit), the MLPs with and without set 49's paths,
#                                      the bf16 block timed and its kernels listed
#   bash bench/gpu/session.sh set50    ~420 s: set 50's softmax tested, the accumulation probe, the bf16 block A/B
#                                      and its kernels
#   bash bench/gpu/session.sh set50b   ~300 s: set 50's relu tested, the accumulation probe without CUDA graphs and
#                                      with cuBLAS's workspace fixed, the bf16 block A/B, mlp-small and mlp-mnist
#   bash bench/gpu/session.sh set50c   ~250 s: set50b cut short (relu tested, the probe without CUDA graphs, the block A/B)
#   bash bench/gpu/session.sh set54    ~500 s: cast_relu's mended test, the block budgets, the replay's host path and
#                                      stable addresses tested on CUDA; the MLPs at "high" holding their losses with
#                                      and without stable addresses, mlp-small's host path profiled, the bf16 block A/B
#   bash bench/gpu/session.sh set54b   ~330 s: cast_relu's test (NaN as NaN) and stable addresses' moved-out results
#                                      tested on CUDA; the MLPs with and without stable addresses, held and dropped losses
#   bash bench/gpu/session.sh set56b   ~330 s: results in two buffers taken in turn (a twin graph each) tested on CUDA;
#                                      the MLPs held and dropped, in blocks of 20 and 300; the host path, held and dropped
#   bash bench/gpu/session.sh set57    ~400 s: mlp-small's step alone and in turn with PyTorch's CUDA graph (host_path.py
#                                      --beside-torch), set56b's rows again; Vulkan's mlp-large (issue 29's row),
#                                      capture's tests on both devices
#   bash bench/gpu/session.sh set58    ~280 s: Vulkan's mlp-large at "medium" with ggml-vulkan's graphs left running
#                                      (train_step.py --asynchronous then, --synchronous since kernel set 56); mlp-small's step by its place in blocks of 20 on
#                                      CUDA, alone and after PyTorch's (host_path.py --block-start), the MLP rows,
#                                      capture's tests
#   bash bench/gpu/session.sh set59    ~480 s: what the tenth session left unrun on a GPU: Vulkan's suite and rows (cnn,
#                                      ResNet, bf16 block, mlp-large) with its graphs left running against waiting;
#                                      on CUDA the optimizer's watched dicts tested, mlp-small by place in a block of 20,
#                                      the MLP rows
#   bash bench/gpu/session.sh set60    ~480 s: Vulkan's products over float16 operands cast once (NV_coopmat2): the
#                                      bit-equality test, mlp-large at "medium" with and without; then set59's CUDA part
#   (sets 61, 62 and 64 time uploads to an idle CUDA device queued: `git revert 6830884` first, or branch idle-uploads)
#   bash bench/gpu/session.sh set61    ~420 s: set60 in more blocks (Vulkan float16 operands, float32 sums), the MLP
#                                      rows with and without uploads to an idle CUDA device queued
#   bash bench/gpu/session.sh set62    ~280 s: set61's Vulkan A/Bs on the device, the streams' tests on CUDA, one MLP A/B
#   bash bench/gpu/session.sh set63    ~140 s: set62's Vulkan A/Bs alone (no CUDA build)
#   bash bench/gpu/session.sh set64    ~540 s: kernel set 54 and idle-device uploads on CUDA (tests, MLP A/Bs), set63 before
#   bash bench/gpu/session.sh set65    ~430 s: set64 without the idle-upload A/B and the held losses
#   bash bench/gpu/session.sh set66    ~330 s: CUDA only: kernel sets 54-55's tests and MLP A/B
#   bash bench/gpu/session.sh set67    ~170 s: Vulkan only: sets 54-55's and NV_coopmat2's tests, set63's rows
#   bash bench/gpu/session.sh set68    ~260 s: CUDA: mlp-small beside a twin of itself (--again), two processes
#   bash bench/gpu/session.sh set69    ~380 s: CUDA: the MLP rows under the balanced order, each runner's time by the
#                                      runner before it; mlp-small's host time by place after PyTorch's graph and eager
#   bash bench/gpu/session.sh set70    ~230 s: CUDA: mlp-small's host path by block place under cProfile, alone and
#                                      after each of PyTorch's runners
#   bash bench/gpu/session.sh set71    ~240 s: Vulkan only (kernel set 56): graphs left running after a barrier, its
#                                      tests, ten draws in fresh processes, mlp-large with and without (--synchronous)
#   bash bench/gpu/session.sh set72    ~360 s: the device generator's new step and graphs left running on Vulkan and
#                                      CUDA: their tests, ten draws in fresh processes, the MLP rows
#   bash bench/gpu/session.sh set73    ~300 s: CUDA: one upload a replay: its tests, a block's first step by phase, MLP rows
#   bash bench/gpu/session.sh set74    ~380 s: CUDA: the bf16 block's step node by node and kernel by kernel, beside
#                                      PyTorch's CUDA graph's kernels of the same step; the block's row
#   bash bench/gpu/session.sh set75    ~580 s: CUDA: kernel set 57 (attention's weights written low under autocast, their
#                                      gradient from the rows' statistics, products written low where only their
#                                      cast reads them) tested, the bf16 block with and without it, the block's
#                                      kernels beside PyTorch's
#   bash bench/gpu/session.sh set75s   ~430 s: set75 cut short: the tests and the block with and without set 57
#   bash bench/gpu/session.sh set75t   ~340 s: set75s cut further: set 57's own tests, the block A/B in 3 blocks
#   bash bench/gpu/session.sh set75u   ~290 s: set 57's own tests alone on CUDA
#   bash bench/gpu/session.sh set76    ~520 s: set 58 (products written at their copies' strides) tested on
#                                      CUDA, the bf16 block with and without it in one process, its kernels
#   bash bench/gpu/session.sh set79    ~320 s: set 58's strided products tested on CUDA with convolutions,
#                                      permuted copies and the launch fuzzer
#   bash bench/gpu/session.sh set80    ~480 s: set 58's binary_x4 and silu_back_x4 tested on CUDA, with
#                                      set79's tests; the bf16 block with and without them, its kernels
#   bash bench/gpu/session.sh set81    ~560 s: set 59's attention kernels as ggml ops on CUDA, their tests, the
#                                      bf16 block with and without them, its kernels
#   bash bench/gpu/session.sh set83    ~440 s: set 60's attention kernels' tests again (with test_amp), the block again
#   bash bench/gpu/session.sh set82    ~560 s: set 60's attention kernels in the probe against set 59's
#                                      (with ncu's counters), then as set81
#   bash bench/gpu/session.sh set81p   ~90 s: the kernels alone against float64, timed (attention_probe.cu), with
#                                      ptxas' registers and with more blocks a multiprocessor, and ncu's counters of each kernel
#   bash bench/gpu/session.sh set58v   ~110 s: set58's Vulkan A/B alone (no CUDA build)
#   bash bench/gpu/session.sh lt_probe ~40 s: cuBLASLt's bias-gradient epilogue (BGRADB) per type and layout
#   bash bench/gpu/session.sh parts    ~90 s: Vulkan's products in parts alone
#   bash bench/gpu/session.sh vkprof   ~150 s: the Vulkan cnn and ResNet op by op (GGML_VK_PERF_LOGGER)
set -uo pipefail
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
export PYTHONUNBUFFERED=1 GGRAD_UNVERIFIED_KERNELS=1
wheel=/tmp/cudawheel-$(cat scripts/patch_ggml_*.py scripts/ggml_kernels/* | md5sum | cut -c1-8)
vk() { PYTHONPATH=/tmp/ggml-vulkan:/tmp/site:src VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json "$@"; }
cu() { PYTHONPATH=/tmp/ggml-cuda:/tmp/site:src "$@"; }
# the CUDA wheel of this tree's kernels (~250 s on 16 cores), unless this machine has it
build_cuda_in_background() {
  rm -f /tmp/build.done  # a warm machine's earlier build says nothing of this tree's
  # niced: the timings that run meanwhile (set 48's Vulkan products moved 2x beside a build at full priority)
  ( ls $wheel/*.whl >/dev/null 2>&1 || GGML_NO_BUILD_ISOLATION=1 nice -n 19 bash scripts/build_cuda.sh \
      .wheels/ggml_python-0.0.45.tar.gz $wheel > /tmp/build.log 2>&1; echo "rc $? at $(el) s" > /tmp/build.done ) &
}
# waits for it until $1 s into the call; false (and says so) where it is not built by then
cuda_wheel_installed() {
  while [ ! -f /tmp/build.done ] && [ "$(el)" -lt "$1" ]; do sleep 3; done
  cat /tmp/build.done 2>/dev/null || { echo "CUDA build not done at $(el) s"; tail -20 /tmp/build.log; return 1; }
  python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/ggml-cuda $wheel/ggml_python-*.whl
}
# the attention probe (bench/gpu/attention_probe.cu) built against each "name:dir:flags" given
# (dir holding a ggrad_attention.cuh; skipped where it does not), in parallel, each run into
# $OUT/attention-probe-<name>.txt; then ncu's counters of each kernel of the first at the block's
# shape, into $OUT/attention-ncu.txt
attention_probes() {
  local spec name dir flags names=""
  for spec in "$@"; do
    IFS=: read -r name dir flags <<< "$spec"
    [ -f "$dir/ggrad_attention.cuh" ] || { echo "probe $name: no $dir/ggrad_attention.cuh"; continue; }
    names="$names $name"
    nvcc -O3 -std=c++17 -arch=sm_90 $flags -I "$dir" -I bench/gpu bench/gpu/attention_probe.cu -o /tmp/attention_probe_$name &
  done
  wait
  for name in $names; do
    /tmp/attention_probe_$name > $OUT/attention-probe-$name.txt 2>&1
    echo "probe $name:"; grep "ms a call\|all ok\|FAILED" $OUT/attention-probe-$name.txt
  done
  set -- $names
  timeout 120 ncu --kernel-name regex:ggrad_attn --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section InstructionStats /tmp/attention_probe_$1 once > $OUT/attention-ncu.txt 2>&1
  grep -i "^  ggrad_attn\|Duration\|Registers Per\|Achieved Occupancy\|Compute (SM) Th\|Memory Th\|error" \
    $OUT/attention-ncu.txt | head -40
}
# the attention kernels as ggml ops once the wheel (build_cuda_in_background) is in: their test
# and the attention tests, the bf16 block with and without them in one process, its kernels in
# the time left
attention_ops() {
  python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
  cuda_wheel_installed 420 || return 1
  cuda_tests 90 "one_kernel_each_way or attention" tests/test_kernels.py tests/test_attention.py
  grep "^FAILED\|^E  " $OUT/tests-cuda.txt | head -20
  echo "tests at $(el) s"
  cu timeout 75 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 \
    --models block --cuda-graph --blocks 4 --without ATTENTION > $OUT/block-cuda.txt 2>&1
  grep "CUDA graph\|without\|eager\|losses" $OUT/block-cuda.txt
  echo "block at $(el) s"
  [ "$(el)" -lt 560 ] && cu timeout $(( 595 - $(el) )) python3 bench/profile_step.py --device cuda --model block \
    --block-batch 32 --amp bf16 --precision high --kernels --top 45 > $OUT/profile-block.txt 2>&1
  echo "done at $(el) s"
}
# the tests on device $1 (cuda or vulkan) of the files $4... matching $3 (in $2 s at most), into
# tests-$1.txt
device_tests() {
  local kind=$1 limit=$2 filter=$3 run=cu workers=6
  shift 3
  [ "$kind" = vulkan ] && run=vk workers=4
  $run timeout "$limit" python3 -m pytest -q -n $workers -p no:cacheprovider --tb=short "$@" -k "$kind and ($filter)" \
    > $OUT/tests-$kind.txt 2>&1
  echo "$kind tests at $(el) s: $(tail -1 $OUT/tests-$kind.txt)"
}
cuda_tests() { device_tests cuda "$@"; }
# mlp-small and mlp-mnist at "high" against PyTorch's CUDA graph into $OUT/$1, in $2 s at most,
# train_step.py's further arguments after them
mlps() {
  local out=$1 limit=$2
  shift 2
  cu timeout "$limit" python3 bench/train_step.py --device cuda --torch-device cuda --precision high \
    --models mlp-small mlp-mnist --cuda-graph --blocks 5 "$@" > $OUT/$out 2>&1
}
vulkan_tests() { device_tests vulkan "$@"; }
# the CUDA wheel building in the background while the Vulkan device is set up beside it
both_devices() {
  build_cuda_in_background
  python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
  setup_vulkan
}
setup_vulkan() { OUT=/tmp/setup BENCHES=none bash bench/gpu/h200.sh vulkan bench-only > $OUT/setup-vulkan.txt 2>&1; }
# Vulkan's kernel and convolution tests matching $1, then the cnn and ResNet timed with and
# without $2 (in $3 s at most)
vulkan_conv_ab() {
  vk timeout 60 python3 -m pytest -q -n 4 -p no:cacheprovider --tb=short tests/test_kernels.py tests/test_conv.py \
    -k "vulkan and ($1)" > $OUT/tests-vulkan.txt 2>&1
  echo "vulkan tests at $(el) s: $(tail -1 $OUT/tests-vulkan.txt)"
  vk timeout $3 python3 bench/train_step.py --device vulkan --torch-device cuda --models cnn resnet --blocks 2 \
    --steps 4 --without $2 > $OUT/conv-vulkan.txt 2>&1
  echo "conv-vulkan at $(el) s"
}
# ~90 s: Vulkan's few-tile products summed in parts, tested, timed against without, op by op
vulkan_parts() {
  setup_vulkan
  vulkan_conv_ab "long_sums or budget or products or test_equals_torch" gemm_parts 80
  vk env GGML_VK_PERF_LOGGER=1 GGML_VK_PERF_LOGGER_FREQUENCY=10 timeout 40 python3 bench/gpu/vulkan_ops.py \
    --model resnet > $OUT/vulkan-ops-resnet.txt 2>&1
}
# ~30 s: autocast's products and attention tested on CUDA, then the bf16 block with and without gemm_low
autocast_on_cuda() {
  cu timeout 90 python3 -m pytest -q -n 6 -p no:cacheprovider --tb=short tests/test_amp.py tests/test_attention.py \
    tests/test_kernels.py -k "cuda and (autocast or amp or attention or mha or sdpa or budget or products or transformer)" \
    > $OUT/tests-cuda.txt 2>&1
  echo "cuda tests at $(el) s: $(tail -1 $OUT/tests-cuda.txt)"
  cu timeout 60 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 --models block \
    --cuda-graph --blocks 3 --without gemm_low > $OUT/block-cuda.txt 2>&1
}
# Vulkan's NV_coopmat2 tests, then mlp-large at "medium" against PyTorch's CUDA graph in $1 blocks:
# a process for each "batches choice" after it (batches host or device; train_step.py --without choice)
vulkan_half_ab() {
  local blocks=$1 ab
  shift
  vk timeout 90 python3 -m pytest -q -rs -p no:cacheprovider --tb=short tests/test_kernels.py -k "vulkan and coopmat2" \
    > $OUT/tests-vulkan.txt 2>&1
  echo "vulkan tests at $(el) s: $(tail -1 $OUT/tests-vulkan.txt)"
  for ab in "$@"; do
    set -- $ab
    vk timeout 60 python3 bench/train_step.py --device vulkan --torch-device cuda --precision medium \
      --models mlp-large --cuda-graph --blocks $blocks --data $1 --without $2 > $OUT/mlp-large-vulkan-$1-$2.txt 2>&1
  done
  echo "vulkan rows at $(el) s"
}
# ~25 s: mlp-small's CUDA step at "high" by its place in blocks of 20 (bench/gpu/host_path.py --block-start)
mlp_small_block_start() {
  cu timeout 40 python3 bench/gpu/host_path.py --device cuda --precision high --model mlp-small --steps 20 \
    --blocks 30 --hold-loss --block-start > $OUT/host-path.txt 2>&1
}
# the bf16 ResNet's CUDA kernels and nodes (bench/profile_step.py), until $1 s into the call
profile_resnet_bf16() {
  cu timeout $(( $1 - $(el) )) python3 bench/profile_step.py --device cuda --model resnet --amp bf16 --precision high \
    --kernels --repeats 3 > $OUT/profile-resnet-bf16.txt 2>&1
}
case "$1" in
  vulkan)
    build_cuda_in_background
    setup_vulkan
    vk timeout 70 python3 -m pytest -v -p no:cacheprovider --tb=long tests/test_lora.py -k "dequantized_models and vulkan" > $OUT/lora.txt 2>&1
    echo "lora at $(el) s"
    vk timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=long -x tests/test_ops.py tests/test_lora.py -k vulkan > $OUT/ops-lora.txt 2>&1
    echo "ops-lora at $(el) s"
    vk timeout 80 python3 bench/train_step.py --device vulkan --torch-device cuda --models cnn resnet --cuda-graph --blocks 2 \
      --steps 6 --without GEMM > $OUT/conv-gemm.txt 2>&1
    echo "conv at $(el) s"
    while [ ! -f /tmp/build.done ] && [ "$(el)" -lt 570 ]; do sleep 5; done
    cat /tmp/build.done 2>/dev/null || echo "CUDA build not done at $(el) s"
    tail -5 /tmp/build.log > $OUT/build-tail.txt 2>&1 ;;
  cuda)
    ls $wheel/*.whl >/dev/null 2>&1 || { echo "no CUDA wheel on this machine"; exit 1; }
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/ggml-cuda $wheel/ggml_python-*.whl
    cu timeout 90 python3 -m pytest -q -n 4 -p no:cacheprovider --tb=short tests/test_conv.py tests/test_kernels.py \
      -k "cuda and (casts_between or test_equals_torch)" > $OUT/tests-cuda.txt 2>&1
    echo "tests at $(el) s"
    cu timeout 110 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --models cnn resnet \
      --cuda-graph --blocks 3 --steps 10 --without im2col_rows fold_rows > $OUT/conv-cuda.txt 2>&1
    echo "conv at $(el) s"
    cu timeout 80 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 --models block \
      --cuda-graph --blocks 5 --without cast_x4 > $OUT/block-cuda.txt 2>&1
    echo "block at $(el) s"
    cu timeout 40 python3 bench/gpu/host_path.py --device cuda --precision high > $OUT/host-path-cuda.txt 2>&1
    cu timeout 40 python3 bench/profile_step.py --device cuda --model mlp-small --kernels > $OUT/profile-mlp-small.txt 2>&1
    echo "mlp-small at $(el) s"
    left=$(( 580 - $(el) ))
    [ $left -gt 20 ] && cu timeout $left python3 -m pytest -q -n 6 -p no:cacheprovider --tb=short tests/test_kernels.py -k cuda > $OUT/kernels-cuda.txt 2>&1 ;;
  lean)
    # ~330 s: Vulkan's quantized tests and cnn/ResNet while the CUDA wheel builds, then the MLPs at "high"
    build_cuda_in_background
    setup_vulkan
    # the quantized products with ggrad's defaults (integer dot off since 2026-12-06)
    vk timeout 60 python3 -m pytest -q -n 4 -p no:cacheprovider --tb=line tests/test_lora.py tests/test_gguf_models.py \
      tests/test_runtime.py -k vulkan > $OUT/quantized-vulkan.txt 2>&1
    echo "quantized at $(el) s"
    vk timeout 70 python3 bench/train_step.py --device vulkan --torch-device cuda --models cnn resnet --cuda-graph --blocks 2 \
      --steps 4 > $OUT/conv-vulkan.txt 2>&1
    echo "conv-vulkan at $(el) s"
    cuda_wheel_installed 280 || exit 0
    PYTHONPATH=/tmp/ggml-cuda:/tmp/site:src timeout $(( 325 - $(el) )) python3 bench/train_step.py --device cuda --torch-device cuda \
      --precision high --models mlp-small mlp-mnist --cuda-graph --blocks 5 > $OUT/train-high-cuda.txt 2>&1
    echo "mlps at $(el) s"
    # where the ResNet and the block spend their steps (issues 28, 25), to choose the next kernels
    PYTHONPATH=/tmp/ggml-cuda:/tmp/site:src timeout 90 python3 bench/profile_step.py --device cuda --model resnet \
      --precision high --kernels --repeats 5 > $OUT/profile-resnet.txt 2>&1
    echo "resnet profile at $(el) s"
    PYTHONPATH=/tmp/ggml-cuda:/tmp/site:src timeout 70 python3 bench/profile_step.py --device cuda --model block \
      --block-batch 32 --amp bf16 --precision high --kernels --repeats 5 > $OUT/profile-block.txt 2>&1 ;;
  set45)
    # ~480 s on a fresh machine: set 45's CUDA kernels (the fold by bands, rows copies) and
    # ops.cont's batched transposes checked on the device, then timed against without
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 330 || exit 1
    cu timeout 100 python3 -m pytest -q -n 6 -p no:cacheprovider --tb=short tests/test_kernels.py tests/test_conv.py \
      -k "cuda and (copies_of_views or fold_by_bands or transpose_over_four or casts_between or fold_kernel or test_equals_torch or unfold_nodes)" \
      > $OUT/tests-cuda.txt 2>&1
    echo "tests at $(el) s: $(tail -1 $OUT/tests-cuda.txt)"
    cu timeout 110 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --models cnn resnet \
      --cuda-graph --blocks 3 --steps 10 --without fold_rows copy_rows batched_transposes > $OUT/conv-cuda.txt 2>&1
    echo "conv at $(el) s"
    cu timeout 80 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 --models block \
      --cuda-graph --blocks 5 --without copy_rows batched_transposes > $OUT/block-cuda.txt 2>&1
    echo "block at $(el) s"
    cu timeout 60 python3 bench/profile_step.py --device cuda --model resnet --precision high --kernels --repeats 5 \
      > $OUT/profile-resnet.txt 2>&1
    echo "resnet profile at $(el) s"
    cu timeout 50 python3 bench/profile_step.py --device cuda --model block --block-batch 32 --amp bf16 --precision high \
      --kernels --repeats 5 --nodes REPEAT_BACK CONT CPY > $OUT/profile-block.txt 2>&1
    echo "block profile at $(el) s"
    left=$(( 570 - $(el) ))
    [ $left -gt 30 ] && cu timeout $left python3 -m pytest -q -n 6 -p no:cacheprovider --tb=short tests/test_kernels.py \
      tests/test_ops.py tests/test_attention.py -k cuda > $OUT/kernels-cuda.txt 2>&1 ;;
  set45c)
    # ~540 s on a fresh machine: the fold without divisions tested and timed (CUDA), the ResNet
    # at issue 28's three precisions, the bf16 block and its profile
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 330 || exit 1
    cu timeout 40 python3 -m pytest -q -n 6 -p no:cacheprovider --tb=short tests/test_kernels.py \
      -k "cuda and (fold_by_bands or fold_kernel)" > $OUT/tests-cuda.txt 2>&1
    echo "cuda tests at $(el) s: $(tail -1 $OUT/tests-cuda.txt)"
    cu timeout 60 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --models resnet \
      --cuda-graph --blocks 2 --steps 8 --without fold_rows > $OUT/conv-cuda.txt 2>&1
    echo "resnet at $(el) s"
    cu timeout 45 python3 bench/train_step.py --device cuda --torch-device cuda --precision highest --models resnet \
      --cuda-graph --blocks 2 --steps 8 > $OUT/conv-cuda-highest.txt 2>&1
    cu timeout 45 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 --models resnet \
      --cuda-graph --blocks 2 --steps 8 > $OUT/conv-cuda-bf16.txt 2>&1
    echo "resnet highest, bf16 at $(el) s"
    cu timeout 50 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 --models block \
      --cuda-graph --blocks 3 > $OUT/block-cuda.txt 2>&1
    echo "block at $(el) s"
    cu timeout $(( 585 - $(el) )) python3 bench/profile_step.py --device cuda --model block --block-batch 32 --amp bf16 \
      --precision high --kernels --repeats 5 --nodes REPEAT_BACK CONT CPY ADD > $OUT/profile-block.txt 2>&1 ;;
  set46)
    # ~520 s on a fresh machine: autocast's products on ggrad's GEMM (CUDA), tested then timed
    build_cuda_in_background
    # while it builds: issue 29's mlp-large on Vulkan, float16 matrix cores at "medium" against PyTorch's TF32
    setup_vulkan
    vk timeout 100 python3 bench/train_step.py --device vulkan --torch-device cuda --precision medium --models mlp-large \
      --cuda-graph --blocks 3 > $OUT/mlp-large-vulkan.txt 2>&1
    echo "vulkan mlp-large at $(el) s"
    cuda_wheel_installed 330 || exit 1
    autocast_on_cuda
    echo "block at $(el) s"
    cu timeout 60 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 --models resnet \
      --cuda-graph --blocks 2 --steps 8 --without gemm_low > $OUT/conv-cuda-bf16.txt 2>&1
    echo "resnet at $(el) s"
    cu timeout 50 python3 bench/profile_step.py --device cuda --model block --block-batch 32 --amp bf16 --precision high \
      --kernels --repeats 5 --nodes CONT CPY ADD CONCAT > $OUT/profile-block.txt 2>&1
    echo "block profile at $(el) s"
    cu timeout 40 python3 bench/profile_step.py --device cuda --model mlp-small --precision high --kernels --repeats 5 \
      > $OUT/profile-mlp-small.txt 2>&1
    profile_resnet_bf16 470 ;;
  set46b)
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 330 || exit 1
    autocast_on_cuda
    cu timeout 40 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --models block \
      --block-batch 8 --cuda-graph --blocks 3 > $OUT/block-f32-cuda.txt 2>&1
    echo "blocks at $(el) s"
    cu timeout 45 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 --models resnet \
      --cuda-graph --blocks 2 --steps 8 > $OUT/conv-cuda-bf16.txt 2>&1
    echo "resnet at $(el) s"
    cu timeout 40 python3 bench/profile_step.py --device cuda --model block --block-batch 32 --amp bf16 --precision high \
      --kernels --repeats 5 --nodes CPY ADD > $OUT/profile-block.txt 2>&1 ;;
  set46c)
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 330 || exit 1
    cu timeout 40 python3 -m pytest -q -n 6 -p no:cacheprovider --tb=short tests/test_amp.py tests/test_conv.py \
      -k "cuda and (autocast or columns or test_equals_torch)" > $OUT/tests-cuda.txt 2>&1
    echo "cuda tests at $(el) s: $(tail -1 $OUT/tests-cuda.txt)"
    cu timeout 40 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 --models resnet \
      --cuda-graph --blocks 2 --steps 6 --without im2col_low > $OUT/conv-cuda-bf16.txt 2>&1 ;;
  set47)
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    # while it builds: Vulkan's convolutions with their input gradients as convolutions (not yet its default)
    setup_vulkan
    vk timeout 150 python3 -c "import sys; sys.path.insert(0, 'bench'); import train_step, ggrad.functional.conv as c; \
c.INPUT_GRADIENT_CONV_KINDS = frozenset({'cuda', 'vulkan'}); train_step.main()" --device vulkan --torch-device cuda \
      --models cnn resnet --blocks 2 --steps 4 --without input_gradient_conv > $OUT/conv-vulkan.txt 2>&1
    echo "vulkan convolutions at $(el) s"
    cuda_wheel_installed 360 || exit 1
    cu timeout 60 python3 -m pytest -q -n 6 -p no:cacheprovider --tb=short tests/test_kernels.py tests/test_conv.py \
      tests/test_amp.py -k "cuda and (products or small or budget or conv or test_equals_torch or stride_one or reversed \
or autocast)" > $OUT/tests-cuda.txt 2>&1
    echo "cuda tests at $(el) s: $(tail -1 $OUT/tests-cuda.txt)"
    cu timeout 40 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --models mlp-small \
      mlp-mnist --cuda-graph --blocks 5 --without gemm_small > $OUT/mlp-cuda-high.txt 2>&1
    cu timeout 30 python3 bench/train_step.py --device cuda --torch-device cuda --precision highest --models mlp-small \
      mlp-mnist --cuda-graph --blocks 3 > $OUT/mlp-cuda-highest.txt 2>&1
    echo "mlps at $(el) s"
    cu timeout 70 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --models cnn resnet \
      --cuda-graph --blocks 2 --steps 8 --without input_gradient_conv > $OUT/conv-cuda.txt 2>&1
    cu timeout 60 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 --models resnet \
      --cuda-graph --blocks 2 --steps 6 --without input_gradient_conv > $OUT/conv-cuda-bf16.txt 2>&1
    echo "convolutions at $(el) s"
    cu timeout 20 python3 bench/profile_step.py --device cuda --model mlp-small --precision high --kernels --repeats 5 \
      > $OUT/profile-mlp-small.txt 2>&1
    cu timeout $(( 585 - $(el) )) python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 \
      --models block --cuda-graph --blocks 3 > $OUT/block-cuda.txt 2>&1 ;;
  set47b)
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 330 || exit 1
    cu timeout 60 python3 -m pytest -q -n 6 -p no:cacheprovider --tb=short tests/test_kernels.py tests/test_conv.py \
      tests/test_amp.py -k "cuda and (running or bookkeeping or batch_norm or budget or conv or test_equals_torch \
or stride_one or reversed or wider)" > $OUT/tests-cuda.txt 2>&1
    echo "cuda tests at $(el) s: $(tail -1 $OUT/tests-cuda.txt)"
    cu timeout 60 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --models resnet \
      --cuda-graph --blocks 2 --steps 8 --without running_count > $OUT/conv-cuda.txt 2>&1
    cu timeout 60 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 --models resnet \
      --cuda-graph --blocks 2 --steps 8 --without running_count input_gradient_conv > $OUT/conv-cuda-bf16.txt 2>&1
    echo "resnet at $(el) s"
    cu timeout 45 python3 bench/train_step.py --device cuda --torch-device cuda --precision highest --models resnet \
      --cuda-graph --blocks 2 --steps 8 > $OUT/conv-cuda-highest.txt 2>&1
    cu timeout 30 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --models cnn \
      --cuda-graph --blocks 3 > $OUT/cnn-cuda.txt 2>&1
    echo "resnet highest, cnn at $(el) s"
    profile_resnet_bf16 585 ;;
  set47c)
    both_devices
    vulkan_conv_ab "running or bookkeeping or batch_norm or budget or test_equals_torch" running_count 130
    cuda_wheel_installed 360 || exit 1
    cu timeout 60 python3 -m pytest -q -n 6 -p no:cacheprovider --tb=short tests/test_conv.py tests/test_amp.py \
      -k "cuda and (four_at_a_time or unfold or test_equals_torch or stride_one or columns or convolution)" \
      > $OUT/tests-cuda.txt 2>&1
    echo "cuda tests at $(el) s: $(tail -1 $OUT/tests-cuda.txt)"
    cu timeout 60 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --models resnet \
      --cuda-graph --blocks 2 --steps 8 --without im2col_x4 > $OUT/conv-cuda.txt 2>&1
    cu timeout 60 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 --models resnet \
      --cuda-graph --blocks 2 --steps 8 --without im2col_x4 > $OUT/conv-cuda-bf16.txt 2>&1
    echo "resnet at $(el) s"
    profile_resnet_bf16 585 ;;
  set47d)
    both_devices
    for model in resnet mlp-large; do
      precision=$([ $model = resnet ] && echo highest || echo medium)
      vk env GGML_VK_PERF_LOGGER=1 GGML_VK_PERF_LOGGER_FREQUENCY=10 timeout 100 python3 bench/gpu/vulkan_ops.py \
        --model $model --precision $precision > $OUT/vulkan-ops-$model.txt 2>&1
      echo "vulkan $model op by op at $(el) s"
    done
    cuda_wheel_installed 360 || exit 1
    cu timeout 40 python3 -m pytest -q -n 6 -p no:cacheprovider --tb=short tests/test_kernels.py \
      -k "cuda and (many_rows or bias_gradient or budget or products)" > $OUT/tests-cuda.txt 2>&1
    echo "cuda tests at $(el) s: $(tail -1 $OUT/tests-cuda.txt)"
    cu timeout 50 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 --models block \
      --cuda-graph --blocks 3 --without row_sum_product > $OUT/block-cuda.txt 2>&1
    echo "block at $(el) s"
    cu timeout $(( 585 - $(el) )) python3 bench/train_step.py --device cuda --torch-device cuda --precision high \
      --models mlp-large mlp-small --cuda-graph --blocks 3 --without row_sum_product > $OUT/mlp-cuda.txt 2>&1 ;;
  set47e)
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 300 || exit 1
    cu timeout 40 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 --models resnet \
      --cuda-graph --blocks 2 --steps 6 --without rows_layout > $OUT/conv-cuda-bf16.txt 2>&1
    echo "resnet bf16 at $(el) s"
    cu timeout $(( 350 - $(el) )) python3 bench/train_step.py --device cuda --torch-device cuda --precision high \
      --models resnet --cuda-graph --blocks 2 --steps 6 --without rows_layout > $OUT/conv-cuda.txt 2>&1 ;;
  set48)
    build_cuda_in_background  # for set48b, if it follows within the machine's idle time
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    setup_vulkan
    vulkan_tests 120 "wide or products or long_sums or linear or budget or test_equals_torch" tests/test_kernels.py tests/test_conv.py
    vk timeout 120 python3 bench/gpu/vulkan_gemm.py > $OUT/vulkan-gemm.txt 2>&1
    echo "vulkan products at $(el) s"
    vk timeout 120 python3 bench/train_step.py --device vulkan --torch-device cuda --models cnn resnet --blocks 2 \
      --steps 4 --without gemm_wide > $OUT/conv-vulkan.txt 2>&1
    echo "conv-vulkan at $(el) s"
    vk timeout 60 python3 bench/train_step.py --device vulkan --torch-device cuda --precision high --models mlp-large \
      mlp-mnist --cuda-graph --blocks 3 --without gemm_wide > $OUT/mlp-vulkan.txt 2>&1
    echo "mlp-vulkan at $(el) s"
    vk env GGML_VK_PERF_LOGGER=1 GGML_VK_PERF_LOGGER_FREQUENCY=10 timeout $(( 585 - $(el) )) python3 \
      bench/gpu/vulkan_ops.py --model resnet > $OUT/vulkan-ops-resnet.txt 2>&1 ;;
  set48b)
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 330 || exit 1
    cuda_tests 60 "epilogue or linear or products or budget or bias" tests/test_kernels.py tests/test_amp.py
    cu timeout 50 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 --models block \
      --cuda-graph --blocks 3 --without gemm_bias_epilogue > $OUT/block-cuda.txt 2>&1
    echo "block at $(el) s"
    cu timeout 60 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --models mlp-small \
      mlp-mnist mlp-large --cuda-graph --blocks 3 --without gemm_bias_epilogue > $OUT/mlp-cuda.txt 2>&1
    echo "mlps at $(el) s"
    for pdl in 0 1; do
      cu env GGML_CUDA_PDL=$pdl timeout 40 python3 bench/profile_step.py --device cuda --model block --block-batch 32 \
        --amp bf16 --precision high --kernels --repeats 3 > $OUT/profile-block-pdl$pdl.txt 2>&1
    done
    echo "profiles at $(el) s" ;;
  set48c)
    both_devices
    vulkan_tests 90 "splits or long_sums or budget or test_equals_torch or wide" tests/test_kernels.py tests/test_conv.py
    vk timeout 90 python3 bench/train_step.py --device vulkan --torch-device cuda --models cnn resnet --blocks 2 \
      --steps 4 --without gemm_parts_many > $OUT/conv-vulkan.txt 2>&1
    echo "conv-vulkan at $(el) s"
    vk timeout 40 python3 bench/gpu/vulkan_gemm.py --shapes "resnet l1 weight" "resnet l2 weight" "resnet l3 weight" \
      > $OUT/vulkan-gemm.txt 2>&1
    vk timeout 40 python3 bench/gpu/vulkan_gemm.py --medium --shapes mlp-large > $OUT/vulkan-gemm-medium.txt 2>&1
    echo "vulkan products at $(el) s"
    cuda_wheel_installed 330 || exit 1
    cuda_tests 60 "epilogue or linear or products or budget" tests/test_kernels.py
    cu timeout 50 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 --models block \
      --cuda-graph --blocks 3 --without gemm_bias_epilogue > $OUT/block-cuda.txt 2>&1
    echo "block at $(el) s"
    vk timeout $(( 585 - $(el) )) python3 bench/train_step.py --device vulkan --torch-device cuda --models resnet \
      --blocks 2 --steps 4 > $OUT/resnet-vulkan-again.txt 2>&1 ;;
  set48d)
    both_devices
    vk timeout 60 python3 bench/train_step.py --device vulkan --torch-device cuda --precision medium --models mlp-large \
      --cuda-graph --blocks 3 > $OUT/mlp-large-vulkan-medium.txt 2>&1
    vk env GGML_VK_PERF_LOGGER=1 GGML_VK_PERF_LOGGER_FREQUENCY=10 timeout 60 python3 bench/gpu/vulkan_ops.py \
      --model mlp-large --precision medium > $OUT/vulkan-ops-mlp-large.txt 2>&1
    echo "vulkan mlp-large at $(el) s"
    cuda_wheel_installed 330 || exit 1
    cu timeout 110 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --models resnet cnn \
      mlp-small mlp-mnist mlp-large --cuda-graph --blocks 2 --steps 6 > $OUT/high-cuda.txt 2>&1
    echo "high at $(el) s"
    cu timeout 80 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 \
      --models resnet block --cuda-graph --blocks 2 --steps 6 > $OUT/bf16-cuda.txt 2>&1
    echo "bf16 at $(el) s"
    cu timeout $(( 550 - $(el) )) python3 bench/train_step.py --device cuda --torch-device cuda --precision highest \
      --models resnet --cuda-graph --blocks 2 --steps 6 > $OUT/highest-cuda.txt 2>&1
    echo "highest at $(el) s"
    cu timeout $(( 585 - $(el) )) python3 bench/adam_only.py --device cuda --torch-device cuda --sizes 1e6 1e8 \
      > $OUT/adam-cuda.txt 2>&1 ;;
  set48e)
    # ~100 s: Vulkan's mlp-large at "medium" with its batches uploaded each step and on the device
    # (set48d: 1.82 ms a step against 1.09 ms of its nodes serialized)
    setup_vulkan
    for data in device host; do
      vk timeout 60 python3 bench/train_step.py --device vulkan --torch-device cuda --precision medium \
        --models mlp-large mlp-mnist --cuda-graph --blocks 3 --data $data > $OUT/mlp-vulkan-medium-$data.txt 2>&1
      echo "data on the $data at $(el) s"
    done ;;
  set48f)
    # ~300 s: the whole suite's Vulkan tests on the device with set 48
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    setup_vulkan
    vk timeout 270 python3 -m pytest -q -n 12 -p no:cacheprovider --tb=short tests -k "vulkan" \
      > $OUT/tests-vulkan-all.txt 2>&1
    echo "vulkan suite at $(el) s: $(tail -1 $OUT/tests-vulkan-all.txt)" ;;
  set48g)
    # ~80 s: the cross-entropy gradient through a stride of 0 on the Vulkan device
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    setup_vulkan
    vk timeout 120 python3 -m pytest -q -n 8 -p no:cacheprovider --tb=short tests/test_kernels.py tests/test_losses.py \
      tests/test_train.py -k "vulkan and (cross_entropy or budget or nll or loss)" > $OUT/tests-vulkan.txt 2>&1
    echo "vulkan tests at $(el) s: $(tail -1 $OUT/tests-vulkan.txt)" ;;
  set49)
    # ~450 s: the optimizer's kept step (Adam alone) and the cross-entropy gradient's stride 0
    # on CUDA, tested and timed; Adam alone on the Vulkan device while the wheel builds
    both_devices
    vulkan_tests 60 "kept or skipped or in_place_in_one or follow" tests/test_optim.py
    vk timeout 60 python3 bench/adam_only.py --device vulkan --torch-device cuda --sizes 1e6 1e8 > $OUT/adam-vulkan.txt 2>&1
    echo "vulkan adam at $(el) s"
    cuda_wheel_installed 330 || exit 1
    cuda_tests 90 "kept or skipped or in_place_in_one or follow or cross_entropy or budget" tests/test_optim.py \
      tests/test_kernels.py tests/test_losses.py
    cu timeout 60 python3 bench/adam_only.py --device cuda --torch-device cuda --sizes 1e6 1e7 1e8 > $OUT/adam-cuda.txt 2>&1
    echo "cuda adam at $(el) s"
    cu timeout $(( 585 - $(el) )) python3 bench/train_step.py --device cuda --torch-device cuda --precision high \
      --models mlp-small mlp-mnist mlp-large --cuda-graph --blocks 3 --without stride_zero > $OUT/mlp-cuda.txt 2>&1 ;;
  set49b)
    # ~560 s: set 49's small products without split K (gemm_whole_k) tested on CUDA, the MLPs timed
    # with and without it (runners in turning order, the compiled step twice), the bias epilogue on
    # small products too, mlp-small's kernels, "highest", the bf16 block; the kept optimizer step's
    # tests on the Vulkan device while the wheel builds
    both_devices
    vulkan_tests 90 "optim or capture or kept" tests/test_optim.py tests/test_capture.py
    cuda_wheel_installed 330 || exit 1
    cuda_tests 60 "split_k or epilogue or products or budget or linear" tests/test_kernels.py tests/test_amp.py
    mlps="mlp-small mlp-mnist mlp-large"
    cu timeout 90 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --models $mlps \
      --cuda-graph --blocks 6 --again --without gemm_whole_k > $OUT/mlp-cuda.txt 2>&1
    echo "mlps at $(el) s"
    cu timeout 25 python3 bench/profile_step.py --device cuda --model mlp-small --precision high --kernels \
      --repeats 3 > $OUT/profile-mlp-small.txt 2>&1
    # (run as --without epilogue_min_outputs: ops.BIAS_EPILOGUE_MIN_OUTPUTS = 0, gone since; the epilogue
    # is on every product now, and this line times it against none)
    cu timeout 70 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --models $mlps \
      --cuda-graph --blocks 6 --without gemm_bias_epilogue > $OUT/mlp-cuda-epilogue.txt 2>&1
    echo "epilogue at $(el) s"
    cu timeout 50 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 \
      --models block --cuda-graph --blocks 4 > $OUT/block-cuda.txt 2>&1
    echo "block at $(el) s"
    cu timeout $(( 585 - $(el) )) python3 bench/train_step.py --device cuda --torch-device cuda --precision highest \
      --models $mlps --cuda-graph --blocks 4 > $OUT/mlp-cuda-highest.txt 2>&1 ;;
  set49c)
    # ~500 s: set 49 as it lands (every bias in the epilogue, small products without split K):
    # tested on CUDA; issue 25's rows, one ggrad runner a model in each of two processes at "high",
    # then with a second copy (--again), "highest", Adam alone, the bf16 block, mlp-small's kernels
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 330 || exit 1
    cuda_tests 60 "split_k or epilogue or products or budget or linear or kept or cross_entropy" tests/test_kernels.py \
      tests/test_amp.py tests/test_optim.py
    mlps="mlp-small mlp-mnist mlp-large"
    for run in 1 2; do
      cu timeout 60 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --models $mlps \
        --cuda-graph --blocks 6 > $OUT/mlp-cuda-high-$run.txt 2>&1
      echo "high $run at $(el) s"
    done
    cu timeout 70 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --models $mlps \
      --cuda-graph --blocks 6 --again > $OUT/mlp-cuda-high-again.txt 2>&1
    cu timeout 20 python3 bench/adam_only.py --device cuda --torch-device cuda --sizes 1e6 1e7 1e8 > $OUT/adam-cuda.txt 2>&1
    cu timeout 40 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 \
      --models block --cuda-graph --blocks 4 > $OUT/block-cuda.txt 2>&1
    echo "adam and block at $(el) s"
    cu timeout 25 python3 bench/profile_step.py --device cuda --model mlp-small --precision high --kernels \
      --repeats 3 > $OUT/profile-mlp-small.txt 2>&1
    cu timeout $(( 585 - $(el) )) python3 bench/train_step.py --device cuda --torch-device cuda --precision highest \
      --models $mlps --cuda-graph --blocks 6 > $OUT/mlp-cuda-highest.txt 2>&1 ;;
  set49d)
    # ~320 s: the tree as it lands, tested on CUDA (the optimizer's kept step after its review, the
    # whole-K products' long-K case) and on the Vulkan device; the MLPs at "high" and Adam once more
    both_devices
    vulkan_tests 90 "optim or capture" tests/test_optim.py tests/test_capture.py
    cuda_wheel_installed 330 || exit 1
    cuda_tests 90 "split_k or epilogue or products or budget or linear or optim or capture" tests/test_kernels.py \
      tests/test_optim.py tests/test_capture.py
    cu timeout 20 python3 bench/adam_only.py --device cuda --torch-device cuda --sizes 1e6 1e8 > $OUT/adam-cuda.txt 2>&1
    cu timeout $(( 590 - $(el) )) python3 bench/train_step.py --device cuda --torch-device cuda --precision high \
      --models mlp-small mlp-mnist mlp-large --cuda-graph --blocks 6 > $OUT/mlp-cuda-high.txt 2>&1 ;;
  set49e)
    # ~300 s: cuBLASLt's operands' alignment capped at 16 (set49d: eager and compiled steps one ulp
    # apart with it up to 256): the products', epilogue's and capture's tests on CUDA with the
    # variants on (GGRAD_UNVERIFIED_KERNELS=1 above), then the MLPs at "high" with and without them
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 330 || exit 1
    cuda_tests 120 "split_k or epilogue or products or budget or linear or optim or capture or amp or land_where or attention" \
      tests/test_kernels.py tests/test_optim.py tests/test_capture.py tests/test_amp.py tests/test_autograd.py \
      tests/test_attention.py
    cu timeout 150 python3 bench/train_step.py --device cuda --torch-device cuda --precision high \
      --models mlp-small mlp-mnist mlp-large --cuda-graph --blocks 6 --again --without gemm_whole_k gemm_bias_epilogue \
      > $OUT/mlp-cuda-high.txt 2>&1
    echo "mlp at $(el) s"
    # the bf16 block: the q/k/v gradients copied into one tensor (no CONCAT), then its kernels
    cu timeout 100 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 \
      --models block --cuda-graph --blocks 4 --without gemm_whole_k gemm_bias_epilogue > $OUT/block-cuda.txt 2>&1
    echo "block at $(el) s"
    cu timeout $(( 590 - $(el) )) python3 bench/profile_step.py --device cuda --model block --block-batch 32 \
      --amp bf16 --precision high --kernels --top 45 --nodes "GGRAD GEMM" CPY > $OUT/profile-block.txt 2>&1 ;;
  set50)
    # ~420 s: kernel set 50 (CUDA's softmax a warp a row) tested; the accumulation probe (the
    # one-ulp CUDA failure of test_capture, open since 2026-12-05) with and without ggml-cuda's
    # fusion; the bf16 block with and without softmax_rows, then its kernels
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 330 || exit 1
    cuda_tests 120 "warp_a_row or budget or land_where or attention or amp or softmax or capture" tests/test_kernels.py \
      tests/test_autograd.py tests/test_attention.py tests/test_amp.py tests/test_ops.py tests/test_capture.py
    cu timeout 60 python3 bench/gpu/accumulation_probe.py cuda:0 > $OUT/accumulation.txt 2>&1
    cu env GGML_CUDA_DISABLE_FUSION=1 timeout 60 python3 bench/gpu/accumulation_probe.py cuda:0 >> $OUT/accumulation.txt 2>&1
    echo "probe at $(el) s"
    cu timeout 120 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 \
      --models block --cuda-graph --blocks 5 --without softmax_rows > $OUT/block-cuda.txt 2>&1
    echo "block at $(el) s"
    cu timeout $(( 590 - $(el) )) python3 bench/profile_step.py --device cuda --model block --block-batch 32 \
      --amp bf16 --precision high --kernels --top 45 > $OUT/profile-block.txt 2>&1 ;;
  set50b)
    # ~300 s: set 50's relu four values a thread tested; the accumulation probe without CUDA
    # graphs and with cuBLAS's workspace fixed (set50: the first call already differs, with
    # and without fusion); the bf16 block with and without unary_x4 and its kernels; mlp-small at "high"
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 330 || exit 1
    cuda_tests 90 "four_values_a_thread or warp_a_row or activation or deepest_view or budget or land_where" \
      tests/test_kernels.py tests/test_autograd.py
    cu env GGML_CUDA_DISABLE_GRAPHS=1 timeout 40 python3 bench/gpu/accumulation_probe.py cuda:0 > $OUT/accumulation.txt 2>&1
    echo "CUBLAS_WORKSPACE_CONFIG=:4096:8" >> $OUT/accumulation.txt
    cu env CUBLAS_WORKSPACE_CONFIG=:4096:8 timeout 40 python3 bench/gpu/accumulation_probe.py cuda:0 >> $OUT/accumulation.txt 2>&1
    echo "probe at $(el) s"
    cu timeout 60 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 \
      --models block --cuda-graph --blocks 5 --without unary_x4 > $OUT/block-cuda.txt 2>&1
    echo "block at $(el) s"
    cu timeout 45 python3 bench/profile_step.py --device cuda --model block --block-batch 32 --amp bf16 --precision high \
      --kernels --top 45 > $OUT/profile-block.txt 2>&1
    echo "profile at $(el) s"
    cu timeout $(( 590 - $(el) )) python3 bench/train_step.py --device cuda --torch-device cuda --precision high \
      --models mlp-small mlp-mnist --cuda-graph --blocks 5 > $OUT/mlp-cuda-high.txt 2>&1 ;;
  set53)
    # ~450 s: set 51's LayerNorm kernels, set 52's relu in the cast and set 53's LayerNorm
    # writing bfloat16 tested on CUDA (set51 and set52, the same without the later sets, found no
    # machine), the bf16 block with and without the last two, its kernels, and mlp-small's host path
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 330 || exit 1
    cuda_tests 100 "relu or layer_norm or LayerNorm or budget or attention or transformer or autocast or amp" \
      tests/test_kernels.py tests/test_attention.py tests/test_amp.py tests/test_nn.py tests/test_layers.py
    cu timeout 75 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 \
      --models block --cuda-graph --blocks 5 --without cast_relu layer_norm_low > $OUT/block-cuda.txt 2>&1
    echo "block at $(el) s"
    cu timeout 45 python3 bench/profile_step.py --device cuda --model block --block-batch 32 --amp bf16 \
      --precision high --kernels --top 45 > $OUT/profile-block.txt 2>&1
    echo "profile at $(el) s"
    cu timeout $(( 590 - $(el) )) python3 bench/gpu/host_path.py --device cuda --precision high --model mlp-small \
      --steps 300 --blocks 5 > $OUT/host-path.txt 2>&1 ;;
  set54)
    # ~500 s: cast_relu's test as mended, the block budgets as counted and the replay's shorter host
    # path and stable addresses tested on CUDA (test_capture, the optimizer's kept step); the MLPs at
    # "high" holding their losses with and without stable addresses, and as before; mlp-small's host
    # path with its Python profile; the bf16 block (cycled device batches) with and without them
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 330 || exit 1
    cuda_tests 90 "relu or layer_norm or budget or capture or compile or replay or kept or stable" \
      tests/test_kernels.py tests/test_capture.py tests/test_optim.py
    cu timeout 60 python3 bench/train_step.py --device cuda --torch-device cuda --precision high \
      --models mlp-small mlp-mnist --cuda-graph --blocks 5 --hold-loss --without stable_addresses > $OUT/mlp-hold-cuda.txt 2>&1
    echo "mlps holding at $(el) s"
    cu timeout 45 python3 bench/train_step.py --device cuda --torch-device cuda --precision high \
      --models mlp-small mlp-mnist --cuda-graph --blocks 5 > $OUT/mlp-cuda.txt 2>&1
    echo "mlps at $(el) s"
    cu timeout 45 python3 bench/gpu/host_path.py --device cuda --precision high --model mlp-small \
      --steps 300 --blocks 5 --profile 30 > $OUT/host-path.txt 2>&1
    echo "host path at $(el) s"
    cu timeout $(( 590 - $(el) )) python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 \
      --models block --cuda-graph --blocks 5 --without stable_addresses > $OUT/block-cuda.txt 2>&1 ;;
  set54b)
    # ~330 s: relu in the cast's test comparing NaN as NaN, the stable addresses' results moved out only
    # while held, tested on CUDA; the MLPs holding their losses with and without stable addresses and as
    # before; mlp-small's host path profiled
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 300 || exit 1
    cuda_tests 60 "relu or budget or capture or stable or kept" tests/test_kernels.py tests/test_capture.py
    mlps mlp-hold-cuda.txt 50 --hold-loss --without stable_addresses
    echo "mlps holding at $(el) s"
    mlps mlp-cuda.txt 40 --without stable_addresses
    echo "mlps at $(el) s"
    cu timeout $(( 440 - $(el) )) python3 bench/gpu/host_path.py --device cuda --precision high --model mlp-small \
      --steps 300 --blocks 5 --profile 30 > $OUT/host-path.txt 2>&1 ;;
  set56b)
    # ~330 s: capture's tests on CUDA (each result in two buffers in turn, a twin graph each); the MLPs
    # at "high" with losses dropped and held (blocks of 20), held in blocks of 300; mlp-small's host
    # path with losses dropped and held
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 270 || exit 1
    cuda_tests 40 "capture or stable or budget" tests/test_capture.py tests/test_kernels.py
    mlps mlp-cuda.txt 20
    mlps mlp-hold-cuda.txt 20 --hold-loss
    echo "mlps at $(el) s"
    mlps mlp-300-cuda.txt 30 --steps 300 --hold-loss
    echo "mlps holding, blocks of 300, at $(el) s"
    cu timeout $(( 440 - $(el) )) python3 bench/gpu/host_path.py --device cuda --precision high --model mlp-small \
      --steps 300 --blocks 5 --hold-loss > $OUT/host-path.txt 2>&1 ;;
  set57)
    # ~400 s: while CUDA builds, capture's tests on the Vulkan device and Vulkan's mlp-large at
    # "medium", batches uploaded and on the device; then capture's tests on CUDA
    # (the twin graph fused as the graph), set56b's MLP rows again (its twins ran unfused), mlp-small's
    # step alone and in turn with PyTorch's CUDA graph in blocks of 300 (set56b: 60 us alone in
    # host_path.py, 79 us in train_step.py's blocks of 300)
    both_devices
    vk timeout 70 python3 -m pytest -q -n 4 -p no:cacheprovider --tb=short tests/test_capture.py -k vulkan \
      > $OUT/tests-vulkan.txt 2>&1
    for data in host device; do
      vk timeout 50 python3 bench/train_step.py --device vulkan --torch-device cuda --precision medium \
        --models mlp-large --cuda-graph --blocks 3 --data $data >> $OUT/mlp-large-vulkan.txt 2>&1
      echo "vulkan mlp-large, data on the $data, at $(el) s"
    done
    cuda_wheel_installed 300 || exit 1
    cuda_tests 40 "capture or stable or budget" tests/test_capture.py tests/test_kernels.py
    mlps mlp-cuda.txt 20
    mlps mlp-hold-cuda.txt 20 --hold-loss
    mlps mlp-300-cuda.txt 30 --steps 300 --hold-loss
    echo "mlps at $(el) s"
    cu timeout $(( 470 - $(el) )) python3 bench/gpu/host_path.py --device cuda --precision high --model mlp-small \
      --steps 300 --blocks 5 --hold-loss --beside-torch > $OUT/host-path.txt 2>&1 ;;
  set58)
    # ~280 s: while CUDA builds, Vulkan's mlp-large at "medium" (batches uploaded) with its graphs
    # left running, an A/B in one process; then on CUDA mlp-small's step by its place in blocks of
    # 20, alone and after PyTorch's CUDA graph (set57: blocks of 20 cost 11 us a step more than
    # blocks of 300), the MLP rows, capture's tests
    both_devices
    vk timeout 60 python3 bench/train_step.py --device vulkan --torch-device cuda --precision medium \
      --models mlp-large --cuda-graph --blocks 3 --data host --synchronous > $OUT/mlp-large-vulkan.txt 2>&1
    echo "vulkan mlp-large at $(el) s"
    cuda_wheel_installed 300 || exit 1
    cu timeout 40 python3 bench/gpu/host_path.py --device cuda --precision high --model mlp-small --steps 20 \
      --blocks 30 --hold-loss --block-start > $OUT/host-path.txt 2>&1
    mlps mlp-hold-cuda.txt 20 --hold-loss
    echo "mlps at $(el) s"
    mlps mlp-cuda.txt 20
    cuda_tests 40 "capture or budget or change_to_the_optimizer" tests/test_capture.py tests/test_kernels.py ;;
  set59)
    # ~480 s, what this tree has not run on a GPU: while CUDA builds, Vulkan's test suite, its
    # mlp-large ("medium", uploaded), cnn, ResNet and bf16 block each with its graphs left running
    # against waiting (train_step.py --asynchronous then, --synchronous since kernel set 56); then on CUDA capture's, the optimizers' and
    # the budget tests (the optimizer's watched dicts), mlp-small's step by its place in blocks of
    # 20, and the MLP rows
    both_devices
    vk timeout 100 python3 -m pytest -q -n 8 -p no:cacheprovider --tb=short tests -k vulkan > $OUT/tests-vulkan.txt 2>&1
    echo "vulkan tests at $(el) s: $(tail -1 $OUT/tests-vulkan.txt)"
    vk timeout 45 python3 bench/train_step.py --device vulkan --torch-device cuda --precision medium \
      --models mlp-large --cuda-graph --blocks 3 --data host --synchronous > $OUT/mlp-large-vulkan.txt 2>&1
    vk timeout 70 python3 bench/train_step.py --device vulkan --torch-device cuda --models cnn resnet --blocks 2 \
      --steps 4 --synchronous > $OUT/conv-vulkan.txt 2>&1
    vk timeout 50 python3 bench/train_step.py --device vulkan --torch-device cuda --precision high --amp bf16 \
      --models block --blocks 2 --steps 6 --synchronous > $OUT/block-vulkan.txt 2>&1
    echo "vulkan rows at $(el) s"
    cuda_wheel_installed 330 || exit 1
    cu timeout 40 python3 bench/gpu/host_path.py --device cuda --precision high --model mlp-small --steps 20 \
      --blocks 30 --hold-loss --block-start > $OUT/host-path.txt 2>&1
    mlps mlp-hold-cuda.txt 20 --hold-loss
    mlps mlp-cuda.txt 20
    echo "mlps at $(el) s"
    cuda_tests $(( 590 - $(el) )) "capture or optim or budget" tests/test_capture.py tests/test_optim.py tests/test_kernels.py ;;
  set60)
    # ~510 s: Vulkan's products over operands cast to float16 once per graph on NV_coopmat2
    # (ops._half_operands): bit-equal to ggml's own casts (the test), mlp-large at "medium" with
    # and without them, batches uploaded and on the device, and with float16 sums (unmarked:
    # ops.VULKAN_FLOAT32_SUMS); then on CUDA what set59 was to measure: mlp-small by place in
    # blocks of 20, the MLP rows, capture's and the optimizers' tests
    both_devices
    vulkan_half_ab 3 "host half_operands" "device half_operands" "device float32_sums"
    cuda_wheel_installed 330 || exit 1
    mlp_small_block_start
    mlps mlp-hold-cuda.txt 40 --hold-loss
    mlps mlp-cuda.txt 40
    echo "mlps at $(el) s"
    cuda_tests $(( 585 - $(el) )) "capture or optim or budget" tests/test_capture.py tests/test_optim.py tests/test_kernels.py ;;
  set64)
    # ~540 s: kernel set 54 (CLASS_TOTAL: the cross-entropy's reduction, mlp-small 27 -> 24 nodes)
    # and uploads to an idle CUDA device queued: their CUDA tests, then mlp-small and mlp-mnist
    # at "high" in 9 blocks with and without each (one A/B a process); before, while the CUDA
    # wheel builds, set63's Vulkan part (the NV_coopmat2 tests, mlp-large's A/Bs in blocks of 7)
    both_devices
    vulkan_half_ab 7 "device half_operands" "device float32_sums"
    cuda_wheel_installed 330 || exit 1
    cuda_tests 80 "cross_entropy or budget or queued or stream or capture or replay" tests/test_kernels.py \
      tests/test_runtime.py tests/test_capture.py
    mlps mlp-cuda-total.txt 45 --blocks 9 --without CLASS_TOTAL
    echo "mlps without CLASS_TOTAL at $(el) s"
    mlps mlp-cuda-idle.txt 45 --blocks 9 --without idle_uploads
    echo "mlps without idle uploads at $(el) s"
    [ "$(el)" -lt 530 ] && mlps mlp-hold-cuda.txt $(( 580 - $(el) )) --hold-loss --blocks 9 --without CLASS_TOTAL
    echo "mlps at $(el) s" ;;
  set65)
    # ~430 s, set64 cut to a short lease: kernel set 54 on CUDA (its tests, mlp-small and mlp-mnist
    # with and without CLASS_TOTAL), set63's Vulkan part while the CUDA wheel builds
    both_devices
    vulkan_half_ab 7 "device half_operands" "device float32_sums"
    cuda_wheel_installed 330 || exit 1
    cuda_tests 60 "cross_entropy or budget" tests/test_kernels.py
    mlps mlp-cuda-total.txt $(( 430 - $(el) )) --blocks 9 --without CLASS_TOTAL
    echo "mlps at $(el) s" ;;
  set66)
    # ~330 s, the least that verifies kernel sets 54 and 55 on CUDA: the CUDA wheel, the
    # cross-entropy's, Adam's constants' and the budgets' tests, mlp-small and mlp-mnist with
    # and without CLASS_TOTAL and the in-place ADAM_HYPER
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 300 || exit 1
    cuda_tests 50 "cross_entropy or budget or adam_constants or in_place_in_one_dispatch" tests/test_kernels.py \
      tests/test_optim.py
    mlps mlp-cuda-total.txt $(( 340 - $(el) )) --blocks 9 --without CLASS_TOTAL adam_hyper_in_place
    echo "mlps at $(el) s" ;;
  set61)
    # ~420 s: set60 again with the noise cut: Vulkan's NV_coopmat2 test (set60 skipped it: the
    # suite's float16 switches reached the child), mlp-large at "medium" in blocks of 7 with and
    # without the float16 operands and the float32 sums; on CUDA the MLP rows in 9 blocks with
    # and without uploads to an idle device queued, mlp-small by place, the streams' tests
    both_devices
    vulkan_half_ab 7 "device half_operands" "device float32_sums" "host float32_sums"
    cuda_wheel_installed 330 || exit 1
    mlps mlp-hold-cuda.txt 60 --hold-loss --blocks 9 --without idle_uploads
    mlps mlp-cuda.txt 60 --blocks 9 --without idle_uploads
    echo "mlps at $(el) s"
    mlp_small_block_start
    cuda_tests $(( 585 - $(el) )) "capture or optim or budget or queued or stream" tests/test_capture.py \
      tests/test_optim.py tests/test_kernels.py tests/test_runtime.py ;;
  set62)
    # ~280 s, set61 cut to what the last device time allows: Vulkan's NV_coopmat2 test, mlp-large
    # at "medium" on the device in blocks of 7 with and without the float16 operands and the
    # float32 sums; on CUDA the streams' and capture's tests (uploads to an idle device queued),
    # then the MLP rows in 9 blocks with and without that
    both_devices
    vulkan_half_ab 7 "device half_operands" "device float32_sums"
    cuda_wheel_installed 330 || exit 1
    cuda_tests 60 "queued or stream or capture or replay" tests/test_runtime.py tests/test_capture.py
    mlps mlp-cuda.txt 60 --blocks 9 --without idle_uploads
    echo "mlps at $(el) s" ;;
  set63)
    # ~140 s, set62's Vulkan half alone (no CUDA build: 285 s of device time left): the
    # NV_coopmat2 tests, mlp-large at "medium" on the device in blocks of 7 with and without the
    # float16 operands and the float32 sums
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    setup_vulkan
    vulkan_half_ab 7 "device half_operands" "device float32_sums" ;;
  set68)
    # ~260 s, CUDA: is mlp-small's standalone ratio (0.99-1.04, set66's last calls) the block
    # after PyTorch's starting cold? mlp-small with a twin of itself (--again) in two processes:
    # both ggrad runners near set66's A/B 0.065 ms would say so
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 240 || exit 1
    for i in 1 2; do
      cu timeout 30 python3 bench/train_step.py --device cuda --torch-device cuda --precision high \
        --models mlp-small --cuda-graph --blocks 15 --again > $OUT/mlp-small-again-$i.txt 2>&1
      grep "CUDA graph" $OUT/mlp-small-again-$i.txt
    done ;;
  set69)
    # ~380 s, CUDA: the MLP rows at "high" under train_step.py's balanced order (set66's were
    # biased by the shuffle), each runner's step by the runner timed before it, in two processes
    # (losses dropped, held); mlp-small's host time by place after PyTorch's graph and its eager
    # step; the bf16 block against PyTorch's eager step and graph
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 300 || exit 1
    mlps mlp-cuda-balanced.txt 45 --blocks 12 --by-predecessor
    mlps mlp-hold-cuda-balanced.txt 45 --blocks 12 --by-predecessor --hold-loss
    echo "mlps at $(el) s"
    cu timeout 50 python3 bench/gpu/host_path.py --device cuda --precision high --model mlp-small --steps 20 \
      --blocks 30 --block-start > $OUT/host-path.txt 2>&1
    echo "host path at $(el) s"
    cu timeout 60 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 \
      --models block --cuda-graph --blocks 6 --by-predecessor > $OUT/block-bf16.txt 2>&1
    echo "block at $(el) s" ;;
  set70)
    # ~260 s, CUDA: set69 put mlp-small's host path at ~78 us a step for a whole block after
    # PyTorch's CUDA graph's block (39 alone): which of ggrad's calls grows, under cProfile
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 300 || exit 1
    cu timeout 60 python3 bench/gpu/host_path.py --device cuda --precision high --model mlp-small --steps 20 \
      --blocks 30 --block-start --profile 25 > $OUT/host-path-profile.txt 2>&1
    echo "host path at $(el) s" ;;
  set71)
    # ~240 s, Vulkan alone (carry.sh vulkan's wheel of kernel set 56): graphs left running
    # again, each after a barrier: the streams', draws' and budget tests on the H100's Vulkan
    # device, ten draws in 60 fresh processes, then mlp-large at "medium" on the device in
    # blocks of 7 with and without (--synchronous), two processes
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    setup_vulkan
    vulkan_tests 80 "left_running or queued or ten_random or long_pending or budget or cross_entropy or adam_constants" \
      tests/test_runtime.py tests/test_autograd.py tests/test_kernels.py tests/test_optim.py
    vk timeout 60 python3 bench/gpu/draws_stress.py --device vulkan --rounds 60 > $OUT/draws-vulkan.txt 2>&1
    echo "draws at $(el) s: $(tail -1 $OUT/draws-vulkan.txt)"
    for i in 1 2; do
      vk timeout 50 python3 bench/train_step.py --device vulkan --torch-device cuda --precision medium \
        --models mlp-large --cuda-graph --blocks 7 --data device --synchronous > $OUT/mlp-large-vulkan-$i.txt 2>&1
      grep "CUDA graph" $OUT/mlp-large-vulkan-$i.txt
    done
    echo "rows at $(el) s" ;;
  set72)
    # ~330 s: the device generator's new step (ops.RAND_STEP) and graphs left running on both
    # devices: Vulkan's (carry.sh vulkan's wheel of set 56) runtime, autograd, capture and
    # dropout tests and ten draws in 60 fresh processes while the CUDA wheel builds, then the
    # same files on CUDA (the streams' Python changed with set 56: queue depth, leaves_running)
    both_devices
    vulkan_tests 90 "generator or left_running or queued or ten_random or long_pending or dropout or capture" \
      tests/test_runtime.py tests/test_autograd.py tests/test_capture.py tests/test_layers.py tests/test_nn.py
    vk timeout 60 python3 bench/gpu/draws_stress.py --device vulkan --rounds 60 > $OUT/draws-vulkan.txt 2>&1
    echo "draws at $(el) s: $(tail -1 $OUT/draws-vulkan.txt)"
    cuda_wheel_installed 300 || exit 1
    cuda_tests 120 "generator or left_running or queued or ten_random or long_pending or dropout or capture or stream" \
      tests/test_runtime.py tests/test_autograd.py tests/test_capture.py tests/test_layers.py tests/test_nn.py
    mlps mlp-cuda.txt $(( 420 - $(el) )) --blocks 12
    echo "mlps at $(el) s" ;;
  set73)
    # ~300 s, CUDA: a replay's numpy arguments uploaded in one copy (capture._batch_buffer): the
    # capture, runtime and optimizer tests on cuda:0, a block's first step by phase, the MLP rows
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 300 || exit 1
    cuda_tests 90 "capture or replay or compile or stream or queued or upload or budget" tests/test_capture.py \
      tests/test_runtime.py tests/test_optim.py tests/test_kernels.py tests/test_train.py
    cu timeout 60 python3 bench/gpu/host_path.py --device cuda --precision high --model mlp-small --steps 20 \
      --blocks 30 --block-start --phases > $OUT/first-step.txt 2>&1
    cat $OUT/first-step.txt
    mlps mlp-cuda.txt 60 --blocks 12 --by-predecessor
    grep "CUDA graph" $OUT/mlp-cuda.txt
    echo "mlps at $(el) s" ;;
  set74)
    # ~380 s, CUDA: where the bf16 block's step goes (its nodes with their shapes, its kernels,
    # PyTorch's kernels of the same step as a CUDA graph), then the block's row
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 300 || exit 1
    cu timeout 150 python3 bench/profile_step.py --device cuda --model block --block-batch 32 --amp bf16 \
      --precision high --kernels --torch --top 70 --nodes all --repeats 10 > $OUT/block-profile.txt 2>&1
    echo "profile at $(el) s"
    cu timeout 90 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 \
      --models block --cuda-graph --blocks 6 > $OUT/block-cuda.txt 2>&1
    grep "CUDA graph" $OUT/block-cuda.txt
    echo "block at $(el) s" ;;
  set75)
    # ~580 s, CUDA: kernel set 57 (attention's weights written low under autocast, their gradient
    # from the rows' statistics, products written low where only their cast reads them): its
    # tests and the attention, autocast, product and budget tests on cuda:0, the bf16 block with
    # and without set 57 in one process, the block's kernels beside PyTorch's, then (time left)
    # the block without gemm_low_out alone
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 300 || exit 1
    cuda_tests 100 "attention or softmax or autocast or amp or budget or sdpa or multihead or transformer or low or layer_norm or products or gemm or cast" \
      tests/test_kernels.py tests/test_attention.py tests/test_amp.py
    cu timeout 90 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 \
      --models block --cuda-graph --blocks 6 --without SOFTMAX_LOW SOFTMAX_LOW_BACK gemm_low_out > $OUT/block-cuda.txt 2>&1
    grep "CUDA graph\|without" $OUT/block-cuda.txt
    echo "block at $(el) s"
    cu timeout 90 python3 bench/profile_step.py --device cuda --model block --block-batch 32 --amp bf16 \
      --precision high --kernels --torch --top 60 --nodes all --repeats 5 > $OUT/block-profile.txt 2>&1
    echo "profile at $(el) s"
    [ "$(el)" -lt 510 ] && cu timeout $(( 585 - $(el) )) python3 bench/train_step.py --device cuda --torch-device cuda \
      --precision high --amp bf16 --models block --cuda-graph --blocks 4 --without gemm_low_out > $OUT/block-cuda-gemm.txt 2>&1
    echo "done at $(el) s" ;;
  set75s)
    # ~430 s, CUDA: set75 without the profile and the second A/B
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 300 || exit 1
    cuda_tests 80 "softmax or autocast or amp or budget or sdpa or multihead or low or layer_norm or products" \
      tests/test_kernels.py tests/test_attention.py tests/test_amp.py
    cu timeout 80 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 \
      --models block --cuda-graph --blocks 5 --without SOFTMAX_LOW SOFTMAX_LOW_BACK gemm_low_out > $OUT/block-cuda.txt 2>&1
    grep "CUDA graph\|without" $OUT/block-cuda.txt
    echo "done at $(el) s" ;;
  set75t)
    # ~340 s, CUDA: set 57's own tests, then the bf16 block with and without it
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 290 || exit 1
    cuda_tests 45 "written_low or writes_its_weights or write_their_low_result or read_beside or bf16_transformer_block" \
      tests/test_kernels.py
    cu timeout 55 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 \
      --models block --cuda-graph --blocks 3 --steps 10 --without SOFTMAX_LOW SOFTMAX_LOW_BACK gemm_low_out > $OUT/block-cuda.txt 2>&1
    grep "CUDA graph\|without" $OUT/block-cuda.txt
    echo "done at $(el) s" ;;
  set75u)
    # ~290 s, CUDA: set 57's own tests alone
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 270 || exit 1
    cuda_tests 30 "written_low or writes_its_weights or write_their_low_result" tests/test_kernels.py
    echo "done at $(el) s" ;;
  set76)
    # ~520 s, CUDA: set 58's strided products (gemm_strided_out) and the attention, autocast, product
    # and budget tests on cuda:0, the bf16 block with and without it in one process, its kernels
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 300 || exit 1
    cuda_tests 100 "attention or softmax or autocast or amp or budget or sdpa or multihead or transformer or low or products or gemm or where_their_copies" \
      tests/test_kernels.py tests/test_attention.py tests/test_amp.py
    cu timeout 40 python3 -m pytest -q -s -p no:cacheprovider tests/test_kernels.py -k "cuda and budget and block" \
      2>&1 | grep "compute nodes" > $OUT/budgets-cuda.txt
    cat $OUT/budgets-cuda.txt
    cu timeout 90 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 \
      --models block --cuda-graph --blocks 6 --without gemm_strided_out > $OUT/block-cuda.txt 2>&1
    grep "CUDA graph\|without\|eager" $OUT/block-cuda.txt
    echo "block at $(el) s"
    [ "$(el)" -lt 540 ] && cu timeout 45 python3 bench/profile_step.py --device cuda --model block --block-batch 32 --amp bf16 \
      --precision high --kernels --top 40 --nodes all --repeats 5 > $OUT/block-profile.txt 2>&1
    echo "done at $(el) s" ;;
  set79)
    # ~320 s, CUDA: set 58's strided products where convolutions and plain permuted copies meet them
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 270 || exit 1
    cuda_tests 40 "conv or permuted_copy or where_their_copies or fuzz" tests/test_conv.py tests/test_kernels.py \
      tests/test_launch_limits.py
    grep "^FAILED\|^E  " $OUT/tests-cuda.txt | head -20
    echo "done at $(el) s" ;;
  set81p)
    # ~90 s: the attention kernels alone against float64 and timed (no wheel), as built (ptxas'
    # own registers) and asked to hold more blocks a multiprocessor (forward 4: 128 registers;
    # backward 3: 168), each build its own file; ncu's counters of the first
    attention_probes "0_0:scripts/ggml_kernels:" \
      "4_3:scripts/ggml_kernels:-DGGRAD_ATTN_FORWARD_BLOCKS=4 -DGGRAD_ATTN_BACKWARD_BLOCKS=3" ;;
  set83)
    # ~440 s, CUDA: set 60's attention kernels as ggml ops again after set82 (H100: probe, block
    # 1.047 ms; two set-57 tests failed, fixed: they test the composed softmax): the attention,
    # autocast, budget and product tests of test_kernels, test_attention and test_amp, then the
    # block with and without them in one process, a second measurement
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 420 || exit 1
    cuda_tests 120 "attention or autocast or budget or amp or one_kernel_each_way" tests/test_kernels.py \
      tests/test_attention.py tests/test_amp.py
    grep "^FAILED\|^E  " $OUT/tests-cuda.txt | head -20
    cu timeout 75 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 \
      --models block --cuda-graph --blocks 4 --without ATTENTION > $OUT/block-cuda.txt 2>&1
    grep "CUDA graph\|without\|eager\|losses" $OUT/block-cuda.txt
    echo "done at $(el) s" ;;
  set82)
    # ~560 s, CUDA: set 60's attention kernels (base-2 scores, ex2.approx, masks only where a step
    # needs them, cp.async into two buffers, dk/dv's products one score tile at a time) in the
    # probe against set 59's (base_attention/) and set 60's first half (base60_attention/), copies
    # made for the call, not committed (skipped where absent), with ncu's counters, while the wheel
    # builds (niced); then set81's tests, block A/B and profile. The copies, before the call:
    #   for b in base_attention:c783c3d base60_attention:a816fe8; do mkdir -p ${b%:*}; git show \
    #     ${b#*:}:scripts/ggml_kernels/ggrad_attention.cuh > ${b%:*}/ggrad_attention.cuh; done
    build_cuda_in_background
    attention_probes "set60:scripts/ggml_kernels:" "set59:base_attention:" "set60a:base60_attention:"
    echo "probes at $(el) s"
    attention_ops ;;
  set81)
    # ~560 s, CUDA: set 59's attention kernels as ggml ops (their probe passed on an H100: set81p),
    # their test and the attention tests, then the bf16 block with and without them in one process,
    # its kernels in the time left. The wheel alone took over 330 s beside the probe's nvcc (the
    # seventeenth session's second call), so nothing else builds meanwhile
    build_cuda_in_background
    attention_ops ;;
  set80)
    # ~480 s, CUDA: set 58's four-a-thread binary ops and relu gradients (binary_x4, silu_back_x4),
    # unverified: their bit test and the suites they touch, set79's tests, then the bf16 block with
    # and without them in one process, its kernels
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 300 || exit 1
    cuda_tests 120 "four_a_thread or relu or binary or conv or permuted_copy or where_their_copies or fuzz or budget" \
      tests/test_kernels.py tests/test_ops.py tests/test_conv.py tests/test_launch_limits.py
    grep "^FAILED\|^E  " $OUT/tests-cuda.txt | head -20
    cu timeout 100 python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 \
      --models block --cuda-graph --blocks 6 --without binary_x4 silu_back_x4 > $OUT/block-cuda.txt 2>&1
    grep "CUDA graph\|without\|eager" $OUT/block-cuda.txt
    echo "block at $(el) s"
    [ "$(el)" -lt 540 ] && cu timeout 45 python3 bench/profile_step.py --device cuda --model block --block-batch 32 --amp bf16 \
      --precision high --kernels --top 40 --repeats 5 > $OUT/block-profile.txt 2>&1
    echo "done at $(el) s" ;;
  set67)
    # ~170 s, Vulkan alone (no CUDA build): kernel sets 54-55 (the cross-entropy's reduction, Adam's
    # constants in place, the budgets) and set60's NV_coopmat2 tests on a real GPU's Vulkan, then
    # set63's mlp-large rows at "medium" in blocks of 7 with and without the float16 operands and
    # the float32 sums (carry.sh vulkan's wheel of this tree)
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    setup_vulkan
    vulkan_tests 60 "cross_entropy or adam_constants or budget or in_place_in_one_dispatch" tests/test_kernels.py \
      tests/test_optim.py
    mv $OUT/tests-vulkan.txt $OUT/tests-vulkan-sets54-55.txt
    vulkan_half_ab 7 "device half_operands" "device float32_sums" ;;
  set58v)
    # ~110 s, set58's Vulkan half alone (no CUDA build: 268 s of device time left): mlp-large at
    # "medium" with ggml-vulkan's graphs left running, an A/B in one process, batches uploaded
    # and on the device
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    setup_vulkan
    for data in host device; do
      vk timeout 45 python3 bench/train_step.py --device vulkan --torch-device cuda --precision medium \
        --models mlp-large --cuda-graph --blocks 3 --data $data --synchronous >> $OUT/mlp-large-vulkan.txt 2>&1
      echo "vulkan mlp-large, data on the $data, at $(el) s"
    done ;;
  set53t)
    # ~300 s, set53 cut to a short lease: the new kernels' tests on CUDA, then the bf16 block
    # with and without relu in the cast and LayerNorm writing bfloat16
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 270 || exit 1
    cuda_tests 40 "relu or layer_norm or budget" tests/test_kernels.py
    cu timeout $(( 340 - $(el) )) python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 \
      --models block --cuda-graph --blocks 3 --steps 10 --without cast_relu layer_norm_low > $OUT/block-cuda.txt 2>&1 ;;
  set50c)
    # ~250 s, set50b cut to what 339 s of device time allows: relu four a thread tested, the
    # accumulation probe without CUDA graphs, the bf16 block with and without unary_x4
    build_cuda_in_background
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl
    cuda_wheel_installed 225 || exit 1
    cuda_tests 25 "four_values_a_thread or budget" tests/test_kernels.py
    cu env GGML_CUDA_DISABLE_GRAPHS=1 timeout 15 python3 bench/gpu/accumulation_probe.py cuda:0 > $OUT/accumulation.txt 2>&1
    cu timeout $(( 290 - $(el) )) python3 bench/train_step.py --device cuda --torch-device cuda --precision high --amp bf16 \
      --models block --cuda-graph --blocks 3 --steps 10 --without unary_x4 > $OUT/block-cuda.txt 2>&1 ;;
  lt_probe)
    # ~40 s: which cuBLASLt bias-gradient epilogues (BGRADB) exist for ggrad's layouts and types
    "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" -O2 -o /tmp/probe bench/gpu/probe_lt_bgrad.cu -lcublasLt > $OUT/probe-build.txt 2>&1 || { cat $OUT/probe-build.txt; exit 1; }
    /tmp/probe > $OUT/lt-probe.txt 2>&1; cat $OUT/lt-probe.txt ;;
  parts)
    vulkan_parts ;;
  vkprof)
    # ~150 s: where the Vulkan cnn's and ResNet's steps go, op by op (ggml-vulkan's perf logger)
    setup_vulkan
    for model in resnet cnn; do
      vk env GGML_VK_PERF_LOGGER=1 GGML_VK_PERF_LOGGER_FREQUENCY=10 timeout 100 python3 bench/gpu/vulkan_ops.py \
        --model $model > $OUT/vulkan-ops-$model.txt 2>&1
      echo "$model at $(el) s"
    done
    vk timeout 90 python3 bench/profile_step.py --device vulkan --model resnet --repeats 3 > $OUT/profile-resnet-vulkan.txt 2>&1 ;;
  *) echo "usage: bash bench/gpu/session.sh vulkan|cuda|lean|set45|set45c|set46|set46b|set46c|set47|set47b|set47c|set47d|set47e|set48|set48b|set48c|set48d|set48e|set48f|set48g|set49|set49b|set49c|set49d|set49e|set50|set50b|set50c|set53|set53t|set54|set54b|set54c|lt_probe|parts|vkprof"; exit 2 ;;
esac
echo "$1 done at $(el) s"
