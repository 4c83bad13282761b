"""The process group: MPI's world communicator, its rank, size and local rank."""

from __future__ import annotations

import atexit
import sys
import traceback

from .rendezvous import Fingerprint, Lifeline, abort_job, agree

_state: dict = {}


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError:
        raise RuntimeError("ggrad.distributed needs mpi4py and an MPI library: `pip install mpi4py mpich` "
                           "(or a system MPI)") from None
    return MPI


def init_process_group(backend: str = "auto") -> None:
    """Join the processes mpiexec started; each then takes the GPU of its local rank where
    there are GPUs. A failing process aborts all of them (MPI_Abort), and one that leaves
    (exits, or destroys the group) while others wait in a collective it never joins ends
    the job: none hangs.

    `backend`: "mpi" exchanges tensors through host memory; "nccl" exchanges CUDA buffers
    device to device (NCCL, one GPU per process; MPI still starts the ranks and serves
    other tensors); "auto" is "nccl" where every process has a CUDA device of its own and
    NCCL loads, else "mpi"."""
    if backend not in ("auto", "mpi", "nccl"):
        raise ValueError(f"backend must be 'auto', 'mpi' or 'nccl', got {backend!r}")
    if _state:
        raise RuntimeError("init_process_group: the process group is already initialized")
    MPI = _mpi()
    comm = MPI.COMM_WORLD
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    _state.update(MPI=MPI, comm=comm, local_rank=local.Get_rank(), local_size=local.Get_size(), nccl=None,
                  lifeline=Lifeline(comm, MPI))
    local.Free()
    try:
        agree(_state["lifeline"], Fingerprint("init_process_group", (("backend", backend),)))
        gpu = _take_local_gpu()
        if backend != "mpi":
            _state["nccl"] = _nccl_communicator(comm, gpu, required=backend == "nccl")
    except BaseException:
        _state.clear()
        raise
    previous = sys.excepthook

    def abort_all(kind, value, tb):  # an exception no one caught ends every rank, not just this one
        traceback.print_exception(kind, value, tb)
        abort_job(comm)
    _state["excepthook"] = previous
    sys.excepthook = abort_all
    atexit.register(_leave)


def _leave() -> None:
    """This rank enters no more collectives: tell the others (a process that ends without
    destroying the group, by sys.exit or by returning, leaves too)."""
    atexit.unregister(_leave)
    _state["lifeline"].leave()


def _nccl_communicator(comm, gpu: tuple[str, int] | None, required: bool):
    """An NCCL communicator over every rank's own CUDA device, or None (required: raise
    instead). Every rank decides alike: they agree through MPI first."""
    from . import nccl
    own_gpu = gpu is not None and gpu[0] == "cuda" and _state["local_size"] <= gpu[1]
    usable = comm.allreduce(int(own_gpu and nccl.available()), op=_state["MPI"].MIN)
    if not usable:
        if required:
            raise ValueError("backend='nccl' needs a CUDA device for each process of a host and the "
                             "NCCL library (pip install nvidia-nccl-cu12); use backend='mpi'")
        return None
    from .. import runtime
    uid = comm.bcast(nccl.unique_id() if comm.Get_rank() == 0 else None, root=0)
    index = int(runtime.get_device().split(":")[1])
    return nccl.Communicator(comm.Get_size(), comm.Get_rank(), uid, index)


def _take_local_gpu() -> tuple[str, int] | None:
    """Set this process's device to its local rank's GPU; (kind, GPUs of that kind) or None."""
    from .. import runtime
    for kind in ("cuda", "vulkan"):
        gpus = [d.name for d in runtime.devices() if d.kind == kind and d.is_gpu]
        if gpus:
            runtime.set_device(gpus[_state["local_rank"] % len(gpus)])
            return kind, len(gpus)
    return None


def _require():
    if not _state:
        raise RuntimeError("the default process group is not initialized: call "
                           "ggrad.distributed.init_process_group() first")
    return _state


def is_initialized() -> bool:
    return bool(_state)


def size_or_one() -> int:
    """The process group's size; 1 without one (code that also runs in a single process)."""
    return get_world_size() if _state else 1


def get_rank() -> int:
    return _require()["comm"].Get_rank()


def get_world_size() -> int:
    return _require()["comm"].Get_size()


def local_rank() -> int:
    return _require()["local_rank"]


def barrier() -> None:
    agree(lifeline(), Fingerprint("barrier"))


def get_backend() -> str:
    """"nccl" when CUDA buffers are exchanged device to device, else "mpi"."""
    return "nccl" if _require()["nccl"] is not None else "mpi"


def destroy_process_group() -> None:
    state = _require()
    _leave()
    sys.excepthook = state["excepthook"]
    if state["nccl"] is not None:
        state["nccl"].destroy()
    _state.clear()


def nccl_communicator():
    """The NCCL communicator (backend "nccl"), or None."""
    return _require()["nccl"]


def comm():
    """The world communicator (for this package's collectives)."""
    return _require()["comm"]


def mpi():
    return _require()["MPI"]


def lifeline() -> Lifeline:
    """This rank's count of collectives, and who has left (for the rendezvous)."""
    return _require()["lifeline"]
