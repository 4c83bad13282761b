"""Fuzzing the public API: every case ends in a result or a Python exception, never a signal.

ggml aborts the process on a failed assert, so the cases run in a child process per
device, which prints ``CASE <program>`` before it runs a case and ``DONE <outcome>``
after. A child killed by a signal fails the group it was in, naming the case it had
started, and a new child carries on with the next group. The case replays on its own:

    python tests/test_fuzz.py replay cpu "<program>"

A program is a short list of steps: inputs (shape, dtype, seed, value range, on the host
or computed on the device) and operations on earlier steps' results. Hypothesis draws
them with a fixed seed (``derandomize``), running each step on torch as it draws, so a
later step can fit its arguments (axes, indices, shapes) to the shapes so far, and so
a step torch refuses ends the program. Where both libraries give a result, the shape and
dtype must agree, and the values too for deterministic ops; with ``grad`` the floating
inputs require grad and their gradients are compared as well. Where ggrad raises and
torch does not (ggrad's limits: 4 dimensions, no empty tensors...) or the other way
round, the case only counts. ``GGRAD_FUZZ_SCALE=10`` runs ten times as many cases.
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np
import pytest

ALLOWED = (ValueError, TypeError, IndexError, NotImplementedError, RuntimeError)
DTYPES = ("float32", "float16", "bfloat16", "int32", "int64", "bool")
FLOATS = ("float32", "float16", "bfloat16")
TAKE_REASON = "issue 11: take_along_last index checks (reduce.py; reported)"


# ---- programs ------------------------------------------------------------------------------
class Ref:
    """An earlier step's result (its `item`-th element when it returned a tuple)."""

    def __init__(self, step: int, item: int | None = None) -> None:
        self.step, self.item = step, item

    def __repr__(self) -> str:
        return f"Ref({self.step})" if self.item is None else f"Ref({self.step}, {self.item})"


def Input(shape, dtype, seed, lo=None, hi=None, where="host"):  # noqa: N802  (reads as a step)
    return ("input", tuple(shape), dtype, seed, lo, hi, where)


def Op(name, *args, **kwargs):  # noqa: N802
    return ("op", name, args, kwargs)


def host_data(shape, dtype, seed, lo, hi) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return np.asarray(rng.random(shape) < 0.5)
    if dtype in FLOATS:
        data = rng.standard_normal(shape) * 2 if lo is None else rng.uniform(lo, hi, shape)
        return np.asarray(data, dtype=np.float32)
    return np.asarray(rng.integers(-4 if lo is None else lo, 5 if hi is None else hi, shape), dtype=np.int64)


class Lib:
    """One library's namespace as the op table calls it: torch or ggrad."""

    def __init__(self, name: str) -> None:
        self.name = name
        if name == "torch":
            import torch
            import torch.nn.functional as tF
            self.mods, self.torch = (tF, torch), torch  # torch.embedding & co. differ from F's
        else:
            import ggrad
            import ggrad.functional as gF
            self.mods, self.torch = (gF, ggrad), None

    @property
    def is_torch(self) -> bool:
        return self.torch is not None

    def __getattr__(self, name: str):
        for mod in self.mods:
            if hasattr(mod, name):
                return getattr(mod, name)
        raise AttributeError(f"{self.name} has no {name}")

    def dtype(self, name: str):
        return getattr(self.mods[1], name)

    def make(self, array: np.ndarray, dtype: str, requires_grad: bool = False):
        if self.is_torch:
            t = self.torch.from_numpy(array).to(getattr(self.torch, dtype))
            return t.requires_grad_() if requires_grad else t
        return self.mods[1].tensor(array, dtype=dtype, requires_grad=requires_grad)


def run(program: dict, L: Lib) -> tuple[list, list, Exception | None]:
    """The values of every step on `L` (the last may be an exception), the leaves that
    require grad, and the exception backward raised, if any."""
    values, leaves, backward_error = [], [], None
    grad = program.get("grad", False)
    with L.grad_tape() if grad and not L.is_torch else contextlib.nullcontext():
        for step in program["steps"]:
            try:
                values.append(_step(step, values, leaves, L, grad))
            except Exception as err:  # noqa: BLE001  (the outcome is what we record)
                values.append(_detached(err))
                break
        loss = _loss(values[-1], L) if grad and not isinstance(values[-1], Exception) else None
        if loss is not None:
            try:
                loss.backward()
            except Exception as err:  # noqa: BLE001
                backward_error = _detached(err)
    if not L.is_torch and not isinstance(values[-1], Exception):  # read now: errors are outcomes
        try:  # (a device-side index check raises at the next read)
            for t in _outputs(values[-1]):
                t.numpy()
        except Exception as err:  # noqa: BLE001
            values[-1] = _detached(err)
        if backward_error is None:
            try:
                for t in leaves:
                    if t.grad is not None:
                        t.grad.numpy()
            except Exception as err:  # noqa: BLE001
                backward_error = _detached(err)
    return values, leaves, backward_error


def _detached(err: Exception) -> Exception:
    """`err` without its traceback (kept as text), whose frames would keep this case's
    tensors -- and their pending work -- alive into the next case."""
    err.fuzz_traceback = "".join(traceback.format_exception(err))
    err.__traceback__ = err.__context__ = err.__cause__ = None
    return err


def _loss(out, L: Lib):
    """sum(out * w), w fixed: a gradient that differs per element."""
    first = out[0] if isinstance(out, tuple) else out
    if not getattr(first, "requires_grad", False) or not first.is_floating_point():
        return None
    w = L.make(host_data(tuple(first.shape), "float32", 999, None, None), "float32")
    return (first.float() * w).sum()


def _step(step, values, leaves, L: Lib, grad: bool):
    if step[0] == "input":
        _, shape, dtype, seed, lo, hi, where = step
        wants_grad = grad and dtype in FLOATS and where == "host"
        t = L.make(host_data(shape, dtype, seed, lo, hi), dtype, wants_grad)
        if wants_grad:
            leaves.append(t)
        return t.clone() if where == "device" else t  # a clone is computed: no host copy
    _, name, args, kwargs = step
    return OPS[name].fn(L, *_resolve(args, values), **_resolve(kwargs, values))


def _resolve(obj, values):
    if isinstance(obj, Ref):
        value = values[obj.step]
        return value if obj.item is None else value[obj.item]
    if isinstance(obj, tuple):
        return tuple(_resolve(o, values) for o in obj)
    if isinstance(obj, list):
        return [_resolve(o, values) for o in obj]
    if isinstance(obj, dict):
        return {k: _resolve(v, values) for k, v in obj.items()}
    if isinstance(obj, slice):
        return slice(*(_resolve(o, values) for o in (obj.start, obj.stop, obj.step)))
    return obj


