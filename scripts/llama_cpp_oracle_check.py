#!/usr/bin/env python
"""llama.cpp itself (llama-cpp-python, built by scripts/build_llama_cpp.sh) as the oracle
for ggrad.models.Llama, end to end, using none of ggrad's own GGUF code (issue 16):

1. a tiny llama with random weights (ggrad's state-dict keys and shapes);
2. written as a llama GGUF with the `gguf` package's GGUFWriter: llama.cpp's keys, tensor
   names from GGUF_NAMES, tensors in F32 (or F16/BF16 matrices, or Q8_0 for every matrix
   whose rows are whole 32-blocks, the others F32), a byte-level tokenizer
   (--tokenizer gpt2 | llama | none);
3. llama.cpp evaluates a fixed token list (logits of every position) and generates greedily;
   ggrad's Llama with the same weights does the same (Q8_0 matrices held in their blocks as
   ggrad.nn.QuantizedLinear / QuantizedEmbedding, F16/BF16 ones as rounded float32); the
   logits are compared (max |a - b| / max |b|) and the greedy tokens must be equal; with the
   gpt2 tokenizer also text in, text out (create_completion at temperature 0);
4. with --lora, a random LoRA adapter (GGUF, general.type = "adapter") applied by llama.cpp
   against ggrad's Llama with W + alpha / r * B @ A (merged, or beside a Q8_0 base);
5. the tokenizer: llama.cpp's tokenize/detokenize of a text against the byte ids.

llama.cpp runs in a child process (`--child`): llama-cpp-python and ggml-python each bundle a
libggml, and once ggml-python is loaded (RTLD_GLOBAL) llama.cpp's libraries bind to its ggml
functions (docs/llama_cpp.md). ggrad runs on --device (cpu by default: ggml's CPU Q8_0
product rounds the activations to Q8_0 blocks exactly as llama.cpp's does).

    .venv/bin/python scripts/llama_cpp_oracle_check.py [--dtype f32|f16|bf16|q8_0]
        [--tokenizer gpt2|llama|none] [--tied] [--lora] [--seed N] [--keep DIR]
Exit status 0 when every check holds (tolerances: f32 1e-4, q8_0 1e-3, f16 1e-2, bf16 5e-2).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

CONFIG = dict(vocab_size=259, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48, max_seq_len=64)
UNK, BOS, EOS, OFFSET = 0, 1, 2, 3  # the byte b is token OFFSET + b (ggrad.gguf.ByteTokenizer's layout)
TEXT = "def f(x):\n    return x ** 2  # é€"
TOKENS = [OFFSET + b for b in TEXT.encode("utf-8")][:24]
N_GENERATE = 8
N_CTX = 128


# ---- the GGUF files ------------------------------------------------------------------------

def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (what llama.cpp's BPE tokenizer uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def write_tokenizer(writer, kind: str, vocab_size: int) -> None:
    import gguf

    if kind == "none":  # no vocabulary: llama.cpp takes its size from llama.vocab_size
        writer.add_tokenizer_model("none")
        return
    specials = ["<unk>", "<s>", "</s>"]
    if kind == "gpt2":
        table = bytes_to_unicode()
        pieces, byte_type = [table[b] for b in range(256)], gguf.TokenType.NORMAL
    else:  # "llama": SentencePiece with byte-fallback tokens
        pieces, byte_type = [f"<0x{b:02X}>" for b in range(256)], gguf.TokenType.BYTE
    tokens = specials + pieces
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [byte_type] * 256
    pad = vocab_size - len(tokens)
    tokens += [f"<pad{i}>" for i in range(pad)]
    types += [gguf.TokenType.UNUSED] * pad
    writer.add_tokenizer_model(kind)
    if kind == "gpt2":
        writer.add_tokenizer_pre("default")
        # llama.cpp's BPE loader requires the merges key, and GGUFWriter drops an empty array:
        # one merge that can never apply (its left side "<s>" is no single byte's character,
        # and no other merge makes it), so every byte stays its own token.
        writer.add_token_merges(["<s> </s>"])
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types([int(t) for t in types])
    writer.add_unk_token_id(UNK)
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    if kind == "llama":
        writer.add_add_space_prefix(False)


def q8_0_ok(name: str, w: np.ndarray) -> bool:
    return w.ndim == 2 and w.shape[1] % 32 == 0


def write_model(path: str, state: dict, cfg: dict, tokenizer: str, dtype: str):
    """Write the llama GGUF; returns the weights as llama.cpp will hold them (Q8_0 ones
    dequantised) and the Q8_0 tensors' raw blocks, both by ggrad state-dict key."""
    import gguf
    from gguf.quants import dequantize, quantize

    from ggrad.models.llama import gguf_name

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("ggrad oracle check")
    writer.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                          "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[dtype])
    writer.add_context_length(cfg["max_seq_len"])
    writer.add_embedding_length(cfg["dim"])
    writer.add_block_count(cfg["n_layers"])
    writer.add_feed_forward_length(cfg["ffn_dim"])
    writer.add_head_count(cfg["n_heads"])
    writer.add_head_count_kv(cfg["n_kv_heads"])
    writer.add_rope_dimension_count(cfg["dim"] // cfg["n_heads"])
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(cfg["vocab_size"])
    write_tokenizer(writer, tokenizer, cfg["vocab_size"])
    held, blocks = {}, {}
    for key, w in state.items():
        name = gguf_name(key)
        w = np.ascontiguousarray(w, dtype=np.float32)  # (out, in) row-major = ggml ne (in, out)
        if dtype == "q8_0" and q8_0_ok(name, w):
            q = quantize(w, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            held[key] = dequantize(q, gguf.GGMLQuantizationType.Q8_0).reshape(w.shape).astype(np.float32)
            blocks[key] = q
        elif dtype in ("f16", "bf16") and w.ndim == 2:  # matrices only: norms stay float32
            if dtype == "f16":
                half = w.astype(np.float16)
                writer.add_tensor(name, half)
            else:
                import ml_dtypes
                half = w.astype(ml_dtypes.bfloat16)
                writer.add_tensor(name, half.view(np.uint16), raw_shape=half.shape,
                                  raw_dtype=gguf.GGMLQuantizationType.BF16)
            held[key] = half.astype(np.float32)
        else:
            writer.add_tensor(name, w)
            held[key] = w
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return held, blocks


LORA_TARGETS = ("attention.wq", "attention.wv", "feed_forward.w3")


def write_lora(path: str, state: dict, cfg: dict, rank: int, alpha: float, seed: int) -> dict:
    """A random LoRA adapter on LORA_TARGETS of every block; returns the merged weights
    W + alpha / rank * B @ A by key. lora_a is numpy (rank, in) = ne (in, rank); lora_b is
    numpy (out, rank) = ne (rank, out), as llama.cpp's adapter loader checks. Also returns
    the factors (a, b) by key."""
    import gguf

    from ggrad.models.llama import gguf_name

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    merged, factors = dict(state), {}
    for n in range(cfg["n_layers"]):
        for target in LORA_TARGETS:
            key = f"layers.{n}.{target}.weight"
            out_f, in_f = state[key].shape
            a = (rng.standard_normal((rank, in_f)) * 0.3).astype(np.float32)
            b = (rng.standard_normal((out_f, rank)) * 0.3).astype(np.float32)
            writer.add_tensor(gguf_name(key) + ".lora_a", a)
            writer.add_tensor(gguf_name(key) + ".lora_b", b)
            merged[key] = (state[key] + alpha / rank * (b @ a)).astype(np.float32)
            factors[key] = (a, b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return merged, factors


# ---- llama.cpp's side (child process) --------------------------------------------------------

def child(request_path: str) -> None:
    import itertools

    import llama_cpp

    req = json.load(open(request_path))
    kw = dict(logits_all=True, n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, n_threads=1, n_threads_batch=1,
              verbose=False, type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, flash_attn=False)
    if req.get("lora"):
        kw.update(lora_path=req["lora"], lora_scale=1.0)
    llm = llama_cpp.Llama(req["model"], **kw)
    tokens = req["tokens"]
    llm.reset()
    llm.eval(tokens)
    logits = np.array(llm.scores[: len(tokens)], dtype=np.float32)
    greedy = list(itertools.islice(llm.generate(tokens, temp=0.0, top_k=1, top_p=1.0, min_p=0.0,
                                                repeat_penalty=1.0), req["n_generate"]))
    result = {"n_vocab": llm.n_vocab(), "greedy": [int(t) for t in greedy]}
    if req.get("text") is not None and req.get("tokenizer") != "none":
        result["tokenized"] = llm.tokenize(req["text"].encode("utf-8"), add_bos=False, special=False)
        ids = [OFFSET + b for b in req["text"].encode("utf-8")]
        result["detokenized"] = llm.detokenize(ids).decode("utf-8", errors="replace")
        result["bos"], result["eos"] = llm.token_bos(), llm.token_eos()
        result["add_bos"] = bool(llama_cpp.llama_vocab_get_add_bos(llm._model.vocab))
        # llama_detokenize (what llama.cpp's server uses; applies the vocabulary's clean_spaces)
        arr = (llama_cpp.llama_token * len(ids))(*ids)
        buf = (llama_cpp.ctypes.c_char * 4096)()
        n = llama_cpp.llama_detokenize(llm._model.vocab, arr, len(ids), buf, 4096, False, False)
        result["llama_detokenize"] = bytes(buf[:n]).decode("utf-8", errors="replace")
    if req.get("tokenizer") == "gpt2":
        # text in, text out: llama.cpp tokenizes the prompt, generates greedily, detokenizes
        out = llm.create_completion(req["text"], max_tokens=req["n_generate"], temperature=0.0, top_k=1,
                                    top_p=1.0, min_p=0.0, repeat_penalty=1.0)
        result["completion"] = out["choices"][0]["text"]
        # more than max_tokens when the text would end inside a UTF-8 character (llama-cpp-python
        # keeps generating until the character is whole)
        result["completion_tokens"] = out["usage"]["completion_tokens"]
    np.save(req["logits"], logits)
    json.dump(result, open(req["result"], "w"))


def run_llama_cpp(workdir: str, model: str, tokens: list, lora: str | None, tokenizer: str, tag: str):
    req = dict(model=model, tokens=tokens, lora=lora, n_generate=N_GENERATE, text=TEXT, tokenizer=tokenizer,
               logits=os.path.join(workdir, f"{tag}.npy"), result=os.path.join(workdir, f"{tag}.json"))
    path = os.path.join(workdir, f"{tag}.request.json")
    json.dump(req, open(path, "w"))
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", path],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"llama.cpp child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}")
    return np.load(req["logits"]), json.load(open(req["result"]))


# ---- ggrad's side ---------------------------------------------------------------------------

def random_state(cfg: dict, seed: int) -> dict:
    """ggrad Llama state dict with random weights (norm weights too), as tests/test_llama.py."""
    from ggrad.models import Llama, LlamaConfig

    rng = np.random.default_rng(seed)
    shapes = {k: p.shape for k, p in Llama(LlamaConfig(**cfg)).state_dict().items()}
    state = {}
    for key, shape in shapes.items():
        if key.endswith("norm.weight"):
            state[key] = rng.uniform(0.5, 1.5, shape)
        else:
            state[key] = rng.standard_normal(shape) * (1.0 if key.startswith("tok_") else 0.3)
    return {k: v.astype(np.float32) for k, v in state.items()}


def ggrad_run(state: dict, cfg: dict, tokens: list, n_generate: int, blocks: dict | None = None,
              lora: dict | None = None, scale: float = 1.0):
    """ggrad's logits of `tokens` and its greedy continuation. `blocks`: Q8_0 weights (raw
    GGUF bytes by state-dict key) held as ggrad.nn.QuantizedLinear / QuantizedEmbedding, so
    that ggml's CPU product rounds the activations to Q8_0 blocks as llama.cpp's does.
    `lora`: (a, b) by key: that layer becomes base(x) + scale * (x @ a^T) @ b^T, as llama.cpp
    applies an adapter (written here, not ggrad.nn.lora, so that this script checks the format
    on its own)."""
    import ggrad
    from ggrad.functional.quantized import from_blocks
    from ggrad.models import Llama, LlamaConfig
    from ggrad.nn import Module
    from ggrad.nn.quantized import QuantizedEmbedding, QuantizedLinear

    class Adapted(Module):
        def __init__(self, base, a, b):
            super().__init__()
            self.base, self.a, self.b = base, ggrad.tensor(a), ggrad.tensor(b)

        def forward(self, x):
            return self.base(x) + ((x @ self.a.T) @ self.b.T) * scale

    model = Llama(LlamaConfig(**cfg))
    model.load_state_dict(state)
    for key, raw in (blocks or {}).items():
        *path, name, _ = key.split(".")
        parent = model
        for part in path:
            parent = parent[int(part)] if part.isdigit() else getattr(parent, part)
        weight = from_blocks(raw, state[key].shape)
        setattr(parent, name, QuantizedEmbedding(weight) if key.startswith("tok_") else QuantizedLinear(weight))
    for key, (a, b) in (lora or {}).items():
        *path, name, _ = key.split(".")
        parent = model
        for part in path:
            parent = parent[int(part)] if part.isdigit() else getattr(parent, part)
        setattr(parent, name, Adapted(getattr(parent, name), a, b))
    logits = model(np.array([tokens], dtype=np.int32)).numpy()[0]
    seq = list(tokens)
    for _ in range(n_generate):  # greedy: the argmax of the last position, whole sequence each time
        seq.append(int(np.argmax(model(np.array([seq], dtype=np.int32)).numpy()[0, -1])))
    return logits, seq[len(tokens):]


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--dtype", choices=("f32", "f16", "bf16", "q8_0"), default="f32")
    ap.add_argument("--tied", action="store_true", help="tied embeddings: no output.weight in the file")
    ap.add_argument("--tokenizer", choices=("gpt2", "llama", "none"), default="gpt2")
    ap.add_argument("--lora", action="store_true", help="also check a LoRA adapter (rank 4, alpha 8)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--q8-tol", type=float, default=1e-3)
    ap.add_argument("--keep", help="write the files here and keep them")
    ap.add_argument("--device", default="cpu", help="ggrad's device (cpu: Q8_0 products as llama.cpp's)")
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return 0

    import ggrad

    ggrad.set_device(args.device)
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        return check(args, args.keep)
    with tempfile.TemporaryDirectory(prefix="llama_cpp_oracle_") as workdir:
        return check(args, workdir)


def check(args, workdir: str) -> int:
    if args.tied:
        CONFIG["tie_embeddings"] = True
    state = random_state(CONFIG, args.seed)
    model_path = os.path.join(workdir, f"tiny-{args.dtype}-{args.tokenizer}{'-tied' if args.tied else ''}.gguf")
    held, blocks = write_model(model_path, state, CONFIG, args.tokenizer, args.dtype)
    tol = {"f32": 1e-4, "q8_0": args.q8_tol, "f16": 1e-2, "bf16": 5e-2}[args.dtype]
    ok = True

    ref_logits, ref = run_llama_cpp(workdir, model_path, TOKENS, None, args.tokenizer, "base")
    logits, greedy = ggrad_run(held, CONFIG, TOKENS, N_GENERATE, blocks)
    r = rel(logits, ref_logits)
    tag = f"{args.dtype}, tokenizer {args.tokenizer}{', tied' if args.tied else ''}, ggrad on {args.device}"
    print(f"[{tag}] n_vocab {ref['n_vocab']}; logits {logits.shape}: "
          f"max |ggrad - llama.cpp| / max |llama.cpp| = {r:.3g} (tolerance {tol:g})")
    if blocks:  # for scale: the same model in float32 with the dequantised weights
        flogits, _ = ggrad_run(held, CONFIG, TOKENS, 0)
        print(f"  (for scale: ggrad float32 on the dequantised weights vs llama.cpp {rel(flogits, ref_logits):.3g}: "
              f"llama.cpp's and ggml's CPU Q8_0 product rounds the activations to Q8_0 too)")
    print(f"  greedy llama.cpp {ref['greedy']}\n  greedy ggrad     {greedy}")
    if args.dtype in ("f16", "bf16"):
        print(f"  ({args.dtype}: llama.cpp's CPU product converts the activations to {args.dtype} too; ggrad here "
              "multiplies float32 activations by the rounded weights: the tolerance is loose)")
    ok &= r <= tol and ref["n_vocab"] == CONFIG["vocab_size"]
    ok &= greedy == ref["greedy"]
    if "tokenized" in ref:
        expected = [OFFSET + b for b in TEXT.encode("utf-8")]
        tok_ok, detok_ok = ref["tokenized"] == expected, ref["detokenized"] == TEXT
        print(f"  tokenize(text) == bytes + {OFFSET}: {tok_ok}; detokenize(bytes + {OFFSET}) == text: {detok_ok}; "
              f"bos {ref['bos']} eos {ref['eos']} add_bos {ref['add_bos']}")
        if not tok_ok:
            print(f"    llama.cpp tokenize: {ref['tokenized']}\n    expected:           {expected}")
        print(f"  llama_detokenize == text: {ref['llama_detokenize'] == TEXT}")
        ok &= detok_ok  # tokenize is informative (the "llama" SPM form escapes spaces)
        if args.tokenizer == "gpt2":
            ok &= tok_ok
            # create_completion(TEXT) against ggrad's greedy continuation of TEXT's bytes, decoded
            # (llama-cpp-python stops at eos, and runs past max_tokens to finish a UTF-8 character)
            prompt = [OFFSET + b for b in TEXT.encode("utf-8")]
            _, cont = ggrad_run(held, CONFIG, prompt, ref["completion_tokens"], blocks)
            cont = cont[: cont.index(EOS)] if EOS in cont else cont
            text = bytes(t - OFFSET for t in cont if OFFSET <= t < OFFSET + 256).decode("utf-8", errors="ignore")
            print(f"  create_completion(text, temperature=0) == ggrad's greedy text: {ref['completion'] == text} "
                  f"({ref['completion']!r} vs {text!r})")
            ok &= ref["completion"] == text

    if args.lora:
        rank, alpha = 4, 8.0
        lora_path = os.path.join(workdir, "tiny-lora.gguf")
        merged, factors = write_lora(lora_path, held, CONFIG, rank, alpha, args.seed + 1)
        lref, lres = run_llama_cpp(workdir, model_path, TOKENS, lora_path, args.tokenizer, "lora")
        if blocks:  # Q8_0 base weights kept quantized, the adapters beside them
            llogits, lgreedy = ggrad_run(held, CONFIG, TOKENS, N_GENERATE, blocks, factors, alpha / rank)
        else:  # float32: the merged weights W + alpha / rank * B @ A
            llogits, lgreedy = ggrad_run(merged, CONFIG, TOKENS, N_GENERATE)
        lr, moved = rel(llogits, lref), rel(ref_logits, lref)
        print(f"  LoRA (rank {rank}, alpha {alpha}, {LORA_TARGETS}): max rel diff {lr:.3g} "
              f"(the adapter moves llama.cpp's logits by {moved:.3g}); greedy equal: {lgreedy == lres['greedy']}")
        ok &= lr <= tol and moved > 10 * tol and lgreedy == lres["greedy"]
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
