"""A tour of ggrad's runtime: devices, pools, in-place updates, counted transfers."""

import numpy as np
from ggml import ggml as G

import ggrad
from ggrad import runtime as rt


def main() -> None:
    print("devices:")
    for d in ggrad.devices():
        print(f"  {d.name:10s} {d.kind:7s} gpu={d.is_gpu!s:5s} {d.memory_total / 2**30:6.1f} GiB  {d.description}")
    name = "gpu" if ggrad.gpu_available() else "cpu"
    ggrad.set_device(name)
    print(f"running on {ggrad.get_device()}")

    rng = np.random.default_rng(0)
    w = rt.to_device(rng.standard_normal((256, 256)).astype(np.float32), scope="persistent")
    g = rt.to_device(rng.standard_normal((256, 256)).astype(np.float32), scope="persistent")
    address, before = w.ptr, rt.memory()["persistent_bytes"]
    with ggrad.count_transfers() as t:
        for _ in range(100):  # w -= 0.01 * g, in place, as an optimizer would
            rt.run_op(lambda ctx, x: G.ggml_add(ctx, x[0], G.ggml_scale(ctx, x[1], -0.01)), [w, g],
                      w.shape, out=w)
    print(f"100 in-place updates: same address {w.ptr == address}, "
          f"persistent pool unchanged {rt.memory()['persistent_bytes'] == before}, crossings {t.crossings}, dispatches {t.dispatches}")

    rt.reset_pass()
    print(f"after reset_pass: persistent handle live={w.live}; memory {rt.memory()}")
    with ggrad.count_transfers() as t:
        value = w.numpy()
    print(f"reading the weight back: {t.crossings} crossing(s), {t.bytes_down} bytes, mean {value.mean():+.4f}")


if __name__ == "__main__":
    main()
