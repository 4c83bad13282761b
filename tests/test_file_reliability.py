"""Files that ggrad reads or writes: damaged or crafted checkpoints and GGUF models are
refused with a ValueError naming the file and what is wrong (never a bare internal
error, a hang or an allocation without bound), a file whose tensors do not fit its
header is refused before anything is allocated, and written files get the mode open()
would give them."""

import importlib.util
import json
import os
import struct

import gguf
import numpy as np
import pytest

import ggrad
from ggrad import gguf as gg
from ggrad import nn
from ggrad.models import Llama, LlamaConfig
from ggrad.models.llama import gguf_name, state_shapes
from ggrad.optim import Adam
from conftest import run_in_child

CONFIG = LlamaConfig(vocab_size=260, dim=64, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=96, max_seq_len=32)

# A child that may allocate without bound: its address space is capped at what it has
# after importing ggrad (devices listed) plus a margin, and it has a CPU-time limit.
LIMITED = """
import resource
import ggrad
with open("/proc/self/status") as status:
    size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (size + (1 << 30), size + (1 << 30)))
resource.setrlimit(resource.RLIMIT_CPU, (120, 120))
"""
LOAD_MODEL = LIMITED + """
import sys
from ggrad import gguf
try:
    gguf.load_model(sys.argv[1])
except ValueError as e:
    print(e)
"""


def tiny_llama(**changes) -> Llama:
    ggrad.manual_seed(0)
    return Llama(LlamaConfig(**{**CONFIG.__dict__, **changes}))


def write_llama(path, state: dict, **keys) -> str:
    """A llama GGUF holding `state` (llama.cpp names -> arrays, numpy's shape: ggml's
    reversed) and the header keys load_model reads, CONFIG's unless given in `keys`."""
    c = {"context_length": CONFIG.max_seq_len, "embedding_length": CONFIG.dim, "block_count": CONFIG.n_layers,
         "feed_forward_length": CONFIG.ffn_dim, "head_count": CONFIG.n_heads, "head_count_kv": CONFIG.n_kv_heads,
         **keys}
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in c.items():
        name = f"llama.attention.{key}" if key.startswith("head_count") else f"llama.{key}"
        (writer.add_string if isinstance(value, str) else writer.add_uint32)(name, value)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", CONFIG.norm_eps)
    for name, array in state.items():
        writer.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def llama_state() -> dict:
    return {gguf_name(k): v.numpy() for k, v in tiny_llama().state_dict().items()}


# ---- item 5: the header is checked against the tensors before anything is allocated ----
def test_a_header_claiming_a_million_blocks_is_refused_before_allocating(tmp_path):
    path = write_llama(tmp_path / "huge.gguf", llama_state(), block_count=1_000_000)
    out = run_in_child(LOAD_MODEL, path, timeout=180)
    assert path in out and "1000000 blocks" in out


def test_state_shapes_are_the_models():
    for tied, arch in ((False, "llama"), (True, "llama"), (False, "qwen2"), (True, "gemma"), (False, "phi3")):
        config = LlamaConfig(**{**CONFIG.__dict__, "n_layers": 2, "tie_embeddings": tied, "arch": arch})
        assert state_shapes(config) == {k: v.shape for k, v in Llama(config).state_dict().items()}


# ---- item 9: tensors that do not fit the header are refused, as llama.cpp does ----
def swapped(state):
    # wk is (32, 64): a converter that wrote its transpose with the dims swapped
    return {**state, "blk.0.attn_k.weight": state["blk.0.attn_k.weight"].T}


MISFITS = {
    "two dims swapped": (swapped, {}, "'blk.0.attn_k.weight' has shape [32, 64], expected [64, 32]"),
    "a tensor missing": (lambda s: {k: v for k, v in s.items() if k != "blk.0.ffn_up.weight"}, {},
                         "holds 11 tensors"),
    "a tensor too many": (lambda s: {**s, "token_types.weight": np.ones(8)}, {}, "holds 13 tensors"),
    "rope frequencies": (lambda s: {**s, "rope_freqs.weight": np.ones(8)}, {}, "scales its RoPE"),
    "yarn rope scaling": (lambda s: s, {"rope.scaling.type": "yarn"}, "scales its RoPE (yarn"),
    "more blocks claimed": (lambda s: s, {"block_count": 2}, "(2 blocks) has 21"),
    "a size as a string": (lambda s: s, {"embedding_length": "64"}, "'llama.embedding_length' must be a positive"),
    "a wrong row length": (lambda s: s, {"embedding_length": 32, "head_count": 2, "head_count_kv": 2},
                           "'token_embd.weight' has shape [64, 260], expected [32, 260]"),
}


