"""What N hosts would give data-parallel training of mlp-large and the transformer block.

This machine has one host and no network, so a multi-host run is modelled (issue 14): a
ring allreduce fed with the allreduce cost measured here, and one-rank step times measured
here (cpu) or recorded in docs/performance.md (H200).

    .venv/bin/python bench/ddp_model.py --out runs/ddp_model.json

1. The allreduce: the script re-runs itself under `mpiexec -n 2` (pip's mpich, beside this
   Python, one ggml thread per rank) and times, per buffer size, `ggrad.distributed.
   all_reduce(t, op="mean")` on a float32 ggrad Tensor on the cpu device (what each DDP
   bucket does: download, MPI Allreduce, upload; here the staging is memcpy) and mpi4py's
   `Allreduce` on numpy arrays (no staging). Each, and the staging (their difference), is
   fitted to t(bytes) = alpha + bytes/beta.
2. The one-rank step: `ggrad.compile`d Adam step of train_step.py's models and per-rank
   batches on the cpu device, all cores, median of blocks (few steps: they take seconds).
3. The projection for N hosts: comm = buckets x 2(N-1) x latency + 2(N-1)/N x bytes / busbw
   (busbw as nccl-tests defines it), over this machine's MPI and stated link classes. On
   ggrad's MPI path (cpu hosts) comm adds the staging measured here; H200 hosts are taken
   device-direct (NCCL's path), host-staged (adding at least 2 x bytes over PCIe), and with
   PyTorch's step time. Two bounds: no overlap (step = compute + comm: what ggrad's DDP does,
   it averages after the backward) and perfect overlap (step = max(compute, comm)).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

import numpy as np

import train_step as T  # beside this script: its models, batches and timing

HOSTS = (1, 2, 4, 8, 16, 32)

# Link classes: (busbw in bytes/s, latency per ring step in s, hosts it can span, source).
# Per-step latencies are NCCL's own model (NVIDIA/nccl src/graph/tuning.cc at 01afd20,
# hwLat, Ring/Simple: 9.6 us over the network, used for every network link here; 3.4 us over
# NVLink); the bus bandwidths are what NCCL's maintainers give as reachable in its issue
# threads: 12 GB/s per 100 Gb/s NIC (NVIDIA/nccl-tests#119, #29),
# 48-49 GB/s per 400 Gb/s NDR CX-7 NIC (NVIDIA/nccl-tests#267), ~370 GB/s ring busbw over
# H100 NVLink 4 (450 GB/s line rate; NVLink SHARP reaches ~480 GB/s; NVIDIA/nccl-tests#212);
# the H200 has the same NVLink 4. 25 GbE is its 3.125 GB/s line rate at the 100 Gb/s NIC's
# 96%. One NIC per host; NVLink joins at most the 8 GPUs of one node.
LINKS = {
    "25 GbE": (3.0e9, 9.6e-6, 32, "25 Gb/s line rate x 0.96 (as NCCL on 100 Gb/s)"),
    "100 Gb/s IB/RoCE": (12.0e9, 9.6e-6, 32, "NVIDIA/nccl-tests#119: 12 GB/s per 100G NIC"),
    "400 Gb/s NDR": (48.0e9, 9.6e-6, 32, "NVIDIA/nccl-tests#267: 48-49 GB/s per NDR NIC"),
    "NVLink 4 (one node)": (370e9, 3.4e-6, 8, "NVIDIA/nccl-tests#212: ~370 GB/s ring busbw on H100"),
}

# PCIe 5.0 x16 per direction, nominal: a host-staged allreduce downloads and uploads every
# gradient byte through it, so 2 x bytes / this is a lower bound on its staging.
PCIE_BYTES_S = 64e9

# One-GPU step times recorded in docs/performance.md, "Targets as measured (H200)" (issue
# 13): ggrad compiled, PyTorch's CUDA graph in the same run, seconds.
H200 = {
    "mlp-large": {"row": "mlp-large, ggrad \"high\" (TF32) vs PyTorch CUDA graph TF32",
                  "ggrad": 2.261e-3, "torch_cuda_graph": 0.725e-3},
    "block": {"row": "transformer block 32x256x512, bf16, vs PyTorch CUDA graph bf16",
              "ggrad": 30.84e-3, "torch_cuda_graph": 1.065e-3},
}


def timed_allreduce(sizes: list[int], repeats: int, out: str) -> None:
    """The mpiexec worker: per size, the median over repeats of the slowest rank's seconds
    per call, for mpi4py on numpy and for ggrad's staged all_reduce; rank 0 writes JSON.
    Each repeat sweeps every size and both paths, so that a burst of load from the other
    work on this machine lands on one sample of many sizes, not on all samples of one."""
    import ggrad
    from ggrad import distributed as dist

    dist.init_process_group()
    ggrad.set_device("cpu")
    comm, MPI = dist.group.comm(), dist.group.mpi()

    def paths(n: int) -> dict:
        host, result, tensor = np.ones(n, np.float32), np.empty(n, np.float32), ggrad.tensor(np.ones(n, np.float32))

        def raw() -> None:
            comm.Allreduce(host, result, op=MPI.SUM)

        def staged() -> None:
            dist.all_reduce(tensor, op="mean")  # DDP's call; the mean of ones stays ones
            ggrad.realize(tensor)  # the upload runs now, not at the next read
        return {"mpi4py": raw, "ggrad": staged}

    calls = {nbytes: paths(nbytes // 4) for nbytes in sizes}
    iters = {nbytes: min(200, max(2, 2 ** 25 // nbytes)) for nbytes in sizes}
    times: dict = {(nbytes, label): [] for nbytes in sizes for label in ("mpi4py", "ggrad")}
    for repeat in range(repeats + 1):  # the first sweep warms up (first-touch pages, MPI's buffers)
        for nbytes in sizes:
            for label, call in calls[nbytes].items():
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(iters[nbytes] if repeat else 1):
                    call()
                elapsed = comm.allreduce((time.perf_counter() - t0) / iters[nbytes], op=MPI.MAX)
                if repeat:
                    times[(nbytes, label)].append(elapsed)
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump([{"bytes": b, "iters": iters[b], **{label: statistics.median(times[(b, label)])
                                                           for label in ("mpi4py", "ggrad")}} for b in sizes], f)


def measure_allreduce(sizes: list[int], repeats: int) -> list[dict]:
    """Run timed_allreduce under `mpiexec -n 2`, the cores shared between the ranks."""
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    threads = str(max(1, (os.cpu_count() or 1) // 2))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "allreduce.json")
        subprocess.run([mpiexec, "-n", "2", sys.executable, os.path.abspath(__file__), "--allreduce-worker", out,
                        "--repeats", str(repeats), "--sizes", *map(str, sizes)],
                       check=True, timeout=1200, env={**os.environ, "GGRAD_NUM_THREADS": threads})
        with open(out) as f:
            return json.load(f)


def fit(nbytes: np.ndarray, seconds: np.ndarray) -> dict:
    """alpha (s) and beta (bytes/s) of t = alpha + bytes/beta, each from its own regime (one
    line misses both: buffers that fit in cache move faster than DDP's buckets of MiBs):
    alpha the intercept of a line through the small sizes (<= 64 KiB), beta from the slope
    through the large ones (>= 8 MiB: past the caches, where the buckets of the two models
    are); and the fit's worst relative miss over the large ones."""
    large, small = nbytes >= 2 ** 23, nbytes <= 2 ** 16
    beta = 1 / np.polyfit(nbytes[large], seconds[large], 1)[0]
    alpha = max(0.0, float(np.polyfit(nbytes[small], seconds[small], 1)[1]))
    worst = np.max(np.abs(alpha + nbytes[large] / beta - seconds[large]) / seconds[large])
    return {"alpha_s": alpha, "beta_bytes_s": float(beta), "max_rel_miss_large": float(worst)}


def model_facts(name: str) -> dict:
    """Gradient bytes (float32, one per parameter) and the number of DDP buckets (each one
    collective: its own latency) for train_step.py's model `name`."""
    from ggrad import nn
    from ggrad.distributed import DistributedDataParallel

    params = list(T.MODELS[name][0](nn).parameters())
    default_mb = inspect.signature(DistributedDataParallel).parameters["bucket_mb"].default
    # DDP's own bucketing rule, without a process group to wrap the model in
    buckets = DistributedDataParallel._buckets(SimpleNamespace(bucket_bytes=int(default_mb * 2 ** 20)), params)
    return {"params": sum(p.numel() for p in params), "grad_bytes": 4 * sum(p.numel() for p in params),
            "buckets": len(buckets), "bucket_mb": default_mb}


def cpu_step(name: str, steps: int, blocks: int, warmup: int) -> float:
    """Median seconds of one compiled Adam step of train_step.py's `name` (its per-rank
    batch) on the cpu device with all cores: what one CPU host computes per step."""
    _, sample, classes, batch = T.MODELS[name]
    data = T.batches(sample, classes, batch, n=4 if name == "block" else 8)
    runner = T.ggrad_step_fn(name, data, "cpu", True, True, "none", resident=name == "block")
    return T.time_interleaved({name: runner}, steps, blocks, warmup)[name]


def ring_seconds(n: int, grad_bytes: int, buckets: int, busbw: float, latency: float) -> float:
    """Ring allreduce of the gradients over n ranks: 2(n-1)/n of the bytes through each
    rank's link, 2(n-1) latency-bound steps per bucket; one rank moves nothing."""
    return 0.0 if n == 1 else buckets * 2 * (n - 1) * latency + 2 * (n - 1) / n * grad_bytes / busbw


def project(compute: float, batch: int, comm: dict[int, float]) -> dict:
    """samples/s and efficiency (per-host samples/s against one host's) for both bounds."""
    rows = {}
    for n, c in comm.items():
        no, ov = compute + c, max(compute, c)
        rows[n] = {"comm_s": c, "step_no_overlap_s": no, "step_overlap_s": ov,
                   "samples_s_no_overlap": n * batch / no, "samples_s_overlap": n * batch / ov,
                   "eff_no_overlap": compute / no, "eff_overlap": compute / ov}
    return rows


def short(v: float) -> str:
    """Three significant digits, thousands separated."""
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--out", default="runs/ddp_model.json", help="where the results go as JSON")
    ap.add_argument("--sizes", type=int, nargs="+", default=[2 ** k for k in range(12, 28)],
                    help="allreduce buffer sizes in bytes (default 4 KiB .. 128 MiB, powers of 2)")
    ap.add_argument("--repeats", type=int, default=9, help="timed repeats per size (median)")
    ap.add_argument("--models", nargs="+", default=["mlp-large", "block"], choices=list(H200))
    ap.add_argument("--steps", type=int, default=1, help="cpu steps per timed block (a step takes seconds)")
    ap.add_argument("--blocks", type=int, default=5, help="timed blocks per model (median)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed cpu steps first")
    ap.add_argument("--allreduce-worker", metavar="JSON", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if sum(b <= 2 ** 16 for b in args.sizes) < 2 or sum(b >= 2 ** 23 for b in args.sizes) < 2:
        ap.error("--sizes needs two sizes <= 64 KiB (for alpha) and two >= 8 MiB (for beta)")
    if args.allreduce_worker:
        timed_allreduce(args.sizes, args.repeats, args.allreduce_worker)
        return

    import torch  # noqa: F401  (train_step loads torch's initial weights; torch before ggml)

    load_before = os.getloadavg()[0]
    measured = measure_allreduce(args.sizes, args.repeats)
    nbytes = np.array([r["bytes"] for r in measured], float)
    series = {label: np.array([r[label] for r in measured]) for label in ("mpi4py", "ggrad")}
    series["staging"] = series["ggrad"] - series["mpi4py"]  # download, the mean's division, upload
    fits = {label: fit(nbytes, t) for label, t in series.items()}

    print(f"ddp_model: {os.cpu_count()} CPUs, mpiexec -n 2 (one host, MPI over shared memory), median of "
          f"{args.repeats}; 1-minute load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after\n")
    print("| bytes | mpi4py Allreduce us | ggrad all_reduce us | staging us | ggrad GB/s |")
    print("| --- | --- | --- | --- | --- |")
    for r, s in zip(measured, series["staging"]):
        print(f"| {r['bytes']:,} | {r['mpi4py'] * 1e6:.1f} | {r['ggrad'] * 1e6:.1f} | {s * 1e6:.1f} | "
              f"{r['bytes'] / r['ggrad'] / 1e9:.2f} |")
    print("\n| path | alpha us | beta GB/s | fit's worst miss >= 8 MiB |\n| --- | --- | --- | --- |")
    for label, f in fits.items():
        print(f"| {label} | {f['alpha_s'] * 1e6:.1f} | {f['beta_bytes_s'] / 1e9:.2f} | {f['max_rel_miss_large']:.0%} |")
    print()

    # Two ranks on one link: bytes/busbw + 2 latencies = alpha + bytes/beta.
    here = (fits["mpi4py"]["beta_bytes_s"], fits["mpi4py"]["alpha_s"] / 2, 32, "measured here (mpiexec -n 2)")
    stage = fits["staging"]
    results = {"cpus": os.cpu_count(), "load_average_before": load_before, "allreduce": measured, "fits": fits,
               "links": {k: list(v) for k, v in LINKS.items()}, "hosts": list(HOSTS), "models": {}}
    print("| model | compute (one rank) | link | " + " | ".join(f"N={n}" for n in HOSTS[1:]) + " |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in HOSTS[1:]) + " |")
    cpu_links = {"this machine's MPI": here, **{k: v for k, v in LINKS.items() if "NVLink" not in k}}
    for name in args.models:
        batch = T.MODELS[name][3]
        facts = model_facts(name)
        grad, buckets = facts["grad_bytes"], facts["buckets"]
        staged = buckets * stage["alpha_s"] + grad / stage["beta_bytes_s"]  # per step, any N > 1
        cpu = cpu_step(name, args.steps, args.blocks, args.warmup)
        pcie = 2 * grad / PCIE_BYTES_S  # the least a host-staged GPU step adds: download and upload
        computes = {"cpu here, ggrad MPI (host-staged)": (cpu, staged, cpu_links),
                    "H200 ggrad, device-direct (NCCL)": (H200[name]["ggrad"], 0.0, LINKS),
                    "H200 ggrad, host-staged at PCIe line rate": (H200[name]["ggrad"], pcie, LINKS),
                    "H200 PyTorch CUDA graph, NCCL": (H200[name]["torch_cuda_graph"], 0.0, LINKS)}
        entry = {**facts, "batch_per_rank": batch, "cpu_step_s": cpu, "cpu_staging_s": staged, "pcie_staging_s": pcie,
                 "h200_row": H200[name]["row"], "projections": {}}
        for label, (compute, extra, links) in computes.items():
            for link, (busbw, latency, span, _) in links.items():
                comm = {n: (extra if n > 1 else 0.0) + ring_seconds(n, grad, buckets, busbw, latency)
                        for n in HOSTS if n <= span}
                rows = project(compute, batch, comm)
                entry["projections"][f"{label} | {link}"] = rows
                cells = [f"{rows[n]['eff_no_overlap']:.0%} / {rows[n]['eff_overlap']:.0%}" if n in rows else "-"
                         for n in HOSTS[1:]]
                print(f"| {name} | {label}: {short(compute * 1e3)} ms, {short(batch / compute)} samples/s | {link} | "
                      + " | ".join(cells) + " |", flush=True)
        results["models"][name] = entry
    print("\ncells: scaling efficiency, no overlap / perfect overlap (samples/s = efficiency x N x one rank's).")
    for name, e in results["models"].items():
        print(f"- {name}: {e['params']:,} parameters, {e['grad_bytes'] / 2 ** 20:.1f} MiB of float32 gradients in "
              f"{e['buckets']} DDP bucket(s) of {e['bucket_mb']:g} MiB; per-rank batch {e['batch_per_rank']}; cpu step "
              f"{e['cpu_step_s'] * 1e3:.0f} ms, host staging {e['cpu_staging_s'] * 1e3:.1f} ms per step; "
              f"H200 row: {e['h200_row']}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
