"""Indices computed on the device are range-checked where they are (checks.py).

Before: cross_entropy with device-computed class indices out of range aborted the process
on the CPU (GGML_ASSERT in get_rows) and returned a finite wrong loss on Vulkan. Each case
runs in a child process (a regression would abort it, not pytest) and asserts IndexError,
the right values for in-range indices, and that the process went on working.
"""

from conftest import run_in_child

PRELUDE = """
import sys, numpy as np, ggrad, ggrad.functional as F
ggrad.set_device(sys.argv[1])
rng = np.random.default_rng(0)

def device_ints(values, dtype=np.int32):
    return F.cast(ggrad.tensor(np.asarray(values, np.float32)), dtype)  # computed on the device

def expect_index_error(fn, label):
    try:
        fn()
    except IndexError as err:
        print(label, "IndexError", "out of range" in str(err))
    else:
        print(label, "no error")
"""


def test_gathers_of_device_indices_raise_index_error(dev):
    out = run_in_child(PRELUDE + """
logits_host = rng.standard_normal((2, 3)).astype(np.float32)
logits = ggrad.tensor(logits_host)
expect_index_error(lambda: F.cross_entropy(logits, device_ints([0, 9])).item(), "cross_entropy")
expect_index_error(lambda: F.cross_entropy(logits, device_ints([-1, 0])).item(), "cross_entropy negative")
W_host = np.arange(12, dtype=np.float32).reshape(4, 3)
W = ggrad.tensor(W_host)
expect_index_error(lambda: F.embedding(device_ints([1, 4]), W).numpy(), "embedding")
expect_index_error(lambda: F.embedding(device_ints([-1]), W).numpy(), "embedding negative")
expect_index_error(lambda: F.one_hot(device_ints([3]), 3).numpy(), "one_hot")
expect_index_error(lambda: F.one_hot(device_ints([0, 2000]), 1500).numpy(), "one_hot large")
expect_index_error(lambda: W[device_ints([0, 4], ggrad.int64)].numpy(), "getitem")
expect_index_error(lambda: W[device_ints([-5], ggrad.int64)].numpy(), "getitem negative")
# the error is raised once, by the next read of anything
bad = F.embedding(device_ints([7]), W)
expect_index_error(lambda: ggrad.tensor([1.0]).numpy(), "unrelated read")
print("then", float(ggrad.tensor([2.0]).item()))
# in range: the same values as host indices (negative ones count from the end in x[idx])
ref = -np.log(np.exp(logits_host) / np.exp(logits_host).sum(1, keepdims=True))[[0, 1], [2, 0]].mean()
print("ce", abs(F.cross_entropy(logits, device_ints([2, 0])).item() - ref) < 1e-5)
print("getitem", np.array_equal(W[device_ints([-1, 0, 2], ggrad.int64)].numpy(), W_host[[-1, 0, 2]]))
print("one_hot", np.array_equal(F.one_hot(device_ints([0, 1499]), 1500).numpy(), np.eye(1500)[[0, 1499]]))
""", dev)
    lines = out.splitlines()
    for label in ("cross_entropy", "cross_entropy negative", "embedding", "embedding negative", "one_hot",
                  "one_hot large", "getitem", "getitem negative", "unrelated read"):
        assert f"{label} IndexError True" in lines, out
    assert "then 2.0" in lines and "ce True" in lines and "getitem True" in lines and "one_hot True" in lines, out


def test_gradient_through_device_indices_equals_host_indices(dev):
    out = run_in_child(PRELUDE + """
ids = np.array([[0, 3], [3, 1]])
grads = []
for index in (ggrad.tensor(ids), device_ints(ids)):
    W = ggrad.param(np.arange(12, dtype=np.float32).reshape(4, 3))
    with ggrad.grad_tape():
        (F.embedding(index, W) * ggrad.tensor(np.arange(12, dtype=np.float32).reshape(2, 2, 3))).sum().backward()
    grads.append(W.grad.numpy())
ref = np.zeros((4, 3), np.float32)
np.add.at(ref, ids.reshape(-1), np.arange(12, dtype=np.float32).reshape(4, 3))
print("equal", np.array_equal(grads[0], ref), np.array_equal(grads[1], ref))
""", dev)
    assert "equal True True" in out, out


def test_compiled_step_checks_every_batch(dev):
    """Label tensors given to a compiled step: host labels are checked on the host at every
    call; device-computed ones on the device, raising at the next read. A step with
    in-range device labels crosses nothing."""
    out = run_in_child(PRELUDE + """
from ggrad import nn
from ggrad.optim import SGD
model = nn.Linear(4, 3)
opt = SGD(model.parameters(), lr=0.1)

@ggrad.compile
def step(x, y):
    with ggrad.grad_tape():
        loss = F.cross_entropy(model(x), y)
        loss.backward()
    opt.step()
    opt.zero_grad()
    return loss

x = rng.standard_normal((2, 4)).astype(np.float32)
for _ in range(3):
    step(x, np.array([0, 2]))
expect_index_error(lambda: step(x, np.array([0, 3])), "host labels")
labels = device_ints([1, 2])
for _ in range(3):
    loss = step(x, labels)
with ggrad.count_transfers() as t:
    loss = step(x, device_ints([2, 1]))
print("crossings", t.crossings - t.uploads, "dispatches", t.dispatches >= 1)
print("finite", np.isfinite(loss.item()))
bad = step(x, device_ints([9, 0]))
expect_index_error(lambda: bad.item(), "device labels")
print("after", np.isfinite(step(x, np.array([1, 1])).item()))
""", dev)
    lines = out.splitlines()
    assert "host labels IndexError True" in lines and "device labels IndexError True" in lines, out
    assert "crossings 0 dispatches True" in lines and "finite True" in lines and "after True" in lines, out
