"""Half-precision parameters train under every optimizer, on every device, as torch's do.

torch keeps a float16/bfloat16 parameter's state in its dtype, and its fused CPU kernels
load each half value as float, compute the update in float32 and round each result once.
ggrad does the same (ggml's AdamW kernel is float32-only: its CPU form aborts on float16,
so each run is in a child process). The reference is torch in the same dtype: Adam and
AdamW fused (float32 math, one rounding); SGD its default loop (torch 2.13's fused CPU
SGD skips the half update, and its loop rounds lr and the buffer to half at each op),
so the bound is two units in the last place of the dtype."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch (the test oracle) is not installed: pip install -e .[test]")

from conftest import run_in_child  # noqa: E402

rng = np.random.default_rng(17)
P0 = rng.standard_normal((3, 5)).astype(np.float32)
GRADS = rng.standard_normal((10, 3, 5)).astype(np.float32)
EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}

# name: (optimizer class, its arguments, step through optim.guard.step_unless)
CASES = {
    "sgd": ("SGD", dict(lr=0.1), False),
    "sgd_momentum": ("SGD", dict(lr=0.1, momentum=0.9, dampening=0.1), False),
    "sgd_nesterov_wd": ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01), False),
    "adam": ("Adam", dict(lr=0.01), False),
    "adam_fused": ("Adam", dict(lr=0.01, fused=True), False),
    "adam_composed": ("Adam", dict(lr=0.01, fused=False), False),
    "adam_l2": ("Adam", dict(lr=0.01, weight_decay=0.1), False),
    "amsgrad": ("Adam", dict(lr=0.01, amsgrad=True), False),
    "adamw": ("AdamW", dict(lr=0.01, weight_decay=0.1), False),
    "adamw_fused": ("AdamW", dict(lr=0.01, weight_decay=0.1, fused=True), False),
    "adam_guarded": ("Adam", dict(lr=0.01), True),
}

CHILD = r"""
import json, sys
import numpy as np
import ggrad
from ggrad import optim, runtime as rt
from ggrad.optim import guard

device, dtype, folder = sys.argv[1:4]
cases = json.loads(sys.argv[4])
ggrad.set_device(device)
data = np.load(f"{folder}/inputs.npz")
report = {}
for name, (cls, kwargs, guarded) in cases.items():
    p = ggrad.tensor(data["p0"], dtype=dtype, requires_grad=True)
    opt = getattr(optim, cls)([p], **kwargs)
    dispatches, crossings, moved, grew = [], [], False, False
    for i, g in enumerate(data["grads"]):
        p.grad = ggrad.tensor(g, dtype=dtype)
        ggrad.realize(p.grad)
        with ggrad.count_transfers() as t:
            if guarded:
                guard.step_unless(ggrad.tensor(True), opt)
            else:
                opt.step()
            ggrad.realize()
        if i == 1:
            ptr, memory = p.handle.ptr, rt.memory()["persistent_bytes"]
        if i >= 1 and not guarded:  # from the second step: every state exists
            dispatches.append(t.dispatches)
            crossings.append(t.crossings)
            moved |= p.handle.ptr != ptr
            grew |= rt.memory()["persistent_bytes"] != memory
    state = opt.state[p]
    arrays = {"p": p}
    arrays.update({k: state[k] for k in ("m", "v", "momentum_buffer") if k in state})
    for key, value in arrays.items():
        assert value.dtype is p.dtype, (name, key, value.dtype)
        np.save(f"{folder}/{name}.{key}.npy", value.numpy().astype(np.float32))
    report[name] = dict(keys=sorted(arrays), dispatches=sorted(set(dispatches)), crossings=sorted(set(crossings)),
                        moved=moved, grew=grew)
print(json.dumps(report))
"""


def torch_run(cls: str, kwargs: dict, dtype: str) -> dict:
    """torch's trajectory on a parameter of `dtype`: final weights and state as float32."""
    kwargs = {k: v for k, v in kwargs.items() if k != "fused"}
    if cls != "SGD":
        kwargs["fused"] = True  # float32 math, each result rounded once (FusedAdamKernel.cpp)
    tdtype = getattr(torch, dtype)
    w = torch.tensor(P0).to(tdtype).requires_grad_()
    opt = getattr(torch.optim, cls)([w], **kwargs)
    for g in GRADS:
        w.grad = torch.tensor(g).to(tdtype)
        opt.step()
    state = opt.state[w]
    names = {"m": "exp_avg", "v": "exp_avg_sq", "momentum_buffer": "momentum_buffer"}
    out = {"p": w.detach()} | {k: state[t] for k, t in names.items() if t in state}
    return {k: v.float().numpy() for k, v in out.items()}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_every_optimizer_trains_half_parameters_as_torch(dev, dtype, tmp_path):
    """Each optimizer's weights and state after 10 steps on a float16/bfloat16 parameter
    are torch's within two units in the last place; the state keeps the parameter's dtype;
    each step from the second on is one dispatch, crosses nothing and writes in place."""
    np.savez(tmp_path / "inputs.npz", p0=P0, grads=GRADS)
    out = run_in_child(CHILD, dev, dtype, str(tmp_path), json.dumps(CASES))
    report = json.loads(out.strip().splitlines()[-1])
    for name, (cls, kwargs, guarded) in CASES.items():
        ref = torch_run(cls, kwargs, dtype)
        got = report[name]
        assert sorted(ref) == got["keys"], name
        for key, want in ref.items():
            have = np.load(tmp_path / f"{name}.{key}.npy")
            bound = 2 * EPS[dtype] * float(np.abs(want).max())
            np.testing.assert_allclose(have, want, rtol=0, atol=bound, err_msg=f"{name}: {key}")
        if not guarded:
            assert got["dispatches"] == [1] and got["crossings"] == [0], (name, got)
            assert not got["moved"] and not got["grew"], (name, got)
