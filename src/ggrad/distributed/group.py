"""The process group: MPI's world communicator, its rank, size and local rank."""

from __future__ import annotations

import sys
import traceback

_state: dict = {}


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError:
        raise RuntimeError("ggrad.distributed needs mpi4py and an MPI library: `pip install mpi4py mpich` "
                           "(or a system MPI)") from None
    return MPI


def init_process_group(backend: str = "auto") -> None:
    """Join the processes mpiexec started. `backend`: "auto" or "mpi" (NCCL for CUDA
    devices is not built yet). Each process then takes the GPU of its local rank where
    there are GPUs; a failing process aborts all of them (MPI_Abort), so none hangs."""
    if backend not in ("auto", "mpi", "nccl"):
        raise ValueError(f"backend must be 'auto', 'mpi' or 'nccl', got {backend!r}")
    if backend == "nccl":
        raise NotImplementedError("the NCCL backend is not built yet; use backend='mpi'")
    if _state:
        raise RuntimeError("init_process_group: the process group is already initialized")
    MPI = _mpi()
    comm = MPI.COMM_WORLD
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    _state.update(MPI=MPI, comm=comm, local_rank=local.Get_rank(), local_size=local.Get_size())
    local.Free()
    _take_local_gpu()
    previous = sys.excepthook

    def abort_all(kind, value, tb):  # an exception no one caught ends every rank, not just this one
        traceback.print_exception(kind, value, tb)
        sys.stderr.flush()
        comm.Abort(1)
        previous(kind, value, tb)
    _state["excepthook"] = previous
    sys.excepthook = abort_all


def _take_local_gpu() -> None:
    from .. import runtime
    for kind in ("cuda", "vulkan"):
        gpus = [d.name for d in runtime.devices() if d.kind == kind and d.is_gpu]
        if gpus:
            runtime.set_device(gpus[_state["local_rank"] % len(gpus)])
            return


def _require():
    if not _state:
        raise RuntimeError("the default process group is not initialized: call "
                           "ggrad.distributed.init_process_group() first")
    return _state


def is_initialized() -> bool:
    return bool(_state)


def get_rank() -> int:
    return _require()["comm"].Get_rank()


def get_world_size() -> int:
    return _require()["comm"].Get_size()


def local_rank() -> int:
    return _require()["local_rank"]


def barrier() -> None:
    _require()["comm"].Barrier()


def destroy_process_group() -> None:
    state = _require()
    sys.excepthook = state["excepthook"]
    _state.clear()


def comm():
    """The world communicator (for this package's collectives)."""
    return _require()["comm"]


def mpi():
    return _require()["MPI"]
