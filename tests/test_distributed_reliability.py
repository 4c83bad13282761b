"""Ranks that disagree or leave: a clear error on every rank, or the job ends with a
message naming the rank, never a hang, a wrong value or MPI's own error stack. Each test
starts its ranks with mpiexec under a timeout (a hang fails it)."""

import re

import numpy as np
import pytest

from ggrad.distributed import DistributedSampler

from test_distributed import mpirun, needs_mpi

MPI_INTERNALS = ("Fatal error in", "MPIR_", "MPI_ERR", "mpi4py.MPI.Exception")


@needs_mpi
@pytest.mark.parametrize("leave", ["sys.exit(0)", "sys.exit(3)", "return", "dist.destroy_process_group(); return"])
def test_a_rank_that_leaves_with_collectives_pending_ends_the_job(leave):
    proc = mpirun(2, f"""
        import sys, ggrad
        from ggrad import distributed as dist

        def main():
            dist.init_process_group()
            t = ggrad.ones(3)
            dist.all_reduce(t)
            if dist.get_rank() == 1:
                {leave}
            dist.all_reduce(t)  # rank 1 never joins this one
            print("rank 0 went on", flush=True)

        main()
    """, timeout=60, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "rank 1 left the job" in out and "collective number 3 (all_reduce)" in out, out[-3000:]
    assert "rank 0 went on" not in out


@needs_mpi
def test_ranks_that_leave_after_their_last_collective_end_cleanly():
    """The notice of a rank that left after the collectives it shares with the others
    (the first to finish, while the others still complete the last one or do other work)
    ends nothing."""
    proc = mpirun(3, """
        import time, ggrad
        from ggrad import distributed as dist
        dist.init_process_group()
        rank = dist.get_rank()
        t = ggrad.ones(1000)
        for _ in range(30):
            dist.all_reduce(t, op="max")
        dist.barrier()
        if rank == 0:
            dist.destroy_process_group()
        else:
            time.sleep(0.5 * rank)  # work without collectives after rank 0 has left
        print(f"done-{rank}", flush=True)
    """, timeout=120)
    assert sorted(re.findall(r"done-\d", proc.stdout)) == ["done-0", "done-1", "done-2"], proc.stdout


@needs_mpi
def test_collectives_that_disagree_across_ranks_raise_a_clear_error_on_every_rank():
    """What rank 1 calls differs from rank 0's in one aspect; both raise torch's message
    (its debug mode's) and the group stays usable."""
    proc = mpirun(2, """
        import numpy as np, ggrad
        from ggrad import distributed as dist
        dist.init_process_group()
        rank = dist.get_rank()
        f32 = lambda n: ggrad.tensor(np.full(n, rank + 1, np.float32))
        cases = {
            "dtype": lambda: dist.all_reduce(f32(3) if rank == 0 else ggrad.tensor(np.full(3, 7, np.int32))),
            "shape": lambda: dist.all_reduce(f32(3 + rank)),
            "collective": lambda: dist.all_reduce(f32(3)) if rank == 0 else dist.broadcast(f32(3), src=0),
            "op": lambda: dist.all_reduce(f32(3), op="sum" if rank == 0 else "max"),
            "barrier": lambda: dist.barrier() if rank == 0 else dist.all_reduce(f32(3)),
            "count": lambda: dist.all_reduce_coalesced([f32(2) for _ in range(1 + rank)]),
            "root": lambda: dist.broadcast(f32(2), src=rank),
            "gather": lambda: dist.all_gather([ggrad.zeros(2 + rank) for _ in range(2)], f32(2 + rank)),
        }
        for name, call in cases.items():
            try:
                call()
                print(f"no-error-{rank}-{name}", flush=True)
            except RuntimeError as e:
                print(f"raised-{rank}-{name}: {e}", flush=True)
            good = f32(2)
            dist.all_reduce(good)  # the ranks still agree on what comes next
            assert good.numpy().tolist() == [3, 3], good.numpy()
        print(f"usable-{rank}", flush=True)
    """, timeout=120)
    out = proc.stdout + proc.stderr
    for name in ["dtype", "shape", "collective", "op", "barrier", "count", "root", "gather"]:
        for rank in (0, 1):
            assert f"raised-{rank}-{name}: Detected mismatch between collectives on ranks" in out, (name, out[-3000:])
    assert "Rank 0 is running collective: all_reduce(op=sum, tensors=[float32 (3,)]), but Rank 1 is running " \
           "collective: all_reduce(op=sum, tensors=[int32 (3,)])" in out, out[-3000:]
    assert "tensor dtypes: ('int32',) vs ('float32',)" in out
    assert "tensor shapes: ((4,),) vs ((3,),)" in out
    assert sorted(re.findall(r"usable-\d", out)) == ["usable-0", "usable-1"], out[-3000:]
    assert not any(s in out for s in MPI_INTERNALS), out[-3000:]


@needs_mpi
def test_ranks_that_ask_for_different_backends_raise_on_every_rank():
    proc = mpirun(2, """
        from mpi4py import MPI
        from ggrad import distributed as dist
        try:
            dist.init_process_group("mpi" if MPI.COMM_WORLD.Get_rank() == 0 else "auto")
        except RuntimeError as e:
            print(f"raised: {e}", flush=True)
        assert not dist.is_initialized()
    """, timeout=60)
    out = proc.stdout + proc.stderr
    assert out.count("raised: Detected mismatch between collectives on ranks") == 2, out[-3000:]
    assert "options: (('backend', 'mpi'),) vs (('backend', 'auto'),)" in out


EXPERTS = """
    import json, sys, numpy as np, ggrad
    from ggrad import nn, distributed as dist
    find_unused, routes, out = sys.argv[1] == "1", json.loads(sys.argv[2]), sys.argv[3]
    dist.init_process_group()
    rank = dist.get_rank()

    class Experts(nn.Module):  # experts of one shape: the flat buckets' sizes agree whoever is used
        def __init__(self):
            super().__init__()
            self.experts = nn.ModuleList([nn.Linear(4, 2) for _ in range(3)])

        def forward(self, x, route):
            return sum(self.experts[e](x) for e in route)

    ggrad.manual_seed(0)
    model = Experts()
    ddp = dist.DistributedDataParallel(model, find_unused_parameters=find_unused)
    x = np.random.default_rng(rank).standard_normal((5, 4)).astype(np.float32)
    weights = {n: p.numpy() for n, p in model.named_parameters()}  # rank 0's, broadcast
    try:
        with ggrad.grad_tape():
            (ddp(ggrad.tensor(x), routes[rank]) ** 2).sum().backward()
    except RuntimeError as e:
        print(f"raised-{rank}: {e}", flush=True)
        raise SystemExit(0)
    np.savez(f"{out}-{rank}.npz", x=x, **{"weight " + n: w for n, w in weights.items()},
             **{n: np.array(np.nan) if p.grad is None else p.grad.numpy() for n, p in model.named_parameters()})
    dist.destroy_process_group()
"""


def torch_ddp_gradients(weights: dict, xs: list, routes: list) -> dict:
    """torch DDP's gradients with find_unused_parameters=True: each rank's own gradients
    (zeros for the experts it did not use) averaged; None for experts no rank used."""
    import torch
    experts = [torch.nn.Linear(4, 2) for _ in range(3)]
    with torch.no_grad():
        for i, e in enumerate(experts):
            for n, p in e.named_parameters():
                p.copy_(torch.tensor(weights[f"weight experts.{i}.{n}"]))
    per_rank = []
    for x, route in zip(xs, routes):
        for e in experts:
            e.zero_grad(set_to_none=True)
        (sum(experts[e](torch.tensor(x)) for e in route) ** 2).sum().backward()
        per_rank.append({f"experts.{i}.{n}": None if p.grad is None else p.grad.numpy().copy()
                         for i, e in enumerate(experts) for n, p in e.named_parameters()})
    averaged = {}
    for name in per_rank[0]:
        grads = [g[name] for g in per_rank]
        present = [g for g in grads if g is not None]
        averaged[name] = None if not present else sum(present) / len(grads)
    return averaged


@needs_mpi
@pytest.mark.parametrize("routes", [[[0], [1]], [[0, 1], [1]], [[0], [0]]])
def test_ddp_find_unused_parameters_averages_as_torchs(tmp_path, routes):
    """Rank r uses the experts routes[r]: each expert's gradient is averaged over the ranks
    as torch's DDP does (zeros from the ranks that did not use it), one no rank used keeps
    no gradient, and the weights stay the same initial ones on both ranks."""
    import json
    out = str(tmp_path / "grads")
    mpirun(2, EXPERTS, "1", json.dumps(routes), out, timeout=120)
    got = [dict(np.load(f"{out}-{rank}.npz")) for rank in (0, 1)]
    assert all(np.array_equal(got[0][n], got[1][n]) for n in got[0] if n.startswith("weight "))
    expected = torch_ddp_gradients(got[0], [g["x"] for g in got], routes)
    for rank in (0, 1):
        for name, grad in expected.items():
            if grad is None:
                assert np.isnan(got[rank][name]).all(), (rank, name)
            else:
                np.testing.assert_allclose(got[rank][name], grad, rtol=1e-5, atol=1e-6, err_msg=f"{rank} {name}")


@needs_mpi
@pytest.mark.parametrize("routes", [[[0], [1]], [[0, 1, 2], [1, 2]]])
def test_ddp_with_unused_parameters_raises_as_torch(tmp_path, routes):
    """Without find_unused_parameters, a rank whose backward left a parameter without a
    gradient raises torch's error (naming it) instead of averaging another's gradient."""
    import json
    proc = mpirun(2, EXPERTS, "0", json.dumps(routes), str(tmp_path / "grads"), timeout=120, check=False)
    out = proc.stdout + proc.stderr
    missing = {0: "experts.1.weight, experts.1.bias", 1: "experts.0.weight, experts.0.bias"}
    for rank, route in enumerate(routes):
        if len(route) < 3:
            assert f"raised-{rank}: Expected to have finished reduction in the prior iteration" in out, out[-3000:]
            assert "find_unused_parameters=True" in out
            if len(route) == 1:
                assert f"Parameters which did not receive grad for rank {rank}: {missing[rank]}" in out, out
    if all(len(r) < 3 for r in routes):
        assert proc.returncode == 0, out[-3000:]
    else:  # rank 0 waits in the exchange; the rank that raised and left ends the job
        assert proc.returncode != 0 and "rank 1 left the job" in out, out[-3000:]
    assert not any(s in out for s in MPI_INTERNALS), out[-3000:]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("size", [0, 1, 5])
def test_distributed_sampler_of_a_small_dataset_as_torchs(size, drop_last):
    from torch.utils.data.distributed import DistributedSampler as TorchSampler
    data = list(range(size))
    for rank in range(3):
        ours = DistributedSampler(data, num_replicas=3, rank=rank, shuffle=False, drop_last=drop_last)
        theirs = TorchSampler(data, num_replicas=3, rank=rank, shuffle=False, drop_last=drop_last)
        assert (list(ours), len(ours)) == (list(theirs), len(theirs))
