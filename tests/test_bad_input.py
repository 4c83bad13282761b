"""Bad input raises a Python exception naming the problem; none may abort the process.

ggml aborts on a failed assert, so every case runs in a child process: a case that
reached ggml would kill it, and the parent would see a signal instead of a report.
"""

import os
import subprocess
import sys
import textwrap


CHILD = textwrap.dedent(r"""
    import sys, numpy as np, ggrad
    from ggml import ggml as G
    from ggrad import runtime as rt
    ggrad.set_device(sys.argv[1])
    dead = rt.to_device(np.ones((2, 2), np.float32)); rt.reset_pass()
    good = rt.to_device(np.ones((2, 2), np.float32), scope="persistent")
    ident = lambda ctx, t: G.ggml_scale(ctx, t[0], 1.0)
    cases = {
        "float64 dtype": (lambda: rt.to_device(np.ones(3)), "dtype float64"),
        "complex dtype": (lambda: rt.to_device(np.ones(3, complex)), "dtype complex128"),
        "strings": (lambda: rt.to_device(["a", "b"]), "dtype <U1"),
        "ragged list": (lambda: rt.to_device([[1.0, 2.0], [3.0]]), "ragged"),
        "empty array": (lambda: rt.to_device(np.zeros((0, 3), np.float32)), "empty"),
        "5-d array": (lambda: rt.to_device(np.zeros((1,) * 5, np.float32)), "at most 4"),
        "NaN in out_shape": (lambda: rt.run_op(ident, [good], (float("nan"), 2)), "NaN"),
        "negative out_shape": (lambda: rt.run_op(ident, [good], (-2, 2)), "positive"),
        "0-d out_shape for 2-d result": (lambda: rt.run_op(ident, [good], ()), "shape mismatch"),
        "wrong out shape": (lambda: rt.run_op(ident, [good], (4, 1), out=good), "shape mismatch"),
        "dtype mismatch with out": (lambda: rt.run_op(ident, [good], (2, 2), out=rt.to_device(np.ones((2, 2), np.float16))), "dtype mismatch"),
        "dead input": (lambda: rt.run_op(ident, [dead], (2, 2)), "dead handle"),
        "dead out": (lambda: rt.run_op(ident, [good], (2, 2), out=dead), "dead handle"),
        "dead ptr": (lambda: dead.ptr, "dead handle"),
        "fn returns no tensor": (lambda: rt.run_op(lambda ctx, t: 3, [good], (2, 2)), "ggml tensor"),
        "bad scope": (lambda: rt.to_device(np.ones(2, np.float32), scope="forever"), "scope"),
        "inputs not a list": (lambda: rt.run_op(ident, good, (2, 2)), "sequence"),
        "unknown device": (lambda: ggrad.set_device("cuda:7"), "unknown device"),
    }
    import ggrad.functional as F
    t = ggrad.tensor
    a, ids = t(np.ones((3, 4))), t([0, 1, 2])
    W = ggrad.param(np.ones((3, 4)))

    def backward_of_a_matrix():
        with ggrad.grad_tape():
            (W * 2.0).backward()

    cases.update({
        "ragged tensor": (lambda: t([[1.0], [2.0, 3.0]]), "ragged"),
        "string tensor": (lambda: t(["x"]), "dtype <U1"),
        "complex tensor": (lambda: t(np.ones(2, complex)), "complex128"),
        "5-d tensor": (lambda: t(np.ones((1,) * 5)), "at most 4"),
        "add shapes": (lambda: a + t(np.ones(5)), "(3, 4) and (5,)"),
        "matmul shapes": (lambda: a @ t(np.ones((3, 2))), "(3, 4) @ (3, 2)"),
        "matmul 0-d": (lambda: a @ t(2.0), "at least 1 dimension"),
        "reshape": (lambda: a.reshape(5, 2), "cannot reshape"),
        "reshape -1 twice": (lambda: a.reshape(-1, -1), "cannot reshape"),
        "permute": (lambda: a.permute(0, 0), "permutation"),
        "sum axis": (lambda: a.sum(axis=2), "out of range"),
        "index": (lambda: a[3], "out of range"),
        "empty slice": (lambda: a[2:1], "empty"),
        "negative slice step": (lambda: a[::-1], "step must be positive"),
        "pow tensor": (lambda: a ** a, "scalar exponent"),
        "pow NaN": (lambda: a ** float("nan"), "NaN"),
        "clamp NaN": (lambda: a.clamp(float("nan"), 1.0), "NaN"),
        "bool subtraction": (lambda: (a > 0) - (a > 1), "subtraction of bool"),
        "matmul dtypes": (lambda: a @ a.half().T, "one dtype"),
        "float index": (lambda: F.embedding(t([0.5]), a), "integer index"),
        "gather range": (lambda: F.embedding(t([7]), a), "out of range"),
        "concat shapes": (lambda: F.concat([a, t(np.ones((2, 5)))], axis=0), "concat"),
        "cross_entropy range": (lambda: F.cross_entropy(a, t([0, 1, 9])), "out of range"),
        "cross_entropy shape": (lambda: F.cross_entropy(a, t([0, 1])), "shape mismatch"),
        "mse shapes": (lambda: F.mse_loss(a, t(np.ones((4, 3)))), "shape mismatch"),
        "dropout p": (lambda: F.dropout(a, 1.0), "[0, 1)"),
        "grad shape": (lambda: setattr(W, "grad", np.ones(3)), "grad of shape"),
        "backward non-scalar": (backward_of_a_matrix, "explicit grad"),
        "int requires grad": (lambda: t([1, 2], requires_grad=True), "float"),
        "wrong device": (lambda: t([1.0], device="tpu"), "unknown device"),
    })
    for name, (call, needle) in cases.items():
        try:
            call()
        except Exception as err:
            assert needle in str(err), f"{name}: {err!r} lacks {needle!r}"
            print("raised", name, type(err).__name__, flush=True)
        else:
            raise SystemExit(f"{name}: no exception")
    print(f"all {len(cases)} cases raised", flush=True)
""")


def test_bad_input_raises_and_never_aborts(dev):
    proc = subprocess.run([sys.executable, "-c", CHILD, dev], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ))
    assert proc.returncode == 0, (
        f"child exited {proc.returncode} (negative: killed by signal)\n{proc.stdout}\n{proc.stderr}")
    assert "all 48 cases raised" in proc.stdout, proc.stdout
