"""Ranks that disagree or leave: a clear error on every rank, or the job ends with a
message naming the rank, never a hang, a wrong value or MPI's own error stack. Each test
starts its ranks with mpiexec under a timeout (a hang fails it)."""

import re

import numpy as np
import pytest


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
    assert "rank 1 left the job" in out and "collective number 2 (all_reduce)" in out, out[-3000:]
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
