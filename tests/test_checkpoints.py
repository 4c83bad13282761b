"""One-file checkpoints: model, optimizer, scheduler, epoch and random state round-trip
through ggrad.save / ggrad.load (safetensors, never pickle) and a resumed run continues
bit-identically on the cpu; every scheduler resumes where it was (and follows torch's);
files of another kind are refused saying what they are, without unpickling anything."""

import json
import math
import pickle

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

import ggrad
import ggrad.functional as F
from ggrad import nn
from ggrad.optim import Adam
from ggrad.optim import lr_scheduler as L

rng = np.random.default_rng(0)
X = rng.standard_normal((16, 6)).astype(np.float32)
Y = rng.integers(0, 3, 16)


def same(a, b) -> bool:
    """Nested equality, arrays compared exactly (dtype and shape too), NaN equal to NaN."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and np.array_equal(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return type(a) is type(b) and a == b


def setup(scheduler="step"):
    model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Dropout(0.3), nn.Linear(12, 3))
    opt = Adam(model.parameters(), lr=1e-2)
    sched = L.StepLR(opt, step_size=2, gamma=0.5) if scheduler == "step" else \
        L.ReduceLROnPlateau(opt, patience=0, factor=0.5, threshold=0.05)
    return model, opt, sched


def train(model, opt, sched, steps):
    for _ in range(steps):
        with ggrad.grad_tape():
            loss = F.cross_entropy(model(ggrad.tensor(X)), ggrad.tensor(Y))
            loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step(loss.item()) if isinstance(sched, L.ReduceLROnPlateau) else sched.step()


def weights(model):
    return [p.numpy() for p in model.parameters()]


def file_layout(path):
    """The safetensors header, and whether the file is that header and the tensors' raw
    bytes and nothing else (no room for a pickle anywhere)."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    return header, len(data) == 8 + n + max(ends, default=0)


# ---- a whole training state in one file ------------------------------------------------------
@pytest.mark.parametrize("scheduler", ["step", "plateau"])
def test_a_resumed_run_continues_bit_identically(scheduler, tmp_path):
    ggrad.manual_seed(3)
    model, opt, sched = setup(scheduler)
    train(model, opt, sched, 3)
    path = tmp_path / "ckpt.safetensors"
    ggrad.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                "epoch": 3, "note": "resume", "rng": ggrad.get_rng_state()}, path)
    train(model, opt, sched, 3)  # dropout masks drawn on the device after the save
    expected = weights(model)

    def resumed(restore_rng: bool):
        ggrad.manual_seed(99)  # other weights and another random state
        model2, opt2, sched2 = setup(scheduler)
        ckpt = ggrad.load(path)
        assert ckpt["epoch"] == 3 and ckpt["note"] == "resume"
        model2.load_state_dict(ckpt["model"])
        opt2.load_state_dict(ckpt["optimizer"])
        sched2.load_state_dict(ckpt["scheduler"])
        if restore_rng:
            ggrad.set_rng_state(ckpt["rng"])
        train(model2, opt2, sched2, 3)
        return weights(model2), sched2

    got, sched2 = resumed(restore_rng=True)
    for a, b in zip(expected, got):
        np.testing.assert_array_equal(a, b)
    assert sched2.get_last_lr() == sched.get_last_lr()
    assert sched2.state_dict() == sched.state_dict()
    # the check has teeth: without the random state the dropout masks, so the weights, differ
    unrestored, _ = resumed(restore_rng=False)
    assert any(not np.array_equal(a, b) for a, b in zip(expected, unrestored))