# ---- comparing with torch -------------------------------------------------------------------
TOLERANCE = {"float32": 2e-3, "float16": 2e-2, "bfloat16": 6e-2}
# Ops known to differ from torch where torch's result is NaN or infinite: positions where
# torch's value is not finite are not compared when one of these ran (each with its reason).
KNOWN_NONFINITE = {
    "relu": "relu(NaN) is 0 (ggml's RELU), torch's NaN",
    **{name: "max/min over an infinity are NaN (sum of x * one-hot: inf * 0), torch's the infinity "
             "(functional/reduce.py, reported)" for name in ("max", "min", "amax", "amin")},
}
# Gradients known to differ from torch's, each with its reason (a fix belongs elsewhere).
KNOWN_GRADIENTS = {
    "mod": "remainder's gradient is NaN where the divisor is 0, torch's is 1 (elementwise.py, reported)",
    "std": "std's gradient where the std is 0 is NaN (sqrt's at 0), torch's 0 (reduce.py, reported)",
    "setitem": "x[i] = v records no gradient for v or x (indexing.py, reported)",
}


def _outputs(value) -> list:
    return list(value) if isinstance(value, tuple) else [value]


def _host(t) -> np.ndarray:
    if hasattr(t, "detach"):  # torch
        t = t.detach()
        return (t.float() if str(t.dtype) == "torch.bfloat16" else t).numpy()
    array = t.numpy()
    return array.astype(np.float32) if t.dtype.name == "bfloat16" else array


def compare(program: dict, ours: tuple, theirs: tuple) -> str:
    """The outcome of one case ("ok", "both raised", "ggrad raised: ..."), or AssertionError."""
    (values, leaves, backward_error), (t_values, t_leaves, t_backward_error) = ours, theirs
    mine, torch_ = values[-1], t_values[-1]
    for err in (mine, backward_error):
        if isinstance(err, Exception) and not isinstance(err, ALLOWED):
            raise AssertionError(f"unexpected exception {type(err).__name__}: {err}\n{err.fuzz_traceback}")
    if isinstance(mine, Exception) and isinstance(torch_, Exception):
        return "both raised"
    if isinstance(mine, Exception):  # a limitation (4 dims, ...): allowed, counted
        return f"ggrad raised: {type(mine).__name__}: {str(mine)[:120]}"
    if isinstance(torch_, Exception):  # ggrad takes more than torch (numpy's rules...): counted
        return f"torch raised: {type(torch_).__name__}"
    ops = [s[1] for s in program["steps"] if s[0] == "op"]
    random = any(OPS[name].compare == "shape" for name in ops)  # later values differ too
    # torch rounds intermediate results to a low input dtype where ggrad computes in float32
    tol = max((TOLERANCE.get(s[2], 0) for s in program["steps"] if s[0] == "input"), default=0)
    nan_ok = next((KNOWN_NONFINITE[name] for name in ops if name in KNOWN_NONFINITE), None)
    _same(mine, torch_, "shape" if random else OPS[ops[-1]].compare if ops else "values", "result", tol, nan_ok)
    if not program.get("grad") or t_backward_error is not None or random:
        return "ok"
    known = [KNOWN_GRADIENTS[name] for name in ops if name in KNOWN_GRADIENTS]
    if known:
        return f"ok (gradient not compared: {known[0]})"
    if backward_error is not None:
        return f"ggrad backward raised: {type(backward_error).__name__}"
    for i, (g, t) in enumerate(zip(leaves, t_leaves)):
        if g.grad is None and (t.grad is None or not t.grad.any()):  # no rule: torch's zeros
            continue
        if g.grad is None:
            raise AssertionError(f"leaf {i}: torch has a gradient, ggrad none")
        _same(g.grad, t.grad if t.grad is not None else t.detach() * 0, "values", f"gradient of leaf {i}",
              tol)
    return "ok+grad"


def _same(ours, theirs, mode: str, what: str, tol: float = 0.0, nan_ok: str | None = None) -> None:
    """Shapes, dtypes and (unless `mode` says otherwise) values alike; with `nan_ok`
    (the reason), where torch's value is not finite ours may be anything."""
    ours, theirs = _outputs(ours), _outputs(theirs)
    assert len(ours) == len(theirs), f"{what}: {len(ours)} outputs, torch {len(theirs)}"
    for k, (g, t) in enumerate(zip(ours, theirs)):
        assert tuple(g.shape) == tuple(t.shape), f"{what}[{k}]: shape {g.shape}, torch {tuple(t.shape)}"
        tname = str(t.dtype).removeprefix("torch.")
        assert g.dtype.name == tname, f"{what}[{k}]: dtype {g.dtype.name}, torch {tname}"
        if mode == "shape" or (mode == "values_first" and k > 0):
            continue
        a, b = _host(g), _host(t)
        if nan_ok and tname in TOLERANCE:
            a = np.where(np.isfinite(b.astype(np.float64)), a, b)
        if tname in TOLERANCE:
            tol = max(tol, TOLERANCE[tname])
            np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=tol, atol=tol,
                                       equal_nan=True, err_msg=f"{what}[{k}]")
        else:
            np.testing.assert_array_equal(a, b, err_msg=f"{what}[{k}]")


def check_case(program: dict) -> str:
    import torch
    ggrad = Lib("ggrad")
    try:  # each case starts with nothing pending (an earlier failure must not leak here)
        ggrad.realize()
    except Exception as err:  # noqa: BLE001
        raise AssertionError(f"work an earlier case left pending fails: {err!r}") from None
    ours = run(program, ggrad)
    with contextlib.nullcontext() if program.get("grad") else torch.no_grad():
        theirs = run(program, Lib("torch"))
    return compare(program, ours, theirs)


# ---- the op table -------------------------------------------------------------------------
class OpSpec:
    """An op as both libraries call it: fn(lib, *args) (the same code for torch and ggrad,
    whose APIs match), its group, the drawer of its arguments (`strategies`) and what of
    its result is compared with torch's ("values", "values_first": the first output's
    values only (equal elements' indices may differ), "shape": random results)."""

    def __init__(self, name: str, group: str, fn, draw: str, compare: str = "values") -> None:
        self.name, self.group, self.fn, self.draw, self.compare = name, group, fn, draw, compare


OPS: dict[str, OpSpec] = {}


# elementwise: x (and y: broadcast partner or scalar)
def _binary(fn):
    def call(L, x, y):
        return fn(x, y)
    return call


for _name, _fn in {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
                   "truediv": lambda a, b: a / b, "floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b,
                   "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
                   "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
                   "and_": lambda a, b: a & b, "or_": lambda a, b: a | b, "xor": lambda a, b: a ^ b}.items():
    OPS[_name] = OpSpec(_name, "elementwise", _binary(_fn), "binary")
for _name in ("maximum", "minimum", "logical_and", "logical_or", "logical_xor"):
    OPS[_name] = OpSpec(_name, "elementwise", lambda L, x, y, n=_name: getattr(L, n)(x, y), "binary_tensors")
