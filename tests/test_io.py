"""Checkpoints: bit-exact round trips, atomic writes, clear errors, GGUF read back."""

import os
import subprocess
import sys

import numpy as np
import pytest

import ggrad
from ggrad import nn
from ggrad.optim import Adam


def model():
    ggrad.manual_seed(3)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.BatchNorm1d(8), nn.Linear(8, 2))


def test_model_round_trip_is_bit_exact(tmp_path):
    a, b = model(), nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.BatchNorm1d(8), nn.Linear(8, 2))
    path = ggrad.save(a, tmp_path / "m.safetensors")
    b.load_state_dict(ggrad.load(path))
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb
        np.testing.assert_array_equal(va.numpy(), vb.numpy())


def test_optimizer_round_trip_continues_bit_identically(tmp_path):
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal((3, 3)) for _ in range(4)]
    for fused in (False, True):
        p = ggrad.param(np.ones((3, 3)))
        opt = Adam([p], lr=0.01, fused=fused)
        for g in grads[:2]:
            p.grad = g
            opt.step()
        path = ggrad.save(opt, tmp_path / "opt.safetensors")
        q = ggrad.param(p.numpy())
        opt2 = Adam([q], lr=0.5, fused=fused)
        opt2.load_state_dict(ggrad.load(path))
        for g in grads[2:]:
            p.grad, q.grad = g, g
            opt.step()
            opt2.step()
        np.testing.assert_array_equal(q.numpy(), p.numpy())


def test_a_crash_mid_save_leaves_the_old_file(tmp_path, monkeypatch):
    import safetensors.numpy as st

    path = tmp_path / "m.safetensors"
    ggrad.save({"w": np.arange(4, dtype=np.float32)}, path)
    before = path.read_bytes()

    def dying_writer(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"half a file")
        raise KeyboardInterrupt("killed mid-save")
    monkeypatch.setattr(st, "save_file", dying_writer)
    with pytest.raises(KeyboardInterrupt):
        ggrad.save({"w": np.zeros(4, dtype=np.float32)}, path)
    assert path.read_bytes() == before
    assert [f for f in os.listdir(tmp_path) if f != "m.safetensors"] == []  # no temp file left


def test_a_killed_process_leaves_the_old_file(tmp_path):
    path = tmp_path / "m.safetensors"
    ggrad.save({"w": np.arange(4, dtype=np.float32)}, path)
    before = path.read_bytes()
    child = (
        "import os, signal, numpy as np, ggrad, safetensors.numpy as st\n"
        "real = st.save_file\n"
        "def die(t, f, metadata=None):\n"
        "    real(t, f, metadata=metadata); os.kill(os.getpid(), signal.SIGKILL)\n"
        "st.save_file = die\n"
        f"ggrad.save({{'w': np.zeros(1000, np.float32)}}, {str(path)!r})\n")
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True)
    assert proc.returncode == -9
    assert path.read_bytes() == before


def test_loading_a_wrong_file_raises_and_changes_nothing(tmp_path):
    m = model()
    before = {k: v.numpy() for k, v in m.state_dict().items()}
    path = ggrad.save({"0.weight": np.zeros((3, 3), np.float32)}, tmp_path / "bad.safetensors")
    with pytest.raises(ValueError, match="missing keys"):
        m.load_state_dict(ggrad.load(path))
    for k, v in m.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), before[k])
    with pytest.raises(FileNotFoundError):
        ggrad.load(tmp_path / "absent.safetensors")


def test_gguf_export_reads_back(tmp_path):
    gguf = pytest.importorskip("gguf")

    m = model()
    path = ggrad.export_gguf(m, tmp_path / "m.gguf", metadata={"task": "test"})
    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    assert set(tensors) == set(m.state_dict())
    for name, value in m.state_dict().items():
        data = np.asarray(tensors[name].data).reshape(value.shape)
        np.testing.assert_array_equal(data, value.numpy())
    assert "ggrad.task" in reader.fields
