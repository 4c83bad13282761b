"""Data: torch.utils.data's datasets, samplers and DataLoader, yielding ggrad tensors.

Two ways in. `DataLoader(x, y, batch_size=32, shuffle=True)` over in-memory arrays is the
fast path: each batch is a slice of the arrays, uploaded when first used. `DataLoader
(dataset, batch_size, ...)` takes any map-style dataset (`__getitem__` and `__len__`) or
an `IterableDataset`, as torch's: samples are collated into numpy batches (by
`collate_fn`, in worker processes with `num_workers > 0`) and converted to tensors in
this process. Either way a batch's device memory returns to the pool once it is dropped.
"""

from .collate import default_collate
from .datasets import ConcatDataset, Dataset, IterableDataset, Subset, TensorDataset, random_split
from .loader import DataLoader
from .samplers import BatchSampler, RandomSampler, Sampler, SequentialSampler
from .workers import WorkerInfo, get_worker_info

__all__ = ["BatchSampler", "ConcatDataset", "DataLoader", "Dataset", "IterableDataset", "RandomSampler", "Sampler",
           "SequentialSampler", "Subset", "TensorDataset", "WorkerInfo", "default_collate", "get_worker_info",
           "random_split"]