@pytest.mark.parametrize("case", MISFITS)
def test_a_file_whose_tensors_do_not_fit_its_header_is_refused(case, tmp_path):
    change, keys, message = MISFITS[case]
    path = write_llama(tmp_path / "m.gguf", change(llama_state()), **keys)
    with pytest.raises(ValueError) as error:
        gg.load_model(path)
    assert path in str(error.value) and message in str(error.value)


def patched(path: str, name: str, after: bytes, skip: int, fmt: str, change) -> str:
    """A copy of `path`, named `name` beside it, with the value of struct format `fmt` that
    lies `skip` bytes after the first `after` changed."""
    data = bytearray(open(path, "rb").read())
    at = data.index(after) + len(after) + skip
    struct.pack_into(fmt, data, at, *change(struct.unpack_from(fmt, data, at)))
    out = os.path.join(os.path.dirname(path), name)
    open(out, "wb").write(data)
    return out


LLAMA_CPP_LOADS = """
import json, sys
import llama_cpp
verdicts = []
for path in sys.argv[1:]:
    try:
        llama_cpp.Llama(path, n_ctx=32, verbose=False)
        verdicts.append("loaded")
    except ValueError:
        verdicts.append("refused")
print(json.dumps(verdicts))
"""


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python (the oracle) is absent")
def test_llama_cpp_refuses_the_swapped_dims_load_model_refuses(tmp_path):
    good = gg.save_model(tiny_llama(), str(tmp_path / "m.gguf"))
    swapped = patched(good, "swapped.gguf", b"blk.0.attn_k.weight", 4, "<QQ", lambda ne: ne[::-1])  # after n_dims
    assert json.loads(run_in_child(LLAMA_CPP_LOADS, good, swapped).splitlines()[-1]) == ["loaded", "refused"]
    gg.load_model(good)
    with pytest.raises(ValueError, match="'blk.0.attn_k.weight' has shape \\[32, 64\\], expected \\[64, 32\\]"):
        gg.load_model(swapped)


# ---- item 13: a name safetensors reserves ----
def test_a_state_named_like_safetensors_metadata_is_refused_before_writing(tmp_path):
    path = tmp_path / "m.safetensors"
    ggrad.save({"w": np.arange(3, dtype=np.float32)}, path)
    before = path.read_bytes()
    with pytest.raises(ValueError, match="__metadata__"):
        ggrad.save({"__metadata__": np.zeros(2, np.float32)}, path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["m.safetensors"]
    nested = {"__metadata__": np.ones(2, np.float32), "epoch": 3}  # its tensor names are ggrad's own
    back = ggrad.load(ggrad.save(nested, path))
    assert back.keys() == nested.keys() and back["epoch"] == 3
    np.testing.assert_array_equal(back["__metadata__"], nested["__metadata__"])


# ---- item 19: every damaged file names itself and what is wrong ----
def safetensors_file(path, header: dict) -> str:
    """A safetensors file of `header`, its tensors' bytes zero."""
    text = json.dumps(header).encode()
    size = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(size))
    return str(path)


def nested_meta(structure: str) -> dict:
    return {"__metadata__": {"ggrad.format": "nested", "ggrad.structure": structure},
            "t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}


DAMAGED = {
    "structure not JSON": (nested_meta("{not json"), "metadata is not JSON"),
    "structure nested deeply": (nested_meta("[" * 100_000 + "]" * 100_000), "nests too deeply"),
    "structure missing": ({"__metadata__": {"ggrad.format": "nested"}}, "has no 'ggrad.structure'"),
    "unknown tensor": (nested_meta('{"w": {"__tensor__": "absent"}}'), "tensor 'absent' that the file does not"),
    "unhashable key": (nested_meta('{"__items__": [[[1], 2]]}'), "unhashable"),
    "not a dict": (nested_meta("5"), "holds a int"),
    "optimizer without micro_steps": ({"__metadata__": {"ggrad.format": "optimizer", "ggrad.optimizer": json.dumps(
        {"param_groups": [], "state": {}, "group_state": []})}}, "no entry 'micro_steps'"),
    "float8 tensor": ({"t": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}}, "'t' is F8_E4M3"),
}


