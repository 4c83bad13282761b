"""Drawing from distributions that tensors hold: torch.multinomial."""

from __future__ import annotations

import numbers

import numpy as np

from .. import dtypes
from ..random import generator as host_generator
from ._core import Tensor, tensor


def multinomial(input, num_samples: int, replacement: bool = False, *, generator=None) -> Tensor:
    """Category indices drawn from the rows of `input` (non-negative weights, not
    necessarily summing to 1), as torch.multinomial: int64, of shape (num_samples,) or
    (rows, num_samples); without replacement each row's draws differ, and where a row has
    fewer positive weights than draws the rest come from its zero-weight categories, as
    torch's do. The weights are read to the host (one download: what a generation loop
    reads anyway) and drawn from ggrad's host generator (`ggrad.manual_seed`), or from
    `generator`, a numpy Generator."""
    weights = np.asarray(input.numpy() if isinstance(input, Tensor) else input, dtype=np.float64)
    if weights.ndim not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if not isinstance(num_samples, numbers.Integral) or isinstance(num_samples, bool) or num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    rows = weights.reshape(-1, weights.shape[-1])
    if not np.isfinite(rows).all() or (rows < 0).any():
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    if (rows.sum(axis=-1) <= 0).any():
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    if not replacement and num_samples > rows.shape[-1]:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    rng = host_generator() if generator is None else generator
    drawn = np.stack([_draw(rng, row, int(num_samples), replacement) for row in rows])
    return tensor(drawn.reshape(weights.shape[:-1] + (int(num_samples),)), dtype=dtypes.int64)


def _draw(rng: np.random.Generator, row: np.ndarray, n: int, replacement: bool) -> np.ndarray:
    positive = np.flatnonzero(row > 0)
    if replacement or len(positive) >= n:
        return rng.choice(len(row), size=n, replace=replacement, p=row / row.sum())
    first = rng.choice(positive, size=len(positive), replace=False, p=row[positive] / row[positive].sum())
    rest = rng.choice(np.flatnonzero(row == 0), size=n - len(positive), replace=False)
    return np.concatenate([first, rest])