def test_a_checkpoint_round_trips_every_kind_of_value(tmp_path):
    ggrad.manual_seed(1)
    model, opt, _ = setup()
    plateau = L.ReduceLROnPlateau(opt)  # best = inf: not a JSON number
    train(model, opt, L.StepLR(opt, 5), 2)
    ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": plateau.state_dict(),
            "epoch": 7, "rng": ggrad.get_rng_state(),
            "extra": {"pair": (1, "a"), "items": [None, True, 2.5, -math.inf], "nan": math.nan,
                      "by_int": {3: "three", (1, 2): "tuple key"}, "__tensor__": "a key like a tag",
                      "f64": np.arange(3, dtype=np.float64), "i64": np.arange(4, dtype=np.int64).reshape(2, 2),
                      "scalar": np.zeros((), np.float32), "np_number": np.float32(0.5)}}
    path = tmp_path / "all.safetensors"
    ggrad.save(ckpt, path)
    back = ggrad.load(path)
    expected = {**ckpt, "model": {k: v.numpy() for k, v in ckpt["model"].items()},
                "extra": {**ckpt["extra"], "np_number": 0.5}}
    assert same(back, expected)
    assert same(back["optimizer"], opt.state_dict())  # in the form load_state_dict takes
    opt.load_state_dict(back["optimizer"])
    assert same(opt.state_dict(), back["optimizer"])

    header, only_tensors = file_layout(path)
    assert only_tensors  # the header and raw tensor bytes: nothing else in the file
    names = set(header) - {"__metadata__"}
    assert {"model.0.weight", "model.3.bias", "optimizer.state.0.m", "optimizer.state.3.v",
            "rng.device", "extra.f64"} <= names  # flattened paths, not opaque names
    structure = header["__metadata__"]["ggrad.structure"]

    def no_constant(name):
        raise AssertionError(f"{name} in the structure: not strict JSON")
    json.loads(structure, parse_constant=no_constant)


def test_old_forms_still_load_as_before(tmp_path):
    model, opt, sched = setup()
    train(model, opt, sched, 1)
    ggrad.save(model, tmp_path / "m.safetensors")
    ggrad.save(opt, tmp_path / "o.safetensors")
    ggrad.save({k: v.numpy() for k, v in model.state_dict().items()}, tmp_path / "d.safetensors")
    ggrad.save(sched, tmp_path / "s.safetensors")
    for name in ("m", "d"):
        assert same(ggrad.load(tmp_path / f"{name}.safetensors"), {k: v.numpy() for k, v in model.state_dict().items()})
    assert same(ggrad.load(tmp_path / "o.safetensors"), opt.state_dict())
    assert ggrad.load(tmp_path / "s.safetensors") == sched.state_dict()


def test_a_header_length_that_starts_like_a_pickle_still_loads(tmp_path):
    """A header of 0x..80 bytes starts the file with 0x80, a pickle's first byte: it is
    still safetensors (the header is checked before any other kind's magic)."""
    path = tmp_path / "w.safetensors"
    for pad in range(300):
        save_file({"w": np.ones(3, np.float32)}, str(path), metadata={"pad": "x" * pad})
        if path.read_bytes()[:2] == b"\x80\x00":
            break
    else:
        pytest.skip("no padding gave a header length starting with 0x80")
    np.testing.assert_array_equal(ggrad.load(path)["w"], np.ones(3, np.float32))


def test_save_refuses_what_it_would_have_to_pickle(tmp_path):
    with pytest.raises(TypeError, match="never pickles"):
        ggrad.save({"model": {"w": np.zeros(2)}, "fn": print}, tmp_path / "x.safetensors")
    with pytest.raises(TypeError, match="object array"):
        ggrad.save({"model": {"w": np.zeros(2)}, "names": np.array(["a", None], dtype=object)}, tmp_path / "x.st")
    assert not list(tmp_path.iterdir())  # refused before anything was written


# ---- random state -------------------------------------------------------------------------------
def test_the_random_state_restores_host_and_device_draws():
    ggrad.manual_seed(5)
    state = ggrad.get_rng_state()
    x = ggrad.zeros(64)
    host, device = ggrad.random.generator().random(5), F.rand_like(x).numpy()
    assert not np.array_equal(F.rand_like(x).numpy(), device)  # the device state advances
    ggrad.random.generator().random(3)
    ggrad.set_rng_state(state)
    np.testing.assert_array_equal(ggrad.random.generator().random(5), host)
    np.testing.assert_array_equal(F.rand_like(x).numpy(), device)


