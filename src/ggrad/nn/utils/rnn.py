"""torch.nn.utils.rnn: batches of sequences of different lengths, packed as torch packs
them (time-major rows, longest sequences first), for the recurrent layers."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ... import dtypes
from ... import functional as F
from ...tensor import Tensor, full_like, tensor

__all__ = ["PackedSequence", "pack_padded_sequence", "pack_sequence", "pad_packed_sequence", "pad_sequence"]


class PackedSequence(NamedTuple):
    """torch's PackedSequence: `data` holds the valid steps of every sequence, time-major
    (step 0 of each sequence, longest first, then step 1...); `batch_sizes[t]` is how many
    sequences are longer than t; `sorted_indices` orders the batch by decreasing length
    (None where it was sorted), `unsorted_indices` undoes that. The recurrent layers take
    it and return one."""

    data: Tensor
    batch_sizes: Tensor
    sorted_indices: Tensor | None = None
    unsorted_indices: Tensor | None = None


def _host_lengths(lengths) -> np.ndarray:
    values = lengths.numpy() if isinstance(lengths, Tensor) else np.asarray(lengths)
    values = np.asarray(values, dtype=np.int64).reshape(-1)
    if values.size and values.min() <= 0:
        raise RuntimeError("Length of all samples has to be greater than 0, but found an element in 'lengths' "
                           "that is <= 0")
    return values


def _order(packed: PackedSequence) -> tuple[np.ndarray, np.ndarray]:
    """(batch sizes, the batch's order by decreasing length) on the host."""
    sizes = packed.batch_sizes.numpy().astype(np.int64)
    order = (packed.sorted_indices.numpy().astype(np.int64) if packed.sorted_indices is not None
             else np.arange(sizes[0]))
    return sizes, order


def _packed_rows(sizes: np.ndarray, order: np.ndarray) -> np.ndarray:
    """For each packed row, its row in the (time, batch) grid flattened time-major."""
    batch = len(order)
    return np.concatenate([t * batch + order[:n] for t, n in enumerate(sizes)])


def pack_padded_sequence(input, lengths, batch_first: bool = False, enforce_sorted: bool = True) -> PackedSequence:
    """A padded (T, B, *) batch (or (B, T, *) with batch_first) and each sequence's length
    (on the host: a list, an array or a tensor, read once), packed as torch's."""
    input = input if isinstance(input, Tensor) else tensor(input)
    lengths = _host_lengths(lengths)
    if input.ndim < 2:
        raise ValueError(f"pack_padded_sequence needs a (T, B, *) input, got {input.shape}")
    padded = F.transpose(input, 0, 1) if batch_first else input
    steps, batch = padded.shape[0], padded.shape[1]
    if len(lengths) != batch:
        raise ValueError(f"Expected `len(lengths)` to be equal to batch_size, but got {len(lengths)} "
                         f"(batch_size={batch})")
    if lengths.max() > steps:
        raise RuntimeError(f"a length of {lengths.max()} is longer than the input's {steps} steps")
    if enforce_sorted:
        if np.any(np.diff(lengths) > 0):
            raise RuntimeError("`lengths` array must be sorted in decreasing order when `enforce_sorted` is True. "
                               "You can pass `enforce_sorted=False` to pack_padded_sequence and/or pack_sequence to "
                               "sidestep this requirement if you do not need ONNX exportability.")
        order, sorted_indices, unsorted_indices = np.arange(batch), None, None
    else:
        order = np.argsort(-lengths, kind="stable")
        sorted_indices = tensor(order, dtype=dtypes.int64)
        unsorted_indices = tensor(np.argsort(order, kind="stable"), dtype=dtypes.int64)
    sizes = np.array([np.count_nonzero(lengths > t) for t in range(int(lengths.max()))], dtype=np.int64)
    rows = F.reshape(padded, (steps * batch,) + padded.shape[2:])
    data = F.take(rows, _packed_rows(sizes, order), 0)
    return PackedSequence(data, tensor(sizes, dtype=dtypes.int64), sorted_indices, unsorted_indices)


def pad_packed_sequence(sequence: PackedSequence, batch_first: bool = False, padding_value: float = 0.0,
                        total_length: int | None = None) -> tuple[Tensor, Tensor]:
    """The inverse of pack_padded_sequence: (the padded batch in its original order, each
    sequence's length, int64), padding_value past each sequence's end."""
    sizes, order = _order(sequence)
    steps, batch = len(sizes), int(sizes[0])
    if total_length is not None:
        if total_length < steps:
            raise ValueError(f"Expected total_length to be at least the length of the longest sequence in input, "
                             f"but got total_length={total_length} and max sequence length being {steps}")
        steps = int(total_length)
    data = sequence.data
    position = np.full(steps * batch, len(data), dtype=np.int64)  # padding: one row past the data
    position[_packed_rows(sizes, order)] = np.arange(len(data))
    filler = full_like(data[:1], padding_value)
    padded = F.reshape(F.take(F.cat([data, filler], 0), position, 0), (steps, batch) + data.shape[1:])
    lengths = np.zeros(batch, dtype=np.int64)
    for n in sizes:
        lengths[order[:n]] += 1
    return (F.transpose(padded, 0, 1) if batch_first else padded), tensor(lengths, dtype=dtypes.int64)


def pad_sequence(sequences, batch_first: bool = False, padding_value: float = 0.0,
                 padding_side: str = "right") -> Tensor:
    """Tensors of shape (L_i, *) as one (max L, B, *) batch (or (B, max L, *)), padded."""
    sequences = [s if isinstance(s, Tensor) else tensor(s) for s in sequences]
    if not sequences:
        raise RuntimeError("received an empty list of sequences")
    if padding_side not in ("left", "right"):
        raise ValueError(f"Expected padding_side to be one of left or right, but got {padding_side}.")
    longest = max(s.shape[0] for s in sequences)
    padded = []
    for s in sequences:
        missing = longest - s.shape[0]
        widths = (0, 0) * (s.ndim - 1) + ((0, missing) if padding_side == "right" else (missing, 0))
        padded.append(F.pad(s, widths, value=padding_value) if missing else s)
    return F.stack(padded, 0 if batch_first else 1)


def pack_sequence(sequences, enforce_sorted: bool = True) -> PackedSequence:
    """A list of (L_i, *) tensors packed (pad_sequence, then pack_padded_sequence)."""
    lengths = [s.shape[0] for s in sequences]
    return pack_padded_sequence(pad_sequence(sequences), lengths, enforce_sorted=enforce_sorted)


def step_masks(packed: PackedSequence) -> tuple[Tensor, Tensor, list[Tensor]]:
    """What a recurrent layer runs a packed batch as: the padded (T, B, *) input in the
    batch's original order, its lengths, and for each step a (B, 1) bool mask of the
    sequences still running (a finished sequence keeps its state)."""
    padded, lengths = pad_packed_sequence(packed)
    host = lengths.numpy()
    return padded, lengths, [tensor((host > t).reshape(-1, 1)) for t in range(padded.shape[0])]


def repack(output: Tensor, like: PackedSequence) -> PackedSequence:
    """A (T, B, *) output in the batch's original order, packed as `like` is."""
    sizes, order = _order(like)
    steps, batch = output.shape[0], output.shape[1]
    rows = F.reshape(output, (steps * batch,) + output.shape[2:])
    return PackedSequence(F.take(rows, _packed_rows(sizes, order), 0), like.batch_sizes, like.sorted_indices,
                          like.unsorted_indices)
