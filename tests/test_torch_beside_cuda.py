"""PyTorch imported after ggrad, in a process that trains on ggml's CUDA backend (issue 11).

With ggml-python's CUDA build, `import ggrad; import torch` aborted the process
(`free(): invalid pointer`, exit 134) before any device was used: ggml's libraries carried
and exported their own copy of libstdc++ (scripts/build_cuda.sh now builds them with a
version script). One child process runs just that import order; another runs it around one
Adam step on CUDA, torch's own CUDA work, then ggrad again.
Skipped where this ggml build has no CUDA device (CI) or torch is missing or has no CUDA;
those checks import nothing of torch into this process.
"""

import importlib.util
import os
import subprocess
import sys
import textwrap

import ggml
import pytest

import ggrad

IMPORT_ONLY = "import numpy, ggrad, torch; print('torch beside ggml CUDA: ok', flush=True)"

CHILD = textwrap.dedent("""
    import numpy as np
    import ggrad
    ggrad.set_device("cuda")
    W = ggrad.param(np.ones((4, 4), np.float32))
    x = ggrad.tensor(np.arange(16, dtype=np.float32).reshape(4, 4))
    opt = ggrad.optim.Adam([W], lr=0.1)
    with ggrad.grad_tape():
        loss = ggrad.matmul(W, x).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    first = W.numpy()
    assert np.all(np.isfinite(first)) and np.allclose(first, 0.9, atol=1e-4), first
    import torch
    assert torch.ones(2, device="cuda").sum().item() == 2.0
    a = torch.arange(16, dtype=torch.float32, device="cuda").reshape(4, 4)
    assert float((a @ a).sum().item()) == float((a.cpu() @ a.cpu()).sum().item())
    with ggrad.grad_tape():
        loss = ggrad.matmul(W, x).sum()
    loss.backward()
    opt.step()
    assert np.all(W.numpy() < first), W.numpy()
    print("torch beside ggml CUDA: ok", flush=True)
""")


def _child_env():
    # the child must find the same ggrad and ggml as this process
    paths = [os.path.dirname(os.path.dirname(os.path.abspath(m.__file__))) for m in (ggrad, ggml)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
    return env


def _torch_has_cuda(env) -> bool:
    # torch first, in its own process: never torch after ggml in this one
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True, timeout=300, env=env)
    return probe.returncode == 0 and probe.stdout.strip().endswith("True")


def test_torch_after_ggrad_with_cuda_training():
    if not any(d.kind == "cuda" for d in ggrad.devices()):
        pytest.skip("no CUDA device in this ggml build")
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    env = _child_env()
    if not _torch_has_cuda(env):
        pytest.skip("torch has no CUDA here")
    for code in (IMPORT_ONLY, CHILD):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, (
            f"child exited {proc.returncode} (-6 or 134: aborted)\n{proc.stdout}\n{proc.stderr[-4000:]}")
        assert "torch beside ggml CUDA: ok" in proc.stdout, proc.stdout