for _name in ("neg", "abs", "exp", "log", "sqrt", "square", "sign", "floor", "ceil", "round", "trunc", "relu",
              "sigmoid", "tanh", "isnan", "isinf", "isfinite", "logical_not"):
    OPS[_name] = OpSpec(_name, "elementwise", lambda L, x, n=_name: getattr(L, n)(x), "unary")
OPS["gelu"] = OpSpec("gelu", "elementwise", lambda L, x, approximate: L.gelu(x, approximate=approximate), "gelu")
OPS["silu"] = OpSpec("silu", "elementwise", lambda L, x: L.silu(x), "unary")
OPS["leaky_relu"] = OpSpec("leaky_relu", "elementwise", lambda L, x, s: L.leaky_relu(x, s), "slope")
OPS["pow"] = OpSpec("pow", "elementwise", lambda L, x, p: x ** p, "power")
OPS["clamp"] = OpSpec("clamp", "elementwise", lambda L, x, lo, hi: x.clamp(lo, hi), "clamp")
OPS["to"] = OpSpec("to", "elementwise", lambda L, x, dtype: x.to(L.dtype(dtype)), "cast")
OPS["where"] = OpSpec("where", "elementwise", lambda L, c, a, b: L.where(c, a, b), "where")
OPS["masked_fill"] = OpSpec("masked_fill", "elementwise", lambda L, x, m, v: x.masked_fill(m, v), "masked_fill")
OPS["invert"] = OpSpec("invert", "elementwise", lambda L, x: ~x, "unary")


# reductions: x, dim (None, in or out of range), keepdim
def _reduction(method):
    def call(L, x, dim, keepdim):
        f = getattr(x, method)
        return f() if dim is None else f(dim, keepdim)
    return call


for _name in ("sum", "mean", "amax", "amin", "argmax", "argmin", "any", "all"):
    OPS[_name] = OpSpec(_name, "reduce", _reduction(_name), "reduce")
OPS["max"] = OpSpec("max", "reduce", _reduction("max"), "reduce", "values_first")
OPS["min"] = OpSpec("min", "reduce", _reduction("min"), "reduce", "values_first")
OPS["var"] = OpSpec("var", "reduce", lambda L, x, dim, keepdim, correction: x.var(dim, keepdim=keepdim, correction=correction),
                    "var")
OPS["std"] = OpSpec("std", "reduce", lambda L, x, dim, keepdim, correction: x.std(dim, keepdim=keepdim, correction=correction),
                    "var")
OPS["norm"] = OpSpec("norm", "reduce", lambda L, x, p, dim, keepdim: x.norm(p, dim, keepdim), "norm")
OPS["logsumexp"] = OpSpec("logsumexp", "reduce", lambda L, x, dim, keepdim: L.logsumexp(x, dim, keepdim), "dim")
OPS["softmax"] = OpSpec("softmax", "reduce", lambda L, x, dim, keepdim: L.softmax(x, dim), "dim")
OPS["log_softmax"] = OpSpec("log_softmax", "reduce", lambda L, x, dim, keepdim: L.log_softmax(x, dim), "dim")
OPS["cumsum"] = OpSpec("cumsum", "reduce", lambda L, x, dim, keepdim: x.cumsum(dim), "dim")
# equal elements may come in either order: values only
OPS["sort"] = OpSpec("sort", "reduce", lambda L, x, dim, keepdim: tuple(x.sort(dim, keepdim)), "dim", "values_first")
OPS["topk"] = OpSpec("topk", "reduce", lambda L, x, k, dim, largest: tuple(x.topk(k, dim, largest)), "topk",
                     "values_first")


# layout
OPS["reshape"] = OpSpec("reshape", "layout", lambda L, x, shape: x.reshape(shape), "reshape")
OPS["view"] = OpSpec("view", "layout", lambda L, x, shape: x.view(*shape), "reshape")
OPS["unflatten"] = OpSpec("unflatten", "layout", lambda L, x, dim, sizes: x.unflatten(dim, sizes), "unflatten")
OPS["flatten"] = OpSpec("flatten", "layout", lambda L, x, a, b: x.flatten(a, b), "two_axes")
OPS["transpose"] = OpSpec("transpose", "layout", lambda L, x, a, b: x.transpose(a, b), "two_axes")
OPS["movedim"] = OpSpec("movedim", "layout", lambda L, x, a, b: x.movedim(a, b), "two_axes")
OPS["permute"] = OpSpec("permute", "layout", lambda L, x, axes: x.permute(*axes), "permute")
OPS["T"] = OpSpec("T", "layout", lambda L, x: x.mT if x.ndim >= 2 else x.T, "unary")
OPS["squeeze"] = OpSpec("squeeze", "layout", lambda L, x, dim: x.squeeze() if dim is None else x.squeeze(dim),
                        "axis_or_none")
OPS["unsqueeze"] = OpSpec("unsqueeze", "layout", lambda L, x, dim: x.unsqueeze(dim), "axis_plus")
OPS["expand"] = OpSpec("expand", "layout", lambda L, x, shape: x.expand(*shape), "expand")
OPS["broadcast_to"] = OpSpec("broadcast_to", "layout", lambda L, x, shape: L.broadcast_to(x, shape), "expand")
OPS["repeat"] = OpSpec("repeat", "layout", lambda L, x, reps: x.repeat(*reps), "repeat")
OPS["cat"] = OpSpec("cat", "layout", lambda L, xs, dim: L.cat(xs, dim), "join")
OPS["stack"] = OpSpec("stack", "layout", lambda L, xs, dim: L.stack(xs, dim), "join")
OPS["split"] = OpSpec("split", "layout", lambda L, x, size, dim: tuple(x.split(size, dim)), "split")
OPS["chunk"] = OpSpec("chunk", "layout", lambda L, x, n, dim: tuple(x.chunk(n, dim)), "split")
OPS["narrow"] = OpSpec("narrow", "layout", lambda L, x, dim, start, length: x.narrow(dim, start, length), "narrow")
OPS["pad"] = OpSpec("pad", "layout", lambda L, x, pads, value: L.pad(x, pads, "constant", value), "pad")
OPS["matmul"] = OpSpec("matmul", "layout", lambda L, a, b: a @ b, "matmul")
OPS["einsum"] = OpSpec("einsum", "layout", lambda L, eq, a, b: L.einsum(eq, a, b), "einsum")
OPS["clone"] = OpSpec("clone", "layout", lambda L, x: x.clone(), "unary")


# indexing and gathers
def _setitem(L, x, index, value):
    y = x.clone()
    y[index] = value
    return y


def _gather_rows(L, table, index):
    return table[index] if L.is_torch else L.gather(table, index)


def _one_hot(L, index, n):
    return L.one_hot(index.long(), n).float() if L.is_torch else L.one_hot(index, n)  # torch: int64 only


def _take_along_last(L, x, index):
    return L.take_along_dim(x, index.long(), -1) if L.is_torch else L.take_along_last(x, index)


