"""Data-parallel training across processes on MPI (mpi4py), launched with
``mpiexec -n N python train.py`` or ``python -m ggrad.distributed.run -n N train.py``.

Each process trains a replica; `DistributedDataParallel` averages the gradients across
processes after each backward pass, in flat buckets. Collectives are staged through host
memory (counted transfers: `count_transfers` shows them).
"""

from .collectives import all_gather, all_reduce, broadcast, reduce_scatter
from .ddp import DistributedDataParallel
from .group import (barrier, destroy_process_group, get_rank, get_world_size, init_process_group, is_initialized,
                    local_rank)
from .sampler import DistributedSampler

__all__ = ["DistributedDataParallel", "DistributedSampler", "all_gather", "all_reduce", "barrier", "broadcast",
           "destroy_process_group", "get_rank", "get_world_size", "init_process_group", "is_initialized",
           "local_rank", "reduce_scatter"]