def test_a_compiled_step_draws_from_the_restored_state():
    """set_rng_state writes the device state in place: a step captured before it (and
    replayed, not traced again) reads the restored state."""
    ggrad.manual_seed(4)
    x = ggrad.ones(64)
    step = ggrad.compile(lambda: F.dropout(x, 0.5) * 1.0)
    for _ in range(3):
        step()
    state = ggrad.get_rng_state()
    after = [step().numpy() for _ in range(2)]
    ggrad.set_rng_state(state)
    again = [step().numpy() for _ in range(2)]
    assert step.traces == 1 and step.captured == 1  # every call after the first was a replay
    assert not np.array_equal(after[0], after[1])
    for a, b in zip(after, again):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("bad, match", [
    (None, "get_rng_state returned"),
    ({"host": {"bit_generator": "nope"}, "device_seed": 0.0, "device": [1.0]}, "bit generator"),
    ({"host": {"bit_generator": "PCG64", "state": {}}, "device_seed": 0.0, "device": [1.0]}, "PCG64 state"),
    ("host", "get_rng_state returned"),
])
def test_a_wrong_random_state_is_refused_and_changes_nothing(bad, match):
    ggrad.manual_seed(2)
    before = ggrad.get_rng_state()
    with pytest.raises(ValueError, match=match):
        ggrad.set_rng_state(bad)
    assert same(ggrad.get_rng_state(), before)
    good = dict(before, device=np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="one number"):
        ggrad.set_rng_state(good)
    assert same(ggrad.get_rng_state(), before)


# ---- ModelCheckpoint ----------------------------------------------------------------------------
def test_model_checkpoint_keeps_a_resumable_state_fit_continues_from(tmp_path):
    """fit for 2 epochs saving every improvement, then 1 more; fresh objects loaded from
    the checkpoint fit that epoch to the same weights (fit's compiled step, shuffling
    drawn from the host generator and dropout from the device one)."""
    path = tmp_path / "best.safetensors"
    ggrad.manual_seed(0)
    model, opt, sched = setup()
    checkpoint = ggrad.ModelCheckpoint(path, monitor="loss", save_optimizer=True, scheduler=sched)
    ggrad.fit(model, F.cross_entropy, opt, (X, Y), epochs=2, batch_size=4, scheduler=sched, verbose=0,
              callbacks=[checkpoint])
    ckpt = ggrad.load(path)
    assert set(ckpt) == {"model", "optimizer", "scheduler", "epoch", "rng"}
    assert ckpt["epoch"] == checkpoint.best_epoch == 2
    ggrad.fit(model, F.cross_entropy, opt, (X, Y), epochs=1, batch_size=4, scheduler=sched, verbose=0)

    ggrad.manual_seed(42)
    fresh, fresh_opt, fresh_sched = setup()
    fresh.load_state_dict(ckpt["model"])
    fresh_opt.load_state_dict(ckpt["optimizer"])
    fresh_sched.load_state_dict(ckpt["scheduler"])
    ggrad.set_rng_state(ckpt["rng"])
    ggrad.fit(fresh, F.cross_entropy, fresh_opt, (X, Y), epochs=1, batch_size=4, scheduler=fresh_sched, verbose=0)
    for a, b in zip(weights(model), weights(fresh)):
        np.testing.assert_array_equal(a, b)
    assert fresh_sched.state_dict() == sched.state_dict() and fresh_opt.lr == opt.lr


def test_model_checkpoint_by_default_saves_the_model_alone(tmp_path):
    path = tmp_path / "best.safetensors"
    model, opt, _ = setup()
    ggrad.fit(model, F.cross_entropy, opt, (X, Y), epochs=1, batch_size=8, verbose=0,
              callbacks=[ggrad.ModelCheckpoint(path, monitor="loss")])
    assert same(ggrad.load(path), {k: v.numpy() for k, v in model.state_dict().items()})
    with safe_open(str(path), framework="numpy") as f:
        assert f.metadata()["ggrad.format"] == "state_dict"