OPS["getitem"] = OpSpec("getitem", "index", lambda L, x, index: x[index], "getitem")
OPS["setitem"] = OpSpec("setitem", "index", _setitem, "setitem")
OPS["gather"] = OpSpec("gather", "index", _gather_rows, "gather")
OPS["embedding"] = OpSpec("embedding", "index", lambda L, index, w: L.embedding(index, w), "embedding")
OPS["one_hot"] = OpSpec("one_hot", "index", _one_hot, "one_hot")
OPS["take_along_last"] = OpSpec("take_along_last", "index", _take_along_last, "take_along_last")


# losses and random
OPS["mse_loss"] = OpSpec("mse_loss", "loss", lambda L, a, b, r: L.mse_loss(a, b, reduction=r), "pair_loss")
OPS["l1_loss"] = OpSpec("l1_loss", "loss", lambda L, a, b, r: L.l1_loss(a, b, reduction=r), "pair_loss")
OPS["bce_logits"] = OpSpec("bce_logits", "loss",
                           lambda L, a, b, r: L.binary_cross_entropy_with_logits(a, b, reduction=r), "bce")
OPS["cross_entropy"] = OpSpec("cross_entropy", "loss", lambda L, x, t, r: L.cross_entropy(x, t, reduction=r),
                              "cross_entropy")
OPS["rand_like"] = OpSpec("rand_like", "loss", lambda L, x, k: _rand_like(L, x, k), "rand_like", "shape")
OPS["dropout"] = OpSpec("dropout", "loss", lambda L, x, p: L.dropout(x, p, True), "dropout", "shape")


def _rand_like(L, x, k):
    """k draws before one read (each draw is ~30 ggml nodes in one lazy node)."""
    draws = [L.rand_like(x) for _ in range(k)]
    return draws[-1]


# modules (ggrad.nn, given the same weights as torch's functional forms)
def _module(L, name, *args):
    """torch's functional form, or ggrad's module with these weights."""
    if L.is_torch:
        return TORCH_MODULES[name](L, *args)
    x, weights = args[0], args[1:]
    n = x.shape[-1] if x.ndim else 1
    if name == "linear":
        m = L.nn.Linear(weights[0].shape[1], weights[0].shape[0])
    elif name == "layer_norm":
        m = L.nn.LayerNorm(weights[0].shape[0])
    elif name == "batch_norm":
        m = L.nn.BatchNorm1d(weights[0].shape[0])
    else:  # attention: weights differ (each side's own init), only the shape is compared
        m = L.nn.MultiheadAttention(n, weights[0], batch_first=True)
        return m(x, x, x, need_weights=False, is_causal=weights[1])[0]
    m.weight, m.bias = weights
    return m(x)


TORCH_MODULES = {
    "linear": lambda L, x, w, b: L.linear(x, w, b),
    "layer_norm": lambda L, x, w, b: L.layer_norm(x, (w.shape[0],), w, b, 1e-5),
    "batch_norm": lambda L, x, w, b: L.batch_norm(x, None, None, w, b, training=True) if x.ndim == 2
    and x.shape[1] == w.shape[0] else _refuse("BatchNorm1d takes (N, C)"),
    "attention": lambda L, x, heads, causal: x.clone() if x.ndim in (2, 3) and x.shape[-1] % heads == 0
    else _refuse("attention takes (batch, time, embed) or (time, embed), embed divisible by heads"),
}


def _refuse(why: str):
    raise ValueError(why)


for _name in TORCH_MODULES:
    OPS[_name] = OpSpec(_name, "nn", lambda L, *args, n=_name: _module(L, n, *args),
                        {"linear": "linear", "attention": "attention"}.get(_name, "norm"),
                        "shape" if _name == "attention" else "values")

# convolution and pooling (issue 12)
OPS["conv2d"] = OpSpec("conv2d", "nn", lambda L, x, w, s, p, d, g: L.conv2d(x, w, None, s, p, d, g), "conv")
OPS["max_pool2d"] = OpSpec("max_pool2d", "nn", lambda L, x, k, s, p, c: L.max_pool2d(x, k, s, p, ceil_mode=c),
                           "pool")
OPS["avg_pool2d"] = OpSpec("avg_pool2d", "nn", lambda L, x, k, s, p, c: L.avg_pool2d(x, k, s, p, ceil_mode=c),
                           "pool")

GROUPS = ("elementwise", "reduce", "layout", "index", "loss", "nn", "chain", "device_index")


