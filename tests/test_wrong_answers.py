"""Other wrong answers of issue 11, each against torch or the file format's reader:
integer powers, GGUF tensor names, checkpoint writes killed mid-save, and estimators that
switched the caller's device."""

import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch (the test oracle) is not installed: pip install -e .[test]")

import ggrad  # noqa: E402
import ggrad.functional as F  # noqa: E402
from ggrad import nn  # noqa: E402

nan, inf = math.nan, math.inf
BASES = np.array([-2.0, 2.0, -1.5, 1.1, -1.0, 0.0, -0.5, 3.0, nan, inf, -inf], np.float32)


POWERS = [17, -17, 3, -3, 2, -1, 0, 1, 31, 64, 65, -65, 101, 2 ** 24 + 1, 2.5, -0.5, 0.5, inf, -inf]


@pytest.mark.parametrize("p", POWERS)
def test_powers_equal_torch(dev, p):
    """(-2) ** 17 was NaN (exp(17 log x) above 16); odd powers keep the sign at any size."""
    bases = BASES if float(p).is_integer() or math.isinf(p) else BASES[:-1]  # NOTE: (-inf) ** 2.5 is NaN, torch's inf
    t = torch.tensor(bases, requires_grad=True)
    want = t ** p
    finite = torch.isfinite(want).detach()
    (want * finite).nan_to_num(0.0).sum().backward()  # gradients where the value is finite
    with ggrad.grad_tape():
        g = ggrad.tensor(bases, requires_grad=True)
        got = g ** p
        (got * ggrad.tensor(finite.numpy().astype(np.float32))).sum().backward()
    ok = finite.numpy()
    rtol = 4e-6 if abs(p) <= 64 else 2e-5  # past 64, exp(p log|x|): its float32 error grows with log|result|
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=rtol, equal_nan=True)
    if math.isfinite(p) and abs(p) < 2 ** 20:
        np.testing.assert_allclose(g.grad.numpy()[ok], t.grad.numpy()[ok], rtol=2e-5, equal_nan=True)


def test_integer_tensor_powers_equal_torch(dev):
    x = np.array([-2, 2, 0, -1, 1], np.int64)  # NOTE: integers compute in float32: exact below 2**24
    for p in (0, 1, 2, 3, 17):
        got, want = ggrad.tensor(x) ** p, torch.tensor(x) ** p
        assert got.dtype is ggrad.int64 and got.tolist() == want.tolist(), p
    assert (ggrad.tensor(x) ** 0.5).dtype is ggrad.float32
    with pytest.raises(RuntimeError, match="negative integer powers"):
        ggrad.tensor(x) ** -1


# ---- GGUF names -------------------------------------------------------------------------------
class _Named(nn.Module):
    def __init__(self, name: str) -> None:
        super().__init__()
        setattr(self, name, nn.Linear(2, 2))


EDGES = np.array([-3.0, 3.0, nan, inf, -inf, 0.5, -0.5, 0.0, 7.5, -1e10, 1e-30, 0.1, 1.0, 0.3, 0.7, -217.0],
                 np.float32)


@pytest.mark.parametrize("mode", ["floor", "trunc"])
def test_rounded_division_equals_torch(dev, mode):
    """floor(a / b) of the exact quotient: 1.0 // 0.1 is 9 (868 of 20,000 quotients of
    tenths differed), -217 // 7 is -31 where division is not correctly rounded (CUDA's
    fast math gave -32), and torch's edges (-3 // inf is -1, inf // 2 is NaN)."""
    rng = np.random.default_rng(0)
    tenths = [(rng.integers(-1000, 1000, 20000) / 10).astype(np.float32), (rng.integers(1, 30, 20000) / 10).astype(np.float32)]
    for a, b in [(EDGES[:, None], EDGES[None, :]), tenths, (np.arange(-300, 300)[:, None], np.array([[7, -7, 13]]))]:
        want = torch.div(torch.tensor(a), torch.tensor(b), rounding_mode=mode).numpy()
        got = ggrad.div(ggrad.tensor(a), ggrad.tensor(b), rounding_mode=mode)
        assert got.dtype.name == str(want.dtype)
        np.testing.assert_array_equal(got.numpy(), want)
        if mode == "floor":  # where the quotient's floor is a float32 integer (torch's exact fmod beyond)
            small = np.broadcast_to(np.abs(want) < 2 ** 24, want.shape)
            got, want = (ggrad.tensor(a) % ggrad.tensor(b)).numpy(), (torch.tensor(a) % torch.tensor(b)).numpy()
            np.testing.assert_array_equal(got[small], want[small])