def test_model_checkpoint_checks_its_arguments():
    _, opt, sched = setup()
    with pytest.raises(ValueError, match="save_optimizer=True"):
        ggrad.ModelCheckpoint("x.safetensors", scheduler=sched)
    with pytest.raises(TypeError, match="lr scheduler"):
        ggrad.ModelCheckpoint("x.safetensors", save_optimizer=True, scheduler=opt.param_groups)
    with pytest.raises(ValueError, match="'min' or 'max'"):
        ggrad.ModelCheckpoint("x.safetensors", mode="best")


# ---- schedulers ------------------------------------------------------------------------------
STEPS, SPLIT = 12, 5
METRICS = [1.0, 0.9, 0.9, 0.9, 0.9, 0.95, 0.95, 0.8, 0.8, 0.8, 0.85, 0.7]  # 0.95: worse than the saved best
SCHEDULERS = {  # name: (ggrad's, torch's or None)
    "StepLR": (lambda o: L.StepLR(o, 3, 0.5), lambda T, o: T.StepLR(o, 3, 0.5)),
    "CosineAnnealingLR": (lambda o: L.CosineAnnealingLR(o, T_max=10, eta_min=1e-3),
                          lambda T, o: T.CosineAnnealingLR(o, T_max=10, eta_min=1e-3)),
    "CosineAnnealingWarmRestarts": (lambda o: L.CosineAnnealingWarmRestarts(o, T_0=2, T_mult=2, eta_min=1e-3),
                                    lambda T, o: T.CosineAnnealingWarmRestarts(o, T_0=2, T_mult=2, eta_min=1e-3)),
    "OneCycleLR": (lambda o: L.OneCycleLR(o, max_lr=0.1, total_steps=STEPS + 1),
                   lambda T, o: T.OneCycleLR(o, max_lr=0.1, total_steps=STEPS + 1)),
    "OneCycleLR-3-phase": (
        lambda o: L.OneCycleLR(o, max_lr=0.1, total_steps=STEPS + 1, three_phase=True, anneal_strategy="linear"),
        lambda T, o: T.OneCycleLR(o, max_lr=0.1, total_steps=STEPS + 1, three_phase=True, anneal_strategy="linear")),
    "LinearWarmupCosine": (  # torch's SequentialLR of LinearLR and CosineAnnealingLR
        lambda o: L.LinearWarmupCosine(o, warmup_steps=4, total_steps=STEPS, eta_min=1e-3),
        lambda T, o: T.SequentialLR(o, [T.LinearLR(o, start_factor=0.25, total_iters=4),
                                        T.CosineAnnealingLR(o, T_max=STEPS - 4, eta_min=1e-3)], milestones=[4])),
    "ReduceLROnPlateau": (lambda o: L.ReduceLROnPlateau(o, patience=1, factor=0.5, cooldown=1),
                          lambda T, o: T.ReduceLROnPlateau(o, patience=1, factor=0.5, cooldown=1)),
}


def rates(sched, opt, metrics, torch_opt=None):
    out = []
    for m in metrics:
        if torch_opt is not None:
            torch_opt.step()  # torch warns when a scheduler steps before its optimizer
        sched.step(m) if "Plateau" in type(sched).__name__ else sched.step()
        out.append(opt.param_groups[0]["lr"])
    return out