# ---- drawing programs (hypothesis) ------------------------------------------------------------
def strategies():
    """The program strategy per group (imports hypothesis and torch: child only)."""
    import torch
    from hypothesis import strategies as st

    torch_lib = Lib("torch")
    sizes = st.sampled_from([1, 1, 2, 3, 4, 5])
    dtypes_ = st.sampled_from(("float32",) * 4 + DTYPES)

    class Builder:
        def __init__(self, draw) -> None:
            self.draw, self.steps, self.values = draw, [], []
            self.seed = 0

        def shape(self, min_dims=1, max_dims=4):
            d = self.draw(st.integers(min_dims, max_dims))
            return tuple(self.draw(sizes) for _ in range(d))

        def input(self, shape=None, dtype=None, lo=None, hi=None, where=None) -> Ref:
            shape = self.shape(0 if self.draw(st.integers(0, 15)) == 0 else 1) if shape is None else shape
            dtype = self.draw(dtypes_) if dtype is None else dtype
            where = self.draw(st.sampled_from(("host", "host", "device"))) if where is None else where
            self.seed += 1
            return self.add(Input(shape, dtype, self.seed, lo, hi, where))

        def add(self, step) -> Ref:
            self.steps.append(step)
            values = self.values
            try:
                with torch.no_grad():
                    values.append(_step(step, values, [], torch_lib, False))
            except Exception as err:  # noqa: BLE001
                values.append(err)
            return Ref(len(self.steps) - 1)

        def tensor(self, ref: Ref):
            return self.values[ref.step]

        def current(self) -> Ref:
            """A tensor to work on: the last result when it is one, else a new input."""
            for i in range(len(self.values) - 1, -1, -1):
                v = self.values[i]
                if isinstance(v, torch.Tensor):
                    return Ref(i)
                if isinstance(v, tuple) and v and isinstance(v[0], torch.Tensor):
                    return Ref(i, 0)
            return self.input()

        def value(self, ref: Ref):
            v = self.values[ref.step]
            return v if ref.item is None else v[ref.item]

        def failed(self) -> bool:
            return bool(self.values) and isinstance(self.values[-1], Exception)

        def axis(self, ndim: int, extra: int = 0, none: bool = False):
            """Mostly in range (negative too), sometimes out of it."""
            hi = max(ndim, 1) + extra
            choices = st.integers(-hi, hi - 1)
            if self.draw(st.integers(0, 9)) == 0:
                choices = st.sampled_from([-hi - 1, hi, 7])
            if none and self.draw(st.booleans()):
                return None
            return self.draw(choices)

        def partner_shape(self, shape):
            """A shape that broadcasts with `shape` (mostly), or one that may not."""
            kind = self.draw(st.integers(0, 5))
            if kind == 0:
                return shape
            if kind == 1:
                return shape[self.draw(st.integers(0, len(shape))):]
            if kind == 2:
                return tuple(1 if self.draw(st.booleans()) else n for n in shape)
            if kind == 3:
                return (self.draw(sizes),) * self.draw(st.integers(1, 2)) + shape  # may pass 4 dims
            if kind == 4:
                return tuple(n + 1 if self.draw(st.integers(0, 3)) == 0 else n for n in shape)
            return self.shape()

    def partner(b: Builder, x: Ref, same_dtype=False):
        xv = b.value(x)
        kind = b.draw(st.integers(0, 5))
        if kind == 0 and not same_dtype:  # a Python scalar
            return b.draw(st.sampled_from([2, -1, 0.5, 1.5, -2.25, 3, True]))
        dtype = str(xv.dtype).removeprefix("torch.") if same_dtype or kind < 3 else None
        return b.input(b.partner_shape(tuple(xv.shape)), dtype)

    # -- one drawer per argument pattern: (builder, x) -> args, kwargs ----------------------------
    def d_binary(b, x):
        y = partner(b, x)
        return (x, y) if b.draw(st.integers(0, 4)) else (y, x), {}

    def d_binary_tensors(b, x):
        return (x, b.input(b.partner_shape(tuple(b.value(x).shape)))), {}

    def d_unary(b, x):
        return (x,), {}

    def d_gelu(b, x):
        return (x, b.draw(st.sampled_from(["none", "tanh"]))), {}

    def d_slope(b, x):
        return (x, b.draw(st.sampled_from([0.01, 0.2, -0.5]))), {}

    def d_power(b, x):
        return (x, b.draw(st.sampled_from([2, 3, 0, -1, 0.5, 1.5, -2, 1]))), {}

    def d_clamp(b, x):
        bound = st.one_of(st.none(), st.sampled_from([-1.5, 0, 0.5, 2, -3]))
        lo, hi = b.draw(bound), b.draw(bound)
        if lo is None and hi is None:
            lo = b.draw(st.sampled_from([-1, 0.25]))
        if b.draw(st.integers(0, 3)) == 0:  # tensor bounds, broadcast
            shape = b.partner_shape(tuple(b.value(x).shape))
            dt = str(b.value(x).dtype).removeprefix("torch.")
            lo = b.input(shape, dt, -1, 0) if lo is not None else None
            hi = b.input(shape, dt, 0, 2) if hi is not None else None
        return (x, lo, hi), {}

    def d_cast(b, x):
        return (x, b.draw(st.sampled_from(DTYPES))), {}

    def d_where(b, x):
        shape = tuple(b.value(x).shape)
        if b.value(x).dtype == torch.bool and b.draw(st.booleans()):  # a mask made by earlier steps
            return (x, b.input(shape), b.input(b.partner_shape(shape))), {}
        c = b.input(b.partner_shape(shape), "bool")
        y = partner(b, x)
        return (c, x, y) if b.draw(st.booleans()) else (c, y, x), {}

    def d_masked_fill(b, x):
        m = b.input(b.partner_shape(tuple(b.value(x).shape)), "bool")
        v = b.draw(st.sampled_from([0, -1.5, 7, float("-inf")]))
        return (x, m, v), {}

    def d_reduce(b, x):
        nd = b.value(x).ndim
        return (x, b.axis(nd, none=True), b.draw(st.booleans())), {}

    def d_dim(b, x):
        return (x, b.axis(b.value(x).ndim), b.draw(st.booleans())), {}

    def d_var(b, x):
        nd = b.value(x).ndim
        return (x, b.axis(nd, none=True), b.draw(st.booleans()), b.draw(st.sampled_from([0, 1]))), {}

    def d_norm(b, x):
        nd = b.value(x).ndim
        return (x, b.draw(st.sampled_from([2, 1, 3, math.inf, -math.inf])), b.axis(nd, none=True),
                b.draw(st.booleans())), {}

    def d_topk(b, x):
        xv = b.value(x)
        dim = b.axis(xv.ndim)
        n = xv.shape[dim] if xv.ndim and -xv.ndim <= dim < xv.ndim else 1
        return (x, b.draw(st.integers(0, n + 1)), dim, b.draw(st.booleans())), {}

    def d_reshape(b, x):
        n = b.value(x).numel()
        if b.draw(st.integers(0, 4)) == 0:  # anything: usually wrong
            return (x, b.shape(1, 5)), {}
        dims, rest = [], n
        for _ in range(b.draw(st.integers(1, 4)) - 1):
            f = b.draw(st.sampled_from([k for k in range(1, rest + 1) if rest % k == 0]))
            dims.append(f)
            rest //= f
        dims.append(rest)
        if b.draw(st.booleans()):
            dims[b.draw(st.integers(0, len(dims) - 1))] = -1
        return (x, tuple(dims)), {}

    def d_unflatten(b, x):
        xv = b.value(x)
        dim = b.axis(xv.ndim)
        n = xv.shape[dim] if xv.ndim and -xv.ndim <= dim < xv.ndim else 1
        f = b.draw(st.sampled_from([k for k in range(1, n + 1) if n % k == 0] + [n + 1]))
        sizes = [f, n // f] if b.draw(st.booleans()) else [f, -1]
        return (x, dim, tuple(sizes)), {}

    def d_two_axes(b, x):
        nd = b.value(x).ndim
        return (x, b.axis(nd), b.axis(nd)), {}

    def d_permute(b, x):
        nd = b.value(x).ndim
        axes = b.draw(st.permutations(range(nd)))
        if b.draw(st.integers(0, 5)) == 0 and nd:
            axes = axes[:-1] + [axes[0]]  # a repeat: not a permutation
        return (x, tuple(a - nd if b.draw(st.booleans()) else a for a in axes)), {}

    def d_axis_or_none(b, x):
        return (x, b.axis(b.value(x).ndim, none=True)), {}

    def d_axis_plus(b, x):
        return (x, b.axis(b.value(x).ndim, extra=1)), {}

    def d_expand(b, x):
        shape = tuple(b.value(x).shape)
        kind = b.draw(st.integers(0, 5))
        if kind == 0:
            target = b.shape()  # likely invalid, maybe smaller
        elif kind == 1:
            target = shape[1:] if shape else (0,)
        else:
            target = tuple(b.draw(sizes) if n == 1 else n for n in shape)
            target = (b.draw(sizes),) * b.draw(st.integers(0, 2)) + target
        if kind == 5 and target:
            target = (-1,) + target[1:]
        return (x, target), {}

    def d_repeat(b, x):
        nd = b.value(x).ndim
        reps = tuple(b.draw(st.integers(1, 3)) for _ in range(nd + b.draw(st.integers(0, 1))))
        if b.draw(st.integers(0, 7)) == 0:
            reps = reps[:-1] + (0,) if reps else (0,)
        return (x, reps), {}

    def d_join(b, x):
        xv = b.value(x)
        others = [x]
        for _ in range(b.draw(st.integers(0, 2))):
            shape = tuple(xv.shape)
            if b.draw(st.booleans()) and shape:
                i = b.draw(st.integers(0, len(shape) - 1))
                shape = shape[:i] + (b.draw(sizes),) + shape[i + 1:]
            others.append(b.input(shape))
        return (others, b.axis(xv.ndim, extra=1)), {}

    def d_split(b, x):
        xv = b.value(x)
        dim = b.axis(xv.ndim)
        n = xv.shape[dim] if xv.ndim and -xv.ndim <= dim < xv.ndim else 1
        if b.draw(st.booleans()):
            size = b.draw(st.integers(0, n + 1))
        else:
            parts = b.draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
            size = parts if sum(parts) == n or b.draw(st.integers(0, 3)) == 0 else [n]
        return (x, size, dim), {}

    def d_narrow(b, x):
        xv = b.value(x)
        dim = b.axis(xv.ndim)
        n = xv.shape[dim] if xv.ndim and -xv.ndim <= dim < xv.ndim else 1
        start = b.draw(st.integers(-n, n))
        return (x, dim, start, b.draw(st.integers(0, n + 1))), {}

    def d_pad(b, x):
        nd = b.value(x).ndim
        pads = tuple(b.draw(st.integers(-2, 2)) for _ in range(2 * b.draw(st.integers(1, max(nd, 1)))))
        return (x, pads, b.draw(st.sampled_from([0.0, 1.5]))), {}

    def d_matmul(b, x):
        xv = b.value(x)
        shape = tuple(xv.shape)
        dt = str(xv.dtype).removeprefix("torch.")
        k = shape[-1] if shape else 1
        kind = b.draw(st.integers(0, 4))
        if kind == 0:
            other = (k,)
        elif kind == 1:
            other = (k, b.draw(sizes))
        elif kind == 2:
            other = shape[:-2] + (k, b.draw(sizes)) if len(shape) >= 2 else (b.draw(sizes), k, 2)
        elif kind == 3:
            other = (b.draw(sizes), 1, k, b.draw(sizes))
        else:
            other = b.shape()
        y = b.input(other, dt if b.draw(st.integers(0, 5)) else None)
        return (x, y) if b.draw(st.integers(0, 3)) else (y, x), {}

    def d_einsum(b, x):
        eq, sa, sb = b.draw(st.sampled_from([
            ("ij,jk->ik", (2, 3), (3, 4)), ("bij,bjk->bik", (2, 2, 3), (2, 3, 1)), ("i,i->", (3,), (3,)),
            ("ij,kj->ik", (2, 3), (4, 3)), ("bhqd,bhkd->bhqk", (1, 2, 3, 4), (1, 2, 2, 4)), ("ij,j->i", (3, 2), (2,)),
            ("ij,ij->ij", (2, 3), (2, 3)), ("ij,jk", (2, 3), (3, 2)), ("ij,jk->ik", (2, 3), (4, 2)),
            ("ii,i->i", (2, 2), (2,)), ("i...,i->i", (2, 3), (2,))]))
        dt = b.draw(st.sampled_from(FLOATS))
        return (eq, b.input(sa, dt), b.input(sb, dt)), {}

    def d_getitem(b, x):
        xv = b.value(x)
        shape = tuple(xv.shape)
        entries = []
        for axis, n in enumerate(shape):
            if len(entries) > axis and b.draw(st.booleans()):
                break
            kind = b.draw(st.integers(0, 9))
            if kind <= 2:
                entries.append(b.draw(st.integers(-n - 1, n)))
            elif kind <= 5:
                start = b.draw(st.one_of(st.none(), st.integers(-n - 1, n + 1)))
                stop = b.draw(st.one_of(st.none(), st.integers(-n - 1, n + 1)))
                step = b.draw(st.sampled_from([None, 1, 2, 3, -1]))
                entries.append(slice(start, stop, step))
            elif kind == 6:
                entries.append(None)
            elif kind == 7 and Ellipsis not in entries:
                entries.append(Ellipsis)
            else:
                k = b.draw(st.integers(1, 3))
                lo, hi = (-n, n) if b.draw(st.integers(0, 3)) else (-n - 2, n + 2)
                where = b.draw(st.sampled_from(("host", "host", "device")))
                ix = b.input((k,), b.draw(st.sampled_from(("int64", "int32"))), lo, hi, where)
                if b.draw(st.integers(0, 3)) == 0:  # a bool mask over this axis
                    ix = b.input((n,), "bool", where="host")
                entries.append(ix)
        if b.draw(st.integers(0, 9)) == 0:
            entries.append(0)  # one too many, often
        return (x, tuple(entries) if len(entries) != 1 or b.draw(st.booleans()) else entries[0]), {}

    def d_setitem(b, x):
        xv = b.value(x)
        shape = tuple(xv.shape)
        kind = b.draw(st.integers(0, 3))
        if kind == 0 and shape:  # a mask over the leading axes
            k = b.draw(st.integers(1, len(shape)))
            index = b.input(shape[:k], "bool", where="host")
            region = shape[k:]
        elif kind == 1 and shape:  # distinct rows, a host list
            n = shape[0]
            index = b.draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=n, unique_by=lambda i: i % n))
            region = (len(index),) + shape[1:]
        else:
            index, region = [], []
            for n in shape[:b.draw(st.integers(0, len(shape)))]:
                if b.draw(st.booleans()):
                    index.append(b.draw(st.integers(-n - 1, n)))
                else:
                    start = b.draw(st.integers(0, n))
                    index.append(slice(start, b.draw(st.integers(start, n + 1))))
                    region.append(len(range(*index[-1].indices(n))))
            index, region = tuple(index), tuple(region)
        if b.draw(st.booleans()):
            value = b.draw(st.sampled_from([0, 2.5, -1, True]))
        else:
            value = b.input(region[b.draw(st.integers(0, len(region))):] if region else (), where="host")
        return (x, index, value), {}

    def index_input(b, n_rows, shape=None, allow_bad=True):
        """Integer indices into n_rows, mostly in range (else maybe not integers either),
        from the host or computed on the device."""
        shape = shape or tuple(b.draw(sizes) for _ in range(b.draw(st.integers(1, 2))))
        bad = allow_bad and b.draw(st.integers(0, 4)) == 0
        lo, hi = (-2, n_rows + 2) if bad else (0, n_rows)
        where = b.draw(st.sampled_from(("host", "host", "device")))
        return b.input(shape, b.draw(st.sampled_from(("int64", "int32", "float32") if bad else ("int64", "int32"))),
                       lo, hi, where)

    def d_gather(b, x):
        table = b.input((b.draw(sizes), b.draw(sizes)), b.draw(dtypes_))
        return (table, index_input(b, b.value(table).shape[0])), {}

    def d_embedding(b, x):
        w = b.input((b.draw(sizes), b.draw(sizes)), b.draw(st.sampled_from(FLOATS)))
        return (index_input(b, b.value(w).shape[0]), w), {}

    def d_one_hot(b, x):
        n = b.draw(st.integers(1, 6))
        return (index_input(b, n), n), {}

    def d_take_along_last(b, x):
        xv = b.value(x)
        shape = tuple(xv.shape) or (1,)
        shape = shape[:3]
        src = b.input(shape, "float32")
        k = b.draw(st.integers(1, 4))
        # bad indices here abort (reduce.py checks none): the "take_index" group has them
        return (src, index_input(b, shape[-1], shape[:-1] + (k,), allow_bad=False)), {}

    def d_pair_loss(b, x):
        xv = b.value(x)
        shape = tuple(xv.shape)
        other = shape if b.draw(st.integers(0, 4)) else b.partner_shape(shape)
        y = b.input(other, "float32" if b.draw(st.integers(0, 4)) else None, 0, 1)
        return (x, y, b.draw(st.sampled_from(["mean", "sum", "none", "max"]))), {}

    def d_bce(b, x):  # torch's result takes the target's dtype (in-place steps inside): one dtype
        xv = b.value(x)
        shape = tuple(xv.shape)
        y = b.input(shape if b.draw(st.integers(0, 4)) else b.partner_shape(shape),
                    str(xv.dtype).removeprefix("torch."), 0, 1)
        return (x, y, b.draw(st.sampled_from(["mean", "sum", "none"]))), {}

    def d_cross_entropy(b, x):
        n, c = b.draw(sizes), b.draw(sizes)
        logits = b.input((n, c) if b.draw(st.integers(0, 5)) else b.shape(), b.draw(st.sampled_from(FLOATS)))
        if b.draw(st.booleans()):
            target = index_input(b, c, (n,))
        else:
            target = b.input((n, c), "float32", 0, 1)
        return (logits, target, b.draw(st.sampled_from(["mean", "sum", "none"]))), {}

    def module_input(b, x):
        if b.value(x).dtype == torch.float32 and b.draw(st.booleans()):
            return x
        return b.input(b.shape(1, 3) if b.draw(st.booleans()) else (b.draw(sizes), b.draw(sizes), 4), "float32")

    def d_attention(b, x):
        return (module_input(b, x), b.draw(st.sampled_from([1, 2, 3])), b.draw(st.booleans())), {}

    def module_weights(b, x, matrix: bool):
        """An input and a module's weights (sized to fit it, mostly)."""
        x = module_input(b, x)
        shape = tuple(b.value(x).shape)
        n = shape[-1] if shape and b.draw(st.integers(0, 5)) else b.draw(sizes)
        w = b.input((b.draw(sizes), n) if matrix else (n,), "float32", where="host")
        bias = b.input((b.value(w).shape[0],), "float32", where="host")
        return (x, w, bias), {}

    def d_linear(b, x):
        return module_weights(b, x, True)

    def d_norm(b, x):
        return module_weights(b, x, False)

    def image(b, channels):
        shape = (b.draw(sizes), channels, b.draw(st.integers(1, 7)), b.draw(st.integers(1, 7)))
        return b.input(shape if b.draw(st.integers(0, 5)) else b.shape(), "float32")

    def d_conv(b, x):
        channels, groups = b.draw(st.sampled_from([1, 2, 4])), b.draw(st.sampled_from([1, 1, 2]))
        weight = b.input((b.draw(st.sampled_from([1, 2, 4])), max(channels // groups, 1), b.draw(st.integers(1, 4)),
                          b.draw(st.integers(1, 4))), "float32", where="host")
        padding = b.draw(st.sampled_from([0, 1, 2, (1, 0), "same", "valid"]))
        return (image(b, channels), weight, b.draw(st.integers(1, 3)), padding, b.draw(st.integers(1, 2)), groups), {}

    def d_pool(b, x):
        kernel = b.draw(st.integers(1, 4))
        return (image(b, b.draw(sizes)), kernel, b.draw(st.sampled_from([None, 1, 2, 3])),
                b.draw(st.integers(0, 2)), b.draw(st.booleans())), {}

    def d_rand_like(b, x):
        return (x, b.draw(st.sampled_from([1, 2, 10, 12]))), {}

    def d_dropout(b, x):
        return (x, b.draw(st.sampled_from([0.0, 0.25, 0.5, 0.9, 1.0, -0.1]))), {}

    drawers = {name[2:]: fn for name, fn in locals().items() if name.startswith("d_")}

    def index_program(draw, take: bool):
        """A gather whose indices reach ggml with no host copy to check: computed on the
        device (in range or not, negative too), for take_along_last also from the host."""
        b = Builder(draw)
        kind = "take" if take else draw(st.sampled_from(["gather", "embedding", "one_hot", "cross_entropy",
                                                          "getitem"]))
        n = draw(st.integers(1, 4))
        lo, hi = (-3, n + 3) if draw(st.booleans()) else (0, n)
        where = draw(st.sampled_from(("host", "device"))) if take else "device"
        dtype = draw(st.sampled_from(("int64", "int32", "float32") if where == "host" else ("int64", "int32")))
        ix = b.input((draw(st.integers(1, 3)),), dtype, lo, hi, where)
        k = b.value(ix).shape[0]

        def data(shape):  # on the host: only the index is computed on the device
            return b.input(shape, "float32", where="host")
        if kind == "gather":
            b.add(Op("gather", data((n, 2)), ix))
        elif kind == "embedding":
            b.add(Op("embedding", ix, data((n, 3))))
        elif kind == "one_hot":
            b.add(Op("one_hot", ix, n))
        elif kind == "cross_entropy":
            b.add(Op("cross_entropy", data((k, n)), ix, "mean"))
        elif kind == "getitem":
            b.add(Op("getitem", data((n, 2)), ix))
        else:
            b.add(Op("take_along_last", data((1, n)), Op_reshape(b, ix, (1, k))))
        return {"steps": b.steps, "grad": False}

    def Op_reshape(b, ref, shape):  # noqa: N802
        return b.add(Op("reshape", ref, shape))

    def make(names: list[str], length: int):
        """Programs of `length` ops drawn from `names` (the index groups: their own)."""
        @st.composite
        def program(draw):
            if names in (["device_index"], ["take_index"]):
                return index_program(draw, names == ["take_index"])
            b = Builder(draw)
            for _ in range(length):
                name = draw(st.sampled_from(names))
                x = b.current() if b.steps else b.input()
                if b.failed():
                    break
                args, kwargs = drawers[OPS[name].draw](b, x)
                b.add(Op(name, *args, **kwargs))
                if b.failed():
                    break
            return {"steps": b.steps, "grad": draw(st.integers(0, 2)) == 0}
        return program()

    return make


# ---- the child: the groups' cases, a line per case ------------------------------------------------
EXAMPLES = {"elementwise": 5, "reduce": 5, "layout": 5, "index": 10, "loss": 10, "nn": 15, "chain": 20,
            "device_index": 25,
            "take_index": 15}


def child(device: str, groups: list[str], scale: float) -> None:
    """Run each group's cases (EXAMPLES per op, per chain length for "chain", times
    `scale`). A group that fails (a mismatch, an unexpected exception) is reported with
    hypothesis's smallest failing case, and the next group runs."""
    import ggrad
    import torch
    from hypothesis import HealthCheck, Phase, given, settings

    torch.set_num_threads(1)  # torch's idle threads spin on the cores ggml's threads need
    ggrad.set_device(device)
    make = strategies()
    for group in groups:
        if group == "chain":
            runs = [(list(OPS), n) for n in (2, 3, 4)]
        elif group in ("device_index", "take_index"):
            runs = [([group], 1)]
        else:
            runs = [([name], 1) for name, spec in OPS.items() if spec.group == group]
        counts: dict[str, int] = {}
        print("GROUP", group, flush=True)
        try:
            for names, length in runs:
                @settings(max_examples=max(1, round(EXAMPLES[group] * scale)), derandomize=True, database=None,
                          deadline=None, suppress_health_check=list(HealthCheck),
                          phases=[Phase.generate, Phase.shrink], print_blob=False)
                @given(make(names, length))
                def case(program):
                    print("CASE", repr(program), flush=True)
                    outcome = check_case(program)
                    key = outcome.split(":")[0]
                    counts[key] = counts.get(key, 0) + 1
                    print("DONE", outcome, flush=True)
                case()
        except Exception:  # noqa: BLE001  (reported; the other groups still run)
            for line in traceback.format_exc().splitlines():
                print("| " + line, flush=True)
            print("FAILED", group, flush=True)
        else:
            print("PASSED", group, counts, flush=True)


def replay(device: str, text: str) -> None:
    import ggrad
    ggrad.set_device(device)
    program = eval(text, {"Ref": Ref, "slice": slice, "Ellipsis": Ellipsis, "inf": math.inf, "nan": math.nan})
    print(check_case(program))


# ---- the tests: one child per device runs every group (again after a signal, from the next) --
HERE = Path(__file__)
SCALE = float(os.environ.get("GGRAD_FUZZ_SCALE", "1"))  # more cases: GGRAD_FUZZ_SCALE=10
_results: dict[str, dict[str, tuple[str, str]]] = {}


def _fuzz(dev: str) -> dict[str, tuple[str, str]]:
    """group -> (status, detail) for `dev`, status "passed", "failed" or "signal"."""
    if dev in _results:
        return _results[dev]
    results: dict[str, tuple[str, str]] = {}
    remaining = [*GROUPS, "take_index"]
    while remaining:
        proc = subprocess.run([sys.executable, str(HERE), "child", dev, ",".join(remaining), str(SCALE)],
                              capture_output=True, text=True, timeout=900, env=dict(os.environ))
        group, last, detail = None, None, []
        for line in proc.stdout.splitlines():
            word, _, rest = line.partition(" ")
            if word == "GROUP":
                group, last, detail = rest, None, []
            elif word == "CASE":
                last = rest
            elif word == "DONE":
                last = None
            elif word == "|":
                detail.append(rest)
            elif word in ("PASSED", "FAILED"):
                results[group] = (word.lower(), rest if word == "PASSED" else "\n".join(detail[-60:]))
                remaining.remove(group)
                group = None
        if proc.returncode != 0:
            if group is None:  # died between groups: nothing to blame, nothing to retry
                results.update({g: ("failed", f"child exited {proc.returncode}\n{proc.stderr[-3000:]}")
                                for g in remaining})
                break
            cwd = Path.cwd()
            where = HERE.relative_to(cwd) if HERE.is_relative_to(cwd) else HERE
            how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exited {proc.returncode}"
            results[group] = ("signal" if proc.returncode < 0 else "failed",
                              f"{how} in the case\n  {last}\nreplay: python {where} replay {dev} \"{last}\""
                              f"\n{proc.stderr[-2000:]}")
            remaining.remove(group)
    _results[dev] = results
    return results


def _outcome(dev: str, group: str) -> tuple[str, str]:
    pytest.importorskip("hypothesis")
    pytest.importorskip("torch")
    return _fuzz(dev)[group]


@pytest.mark.parametrize("group", GROUPS)
def test_fuzz(dev, group):
    status, detail = _outcome(dev, group)
    assert status == "passed", f"fuzz group {group} on {dev}: {detail}"


def test_fuzz_take_along_last_indices(dev):
    """take_along_last's indices, from the host or computed on the device, in range or
    not (negative too). Nothing checks them yet (functional/reduce.py; reported): an
    expected failure, for now, naming the case."""
    status, detail = _outcome(dev, "take_index")
    if status != "passed":
        pytest.xfail(f"{TAKE_REASON}: {status}: {detail[-1500:]}")


# torch.matmul's cases with 1-d operands (the fuzz found 1-d @ 1-d refused), with gradients.
MATMUL_SHAPES = [((3,), (3,)), ((1,), (1,)), ((3,), (3, 4)), ((4, 3), (3,)), ((2, 4, 3), (3,)), ((3,), (2, 3, 4)),
                 ((2, 1, 4, 3), (3,)), ((3,), (2, 2, 3, 4)), ((3, 1, 5, 1), (3, 1, 5)), ((2, 1, 3, 4), (1, 3, 4, 2))]


@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=lambda s: f"{s[0]}@{s[1]}")
def test_matmul_as_torch(dev, shapes):
    torch = pytest.importorskip("torch")
    import ggrad
    rng = np.random.default_rng(len(shapes[0]) * 10 + len(shapes[1]))
    a, b = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    expected = ta @ tb
    w = rng.standard_normal(tuple(expected.shape)).astype(np.float32)
    (expected * torch.tensor(w)).sum().backward()
    ga, gb = ggrad.tensor(a, requires_grad=True), ggrad.tensor(b, requires_grad=True)
    with ggrad.grad_tape():
        out = ga @ gb
        (out * ggrad.tensor(w)).sum().backward()
    assert out.shape == tuple(expected.shape)
    np.testing.assert_allclose(out.numpy(), expected.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ga.grad.numpy(), ta.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gb.grad.numpy(), tb.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_matmul_vectors_of_different_lengths_raise():
    import ggrad
    with pytest.raises(ValueError, match="dot product"):
        ggrad.tensor([1.0, 2.0]) @ ggrad.tensor([1.0, 2.0, 3.0])


if __name__ == "__main__":
    if sys.argv[1] == "child":
        child(sys.argv[2], sys.argv[3].split(","), float(sys.argv[4]))
    elif sys.argv[1] == "replay":
        replay(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit("usage: test_fuzz.py child DEVICE GROUP[,GROUP...] SCALE | replay DEVICE PROGRAM")
