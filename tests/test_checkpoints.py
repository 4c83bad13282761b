"""One-file checkpoints: model, optimizer, scheduler, epoch and random state round-trip
through ggrad.save / ggrad.load (safetensors, never pickle) and a resumed run continues
bit-identically on the cpu; files of another kind are refused saying what they are."""

import numpy as np
import pytest
from safetensors import safe_open

import ggrad
import ggrad.functional as F
from ggrad import nn
from ggrad.optim import Adam
from ggrad.optim.lr_scheduler import OneCycleLR, ReduceLROnPlateau, StepLR

rng = np.random.default_rng(0)
X = rng.standard_normal((16, 6)).astype(np.float32)
Y = rng.integers(0, 3, 16)


def setup():
    model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Dropout(0.3), nn.Linear(12, 3))
    opt = Adam(model.parameters(), lr=1e-2)
    return model, opt, StepLR(opt, step_size=2, gamma=0.5)


def train(model, opt, sched, steps):
    for _ in range(steps):
        with ggrad.grad_tape():
            F.cross_entropy(model(ggrad.tensor(X)), ggrad.tensor(Y)).backward()
        opt.step()
        opt.zero_grad()
        sched.step()


def test_a_resumed_run_continues_bit_identically(tmp_path):
    ggrad.manual_seed(3)
    model, opt, sched = setup()
    train(model, opt, sched, 3)
    path = tmp_path / "ckpt.safetensors"
    ggrad.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                "epoch": 3, "note": "resume", "rng": ggrad.get_rng_state()}, path)
    train(model, opt, sched, 3)  # dropout masks drawn on the device after the save
    expected = [p.numpy() for p in model.parameters()]

    ggrad.manual_seed(99)  # other weights and another random state
    model2, opt2, sched2 = setup()
    ckpt = ggrad.load(path)
    assert ckpt["epoch"] == 3 and ckpt["note"] == "resume"
    model2.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["optimizer"])
    sched2.load_state_dict(ckpt["scheduler"])
    ggrad.set_rng_state(ckpt["rng"])
    train(model2, opt2, sched2, 3)
    for a, b in zip(expected, model2.parameters()):
        np.testing.assert_array_equal(a, b.numpy())
    assert sched2.get_last_lr() == sched.get_last_lr()
    with safe_open(str(path), framework="numpy") as f:  # a plain safetensors file: no pickle anywhere
        assert "ggrad.structure" in f.metadata() and len(list(f.keys())) > 0


def test_host_generator_state_round_trips():
    state = ggrad.get_rng_state()
    first = ggrad.random.generator().random(5)
    ggrad.set_rng_state(state)
    np.testing.assert_array_equal(ggrad.random.generator().random(5), first)


@pytest.mark.parametrize("make", [
    lambda opt: StepLR(opt, step_size=3, gamma=0.3),
    lambda opt: OneCycleLR(opt, max_lr=0.1, total_steps=12),
    lambda opt: ReduceLROnPlateau(opt, patience=1, factor=0.5),
])
def test_every_scheduler_resumes_where_it_was(make, tmp_path):
    def run(sched, opt, n, metrics):
        rates = []
        for i in range(n):
            sched.step(metrics[i]) if isinstance(sched, ReduceLROnPlateau) else sched.step()
            rates.append(opt.param_groups[0]["lr"])
        return rates
    metrics = [1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.4, 0.4, 0.4, 0.4]
    opt = Adam([ggrad.param(np.zeros(2, np.float32))], lr=0.05)
    sched = make(opt)
    run(sched, opt, 4, metrics)
    ggrad.save({"scheduler": sched.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "s.safetensors")
    rest = run(sched, opt, 6, metrics[4:])
    opt2 = Adam([ggrad.param(np.zeros(2, np.float32))], lr=0.05)
    sched2 = make(opt2)
    ckpt = ggrad.load(tmp_path / "s.safetensors")
    opt2.load_state_dict(ckpt["optimizer"])
    sched2.load_state_dict(ckpt["scheduler"])
    assert run(sched2, opt2, 6, metrics[4:]) == rest


def test_model_checkpoint_can_keep_the_optimizer(tmp_path):
    ggrad.manual_seed(0)
    model, opt, _ = setup()
    path = tmp_path / "best.safetensors"
    ggrad.fit(model, F.cross_entropy, opt, (X, Y), epochs=2, batch_size=8, verbose=0,
              callbacks=[ggrad.ModelCheckpoint(path, monitor="loss", save_optimizer=True)])
    ckpt = ggrad.load(path)
    assert set(ckpt) == {"model", "optimizer", "epoch", "rng"}
    fresh, fresh_opt, _ = setup()
    fresh.load_state_dict(ckpt["model"])
    fresh_opt.load_state_dict(ckpt["optimizer"])
    assert fresh_opt.state_dict()["param_groups"][0]["lr"] == opt.param_groups[0]["lr"]


def test_files_of_other_kinds_say_what_they_are(tmp_path):
    gguf = tmp_path / "m.gguf"
    ggrad.export_gguf(nn.Linear(2, 2), str(gguf))
    with pytest.raises(ValueError, match="GGUF"):
        ggrad.load(gguf)
    torch = pytest.importorskip("torch")
    pt = tmp_path / "m.pt"
    torch.save({"w": torch.zeros(2)}, pt)
    with pytest.raises(ValueError, match="PyTorch checkpoint.*never unpickles"):
        ggrad.load(pt)
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match="not a safetensors"):
        ggrad.load(junk)
    with pytest.raises(TypeError, match="never pickles"):
        ggrad.save({"model": {"w": np.zeros(2)}, "fn": print}, tmp_path / "x.safetensors")