@pytest.mark.parametrize("case", DAMAGED)
def test_a_damaged_checkpoint_names_itself_and_what_is_wrong(case, tmp_path):
    header, message = DAMAGED[case]
    path = safetensors_file(tmp_path / "bad.safetensors", header)
    with pytest.raises(ValueError) as error:
        ggrad.load(path)
    assert path in str(error.value) and message in str(error.value)


def test_a_gguf_array_whose_count_runs_past_the_end_is_refused_not_looped_over(tmp_path):
    path = str(tmp_path / "m.gguf")
    gg.save_model(tiny_llama(), path)
    data = bytearray(open(path, "rb").read())
    key = b"tokenizer.ggml.token_type"  # an array of int32: gguf's reader loops on its count
    count_at = data.index(key) + len(key) + 4 + 4  # then the value type, the item type, the count
    data[count_at:count_at + 8] = struct.pack("<Q", 1 << 62)
    open(path, "wb").write(data)
    out = run_in_child(LOAD_MODEL, path, timeout=180)
    assert path in out and "'tokenizer.ggml.token_type' runs" in out


FUZZ = LIMITED + """
import json, sys
import numpy as np
import ggrad
from ggrad import gguf

source, kind, folder, seed, cases = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
load = ggrad.load if kind == "safetensors" else gguf.load_model
original = open(source, "rb").read()
rng = np.random.default_rng(seed)
bad = []
for case in range(cases):
    data = bytearray(original)
    if case % 3 == 0:  # truncated
        data = data[:int(rng.integers(0, len(data)))]
    else:  # bits flipped, mostly in the header, where flips change the structure
        span = len(data) if case % 3 == 1 else min(len(data), 4096)
        for _ in range(int(rng.integers(1, 5))):
            data[int(rng.integers(0, span))] ^= 1 << int(rng.integers(0, 8))
    path = f"{folder}/case{case}.{kind}"
    open(path, "wb").write(data)
    try:
        load(path)
    except ValueError as e:
        if path not in str(e):
            bad.append([case, "ValueError without the file's name: " + str(e)[:300]])
    except Exception as e:
        bad.append([case, f"{type(e).__name__}: {str(e)[:300]}"])
print(json.dumps(bad))
"""


def checkpoint_file(path) -> str:
    ggrad.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    opt = Adam(model.parameters(), lr=1e-2)
    for p in model.parameters():
        p.grad = np.ones(p.shape, np.float32)
    opt.step()
    return ggrad.save({"model": model, "optimizer": opt, "epoch": 2, "note": (1, float("inf"))}, path)


@pytest.mark.parametrize("kind", ["safetensors", "gguf-f32", "gguf-q8_0"])
def test_fuzzed_files_load_or_raise_a_value_error_naming_the_file(kind, tmp_path):
    if kind == "safetensors":
        source = checkpoint_file(tmp_path / "source.safetensors")
    else:
        source = gg.save_model(tiny_llama(), str(tmp_path / "source.gguf"), dtype=kind.split("-")[1])
    (tmp_path / "cases").mkdir()
    out = run_in_child(FUZZ, source, kind.split("-")[0], str(tmp_path / "cases"), "24", "150", timeout=400)
    assert json.loads(out.strip().splitlines()[-1]) == []


# ---- item 21: written files get the mode open() gives, or keep the replaced file's ----
WRITERS = {
    "save": lambda path: ggrad.save({"w": np.zeros(2, np.float32)}, path),
    "export_gguf": lambda path: ggrad.export_gguf(nn.Linear(2, 2), path),
    "gguf.save_model": lambda path: gg.save_model(tiny_llama(), path),
}


@pytest.mark.parametrize("writer", WRITERS)
def test_a_written_file_has_the_umasks_mode_and_a_replaced_one_keeps_its_own(writer, tmp_path):
    path = str(tmp_path / "file")

    def mode() -> int:
        return os.stat(path).st_mode & 0o777
    umask = os.umask(0o022)
    try:
        WRITERS[writer](path)
        assert mode() == 0o644
        os.chmod(path, 0o640)
        WRITERS[writer](path)
        assert mode() == 0o640
        os.remove(path)
        os.umask(0o077)
        WRITERS[writer](path)
        assert mode() == 0o600
    finally:
        os.umask(umask)
