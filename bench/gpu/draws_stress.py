"""Ten random draws before one read, in fresh processes (each with its own random seed):
each draw reads the device generator's state, which the next advances in place, so a graph
left running that the next one does not wait for would repeat a draw. 2 of 253 processes
on lavapipe repeated one with Vulkan's graphs left running (2026-12-06), and 1 of 300 with
kernel set 56's barrier: the generator's own step, which from 4 of the 1000 seeds repeated
a state within ten draws (ops.RAND_STEP replaced it). A repeat now would be an ordering fault.

    python bench/gpu/draws_stress.py --device vulkan --rounds 300
"""

from __future__ import annotations

import argparse
import subprocess
import sys

CHILD = """
import sys, numpy as np, ggrad, ggrad.functional as F
from ggrad.runtime import kernels, streams
ggrad.set_device(sys.argv[1])
backend = ggrad.runtime.current().backend
x = ggrad.tensor(np.ones((4, 4), np.float32))
draws = [F.rand_like(x) for _ in range(10)]
values = np.stack([d.numpy() for d in draws])
print(len({v.tobytes() for v in values}), backend.leaves_running, kernels.version())
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="vulkan")
    ap.add_argument("--rounds", type=int, default=100)
    args = ap.parse_args()
    repeated, note = 0, ""
    for _ in range(args.rounds):
        out = subprocess.run([sys.executable, "-c", CHILD, args.device], capture_output=True, text=True, check=True)
        distinct, left_running, kernel_set = out.stdout.split()[-3:]
        repeated += distinct != "10"
        note = f"graphs left running: {left_running}, kernel set {kernel_set}"
    print(f"{args.device}: {args.rounds} fresh processes of ten draws before one read, {repeated} with a draw "
          f"repeated ({note})")
    sys.exit(1 if repeated else 0)


if __name__ == "__main__":
    main()
