"""The training loop without `fit`: tape, backward, clip, step, on the default device.

    .venv/bin/python examples/low_level_loop.py
"""

import numpy as np

import ggrad
import ggrad.functional as F
from ggrad.optim import AdamW, clip_grad_norm_
from ggrad.optim.lr_scheduler import LinearWarmupCosine


def main() -> None:
    ggrad.set_device("gpu" if ggrad.gpu_available() else "cpu")
    rng = np.random.default_rng(0)
    true_w = rng.standard_normal((8, 3))
    x_all = rng.standard_normal((512, 8)).astype(np.float32)
    y_all = (x_all @ true_w + 0.01 * rng.standard_normal((512, 3))).astype(np.float32)

    w1 = ggrad.param(rng.standard_normal((32, 8)) * 0.3)
    b1 = ggrad.param(np.zeros(32))
    w2 = ggrad.param(rng.standard_normal((3, 32)) * 0.3)
    opt = AdamW([w1, b1, w2], lr=1e-2, weight_decay=1e-4)
    sched = LinearWarmupCosine(opt, warmup_steps=20, total_steps=300)

    with ggrad.count_transfers() as counted:
        for step in range(300):
            rows = rng.integers(0, 512, 64)
            x, y = ggrad.tensor(x_all[rows]), ggrad.tensor(y_all[rows])  # uploaded on first use
            with ggrad.grad_tape():  # a new pass: the previous step's scratch is reset
                loss = F.mse_loss(F.gelu(x @ w1.T + b1) @ w2.T, y)
                loss.backward()
            norm = clip_grad_norm_([w1, b1, w2], max_norm=5.0)  # lazy: nothing read
            opt.step()  # in place, on the device
            opt.zero_grad()
            sched.step()
            if step % 100 == 0 or step == 299:  # reading a value is the only crossing
                print(f"step {step:3d}  loss {loss.item():.5f}  grad norm {norm.item():.3f}  lr {sched.get_last_lr()[0]:.2e}")
    print(f"{counted.crossings} crossings in 300 steps ({counted.uploads} batch uploads, "
          f"{counted.downloads} reads), {counted.dispatches} dispatches")


if __name__ == "__main__":
    main()
