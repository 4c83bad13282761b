"""Device fixtures: every device test runs on cpu and on each Vulkan device present.

ggml lists a Vulkan device that runs on the CPU (lavapipe, as in CI) only when
GGML_VK_VISIBLE_DEVICES is set, so it is set before ggml enumerates devices.
"""

import glob
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

os.environ.setdefault("GGML_VK_VISIBLE_DEVICES", "0")
# On a machine without a GPU, use the newer lavapipe that scripts/bootstrap.sh unpacked
# (Debian 12's corrupts the heap compiling some ggml shaders; see the script).
_LAVAPIPE = Path(os.environ.get("GGRAD_CACHE", Path.home() / ".cache" / "ggrad")) / "lavapipe" / "lvp_icd.json"
if _LAVAPIPE.exists() and not glob.glob("/dev/dri/renderD*") and not glob.glob("/dev/nvidia*"):
    os.environ.setdefault("VK_DRIVER_FILES", str(_LAVAPIPE))

import numpy as np  # noqa: E402
import pytest  # noqa: E402

try:  # on the H200 host, importing scikit-learn (scipy) after ggml's CUDA backend started
    import sklearn.utils.estimator_checks  # noqa: F401  aborted the process; import it first
except ImportError:
    pass
try:  # and importing matplotlib.pyplot after it raised SystemError (pybind11, ft2font)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401
except ImportError:
    pass

import ggrad  # noqa: E402

AVAILABLE = [d.name for d in ggrad.devices()]
DEVICE_PARAMS = ["cpu", "vulkan:0", "cuda:0"]
_ran = Counter()


@pytest.fixture(autouse=True)
def _graphs_of_this_test(request, monkeypatch):
    """Each test runs the graphs it builds itself: one that forces a path (a kernel refused,
    a builder replaced) must not reuse an earlier test's graph of the same shapes."""
    from ggrad import lazy
    monkeypatch.setattr(lazy, "BUILD_TAG", request.node.nodeid)


def pytest_report_header(config):
    lines = [f"ggrad devices: {', '.join(f'{d.name} ({d.description})' for d in ggrad.devices())}"]
    for name in DEVICE_PARAMS[1:]:
        if name not in AVAILABLE:
            lines.append(f"no {name} device: its tests are skipped")
    return lines


@pytest.fixture(params=DEVICE_PARAMS)
def dev(request):
    """Run the test with `request.param` as the current device; cpu afterwards."""
    name = request.param
    if name not in AVAILABLE:
        pytest.skip(f"no {name} device in this ggml build")
    previous = ggrad.set_device(name)
    try:
        yield name
    finally:
        ggrad.set_device(previous if previous in AVAILABLE else "cpu")


@pytest.fixture
def fit_steps(monkeypatch):
    """The compiled steps `ggrad.fit` makes, in order (to ask whether they replayed)."""
    from ggrad import train
    made = []
    make = train._train_step

    def spy(*args):
        made.append(make(*args))
        return made[-1]
    monkeypatch.setattr(train, "_train_step", spy)
    return made


def pytest_runtest_logreport(report):
    if report.when == "call" and report.passed:
        for name in DEVICE_PARAMS:
            if f"[{name}" in report.nodeid or f"-{name}]" in report.nodeid:
                _ran[name] += 1


def pytest_terminal_summary(terminalreporter):
    counts = ", ".join(f"{name}: {_ran[name]}" for name in DEVICE_PARAMS)
    terminalreporter.write_line(f"device tests passed per device -- {counts}")


@pytest.fixture
def ggml_host():
    """(ctx, put): a ggml context of 256 MB in host memory for a test that builds ggml nodes
    itself (ggrad's view rewrites checked by ggml's own CPU copies), and put(array), a new
    float32 tensor there holding `array` (ggml's axes reversed); freed after the test."""
    import ctypes

    from ggml import ggml as G
    ctx = G.ggml_init(G.ggml_init_params(mem_size=256 << 20, mem_buffer=None, no_alloc=False))

    def put(array):
        array = np.ascontiguousarray(array, np.float32)
        ne = (ctypes.c_int64 * 4)(*(tuple(reversed(array.shape)) + (1,) * (4 - array.ndim)))
        tensor = G.ggml_new_tensor(ctx, G.GGML_TYPE_F32, 4, ne)
        ctypes.memmove(tensor.contents.data, array.ctypes.data, array.nbytes)
        return tensor
    yield ctx, put
    G.ggml_free(ctx)


