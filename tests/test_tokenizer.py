"""ggrad.tokenizer against llama.cpp: its own tokenizer tests (the .inp texts and .out ids
of five vocabularies: SentencePiece llama and phi-3, byte-level BPE gpt-2, qwen2 and
llama3), and llama-cpp-python itself on texts of every kind (specials, whitespace runs,
bytes no token covers), both ways."""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from ggrad.tokenizer import GGUFTokenizer
from conftest import run_in_child

pytest.importorskip("regex")
VOCABS = Path(os.environ.get("GGRAD_CACHE", Path.home() / ".cache" / "ggrad")) / "llama-cpp-vocab-0.3.36"
NAMES = ["llama-spm", "phi-3", "gpt-2", "qwen2", "llama-bpe"]
pytestmark = pytest.mark.skipif(not (VOCABS / ".complete").exists(),
                                reason="llama.cpp's test vocabularies are not kept: scripts/build_llama_cpp.sh")


def vocab(name: str) -> str:
    return str(VOCABS / f"ggml-vocab-{name}.gguf")


@pytest.mark.parametrize("name", NAMES)
def test_llama_cpps_own_tokenizer_cases(name):
    tok = GGUFTokenizer.from_file(vocab(name))
    texts = (VOCABS / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    ids = (VOCABS / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8").split("\n")
    assert len(texts) >= 40
    for text, want in zip(texts, ids):
        assert tok.encode(text, add_special=False) == [int(i) for i in want.split()], repr(text)


TEXTS = ["", " ", "Hello world", "  two  spaces\n\n\tand tabs ", "naïve café 東京 🦙 ∑", "don't you'LL 123456 7.5e-3",
         "<s> a</s>b <|endoftext|><|im_start|>user\nhi<|im_end|>", "\u0000\u0001 odd \x7f bytes ￿",
         "def f(x):\n    return x ** 2  # é€", "a" * 50 + " " + "ab" * 30,
         " ? Hello , world . it 's a ' ' b ' c ! they 're we 've I 'm", "<|fim_prefix|>x<|fim_suffix|>y<|fim_middle|>"]

LLAMA_CPP = """
import ctypes, json, sys
import llama_cpp
path, texts, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
llm = llama_cpp.Llama(path, vocab_only=True, verbose=False)
result = {"encoded": [[llm.tokenize(t.encode(), add_bos=add, special=special) for add in (False, True)
                       for special in (False, True)] for t in texts]}

def detokenize(ids):  # llama_detokenize itself (llama-cpp-python's own detokenize keeps the prefix space)
    buf = (ctypes.c_char * 4096)()
    n = llama_cpp.llama_detokenize(llm._model.vocab, (llama_cpp.llama_token * len(ids))(*ids), len(ids), buf, 4096,
                                   False, False)
    return list(bytes(buf[:n]))
result["decoded"] = [[detokenize(ids) for ids in cases] for cases in result["encoded"]]
json.dump(result, open(out, "w"))
"""


@pytest.mark.skipif(__import__("importlib").util.find_spec("llama_cpp") is None,
                    reason="llama-cpp-python (the oracle) is not installed: scripts/build_llama_cpp.sh")
@pytest.mark.parametrize("name", NAMES)
def test_ids_and_texts_are_llama_cpps(tmp_path, name):
    """encode with and without BOS/EOS and special-token parsing, and decode, equal
    llama_tokenize and llama_detokenize (llama-cpp-python, vocab only)."""
    out = tmp_path / "tokens.json"
    run_in_child(LLAMA_CPP, vocab(name), json.dumps(TEXTS), str(out))
    theirs = json.loads(out.read_text())
    tok = GGUFTokenizer.from_file(vocab(name))
    for text, cases, decoded in zip(TEXTS, theirs["encoded"], theirs["decoded"]):
        ours = [tok.encode(text, add_special=add, parse_special=special) for add in (False, True)
                for special in (False, True)]
        assert ours == cases, repr(text)
        for ids, text_bytes in zip(cases, decoded):
            assert tok.decode(ids) == bytes(text_bytes).decode("utf-8", errors="replace"), (repr(text), ids)


def test_a_vocabulary_round_trips_through_save_model(tmp_path):
    """A model saved with a file's vocabulary carries it: the same ids for the same text."""
    from ggrad import gguf as gg
    from ggrad.models import Llama, LlamaConfig

    tok = GGUFTokenizer.from_file(vocab("llama-spm"))
    model = Llama(LlamaConfig(vocab_size=len(tok), dim=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=16,
                              max_seq_len=16))
    again = GGUFTokenizer.from_file(gg.save_model(model, str(tmp_path / "m.gguf"), tokenizer=tok))
    for text in TEXTS:
        assert again.encode(text) == tok.encode(text)
    with pytest.raises(ValueError, match="embedding"):
        tok.write(None, len(tok) + 1)


def test_bad_vocabularies_and_ids_raise_clearly():
    with pytest.raises(NotImplementedError, match="'bert'"):
        GGUFTokenizer("bert", ["a"], [1])
    with pytest.raises(NotImplementedError, match="pre-tokenizer 'deepseek-llm'"):
        GGUFTokenizer("gpt2", ["a"], [1], pre="deepseek-llm")
    with pytest.raises(ValueError, match="as many types"):
        GGUFTokenizer("llama", ["a", "b"], [1])
    tok = GGUFTokenizer.from_file(vocab("gpt-2"))
    with pytest.raises(IndexError, match="outside the vocabulary"):
        tok.decode([len(tok)])
    assert np.all(np.array(tok.encode("x" * 10)) < len(tok))
