"""Kernels that a GPU could not launch at the sizes given (issue 24, item 1).

ggml-cuda aborts the process when a kernel's grid passes 65,535 blocks along y or z
(a CNN step of batch 128: "PAD failed / CUDA error: invalid argument"), ggml-vulkan
when it passes the device's workgroup count, and ggml-vulkan refuses a tensor past its
storage-buffer range. Three guarantees, each tested here:
- the graphs ggrad builds for large convolutions, pools, pads, sums and gathers fit
  every such limit (checked on built graphs that are never allocated or run, so the
  sizes can be those of real networks: batch 512, 512 channels, 224x224 images);
- a node that would not fit is refused with a Python error before anything runs;
- the split forms compute what the plain ones do (hypothesis draws the shapes, each
  case in a child process on every device, compared with torch).
"""

import gc

import numpy as np
import pytest
from ggml import ggml as G

import ggrad
import ggrad.functional as F
from ggrad import dtypes, lazy
from ggrad.runtime import current, launch
from ggrad.tensor import Tensor

from conftest import AVAILABLE, run_in_child

torch = pytest.importorskip("torch")


class _Built(BaseException):
    """Raised instead of running the first graph: carries the launch problems found."""


def _launch_problems(make, device: str) -> list[str]:
    """The launch problems, under CUDA's rules (and Vulkan's, built there), of every node of the graph
    `make()()` realizes on `device`; the graph is built (on that device's code paths) but
    neither allocated nor run, and its tensors are gone before the device changes back."""
    def build_only(state, outputs, stores, effects):
        order, _, _ = lazy._walk([*outputs, *(v for _, v in stores), *(s for e in effects for s in e.srcs)])
        graph = lazy._build(current(), order, outputs, stores, effects)
        try:
            found = []
            for i in range(graph.n_nodes()):
                node = G.ggml_graph_node(graph.graph, i)
                for kind in kinds:
                    why = launch.problem(kind, node)
                    if why:
                        found.append(f"{kind}: {G.ggml_op_desc(node).decode()} {tuple(node.contents.ne)}: {why}")
        finally:
            graph.free()
        raise _Built(found)

    kinds = ("cuda", "vulkan") if device.startswith("vulkan") else ("cuda",)  # Vulkan's splits are Vulkan's
    previous = ggrad.set_device(device)
    run, lazy._run = lazy._run, build_only
    try:
        make()()
    except _Built as built:
        return built.args[0]
    finally:
        lazy._run = run
        gc.collect()
        ggrad.set_device(previous)
    raise AssertionError("nothing was realized")


def _huge(*shape) -> Tensor:
    """A leaf of `shape` that takes no memory (it is never uploaded here)."""
    node = lazy.Node(shape, dtypes.float32, host=np.broadcast_to(np.float32(0.5), shape), scope="persistent")
    return Tensor._wrap(node, requires_grad=True)


def _gradients(loss_of, *leaves):
    def build():
        with ggrad.grad_tape():
            loss_of(*leaves).sum().backward()
        lazy.realize([leaf.grad._node for leaf in leaves])
    return build


# a device whose builders take the paths a GPU takes (Vulkan lacks IM2COL_BACK and
# POOL_2D_BACK, as CUDA does); cpu otherwise
_GPU_PATHS = "vulkan:0" if "vulkan:0" in AVAILABLE else "cpu"

