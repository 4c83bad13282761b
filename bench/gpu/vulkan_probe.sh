#!/usr/bin/env bash
# The Vulkan questions the 2026-12-05 night lease left open, in one device call on a fresh
# machine (carry [".wheels", ".whl", ".gl"], after bench/gpu/carry.sh vulkan), most urgent
# first, each result written straight under $OUT (a call cut at its limit keeps what finished):
#   lora.txt                LoRA over q4_0/q5_1 failed on the H100's Vulkan device in the whole
#                           suite's run: each adapter's error, through ggrad's quantized-backward
#                           kernel and composed, with full tracebacks
#   lora-without-kernel.txt the LoRA bench with that kernel refused (lease.sh vulkan has it on)
#   conv-gemm.txt           cnn and ResNet with ggrad's GEMM shader for every float32 product
#                           against ggml's mul_mat, same process
#   block-gemm.txt          the same for the block at "high"
#   block-bf16-high.txt     the bf16 block at "high" (matrix cores off): its products of rounded
#                           operands through the GEMM shader since d34ca52 (set 36: 11.2 ms)
#   conv-per-image.txt      convolutions in the per-image product layout (conv.PER_IMAGE_PRODUCT_KINDS)
#   ops-lora.txt            test_ops then test_lora in one process: the failing worker's order
set -uo pipefail
t0=$(date +%s)
OUT=/tmp/setup BENCHES=none bash bench/gpu/h200.sh vulkan bench-only > /tmp/setup.txt 2>&1
export PYTHONPATH=/tmp/ggml-vulkan:/tmp/site:src VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json PYTHONUNBUFFERED=1
timeout 60 python3 -m pytest -v -p no:cacheprovider --tb=long tests/test_lora.py -k "dequantized_models and vulkan" > $OUT/lora.txt 2>&1
echo "lora at $(( $(date +%s) - t0 )) s"
timeout 50 python3 -c "import runpy, sys; from ggrad.runtime import kernels; s = kernels.supported
kernels.supported = lambda b, k: k != kernels.QMATMUL_BACK and s(b, k)
sys.argv[0] = 'bench/lora_tokens.py'; runpy.run_path('bench/lora_tokens.py', run_name='__main__')" \
  --device vulkan --torch-device cuda --blocks 3 --steps 3 > $OUT/lora-without-kernel.txt 2>&1
timeout 80 python3 bench/train_step.py --device vulkan --torch-device cuda --models cnn resnet --cuda-graph --blocks 2 \
  --steps 6 --without GEMM > $OUT/conv-gemm.txt 2>&1
echo "conv at $(( $(date +%s) - t0 )) s"
timeout 60 python3 bench/train_step.py --device vulkan --torch-device cuda --precision high --models block --cuda-graph \
  --blocks 3 --without GEMM > $OUT/block-gemm.txt 2>&1
timeout 60 python3 bench/train_step.py --device vulkan --torch-device cuda --precision high --amp bf16 --models block \
  --cuda-graph --blocks 3 --without GEMM > $OUT/block-bf16-high.txt 2>&1
timeout 70 python3 -c "import runpy, sys; import ggrad.functional.conv as c; c.PER_IMAGE_PRODUCT_KINDS = frozenset({'cpu', 'cuda', 'vulkan'})
sys.argv[0] = 'bench/train_step.py'; runpy.run_path('bench/train_step.py', run_name='__main__')" \
  --device vulkan --torch-device cuda --models cnn resnet --cuda-graph --blocks 2 --steps 6 > $OUT/conv-per-image.txt 2>&1
timeout 90 python3 -m pytest -q -p no:cacheprovider --tb=long tests/test_ops.py tests/test_lora.py -k vulkan > $OUT/ops-lora.txt 2>&1
echo "done at $(( $(date +%s) - t0 )) s"
