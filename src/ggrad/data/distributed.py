"""`DistributedSampler`: each rank its shard of a dataset, as torch's
(torch.utils.data.distributed). It asks the process group (distributed/group.py, the
lowest part of the distributed layer) for the ranks."""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np

from ..distributed import group
from .samplers import Sampler


class DistributedSampler(Sampler):
    """torch's DistributedSampler: the indices (shuffled by `seed + epoch` when `shuffle`)
    padded by repetition to a multiple of the world size (or cut, with `drop_last`), and
    rank r takes every world-size-th from r. Call `set_epoch` each epoch to reshuffle; every
    rank must use the same seed."""

    def __init__(self, dataset, num_replicas: int | None = None, rank: int | None = None, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False) -> None:
        num_replicas = group.get_world_size() if num_replicas is None else int(num_replicas)
        rank = group.get_rank() if rank is None else int(rank)
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
        self.dataset, self.num_replicas, self.rank = dataset, num_replicas, rank
        self.shuffle, self.seed, self.drop_last, self.epoch = bool(shuffle), int(seed), bool(drop_last), 0
        n = len(dataset)
        if drop_last and n % num_replicas:
            self.num_samples = math.ceil((n - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:
        n = len(self.dataset)
        indices = (np.random.default_rng(self.seed + self.epoch).permutation(n) if self.shuffle
                   else np.arange(n)).tolist()
        if not self.drop_last:
            padding = self.total_size - len(indices)
            if padding <= len(indices):  # (an empty dataset needs none: no division by its length)
                indices += indices[:padding]
            else:
                indices += (indices * math.ceil(padding / len(indices)))[:padding]
        else:
            indices = indices[:self.total_size]
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples
