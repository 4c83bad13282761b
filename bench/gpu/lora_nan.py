"""Where NaN enters LoRA gradients over q4_0/q5_1 weights on NVIDIA's Vulkan device
(test_lora's dequantized-model case, 2026-12-06 H200): the quantized model's logits, loss
and each adapter's gradients, NaN counted, beside the float model's. Run it with and without
GGML_VK_DISABLE_INTEGER_DOT_PRODUCT=1 (ggml-vulkan's 8-bit activation products).

    python bench/gpu/lora_nan.py --device vulkan --kinds q4_0 q5_1 q8_0
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

import ggrad
import ggrad.functional as F
from ggrad import gguf as gg
from ggrad import nn
from ggrad.functional import quantized
from ggrad.models import Llama, LlamaConfig
from ggrad.nn import lora

CONFIG = LlamaConfig(vocab_size=260, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96, max_seq_len=32)


def nans(t) -> int:
    return int(np.isnan(t.numpy()).sum())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="vulkan")
    ap.add_argument("--kinds", nargs="+", default=["q4_0", "q5_1", "q8_0"])
    args = ap.parse_args()
    ggrad.set_device(args.device)
    print("integer dot off:", os.environ.get("GGML_VK_DISABLE_INTEGER_DOT_PRODUCT"))
    for kind in args.kinds:
        ggrad.manual_seed(4)
        with tempfile.TemporaryDirectory() as tmp:
            q = gg.load_model(gg.save_model(Llama(CONFIG), os.path.join(tmp, "q.gguf"), dtype=kind))
        reference = Llama(CONFIG)
        with ggrad.no_grad():
            for name, mod in q.named_modules():
                if isinstance(mod, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
                    reference.get_submodule(name).weight.assign_(quantized.dequantize(mod.weight))
            reference.load_state_dict(q.state_dict(), strict=False)
        for m in (q, reference):
            lora.add_lora(m, ("wq", "wv", "w2"), rank=4, alpha=8.0)
        rng = np.random.default_rng(5)
        for (name, a), b in zip(lora.lora_layers(q).items(), lora.lora_layers(reference).values()):
            with ggrad.no_grad():
                for t in (a.lora_A, b.lora_A):
                    t.assign_(np.random.default_rng(len(name)).standard_normal(t.shape).astype(np.float32) * 0.1)
                B = rng.standard_normal(a.lora_B.shape).astype(np.float32) * 0.1
                a.lora_B.assign_(B)
                b.lora_B.assign_(B)
        ids = np.random.default_rng(6).integers(3, 259, (2, 16))
        x, y = ggrad.tensor(ids), ggrad.tensor(np.roll(ids, -1, axis=1).reshape(-1))
        for label, m in (("quantized", q), ("float", reference)):
            with ggrad.grad_tape():
                logits = F.reshape(m(x), (-1, CONFIG.vocab_size))
                loss = F.cross_entropy(logits, y)
                loss.backward()
            grads = {name: (nans(a.lora_A.grad), nans(a.lora_B.grad)) for name, a in lora.lora_layers(m).items()}
            print(f"{kind} {label}: logits NaN {nans(logits)} of {logits.numel()}, loss {float(loss.item()):.6f}, "
                  f"adapter gradients NaN (A, B): {grads}")
        for name, a in lora.lora_layers(q).items():
            b = lora.lora_layers(reference)[name]
            for which in ("lora_A", "lora_B"):
                got, want = getattr(a, which).grad.numpy(), getattr(b, which).grad.numpy()
                print(f"  {name}.{which}: error {np.nanmax(np.abs(got - want)) / np.abs(want).max():.1e}")


if __name__ == "__main__":
    main()
