"""After which call a captured gradient-accumulation iteration (k micro-step tapes, then
Adam) first leaves the eager loop's bits, parameter by parameter: the CUDA failure of
tests/test_capture.py::test_a_whole_iteration_of_micro_steps_is_captured_and_equals_eager
(docs/performance.md, 2026-12-05). Run from the repository root:

    python3 bench/gpu/accumulation_probe.py cuda:0
    GGML_CUDA_DISABLE_FUSION=1 python3 bench/gpu/accumulation_probe.py cuda:0
"""
import sys

import numpy as np

sys.path.insert(0, "tests")
import ggrad  # noqa: E402
from ggrad.optim import Adam  # noqa: E402
from test_capture import BATCH, SIZES, accumulating_iteration, mlp  # noqa: E402

dev = sys.argv[1]
ggrad.set_device(dev)
k, rng = 3, np.random.default_rng(5)
data = [(rng.standard_normal((k, BATCH, SIZES[0])).astype(np.float32), rng.integers(0, SIZES[-1], (k, BATCH)))
        for _ in range(3)]


def params(compiled: bool, calls: int) -> list:
    model = mlp()
    iteration = accumulating_iteration(model, Adam(model.parameters(), lr=1e-2), k, compiled)
    for i in range(calls):
        iteration(*data[i % len(data)])
    return [p.numpy() for p in model.parameters()]


for calls in range(1, 9):  # the first call traces (runs as eager), the next ones replay
    differing = [f"{int((a != b).sum())}/{a.size}" for a, b in zip(params(False, calls), params(True, calls))]
    print(f"after call {calls}: differing elements per parameter {differing}")
