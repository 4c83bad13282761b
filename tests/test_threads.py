"""Threads training independent models share the device safely (runtime/critical.py).

Before: two threads each training their own model, or one training while another ran
inference, aborted or segfaulted on cpu and Vulkan. Each case runs in a child process
and compares every thread's result with the same work done in one thread.
"""

from conftest import assert_resident_training, run_in_child

PRELUDE = """
import sys, threading, numpy as np, ggrad, ggrad.functional as F
from ggrad import nn
from ggrad.optim import Adam
ggrad.set_device(sys.argv[1])
data = np.random.default_rng(0)
X = data.standard_normal((32, 8)).astype(np.float32)
Y = data.integers(0, 4, 32)

seeding = threading.Lock()

def make(seed):
    with seeding:  # the generator is process-wide, as torch's: seed and draw in one go
        ggrad.manual_seed(seed)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return model, Adam(model.parameters(), lr=0.01)

def train(seed, steps, compiled, out):
    model, opt = make(seed)
    def step(x, y):
        with ggrad.grad_tape():
            loss = F.cross_entropy(model(x), y)
            loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    run = ggrad.compile(step) if compiled else step
    for i in range(steps):
        loss = run(X, Y)
        if i % 10 == 0:
            loss.item()  # reads interleave with the other thread's steps
    out[seed] = [p.numpy() for p in model.parameters()]

def in_threads(targets):
    errors = []
    def guarded(fn, *args):
        try:
            fn(*args)
        except BaseException as err:
            errors.append(repr(err))
    threads = [threading.Thread(target=guarded, args=t) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors
"""


def test_two_threads_train_their_own_models(dev):
    out = run_in_child(PRELUDE + """
for compiled in (False, True):
    alone, together = {}, {}
    for seed in (1, 2):
        train(seed, 40, compiled, alone)
    errors = in_threads([(train, seed, 40, compiled, together) for seed in (1, 2)])
    same = all(np.allclose(a, b, rtol=1e-5, atol=1e-6) for seed in (1, 2)
               for a, b in zip(alone[seed], together[seed]))
    print("compiled" if compiled else "eager", errors, same)
""", dev)
    assert "eager [] True" in out and "compiled [] True" in out, out


def test_one_thread_trains_while_another_infers(dev):
    out = run_in_child(PRELUDE + """
frozen, _ = make(7)
with ggrad.no_grad():
    expected = frozen(ggrad.tensor(X)).numpy()
mismatches = []

def infer(_):
    for _ in range(60):
        got = frozen(ggrad.tensor(X)).numpy()
        if not np.allclose(got, expected, rtol=1e-5, atol=1e-6):
            mismatches.append(float(np.abs(got - expected).max()))

trained = {}
errors = in_threads([(train, 3, 60, False, trained), (infer, None)])
alone = {}
train(3, 60, False, alone)
print("errors", errors, "mismatches", mismatches,
      "same", all(np.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(alone[3], trained[3])))
""", dev)
    assert "errors [] mismatches [] same True" in out, out


def test_a_grad_tape_in_one_thread_keeps_another_threads_pass(dev):
    """Each thread has its own pass pool: entering a tape resets only the caller's."""
    out = run_in_child(PRELUDE + """
W = ggrad.param(np.ones((2, 2), np.float32))
inside = threading.Event(); reset = threading.Event(); result = {}

def hold_a_pass():
    with ggrad.grad_tape():
        mid = W * 3.0
        mid.numpy()  # realized into this thread's pass pool
        inside.set(); reset.wait()
        result["value"] = (mid * 1.0).numpy().tolist()

def enter_a_tape():
    inside.wait()
    with ggrad.grad_tape():
        (W * 2.0).sum().numpy()
    reset.set()

print(in_threads([(hold_a_pass,), (enter_a_tape,)]), result)
""", dev)
    assert "[] {'value': [[3.0, 3.0], [3.0, 3.0]]}" in out, out


def test_compile_message_when_nothing_nests():
    """Two threads tracing compiled functions at once: neither is told it nested."""
    out = run_in_child(PRELUDE + """
started = threading.Barrier(2)
def trace(seed, out):
    model, opt = make(seed)
    first = [True]
    @ggrad.compile
    def step(x):
        if first[0]:  # both threads trace at once
            first[0] = False
            started.wait()
        with ggrad.grad_tape():
            loss = model(x).sum()
            loss.backward()
        opt.step(); opt.zero_grad()
        return loss
    for _ in range(3):
        step(X)
    out[seed] = step.captured
counts = {}
print(in_threads([(trace, 1, counts), (trace, 2, counts)]), sorted(counts.items()))
""", "cpu")
    assert "[] [(1, 1), (2, 1)]" in out, out


def test_a_traced_graph_leaves_the_reuse_cache_before_its_capture_is_built(dev, monkeypatch):
    """Between a traced call's last graph and its capture, another thread's call of the same
    shape took that graph from the device's reuse cache and bound it to its own buffers:
    both captures then ran one graph (two threads' compiled models trained wrong, now and
    then). The trace takes its graphs out of the cache as it records them."""
    import numpy as np
    import ggrad
    from ggrad import capture, nn
    seen = []
    build = capture._Capture.__init__

    def checked(self, trace, *args):
        seen.extend(run.dev.cached_graph(run.key) is run.graph for run in trace.graphs())
        build(self, trace, *args)
    monkeypatch.setattr(capture._Capture, "__init__", checked)
    model = nn.Sequential(nn.Linear(8, 4))
    x = ggrad.tensor(np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32))
    assert_resident_training(model, model.parameters(), x, ggrad.tensor(np.arange(4)))
    assert seen and not any(seen)


def _lock_held_in(monkeypatch, name: str) -> list:
    """Whether the ggml lock (runtime/critical.py) was held at each call of ggml's `name`."""
    from ggml import ggml as G
    from ggrad.runtime import critical
    held = []
    real = getattr(G, name)
    monkeypatch.setattr(G, name, lambda *args: (held.append(critical.lock._is_owned()), real(*args))[1])
    return held


def test_waiting_for_the_device_holds_the_ggml_lock(dev, monkeypatch):
    """A wait for queued graphs (streams.settle) runs under the ggml lock: ggml-vulkan's
    synchronize beside another thread's compute hung two threads training on lavapipe."""
    import ggrad
    from ggrad.runtime import streams
    held = _lock_held_in(monkeypatch, "ggml_backend_synchronize")
    backend = ggrad.runtime.current().backend
    monkeypatch.setattr(streams, "_queued", {id(backend): backend.handle})
    streams.settle()
    assert held == [True]


def test_freeing_a_graph_holds_the_ggml_lock(dev, monkeypatch):
    """A graph is freed under the ggml lock (its scratch buffers go back to the backend):
    a thread dropping its compiled steps' graphs did so beside another thread's compute."""
    import numpy as np
    import ggrad
    x = ggrad.tensor(np.ones(4, np.float32)) * 2.0
    ggrad.realize(x)
    _, kept = ggrad.runtime.current().graphs.popitem()
    held = _lock_held_in(monkeypatch, "ggml_free")
    kept.free()
    assert held and all(held)