def test_export_gguf_refuses_names_ggml_cannot_read(tmp_path):
    gguf = pytest.importorskip("gguf")
    fits = "a" * (63 - len(".weight"))  # 63 bytes with ".weight": the longest ggml reads
    path = ggrad.export_gguf(_Named(fits), tmp_path / "ok.gguf")
    assert f"{fits}.weight" in [t.name for t in gguf.GGUFReader(path).tensors]
    with pytest.raises(ValueError, match=r"'a{57}\.weight' is 64 bytes.*at most 63"):
        ggrad.export_gguf(_Named("a" * 57), tmp_path / "long.gguf")
    with pytest.raises(ValueError, match="bytes"):  # bytes, not characters
        ggrad.export_gguf(_Named("\u00e9" * 30), tmp_path / "utf8.gguf")
    assert not (tmp_path / "long.gguf").exists() and not list(tmp_path.glob(".ggrad-*"))


# ---- checkpoint writes ------------------------------------------------------------------------
KILLED_SAVE = textwrap.dedent("""
    import sys, time
    import numpy as np
    import safetensors.numpy
    import ggrad

    def stalls(tensors, path, metadata=None):  # writes part of the file, then hangs
        with open(path, "wb") as f:
            f.write(b"partial")
        print("writing", flush=True)
        time.sleep(120)

    safetensors.numpy.save_file = stalls
    ggrad.save({"w": np.zeros(3, np.float32)}, sys.argv[1])
""")