LARGE = [
    pytest.param(lambda: _gradients(lambda x, w: F.conv2d(x, w, stride=2, padding=1), _huge(128, 32, 28, 28),
                                    _huge(64, 32, 3, 3)), id="cnn-batch128-stride2"),
    pytest.param(lambda: _gradients(lambda x, w: F.conv2d(x, w, padding=1), _huge(512, 512, 14, 14),
                                    _huge(512, 512, 3, 3)), id="resnet-layer4-batch512"),
    pytest.param(lambda: _gradients(lambda x, w: F.conv2d(x, w, stride=2, padding=3), _huge(512, 3, 224, 224),
                                    _huge(64, 3, 7, 7)), id="stem-224-batch512"),
    pytest.param(lambda: _gradients(lambda x, w: F.conv_transpose2d(x, w, stride=2), _huge(256, 256, 16, 16),
                                    _huge(256, 128, 4, 4)), id="transposed-batch256"),
    pytest.param(lambda: _gradients(lambda x: F.max_pool2d(x, 3, 2, 1), _huge(512, 64, 112, 112)),
                 id="maxpool-112-batch512"),
    pytest.param(lambda: _gradients(lambda x: F.avg_pool2d(x, 2), _huge(512, 256, 56, 56)), id="avgpool-batch512"),
    pytest.param(lambda: _gradients(lambda x: F.pad(x, (1, 2, 3, 4)), _huge(512, 512, 32, 32)), id="pad-4d"),
    pytest.param(lambda: _gradients(lambda x: x[:, 3:], _huge(200_000, 16)), id="slice-rows"),
    pytest.param(lambda: _gradients(lambda x: F.cat([x, x * 2], 1), _huge(100_000, 3, 70_000 // 1000)),
                 id="cat"),
    pytest.param(lambda: _gradients(lambda x, b: x + b, _huge(100_000, 8), _huge(100_000, 1)), id="sum-to-column"),
    pytest.param(lambda: _gradients(lambda x, b: x * b, _huge(4, 100_000, 8), _huge(4, 100_000, 1)),
                 id="sum-to-3d"),
    pytest.param(lambda: _gradients(lambda x, b: x + b, _huge(128, 512, 2, 2), _huge(1, 512, 1, 1)),
                 id="sum-to-channels-batch128"),  # a composed BatchNorm2d's bias gradient
]


@pytest.mark.parametrize("build", LARGE)
def test_large_graphs_fit_every_launch_limit(build):
    problems = _launch_problems(build, _GPU_PATHS)
    assert not problems, "\n".join(problems[:10])


def test_the_checker_sees_an_oversized_pad():
    """Sanity of the test above: the old way (one PAD of a (1, W, H, C*N) reshape) fails it."""
    ctx = G.ggml_init(G.ggml_init_params(mem_size=1 << 16, mem_buffer=None, no_alloc=True))
    try:
        image = G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 1, 28, 28, 64 * 128)
        old = G.ggml_pad(ctx, image, 1, 0, 0, 0)
        assert "65,535" in launch.problem("cuda", old)
        flat = ggrad.ops.pad_axis(ctx, image, 0, 0, 1)
        assert launch.problem("cuda", flat) is None
        assert tuple(flat.contents.ne)[:2] == (2, 28 * 28 * 64 * 128)
    finally:
        G.ggml_free(ctx)


def test_an_unlaunchable_node_raises_before_running(dev, monkeypatch):
    """A node past a launch limit is a Python error naming the limit, and nothing runs."""
    monkeypatch.setattr(launch, "problem", lambda kind, node: "a test limit" if node.contents.op == G.GGML_OP_SQRT
                        else None)
    x = ggrad.tensor(np.ones((3, 4), np.float32))
    with pytest.raises(RuntimeError, match="too large for ggml's .* a test limit; nothing was run"):
        F.sqrt(x).numpy()
    assert float((x + 1).sum().item()) == 24.0  # the next graph still runs


def test_an_op_the_backend_lacks_raises_naming_its_types(dev, monkeypatch):
    """A node the backend does not implement is a Python error naming the op, the sources'
    types and the result's (ggml-cuda's GET_ROWS of a K-quant read "GET_ROWS on float32"),
    and nothing runs."""
    backend = type(current().backend)
    has_op = backend.has_op
    monkeypatch.setattr(backend, "has_op", lambda self, node: node.contents.op != G.GGML_OP_SQRT and has_op(self, node))
    x = ggrad.tensor(np.ones((3, 4), np.float32))
    with pytest.raises(NotImplementedError, match=r"does not support SQRT of f32 into f32 of ggml shape "
                                                  r"\(4, 3, 1, 1\); nothing was run"):
        F.sqrt(x).numpy()
    assert float((x + 1).sum().item()) == 24.0


@pytest.mark.skipif("vulkan:0" not in AVAILABLE, reason="no Vulkan device")
def test_vulkan_tensor_limit_is_found_and_named():
    """The most bytes one tensor may hold (the storage-buffer range: lavapipe's 128 MiB, the
    H100's 4 GiB). A tensor computed past it is refused by name, or, where ggrad's buffers
    hold less (the H100's hold 1 GiB), as a value to keep; the device switches and runs
    after (the refused value is not tried again)."""
    previous = ggrad.set_device("vulkan:0")
    try:
        limit = current().backend.max_tensor_bytes
        if limit is None:
            pytest.skip("this Vulkan device indexes any tensor")
        assert limit >= 1 << 20
        x = ggrad.tensor(np.ones((limit // 4 + 1024,), np.float32)[:8])  # a small tensor runs
        assert float(x.sum().item()) == 8.0
        big = F.pad(x, (0, limit // 4 + 1024 - 8)) + 1  # made on the device: nothing uploaded
        with pytest.raises(RuntimeError, match="bytes per tensor|buffer can hold"):
            big.sum().item()
    finally:
        ggrad.set_device(previous)
    assert float((x + 1).sum().item()) == 16.0


@pytest.mark.skipif("vulkan:0" not in AVAILABLE, reason="no Vulkan device")
def test_a_convolution_past_the_tensor_limit_splits_its_batch():
    """lavapipe refused a CNN's evaluation at batch 297 (im2col columns of 197 MB): the
    batch is split, and the result equals torch's."""
    previous = ggrad.set_device("vulkan:0")
    try:
        limit = current().backend.max_tensor_bytes
        if limit is None:
            pytest.skip("this Vulkan device indexes any tensor")
        rng = np.random.default_rng(0)
        per_sample = 26 * 26 * 9 * 4  # a 3x3 kernel over one 28x28 channel: the columns' bytes
        n = limit // per_sample + 3
        x, w = rng.standard_normal((n, 1, 28, 28), np.float32), rng.standard_normal((2, 1, 3, 3), np.float32)
        y = F.conv2d(ggrad.tensor(x), ggrad.tensor(w)).numpy()
        want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w)).numpy()
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    finally:
        ggrad.set_device(previous)


_FUZZ_CHILD = """
import contextlib, sys, zlib, numpy as np, torch
import ggrad, ggrad.functional as F
from hypothesis import given, settings, strategies as st, HealthCheck
ggrad.set_device(sys.argv[1])
cap = int(sys.argv[2])

@st.composite
def case(draw):
    n, c = draw(st.integers(1, 512)), draw(st.integers(1, 512))
    h, w = draw(st.integers(1, 224)), draw(st.integers(1, 224))
    if n * c * h * w > cap:  # shrink the largest axis until the case fits the budget
        scale = (cap / (n * c * h * w)) ** 0.25
        n, c, h, w = (max(1, int(v * scale)) for v in (n, c, h, w))
    k = draw(st.integers(1, max(1, min(h, w, 5))))
    s = draw(st.integers(1, 3))
    p = draw(st.integers(0, k // 2))
    op = draw(st.sampled_from(["conv", "convT", "max", "avg", "pad", "cat"]))
    oc = draw(st.integers(1, 8))
    return op, (n, c, h, w), k, s, p, oc

@settings(max_examples=int(sys.argv[3]), deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(case())
def check(case):
    op, shape, k, s, p, oc = case
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((oc, shape[1], k, k)).astype(np.float32) / k
    wt = rng.standard_normal((shape[1], oc, k, k)).astype(np.float32) / k
    fns = {
        "conv": lambda M, x: M.conv2d(x, M_w, stride=s, padding=p),
        "convT": lambda M, x: M.conv_transpose2d(x, M_wt, stride=s, padding=min(p, k - 1)),
        "max": lambda M, x: M.max_pool2d(x, k, s, p),
        "avg": lambda M, x: M.avg_pool2d(x, k, s, p),
        "pad": lambda M, x: M.pad(x, (p, k, s, p)),
        "cat": lambda M, x: M.cat([x, x * 2], 1) if M is F else torch.cat([x, x * 2], 1),
    }
    results = []
    for M, wrap in ((F, lambda a: ggrad.tensor(a, requires_grad=True)),
                    (torch.nn.functional, lambda a: torch.tensor(a, requires_grad=True))):
        global M_w, M_wt
        M_w, M_wt = wrap(w), wrap(wt)
        xt = wrap(x)
        try:
            with (ggrad.grad_tape() if M is F else contextlib.nullcontext()):
                y = fns[op](M, xt)
                (y * y).sum().backward()
        except (ValueError, RuntimeError) as error:  # both refuse, or neither
            results.append(type(error))
            continue
        results.append((np.asarray(y.detach().numpy()), np.asarray(xt.grad.numpy())))
    if isinstance(results[0], type) or isinstance(results[1], type):
        assert isinstance(results[0], type) and isinstance(results[1], type), (case, results)
        return
    (y, gx), (ty, tgx) = results
    scale = max(1.0, float(np.abs(ty).max()))
    np.testing.assert_allclose(y, ty, rtol=1e-4, atol=1e-4 * scale, err_msg=str(case))
    np.testing.assert_allclose(gx, tgx, rtol=1e-3, atol=1e-3 * scale * scale, err_msg=str(case))

check()
print("ok")
"""


@pytest.mark.parametrize("name", ["cpu", "vulkan:0", "cuda:0"])
def test_fuzz_conv_pool_pad_cat_shapes(name):
    """Shapes of real networks (batch <= 512, channels <= 512, images <= 224), scaled to a
    budget of elements per device, each case forward and backward against torch, in a
    child process: a launch failure there fails the test instead of ending pytest."""
    if name not in AVAILABLE:
        pytest.skip(f"no {name} device")
    budget, examples = {"cpu": (1 << 16, 40), "vulkan:0": (1 << 16, 25), "cuda:0": (1 << 26, 60)}[name]
    assert run_in_child(_FUZZ_CHILD, name, str(budget), str(examples), timeout=900).strip().endswith("ok")


def test_row_counts_past_the_grid_compute_what_numpy_does(dev):
    """The split forms, run: a gather from a table of 70,000 rows (its gradient sums rows
    into the table in blocks on CUDA), a column broadcast over 70,000 rows (its gradient
    sums rows instead of REPEAT_BACK) and a slice of 70,000 rows (its gradient pads)."""
    rng = np.random.default_rng(1)
    rows = 70_000
    table = rng.standard_normal((rows, 4)).astype(np.float32)
    index = np.concatenate([rng.integers(0, rows, 500), [0, rows - 1, 65_535, 65_534, 65_536]])
    x = rng.standard_normal((rows, 3)).astype(np.float32)
    column = rng.standard_normal((rows, 1)).astype(np.float32)
    t, c, xs = (ggrad.tensor(a, requires_grad=True) for a in (table, column, x))
    with ggrad.grad_tape():
        picked = F.embedding(ggrad.tensor(index), t)
        (picked * picked).sum().backward()
        (xs * c + xs[:, 1:].sum()).sum().backward()
    want = np.zeros_like(table)
    np.add.at(want, index, 2 * table[index])
    np.testing.assert_allclose(t.grad.numpy(), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(c.grad.numpy(), x.sum(1, keepdims=True), rtol=1e-5, atol=1e-5)
    want_x = np.broadcast_to(column, x.shape) + np.array([0, 1, 1], np.float32) * x.size  # the sum, added to each
    np.testing.assert_allclose(xs.grad.numpy(), want_x, rtol=1e-6)
