"""The runtime's invariants, on every device: in place, pools, handles, counted transfers."""

import numpy as np
import pytest
from ggml import ggml as G

import ggrad
from ggrad import runtime as rt


def scale(k):
    return lambda ctx, t: G.ggml_scale(ctx, t[0], k)


def test_run_op_out_writes_in_place(dev):
    a = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    h = rt.to_device(a, scope="persistent")
    ptr = h.ptr
    result = rt.run_op(scale(2.0), [h], (4, 4), out=h)
    assert result is h and h.ptr == ptr and h.live and h.scope == "persistent"
    np.testing.assert_allclose(h.numpy(), 2 * a.astype(np.float64), rtol=1e-6)


def test_run_op_new_result_lands_in_its_scope(dev):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.ones(4, dtype=np.float32)
    h = rt.to_device(a, scope="persistent")
    for scope in ("pass", "persistent"):
        out = rt.run_op(lambda ctx, t: G.ggml_add(ctx, t[0], t[1]), [h, b], (3, 4), scope=scope)
        assert out.scope == scope and out.shape == (3, 4) and out.dtype == np.float32
        np.testing.assert_array_equal(out.numpy(), a + b)
    np.testing.assert_array_equal(h.numpy(), a)  # the input was read, not written


def test_run_op_out_shape_mismatch_runs_nothing(dev):
    a = np.arange(16, dtype=np.float32).reshape(4, 4)
    h = rt.to_device(a, scope="persistent")
    with ggrad.count_transfers() as t, pytest.raises(ValueError, match="shape mismatch"):
        rt.run_op(scale(2.0), [h], (2, 8), out=h)
    assert t.dispatches == 0 and t.crossings == 0
    np.testing.assert_array_equal(h.numpy(), a)


def test_run_op_fn_result_shape_mismatch(dev):
    a = np.zeros((2, 3), dtype=np.float32)
    with ggrad.count_transfers() as t, pytest.raises(ValueError, match="shape mismatch"):
        rt.run_op(scale(1.0), [a], (3, 2))
    assert t.dispatches == 0


def test_reset_pass_kills_pass_handles_only(dev):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    scratch = rt.to_device(a)
    kept = rt.to_device(a, scope="persistent")
    assert scratch.live and scratch.scope == "pass"
    rt.reset_pass()
    assert not scratch.live and kept.live
    with pytest.raises(RuntimeError, match="pass pool .* was reset"):
        scratch.numpy()
    with pytest.raises(RuntimeError, match="reset"):
        scratch.ptr  # noqa: B018  (reading it must raise)
    np.testing.assert_array_equal(kept.numpy(), a)


def test_dead_handles_are_refused_before_anything_runs(dev):
    a = np.ones((2, 2), dtype=np.float32)
    dead = rt.to_device(a)
    live = rt.to_device(a, scope="persistent")
    rt.reset_pass()
    with ggrad.count_transfers() as t:
        with pytest.raises(RuntimeError, match="dead handle"):
            rt.run_op(scale(1.0), [dead], (2, 2))
        with pytest.raises(RuntimeError, match="dead handle"):
            rt.run_op(scale(1.0), [live], (2, 2), out=dead)
    assert t.dispatches == 0 and t.crossings == 0


def test_in_place_writes_do_not_grow_memory(dev):
    h = rt.to_device(np.ones((8, 8), dtype=np.float32), scope="persistent")
    rt.run_op(scale(1.0), [h], (8, 8), out=h)
    before = rt.memory()
    for _ in range(100):
        rt.run_op(scale(1.0), [h], (8, 8), out=h)
    assert rt.memory() == before
    np.testing.assert_array_equal(h.numpy(), np.ones((8, 8)))


def test_dropped_persistent_handles_give_their_memory_back(dev):
    rt.to_device(np.zeros((64, 64), dtype=np.float32), scope="persistent")
    before = rt.memory()["persistent_bytes"]
    for i in range(1000):  # a data loader: a fresh batch per step, the last one dropped
        batch = rt.to_device(np.full((64, 64), i, dtype=np.float32), scope="persistent")
    assert batch.numpy()[0, 0] == 999
    assert rt.memory()["persistent_bytes"] == before


