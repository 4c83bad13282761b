"""Data-parallel training on MPI: N processes started by mpiexec (each test starts them
and times out instead of hanging) train to the same weights as one process with the
N-times larger batch; collectives give MPI's values; a failing rank ends them all."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ggrad
from ggrad.distributed import DistributedSampler

# GGRAD_MPIEXEC: an MPI elsewhere (the GPU host's script installs pip's mpich under a prefix)
MPIEXEC = os.environ.get("GGRAD_MPIEXEC", os.path.join(os.path.dirname(sys.executable), "mpiexec"))
needs_mpi = pytest.mark.skipif(not os.path.exists(MPIEXEC), reason="no mpiexec beside this Python (pip's mpich)")


def mpirun(n: int, source: str, *args: str, timeout: float = 240, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([MPIEXEC, "-n", str(n), sys.executable, "-c", textwrap.dedent(source), *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    if check:
        assert proc.returncode == 0, f"mpiexec exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}"
    return proc


TRAIN = """
    import sys, numpy as np, ggrad, ggrad.functional as F
    from ggrad import nn, distributed as dist
    from ggrad.distributed import collectives
    from ggrad.optim import SGD, Adam
    device, optimizer, per_rank, steps, accumulate, mode, out = sys.argv[1:8]
    per_rank, steps, accumulate = int(per_rank), int(steps), int(accumulate)
    dist.init_process_group()
    ggrad.set_device(device)
    rank, size = dist.get_rank(), dist.get_world_size()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((steps * accumulate * size * per_rank, 6)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    ggrad.manual_seed(rank)  # different initial weights: DDP must broadcast rank 0's
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
    if rank == 0:
        np.savez(out + "-init.npz", *[p.numpy() for p in model.parameters()])
    ddp = dist.DistributedDataParallel(model, bucket_mb=0.0002)  # several buckets
    # "eager": accumulation by hand under no_sync; "compiled": a compiled step per micro-batch,
    # the optimizer accumulating (DDP then exchanges only before a step that applies)
    k = accumulate if mode == "compiled" else 1
    opt = (SGD(model.parameters(), lr=0.1, momentum=0.9, accumulate_steps=k) if optimizer == "sgd"
           else Adam(model.parameters(), lr=0.01, accumulate_steps=k))
    exchanges = []
    reduce = collectives._reduce
    collectives._reduce = lambda staged, op: (exchanges.append(len(staged)), reduce(staged, op))

    @ggrad.compile
    def micro_step(xb, yb):
        with ggrad.grad_tape():
            F.cross_entropy(ddp(xb), yb).backward()
        opt.step()
        opt.zero_grad()

    crossings = []
    for s in range(steps):
        for a in range(accumulate):
            start = ((s * accumulate + a) * size + rank) * per_rank
            xb, yb = x[start:start + per_rank], y[start:start + per_rank]
            last = a == accumulate - 1
            if mode == "compiled":
                with ggrad.count_transfers() as t:
                    micro_step(xb, yb)
                crossings.append(t.crossings)
                continue
            with ggrad.grad_tape():
                if last:
                    loss = F.cross_entropy(ddp(ggrad.tensor(xb)), ggrad.tensor(yb)) / accumulate
                    loss.backward()
                else:
                    with ddp.no_sync():
                        loss = F.cross_entropy(ddp(ggrad.tensor(xb)), ggrad.tensor(yb)) / accumulate
                        loss.backward()
        if mode != "compiled":
            opt.step()
            opt.zero_grad()
    if mode == "compiled":
        assert micro_step.reason is None, micro_step.reason
        assert micro_step.traces <= 2 * accumulate, micro_step.traces  # a trace per phase (and the first step)
    if rank == 0:
        np.savez(out + ".npz", *[p.numpy() for p in model.parameters()])
        np.savez(out + "-counts.npz", exchanges=np.array(exchanges), crossings=np.array(crossings))
    dist.destroy_process_group()
"""


def single_process(init, optimizer, per_rank, steps, accumulate, size):
    """The same run in this process: one batch of size * per_rank per micro-step."""
    import ggrad.functional as F
    from ggrad import nn
    from ggrad.optim import SGD, Adam
    rng = np.random.default_rng(0)
    x = rng.standard_normal((steps * accumulate * size * per_rank, 6)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
    with ggrad.no_grad():
        for p, value in zip(model.parameters(), init):
            p.assign_(value)
    opt = SGD(model.parameters(), lr=0.1, momentum=0.9) if optimizer == "sgd" else Adam(model.parameters(), lr=0.01)
    batch = size * per_rank
    for s in range(steps):
        for a in range(accumulate):
            start = (s * accumulate + a) * batch
            with ggrad.grad_tape():
                loss = F.cross_entropy(model(ggrad.tensor(x[start:start + batch])),
                                       ggrad.tensor(y[start:start + batch])) / accumulate
                loss.backward()
        opt.step()
        opt.zero_grad()
    return [p.numpy() for p in model.parameters()]


@needs_mpi
@pytest.mark.parametrize("size, optimizer, accumulate, mode", [
    (2, "sgd", 1, "eager"), (2, "adam", 1, "compiled"), (3, "adam", 1, "eager"), (2, "sgd", 2, "eager"),
    (3, "adam", 2, "eager"), (2, "sgd", 3, "compiled"), (3, "adam", 2, "compiled")])
def test_ddp_equals_one_process_with_the_whole_batch(dev, tmp_path, size, optimizer, accumulate, mode):
    out = str(tmp_path / "run")
    mpirun(size, TRAIN, dev, optimizer, "4", "20", str(accumulate), mode, out)
    init = list(np.load(out + "-init.npz").values())
    got = list(np.load(out + ".npz").values())
    expected = single_process(init, optimizer, 4, 20, accumulate, size)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
    counts = np.load(out + "-counts.npz")
    buckets = 2  # bucket_mb=0.0002 (209 bytes): the first weight alone, then the other three
    assert counts["exchanges"].tolist() == [buckets] * 20  # one per applied step: none on the others
    if mode == "compiled" and dev != "cpu":  # the cpu device's memory is the host's: nothing crosses
        # each micro-step uploads its batch (x and y in one copy); an applying one stages each
        # bucket down and up
        applying = [1 + 2 * buckets if (i + 1) % accumulate == 0 else 1 for i in range(20 * accumulate)]
        assert counts["crossings"][2 * accumulate:].tolist() == applying[2 * accumulate:]


@needs_mpi
def test_collectives_equal_mpis_values_and_count_their_staging():
    proc = mpirun(3, """
        import numpy as np, ggrad
        from ggrad import distributed as dist
        if "cuda:0" not in [d.name for d in ggrad.devices()]:  # NCCL asked for, no GPU: every rank says so
            try:
                dist.init_process_group("nccl")
                raise SystemExit("backend='nccl' without a CUDA device did not raise")
            except ValueError as e:
                assert "backend='nccl' needs a CUDA device" in str(e), e
        dist.init_process_group()
        r, n = dist.get_rank(), dist.get_world_size()
        t = ggrad.tensor(np.array([r, 10 * r, -r], np.float32))
        with ggrad.count_transfers() as counted:
            dist.all_reduce(t, op="sum")
        assert t.numpy().tolist() == [3, 30, -3], t.numpy()
        assert counted.downloads + counted.uploads >= 1 or ggrad.get_device() == "cpu"
        m = ggrad.tensor(np.array([r, -r], np.float32)); dist.all_reduce(m, op="mean")
        assert np.allclose(m.numpy(), [1, -1])
        x = ggrad.tensor(np.array([r, 2.0], np.float32)); dist.all_reduce(x, op="max")
        assert x.numpy().tolist() == [2, 2]
        b = ggrad.tensor(np.full(2, r, np.float32)); dist.broadcast(b, src=2)
        assert b.numpy().tolist() == [2, 2]
        parts = [ggrad.zeros(2) for _ in range(n)]; dist.all_gather(parts, ggrad.tensor(np.full(2, r, np.float32)))
        assert [p.numpy().tolist() for p in parts] == [[0, 0], [1, 1], [2, 2]]
        out = ggrad.zeros(2)
        dist.reduce_scatter(out, [ggrad.tensor(np.full(2, 10 * i + r, np.float32)) for i in range(n)])
        assert out.numpy().tolist() == [30 * r + 3] * 2, out.numpy()
        dist.barrier()
        print(f"ok-{r}-{dist.local_rank()}", flush=True)
    """)
    import re
    assert sorted(re.findall(r"ok-(\d)-\d", proc.stdout)) == ["0", "1", "2"], proc.stdout


@needs_mpi
def test_a_rank_that_raises_ends_every_rank():
    proc = mpirun(2, """
        import time
        from ggrad import distributed as dist
        dist.init_process_group()
        if dist.get_rank() == 1:
            raise ValueError("rank 1 fails")
        dist.barrier()  # rank 0 would wait here forever without the abort
    """, timeout=60, check=False)
    assert proc.returncode != 0
    assert "rank 1 fails" in proc.stdout + proc.stderr


@needs_mpi
def test_the_launcher_starts_n_ranks(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text("from ggrad import distributed as dist\ndist.init_process_group()\n"
                      "print(f'rank-{dist.get_rank()}-of-{dist.get_world_size()}', flush=True)\n")
    proc = subprocess.run([sys.executable, "-m", "ggrad.distributed.run", "-n", "2", str(script)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import re
    # the ranks' lines reach mpiexec's stdout in any order, a line's end possibly after the other's
    assert sorted(re.findall(r"rank-\d-of-\d", proc.stdout)) == ["rank-0-of-2", "rank-1-of-2"], proc.stdout


def test_distributed_sampler_shards_as_torchs():
    data = list(range(10))
    shards = [list(DistributedSampler(data, num_replicas=3, rank=r, shuffle=False)) for r in range(3)]
    assert shards == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]  # padded by repetition, as torch's
    cut = [list(DistributedSampler(data, num_replicas=3, rank=r, shuffle=False, drop_last=True)) for r in range(3)]
    assert cut == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    samplers = [DistributedSampler(data, num_replicas=2, rank=r, seed=5) for r in range(2)]
    first = [list(s) for s in samplers]
    assert sorted(first[0] + first[1]) == data and len(samplers[0]) == 5
    for s in samplers:
        s.set_epoch(1)
    second = [list(s) for s in samplers]
    assert second != first and sorted(second[0] + second[1]) == data
    with pytest.raises(ValueError, match="Invalid rank"):
        DistributedSampler(data, num_replicas=2, rank=2)


def test_using_the_group_before_init_is_a_clear_error():
    from ggrad import distributed as dist
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        dist.get_rank()
    with pytest.raises(ValueError, match="backend must be"):
        dist.init_process_group("gloo")


def _nccl_ready() -> bool:
    from ggrad.distributed import nccl
    return "cuda:0" in [d.name for d in ggrad.devices()] and nccl.available()


@needs_mpi
@pytest.mark.skipif(not _nccl_ready(), reason="no cuda:0 device or no NCCL library (pip install nvidia-nccl-cu12)")
def test_nccl_exchanges_on_the_device_inside_a_compiled_step():
    """World size 1 on one GPU: NCCL's collectives give the values and move nothing
    through the host, also as steps of a captured training step."""
    proc = mpirun(1, """
        import numpy as np, ggrad, ggrad.functional as F
        from ggrad import nn, distributed as dist
        from ggrad.optim import Adam
        dist.init_process_group(backend="nccl")
        assert dist.get_backend() == "nccl" and ggrad.get_device() == "cuda:0"
        for dtype in (ggrad.float32, ggrad.bfloat16, ggrad.int64):
            t = ggrad.tensor(np.array([1, -2, 3], np.float32)).to(dtype) * 2
            ggrad.realize(t)  # its data uploaded before counting
            with ggrad.count_transfers() as moved:
                dist.all_reduce(t, op="sum"); dist.all_reduce(t, op="max"); dist.broadcast(t, src=0)
            assert moved.crossings == 0, moved
            assert t.numpy().tolist() == [2, -4, 6], (dtype, t.numpy())
        m = ggrad.tensor(np.array([1.5, 3.0], np.float32)); dist.all_reduce(m, op="mean")
        assert m.numpy().tolist() == [1.5, 3.0]

        ggrad.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
        reference = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
        reference.load_state_dict(model.state_dict())
        opt, ref_opt = Adam(model.parameters(), lr=1e-2), Adam(reference.parameters(), lr=1e-2)
        rng = np.random.default_rng(0)
        xs = [ggrad.tensor(rng.standard_normal((16, 8)).astype(np.float32)) for _ in range(6)]
        ys = [ggrad.tensor(rng.integers(0, 4, 16)) for _ in range(6)]
        ggrad.realize(*xs, *ys)  # on the device before the steps: they upload nothing

        @ggrad.compile
        def step(x, y):
            with ggrad.grad_tape():
                loss = F.cross_entropy(model(x), y)
                loss.backward()
            dist.all_reduce_coalesced([p.grad for p in model.parameters()], op="mean")
            opt.step(); opt.zero_grad()
            return loss

        for i in range(6):
            with ggrad.count_transfers() as moved:
                loss = step(xs[i], ys[i])
            with ggrad.grad_tape():
                ref_loss = F.cross_entropy(reference(xs[i]), ys[i])
                ref_loss.backward()
            ref_opt.step(); ref_opt.zero_grad()
            assert abs(loss.item() - ref_loss.item()) < 1e-6, (i, loss.item(), ref_loss.item())
            if i >= 2:
                assert moved.crossings == 0, (i, moved)
        assert step.reason is None and step.traces <= 2, (step.reason, step.traces)
        for p, q in zip(model.parameters(), reference.parameters()):
            np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-6, atol=1e-7)
        dist.destroy_process_group()
        print("nccl-ok", flush=True)
    """)
    assert "nccl-ok" in proc.stdout
