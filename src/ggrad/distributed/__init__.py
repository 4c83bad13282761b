"""Data-parallel training across processes, launched with ``mpiexec -n N python train.py``
or ``python -m ggrad.distributed.run -n N train.py``.

Each process trains a replica; `DistributedDataParallel` averages the gradients across
processes after each backward pass, in flat buckets. MPI (mpi4py) starts the ranks;
collectives exchange CUDA buffers device to device with NCCL (backend "nccl"), else stage
them through host memory (counted transfers: `count_transfers` shows them).
"""

from .collectives import all_gather, all_reduce, all_reduce_coalesced, broadcast, reduce_scatter
from .ddp import DistributedDataParallel
from .group import (barrier, destroy_process_group, get_backend, get_rank, get_world_size, init_process_group,
                    is_initialized, local_rank)
from ..data.distributed import DistributedSampler

__all__ = ["DistributedDataParallel", "DistributedSampler", "all_gather", "all_reduce", "all_reduce_coalesced",
           "barrier", "broadcast", "destroy_process_group", "get_backend", "get_rank", "get_world_size",
           "init_process_group", "is_initialized", "local_rank", "reduce_scatter"]