def test_pass_pool_settles_after_a_pass_that_spills(dev):
    sizes = []
    for _ in range(4):
        rt.reset_pass()
        held = [rt.to_device(np.ones((1024, 1024), dtype=np.float32)) for _ in range(3)]  # 12 MiB
        sizes.append(rt.memory()["pass_bytes"])
        assert all(h.live for h in held)
    assert sizes[1] == sizes[2] == sizes[3]


def test_transfer_counts_are_exact(dev):
    a = np.ones((4, 4), dtype=np.float32)
    crossing = dev != "cpu"  # copies to host memory are not crossings
    with ggrad.count_transfers() as up:
        h = rt.to_device(a)
    with ggrad.count_transfers() as down:
        h.numpy()
    assert (up.uploads, up.bytes_up, up.crossings) == ((1, 64, 1) if crossing else (0, 0, 0))
    assert (down.downloads, down.bytes_down) == ((1, 64) if crossing else (0, 0))
    totals = rt.transfers()
    assert set(totals) >= {"uploads", "downloads", "bytes_up", "bytes_down", "dispatches"}


def test_run_op_counts_one_dispatch_and_no_crossing_for_handles(dev):
    h = rt.to_device(np.ones((4, 4), dtype=np.float32), scope="persistent")
    with ggrad.count_transfers() as t:
        rt.run_op(scale(3.0), [h], (4, 4), out=h)
    assert (t.dispatches, t.crossings) == (1, 0)


def test_unsupported_node_raises_instead_of_being_skipped():
    if "vulkan:0" not in [d.name for d in ggrad.devices()]:
        pytest.skip("no Vulkan device")
    with ggrad.device("vulkan"):
        a = np.ones((4, 4), dtype=np.float32)
        with ggrad.count_transfers() as t, pytest.raises(NotImplementedError, match="OUT_PROD"):
            rt.run_op(lambda ctx, x: G.ggml_out_prod(ctx, x[0], x[1]), [a, a], (4, 4))
        assert t.dispatches == 0


def test_release_moves_persistent_values_to_the_host():
    if "vulkan:0" not in [d.name for d in ggrad.devices()]:
        pytest.skip("no Vulkan device")
    a = np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32)
    with ggrad.device("vulkan"):
        kept = rt.to_device(a, scope="persistent")
        rt.run_op(scale(2.0), [kept], (5, 3), out=kept)
        scratch = rt.to_device(a)
    assert ggrad.get_device() == "cpu"
    assert not kept.live and not scratch.live
    with pytest.raises(RuntimeError, match="released"):
        kept.numpy()
    np.testing.assert_array_equal(kept.host_copy, 2 * a)
    assert scratch.host_copy is None
    with ggrad.device("vulkan"):  # switching back later works
        again = rt.to_device(kept.host_copy, scope="persistent")
        np.testing.assert_array_equal(again.numpy(), 2 * a)


def test_set_device_returns_previous_and_context_restores_on_error():
    assert ggrad.get_device() == "cpu"
    names = [d.name for d in ggrad.devices()]
    other = "vulkan:0" if "vulkan:0" in names else "cpu"
    assert ggrad.set_device(other) == "cpu"
    assert ggrad.set_device("cpu") == other
    with pytest.raises(KeyError):
        with ggrad.device(other):
            assert ggrad.get_device() == other
            raise KeyError("boom")
    assert ggrad.get_device() == "cpu"


def test_device_names_and_errors():
    infos = {d.name: d for d in ggrad.devices()}
    assert "cpu" in infos and infos["cpu"].kind == "cpu" and not infos["cpu"].is_gpu
    assert all(d.memory_total > 0 for d in infos.values())
    with pytest.raises(ValueError, match="usable devices: .*cpu"):
        ggrad.set_device("tpu")
    with pytest.raises(TypeError):
        ggrad.set_device(3)
    lavapipe = [d for d in infos.values() if "llvmpipe" in d.description]
    assert all(not d.is_gpu for d in lavapipe)
    if not ggrad.gpu_available():
        with pytest.raises(RuntimeError, match="GPU"):
            ggrad.set_device("gpu")
        assert ggrad.get_device() == "cpu"
    else:
        assert infos[ggrad.runtime.backend.resolve("gpu")].is_gpu


