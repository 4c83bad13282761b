#!/usr/bin/env bash
# The Vulkan LoRA NaN needs an earlier test in the same process (a fresh one found none on an
# H100): the q8_0 case then the q4_0 one, with ggml-vulkan's integer-dot products kept
# (GGRAD_VK_INTEGER_DOT=1; ggrad turns them off since) and under ggml-vulkan's switches.
set -uo pipefail
OUT=/tmp/setup BENCHES=none bash bench/gpu/h200.sh vulkan bench-only > /dev/null 2>&1
export PYTHONPATH=/tmp/ggml-vulkan:/tmp/site:src VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
for switch in NONE GGML_VK_DISABLE_INTEGER_DOT_PRODUCT GGML_VK_DISABLE_MMVQ; do
  echo "== $switch" >> $OUT/lora-order.txt
  env GGRAD_VK_INTEGER_DOT=1 $switch=1 timeout 30 python3 -m pytest -q -p no:cacheprovider --tb=line tests/test_lora.py \
    -k "dequantized_models and vulkan and kernel and (q8_0 or q4_0)" 2>&1 | grep -E "passed|failed|Error|nan" >> $OUT/lora-order.txt
done
