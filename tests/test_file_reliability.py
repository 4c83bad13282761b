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