def test_memory_reports_pools():
    mem = rt.memory()
    assert {"persistent_bytes", "pass_bytes"} <= set(mem)
    h = rt.to_device(np.ones(4, dtype=np.float32), scope="persistent")
    assert rt.memory()["persistent_bytes"] >= h.nbytes


def test_importing_and_starting_every_device_prints_nothing():
    """ggml's messages (the Vulkan banner) go to the "ggrad.ggml" logger, not the terminal."""
    import subprocess
    import sys
    code = ("import ggrad\n"
            "for d in ggrad.devices():\n"
            "    ggrad.set_device(d.name)\n"
            "    (ggrad.tensor([1.0, 2.0]) * 2).numpy()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == "", done.stderr
    shown = subprocess.run([sys.executable, "-m", "ggrad", "info"], capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0 and "devices:" in shown.stdout
    # each device's line of ggrad's kernels it runs: the cross-entropy kernel everywhere (set 2)
    from ggrad.runtime import kernels
    listed = [line for line in shown.stdout.splitlines() if "ggrad's kernels:" in line]
    assert len(listed) == len(ggrad.devices()), shown.stdout
    assert kernels.version() < 2 or all("CLASS_CROSS_ENTROPY" in line for line in listed), shown.stdout


def test_cpu_computes_a_large_tensor_where_its_copy_lies():
    """On the CPU, a tensor's own copy of a large array is its buffer (no second copy, no
    pool block). It is still a copy of the caller's array, in-place updates keep its
    address, and releasing the device moves its value to the next one."""
    a = np.random.default_rng(2).standard_normal((256, 256)).astype(np.float32)
    want = a.copy()
    with ggrad.device("cpu"):
        t = ggrad.tensor(a)
        pool = rt.current().persistent
        used, size = pool.used, pool.nbytes
        ptr = t.handle.ptr
        assert (pool.used, pool.nbytes) == (used, size) and ptr % 32 == 0
        a[:] = 0  # the caller's array is not the tensor's
        np.testing.assert_array_equal(t.numpy(), want)
        t.mul_(2.0)
        assert t.handle.ptr == ptr
        np.testing.assert_array_equal(t.numpy(), 2 * want)
    if "vulkan:0" in [d.name for d in ggrad.devices()]:
        with ggrad.device("vulkan"):  # the CPU is released: its values move
            np.testing.assert_array_equal((t + 1).numpy(), 2 * want + np.float32(1))
        np.testing.assert_array_equal(t.numpy(), 2 * want)


def _adam_steps(x_batches, y_batches) -> tuple[list[float], list[np.ndarray]]:
    """Losses (read after each step) and final weights of a compiled MLP step over host batches."""
    from ggrad import nn
    from ggrad.optim import Adam
    ggrad.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = Adam(model.parameters(), lr=1e-2)

    @ggrad.compile
    def step(x, y):
        with ggrad.grad_tape():
            loss = ggrad.functional.cross_entropy(model(x), y)
            loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    losses = [float(step(x, y).item()) for x, y in zip(x_batches, y_batches)]
    for x, y in zip(x_batches, y_batches):  # queued back to back: nothing read in between
        step(x, y)
    return losses, [p.numpy() for p in model.parameters()]


def test_queued_graphs_finish_before_the_host_touches_their_memory(dev, monkeypatch):
    """A graph left running (CUDA's, streams.py) is waited for by every download and
    synchronize, and the next batch is queued behind it: the same device asked to queue its
    graphs gives the synchronous answers bit for bit, and nothing stays queued once a value
    is read."""
    from ggrad.runtime import streams
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((5, 8)).astype(np.float32) for _ in range(4)]
    ys = [rng.integers(0, 3, 5) for _ in range(4)]
    monkeypatch.setattr(streams, "enabled", False)
    waited = _adam_steps(xs, ys)
    monkeypatch.setattr(streams, "enabled", True)
    monkeypatch.setattr(streams, "QUEUED_UPLOADS", True)
    monkeypatch.setattr(streams, "ASYNCHRONOUS_KINDS", frozenset({rt.current().backend.info.kind}))
    monkeypatch.setattr(streams, "QUEUED_UPLOAD_KINDS", frozenset({rt.current().backend.info.kind}))
    monkeypatch.setattr(rt.current().backend, "leaves_running", True)
    queued = []
    start = streams.queue
    monkeypatch.setattr(streams, "queue", lambda *a: (start(*a), queued.append(dict(streams._queued)))[0])
    behind = []
    queues_upload = streams.queues_upload
    monkeypatch.setattr(streams, "queues_upload", lambda *a: behind.append(queues_upload(*a)) or behind[-1])
    left_running = _adam_steps(xs, ys)
    assert queued and all(queued), "no graph was left running"
    assert any(behind), "no batch was queued behind a running graph"
    assert not streams._queued  # the weights' downloads waited
    assert left_running[0] == waited[0]
    for ours, theirs in zip(left_running[1], waited[1]):
        np.testing.assert_array_equal(ours, theirs)
    step = ggrad.ones(3) * 2
    ggrad.realize(step)
    assert streams._queued
    ggrad.cuda.synchronize()
    assert not streams._queued


def test_graphs_left_running_read_what_the_one_before_wrote(dev, monkeypatch):
    """Each graph left running (CUDA; Vulkan from kernel set 56) reads what the graph before
    it wrote: 300 graphs, each adding to the last one's result and each freed once queued
    (an eager op's), and random draws (each advancing the generator's state in place),
    before one read. ggml-vulkan ordered a graph after the running ones by tensors the
    earlier graphs named, freed since; set 56 puts a barrier first. A Vulkan device never
    holds more than streams.QUEUE_DEPTH graphs unwaited for (each keeps its command buffers
    until then)."""
    from ggrad.runtime import kernels, streams
    import ggrad.functional as F
    backend = rt.current().backend
    kind = backend.info.kind
    if kind == "vulkan":
        assert backend.leaves_running == (kernels.version() >= streams.LEFT_RUNNING_SINCE["vulkan"])
    left_running = streams.enabled and kind in streams.ASYNCHRONOUS_KINDS and backend.leaves_running
    depths = []
    start = streams.queue
    monkeypatch.setattr(streams, "queue", lambda *a: (start(*a), depths.append(streams._depth.get(id(a[0]), 0)))[0])
    x = ggrad.tensor(np.zeros(4096, np.float32))
    draws = []
    for i in range(300):
        x = x * 1.0 + 1.0
        ggrad.realize(x)
        if i % 30 == 0:
            draws.append(F.rand_like(x))
            ggrad.realize(draws[-1])
    assert (len(depths) > 300) == left_running, (kind, len(depths))
    if kind in streams.QUEUE_DEPTH and left_running:
        assert max(depths) == streams.QUEUE_DEPTH[kind]
    np.testing.assert_array_equal(x.numpy(), np.full(4096, 300, np.float32))
    values = [d.numpy() for d in draws]
    assert len({v.tobytes() for v in values}) == len(values)


def test_vulkan_devices_start_without_integer_dot_products(dev):
    """ggml-vulkan's integer-dot products (Q8_1-rounded activations) gave NaN gradients on
    NVIDIA GPUs after an earlier step in the process: ggrad starts Vulkan devices without
    them (unless GGRAD_VK_INTEGER_DOT=1), so a quantized product is the dequantized weight's."""
    import os
    from ggrad.runtime import backend
    if not dev.startswith("vulkan") or os.environ.get("GGRAD_VK_INTEGER_DOT") == "1":
        pytest.skip(f"{dev}: not a Vulkan device, or integer dot kept")
    assert os.environ.get("GGML_VK_DISABLE_INTEGER_DOT_PRODUCT") is not None
    assert backend.vulkan_traits(dev).get("int dot") == "0"