def fresh_optimizer():
    return Adam([ggrad.param(np.zeros(2, np.float32))], lr=0.05)


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_every_scheduler_resumes_where_it_was(name, tmp_path):
    make, make_torch = SCHEDULERS[name]
    opt = fresh_optimizer()
    whole = rates(make(opt), opt, METRICS)
    if make_torch is not None:
        torch = pytest.importorskip("torch")
        t_opt = torch.optim.Adam([torch.zeros(2, requires_grad=True)], lr=0.05)
        t_sched = make_torch(torch.optim.lr_scheduler, t_opt)
        assert whole == pytest.approx(rates(t_sched, t_opt, METRICS, t_opt), rel=1e-12, abs=1e-15)

    opt = fresh_optimizer()
    sched = make(opt)
    rates(sched, opt, METRICS[:SPLIT])
    path = tmp_path / "s.safetensors"
    ggrad.save({"scheduler": sched.state_dict(), "optimizer": opt.state_dict()}, path)
    ckpt = ggrad.load(path)
    assert same(ckpt["scheduler"], sched.state_dict())

    def resumed(restore: bool):
        opt2 = fresh_optimizer()
        sched2 = make(opt2)
        opt2.load_state_dict(ckpt["optimizer"])
        if restore:
            sched2.load_state_dict(ckpt["scheduler"])
        return rates(sched2, opt2, METRICS[SPLIT:])
    assert resumed(restore=True) == whole[SPLIT:]  # exactly
    assert resumed(restore=False) != whole[SPLIT:]  # the scheduler's own state matters


def test_a_scheduler_refuses_another_schedulers_state():
    opt = fresh_optimizer()
    step, cosine = L.StepLR(opt, 2), L.CosineAnnealingLR(opt, T_max=4)
    with pytest.raises(ValueError, match="unknown keys.*step_size"):
        cosine.load_state_dict(step.state_dict())
    with pytest.raises(TypeError, match="takes a dict"):
        step.load_state_dict([("last_epoch", 3)])
    assert cosine.state_dict()["T_max"] == 4 and "step_size" not in cosine.state_dict()


def test_a_scheduler_state_dict_is_a_copy():
    opt = fresh_optimizer()
    sched = L.OneCycleLR(opt, max_lr=0.1, total_steps=10)
    state = sched.state_dict()
    state["base_lrs"].append(1.0)
    assert len(sched.base_lrs) == 1


# ---- files of other kinds --------------------------------------------------------------------
@pytest.fixture
def no_unpickling(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("something was unpickled")
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)


def test_files_of_other_kinds_say_what_they_are(tmp_path, no_unpickling):
    gguf = tmp_path / "m.gguf"
    ggrad.export_gguf(nn.Linear(2, 2), str(gguf))
    with pytest.raises(ValueError, match="this is a GGUF file: .*GGUFReader"):
        ggrad.load(gguf)
    arrays = tmp_path / "a.npz"
    np.savez(arrays, w=np.zeros(2))
    with pytest.raises(ValueError, match=r"numpy \.npz archive.*np\.load"):
        ggrad.load(arrays)
    np.save(tmp_path / "a.npy", np.zeros(2))
    with pytest.raises(ValueError, match=r"numpy \.npy file"):
        ggrad.load(tmp_path / "a.npy")
    (tmp_path / "junk.bin").write_bytes(np.random.default_rng(1).bytes(256))
    with pytest.raises(ValueError, match="not a safetensors checkpoint"):
        ggrad.load(tmp_path / "junk.bin")
    (tmp_path / "empty").write_bytes(b"")
    with pytest.raises(ValueError, match="is empty"):
        ggrad.load(tmp_path / "empty")
    good = tmp_path / "good.safetensors"
    ggrad.save(nn.Linear(4, 4), good)
    (tmp_path / "cut.safetensors").write_bytes(good.read_bytes()[:-10])
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        ggrad.load(tmp_path / "cut.safetensors")


def test_a_legacy_pytorch_pickle_is_refused_unread(tmp_path):
    torch = pytest.importorskip("torch")
    pt = tmp_path / "m.pt"
    torch.save({"w": torch.zeros(2)}, pt, _use_new_zipfile_serialization=False)
    with pytest.MonkeyPatch.context() as mp:  # torch is imported above; nothing may unpickle now
        for name in ("load", "loads", "Unpickler"):
            mp.setattr(pickle, name, lambda *a, **k: (_ for _ in ()).throw(AssertionError("unpickled")))
        with pytest.raises(ValueError, match="is a pickle.*never unpickles.*torch.save's default format"):
            ggrad.load(pt)