def tf32(dev: str) -> bool:
    """Whether float32 products on `dev` may run in TF32 now (CUDA at matmul precision
    "high" or "medium"; "highest", the default, is float32 everywhere)."""
    return dev.startswith("cuda") and ggrad.get_float32_matmul_precision() != "highest"


def rounds_quantized_activations(dev: str) -> bool:
    """Whether ggml rounds the activations of a product with a quantized weight to 8-bit
    blocks on `dev`, as llama.cpp does: the CPU and CUDA always, Vulkan where the device
    has integer dot products (the H100 has; lavapipe multiplies by the dequantized
    values, exactly)."""
    from ggrad.runtime.backend import vulkan_traits
    return not dev.startswith("vulkan") or vulkan_traits(dev).get("int dot") != "0"


def without_quantized_backward_kernel(monkeypatch) -> None:
    """ggrad's quantized-backward kernel refused for the test: the composed path (chunks of
    W's rows read to float32), its oracle, runs instead."""
    from ggrad.runtime import kernels
    supported = kernels.supported
    monkeypatch.setattr(kernels, "supported", lambda b, kernel: kernel != kernels.QMATMUL_BACK and supported(b, kernel))


def assert_close(dev: str, actual, desired, rtol: float = 1e-5, atol: float = 1e-5, err_msg: str = "") -> None:
    """np.testing.assert_allclose; where products run in TF32 (`tf32`: ~1e-3 of the
    operands' size, not of each result), within 5e-3 of the largest |desired|."""
    desired = np.asarray(desired)
    if tf32(dev):
        scale = float(np.nanmax(np.abs(desired))) if desired.size else 1.0
        np.testing.assert_allclose(actual, desired, rtol=0, atol=5e-3 * max(scale, 1e-6), err_msg=err_msg)
    else:
        np.testing.assert_allclose(actual, desired, rtol=rtol, atol=atol, err_msg=err_msg)


def set_variant(monkeypatch, name: str, on: bool) -> None:
    """ggrad's nodes ask for the op variant `name` (kernels.OP_VARIANTS) where `on` and never
    where not, whatever the device and the kernel set say (graphs built after this); the
    other variants as before."""
    from ggrad.runtime import kernels
    variant = kernels.variant
    monkeypatch.setattr(kernels, "variant", lambda backend, asked: on if asked == name else variant(backend, asked))


def compiled_nodes(step) -> list:
    """The ggml compute nodes (their structs) of a compiled step's kept graphs, every capture's."""
    return [node.contents for kept in step._captures.values() for capture in kept
            for graph in capture.graphs for _, node in graph.compute_nodes()]


def assert_resident_training(forward, parameters, x, y) -> None:
    """A compiled cross-entropy training step of `forward` (Adam over `parameters`), warm,
    with the batch on the device: one dispatch, no crossing, and the loss goes down."""
    import ggrad.functional as F
    from ggrad.optim import Adam
    opt = Adam(list(parameters), lr=1e-2)

    @ggrad.compile
    def step(x, y):
        with ggrad.grad_tape():
            loss = F.cross_entropy(forward(x), y)
            loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    first = step(x, y).item()
    for _ in range(3):
        step(x, y)
    ggrad.realize()
    with ggrad.count_transfers() as t:
        step(x, y)
        ggrad.realize()
    assert t.crossings == 0 and t.dispatches == 1, t
    assert step(x, y).item() < first


def run_in_child(source: str, *args: str, timeout: float = 300) -> str:
    """Run `source` (dedented) in a fresh Python with `args`; a child killed by a signal
    (a ggml abort, a segfault) fails the test, and so does any nonzero exit. Returns its
    output: the test asserts on what the child printed."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(source), *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    out = proc.stdout + proc.stderr
    # ggml's own message comes before its backtrace, which the tail below would cut off
    cause = "\n".join(line for line in out.splitlines() if "GGML" in line or "error" in line.lower())
    assert proc.returncode >= 0, f"child killed by signal {-proc.returncode}:\n{cause[:2000]}\n...\n{out[-3000:]}"
    assert proc.returncode == 0, f"child exited {proc.returncode}:\n{out[-3000:]}"
    return proc.stdout
