"""Bad input raises a Python exception naming the problem; none may abort the process.

ggml aborts on a failed assert, so every case runs in a child process: a case that
reached ggml would kill it, and the parent would see a signal instead of a report.
"""

import os
import subprocess
import sys
import textwrap

import pytest

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
    assert "all 18 cases raised" in proc.stdout, proc.stdout
