"""PyTorch's checkpoints read as torch.load(weights_only=True) reads them: tensors and
plain containers, nothing else ever built or run (ggrad/torch_checkpoint.py)."""

import io
import os
import pickle
import zipfile

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch (the test oracle) is not installed: pip install -e .[test]")

import ggrad  # noqa: E402
from ggrad import nn  # noqa: E402


def test_a_torch_state_dict_loads_into_the_same_ggrad_model(dev, tmp_path):
    torch.manual_seed(0)
    theirs = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    theirs.train()(torch.randn(16, 5))  # running statistics that are not the defaults
    torch.save(theirs.state_dict(), tmp_path / "model.pt")
    ours = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    ours.load_state_dict(ggrad.load(tmp_path / "model.pt", map_location="cpu"))
    x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    theirs.eval(), ours.eval()
    np.testing.assert_allclose(ours(ggrad.tensor(x)).numpy(), theirs(torch.tensor(x)).detach().numpy(), rtol=1e-5,
                               atol=1e-6)


def test_every_dtype_view_tie_and_container_comes_back():
    base = torch.randn(3, 4)
    values = {
        "f32": base, "f16": base.half(), "bf16": base.bfloat16(), "f64": base.double(), "i64": torch.arange(6),
        "i32": torch.arange(6, dtype=torch.int32), "i8": torch.arange(-3, 3, dtype=torch.int8),
        "u8": torch.arange(6, dtype=torch.uint8), "flag": torch.tensor([True, False, True]),
        "transposed": base.t(), "narrowed": base[1:, 2:], "strided": base[:, ::2], "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3), "tied": base, "param": torch.nn.Parameter(torch.ones(2)),
    }
    checkpoint = {"weights": values, "step": 7, "lr": 0.125, "name": "run-1", "sizes": (3, 4), "nested": [1, {"a": None}]}
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    buffer.seek(0)
    got = ggrad.load(buffer)
    for key, value in values.items():
        want = value.detach().float().numpy() if value.dtype == torch.bfloat16 else value.detach().numpy()
        array = got["weights"][key]
        assert array.shape == tuple(value.shape), key
        np.testing.assert_array_equal(array.astype(np.float32) if value.dtype == torch.bfloat16 else array, want,
                                      err_msg=key)
    assert got["weights"]["tied"] is got["weights"]["f32"]  # one tensor under two names stays one
    assert got["weights"]["bf16"].dtype.name == "bfloat16"
    assert {k: got[k] for k in ("step", "lr", "name", "sizes", "nested")} == \
        {"step": 7, "lr": 0.125, "name": "run-1", "sizes": (3, 4), "nested": [1, {"a": None}]}


def test_ggrad_checkpoints_go_through_file_objects():
    model = nn.Linear(3, 2)
    buffer = io.BytesIO()
    ggrad.save({"model": model.state_dict(), "epoch": 2}, buffer)
    buffer.seek(0)
    back = ggrad.load(buffer)
    assert back["epoch"] == 2
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(back["model"][key], value.numpy())
    with pytest.raises(ValueError, match="weights_only=False"):
        ggrad.load(io.BytesIO(buffer.getvalue()), weights_only=False)


def _torch_zip_with(payload: bytes, path, saved=None) -> None:
    """The torch.save archive of `saved`, its data.pkl replaced by `payload`."""
    legit = io.BytesIO()
    torch.save({"w": torch.zeros(2)} if saved is None else saved, legit)
    with zipfile.ZipFile(io.BytesIO(legit.getvalue())) as source, zipfile.ZipFile(path, "w") as out:
        for name in source.namelist():
            out.writestr(name, payload if name.endswith("data.pkl") else source.read(name))


class _Runs:
    def __init__(self, call, *args):
        self.call, self.args = call, args

    def __reduce__(self):
        return self.call, self.args


@pytest.mark.parametrize("case", ["os.system", "eval", "numpy", "subclass of storage"])
def test_a_malicious_checkpoint_runs_nothing(case, tmp_path):
    """A pickle that would run a command, eval code, or build another object raises
    UnpicklingError and nothing happens (the marker file is never made)."""
    marker = tmp_path / "ran"
    if case == "os.system":
        payload = pickle.dumps({"w": _Runs(os.system, f"touch {marker}")}, protocol=2)
    elif case == "eval":
        payload = pickle.dumps(_Runs(eval, f"open({str(marker)!r}, 'w')"), protocol=4)
    elif case == "numpy":
        payload = pickle.dumps({"w": np.zeros(2)}, protocol=2)  # numpy's own reconstructor: not allowed either
    else:
        payload = pickle.dumps(_Runs(type, "FloatStorage", (object,), {}), protocol=2)
    _torch_zip_with(payload, tmp_path / "evil.pt")
    with pytest.raises(pickle.UnpicklingError, match="is not allowed"):
        ggrad.load(tmp_path / "evil.pt")
    assert not marker.exists()


def test_a_tensor_that_would_read_past_its_storage_is_refused(tmp_path):
    buffer = io.BytesIO()
    torch.save({"w": torch.zeros(4)}, buffer)
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as source:
        payload = source.read(next(n for n in source.namelist() if n.endswith("data.pkl")))
    # the size (4,) becomes (40,): the stride walk would leave the 4-element storage
    forged = payload.replace(b"K\x04\x85", b"K\x28\x85", 1)
    assert forged != payload
    _torch_zip_with(forged, tmp_path / "long.pt", {"w": torch.zeros(4)})
    with pytest.raises(pickle.UnpicklingError, match="reads past its storage"):
        ggrad.load(tmp_path / "long.pt")