def test_a_save_killed_midway_leaves_the_old_file_and_its_temp_is_cleaned_up(tmp_path):
    path = tmp_path / "model.safetensors"
    ggrad.save({"w": np.ones(3, np.float32)}, path)
    proc = subprocess.Popen([sys.executable, "-c", KILLED_SAVE, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    orphans = list(tmp_path.glob(".ggrad-*.tmp"))
    assert len(orphans) == 1 and f"-{proc.pid}-" in orphans[0].name
    np.testing.assert_array_equal(ggrad.load(path)["w"], np.ones(3))  # the old file, whole
    mine = tmp_path / f".ggrad-{orphans[0].name.split('-')[1]}-{os.getpid()}-inflight.tmp"
    mine.write_bytes(b"a live writer's")  # this process runs: not stale
    foreign = tmp_path / ".ggrad-otherhost-1-x.tmp"
    foreign.write_bytes(b"")
    old = time.time() - 2 * 3600
    os.utime(foreign, (old, old))  # another host's, old: stale by age
    ggrad.save({"w": np.full(3, 2.0, np.float32)}, path)
    assert sorted(p.name for p in tmp_path.glob(".ggrad-*")) == [mine.name]
    np.testing.assert_array_equal(ggrad.load(path)["w"], np.full(3, 2.0))


def test_saves_are_flushed_to_disk_before_and_after_the_rename(tmp_path, monkeypatch):
    synced = []
    real = os.fsync

    def spy(fd):
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        return real(fd)
    monkeypatch.setattr(os, "fsync", spy)
    ggrad.save({"w": np.ones(2, np.float32)}, tmp_path / "m.safetensors")
    assert synced[0].startswith(".ggrad-") and synced[1] == tmp_path.name


# ---- estimators and the caller's device --------------------------------------------------------
def test_estimators_give_the_callers_device_back(dev):
    from ggrad.sklearn import MLPClassifier, MLPRegressor
    other = "cpu" if dev != "cpu" else next((d for d in ("vulkan:0",) if d in [x.name for x in ggrad.devices()]), "cpu")
    kept = ggrad.tensor(np.arange(4, dtype=np.float32)) * 2.0
    ggrad.realize(kept)
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((20, 3)), rng.integers(0, 2, 20)
    clf = MLPClassifier(hidden_layer_sizes=(4,), epochs=2, device=other).fit(X, y)
    assert ggrad.get_device() == dev and kept.tolist() == [0.0, 2.0, 4.0, 6.0]
    MLPRegressor(hidden_layer_sizes=(4,), epochs=2, device=other).fit(X, X[:, 0]).predict(X)
    assert ggrad.get_device() == dev and kept.tolist() == [0.0, 2.0, 4.0, 6.0]
    here = MLPClassifier(hidden_layer_sizes=(4,), epochs=2).fit(X, y)  # device=None: the caller's
    w = ggrad.param(np.ones(3, np.float32))
    with ggrad.grad_tape():
        loss = (w * 2.0).sum()
        assert here.predict(X[:3]).shape == (3,)
        if other != dev:
            with pytest.raises(RuntimeError, match="inside a grad_tape"):
                clf.predict(X[:3])
        with pytest.raises(RuntimeError, match="inside a grad_tape"):
            here.fit(X, y)
        loss.backward()  # the tape's values outlived the calls
    assert loss.item() == 6.0 and w.grad.tolist() == [2.0, 2.0, 2.0]


# ---- take_along_last's indices -------------------------------------------------------------
def test_take_along_last_checks_its_indices(dev):
    """Unchecked, a bad index aborted the process in ggml (a float one) or read out of bounds."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    index = np.array([[3, 0], [1, 1], [0, 2]])
    got = F.take_along_last(ggrad.tensor(x), ggrad.tensor(index))
    assert got.tolist() == torch.take_along_dim(torch.tensor(x), torch.tensor(index), -1).tolist()
    with pytest.raises(TypeError, match="integer index"):
        F.take_along_last(ggrad.tensor(x), ggrad.tensor(index.astype(np.float32)))
    with pytest.raises(ValueError, match="same rank"):
        F.take_along_last(ggrad.tensor(x), ggrad.tensor(index[0]))
    with pytest.raises(IndexError, match="out of range"):
        F.take_along_last(ggrad.tensor(x), ggrad.tensor(index + 2))
    on_device = ggrad.tensor(index) * 2  # computed: checked where it is, raised at the next read
    with pytest.raises(IndexError):
        F.take_along_last(ggrad.tensor(x), on_device).numpy()


# ---- host memory a tensor was made from ----------------------------------------------------
def test_tensors_copy_the_host_memory_they_are_made_from(dev):
    """A tensor made from an array held that array until its first upload: a later write
    into it (a torch parameter's .numpy() after torch's optimizer step, a reused batch
    buffer) changed the tensor, as torch.from_numpy would, where torch.tensor copies.
    A word-level LM loaded from torch's state_dict started from torch's updated weights."""
    a = np.ones(3, np.float32)
    made = ggrad.tensor(a)
    theirs = torch.nn.Linear(2, 1)
    ours = nn.Linear(2, 1)
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    before = theirs.weight.detach().numpy().copy()
    rows = np.ones((4, 4), np.float32)
    column = ggrad.tensor(rows[:, 1])
    grad_source = np.ones((1, 2), np.float32)
    ours.weight.grad = grad_source
    a[0] = 5.0
    with torch.no_grad():
        theirs.weight.add_(1.0)
    rows[:] = 3.0
    grad_source[:] = 9.0
    assert made.tolist() == [1.0, 1.0, 1.0]
    np.testing.assert_array_equal(ours.weight.numpy(), before)
    assert column.tolist() == [1.0] * 4
    assert ours.weight.grad.tolist() == [[1.0, 1.0]]


def test_slices_with_axes_of_length_one_reach_every_op(dev):
    """A slice that is one run of memory is a view, but ggml keeps its parent's strides on
    its axes of length 1, and SCALE asserts on those: the gradient of cat over channels at
    batch 1 aborted the process (the CUDA fuzzer found it; the CPU aborted too)."""
    a = np.random.default_rng(0).standard_normal((1, 3, 4, 5)).astype(np.float32)
    x = ggrad.tensor(a, requires_grad=True)
    with ggrad.grad_tape():
        y = F.cat([x, x * 2], 1)
        (y * y).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 10 * a, rtol=1e-6)
    t = ggrad.tensor(a)
    for got, want in ((t[:, 1:2] * 3, a[:, 1:2] * 3), (t[:, 2:] * 0.5 + 1, a[:, 2:] * 0.5 + 1),
                      (t[0, :, 3:] * -2, a[0, :, 3:] * -2), (F.softmax(t[:, 1:], -1), None)):
        if want is None:
            e = np.exp(a[:, 1:] - a[:, 1:].max(-1, keepdims=True))
            want = e / e.sum(-1, keepdims=True)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-7)


def test_round_takes_ties_to_even_as_torch(dev):
    """ggml's ROUND takes ties away from zero: round(2.5) was 3 and round(-0.5) -1, torch's
    2 and -0. Ties, values near them, large values, inf and NaN, and half precision."""
    ties = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 4.5, 5.5, -7.5, 8388607.5, 0.49999997, -0.49999997,
                     -0.50000006, 16777215.0, 3e9, -3e9, 3.4e38, np.inf, -np.inf, np.nan, 0.0, -1e-30], np.float32)
    rng = np.random.default_rng(0)
    spread = (rng.standard_normal(20000) * rng.choice([1.0, 1e3, 1e7, 1e9], 20000)).astype(np.float32)
    spread[::5] = np.floor(spread[::5]) + np.float32(0.5)
    for values in (ties, spread):
        np.testing.assert_array_equal(ggrad.round(ggrad.tensor(values)).numpy(), torch.round(torch.tensor(values)).numpy())
    for low, theirs in ((ggrad.float16, torch.float16), (ggrad.bfloat16, torch.bfloat16)):
        small = ties[np.isfinite(ties) & (np.abs(ties) < 1000)]
        got = ggrad.tensor(small).to(low).round().float().numpy()
        np.testing.assert_array_equal(got, torch.tensor(small).to(theirs).round().float().numpy())
