"""Tensor dtypes as PyTorch names them, and how each is stored in ggml.

A `dtype` is what a tensor holds to its user; its `storage` is the numpy dtype of the
device buffer (ggml's type). They differ where ggml has no such type:

- ``int64`` is stored as ggml I32. Data outside int32's range is refused when it enters
  (``ValueError``), never wrapped. Integer arithmetic runs in float32 on the device, so
  it is exact for results up to 2**24 in magnitude (indices, counts, class ids).
- ``bool`` is stored as float32 0.0 / 1.0: comparisons, masks and ``where`` are then
  plain float arithmetic on every backend.
- ``bfloat16`` uses ml_dtypes' numpy bfloat16 on the host (ggml BF16 on the device).

Host data follows ``torch.tensor``: numpy float64 becomes float32 (the default dtype),
float16 stays float16, Python ints and numpy int64 become int64, int32 stays int32,
smaller integers become int32, bools become bool.
"""

from __future__ import annotations

import builtins
import numbers

import ml_dtypes
import numpy as np

from .runtime import quants

_BOOL, _INT, _FLOAT = 0, 1, 2  # categories, in promotion order
_QUANT = 3  # frozen quantized weights: read only by the products that take them (functional/quantized.py)


class dtype:
    """A tensor element type (PyTorch's ``torch.dtype``); compare with ``is`` or ``==``."""

    __slots__ = ("name", "storage", "host", "category", "rank", "itemsize", "is_quantized")

    def __init__(self, name: str, storage, host, category: int, rank: int) -> None:
        self.name = name
        self.storage = np.dtype(storage)
        self.host = np.dtype(host)
        self.category = category
        self.rank = rank  # order within a category: the larger wins a promotion
        self.itemsize = self.host.itemsize
        self.is_quantized = category == _QUANT  # an attribute, not a property: every op reads it

    is_floating_point = property(lambda self: self.category == _FLOAT)
    is_signed = property(lambda self: self.category != _BOOL)

    def __repr__(self) -> str:
        return f"ggrad.{self.name}"

    def __reduce__(self):
        return (as_dtype, (self.name,))


float32 = dtype("float32", np.float32, np.float32, _FLOAT, 2)
float16 = dtype("float16", np.float16, np.float16, _FLOAT, 1)
bfloat16 = dtype("bfloat16", ml_dtypes.bfloat16, ml_dtypes.bfloat16, _FLOAT, 1)
int32 = dtype("int32", np.int32, np.int32, _INT, 1)
int64 = dtype("int64", np.int32, np.int64, _INT, 2)
bool_ = dtype("bool", np.float32, np.bool_, _BOOL, 0)

# Not dtypes of arithmetic: a tensor of one is a frozen weight in ggml's blocks of that type
# (runtime/quants.py), its shape the weights' (rows, columns), its host form the
# (rows, columns / block) blocks. Read only by the products that take them
# (functional/quantized.py).
QUANTIZED = {name: dtype(name, kind.storage, kind.storage, _QUANT, 0) for name, kind in quants.BLOCK_TYPES.items()}
q4_0, q4_1, q5_0, q5_1, q8_0 = (QUANTIZED[n] for n in ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0"))
q4_k, q5_k, q6_k = (QUANTIZED[n] for n in ("q4_k", "q5_k", "q6_k"))

ALL = (float32, float16, bfloat16, int32, int64, bool_)
_BY_NAME = {d.name: d for d in ALL}
_BY_NAME.update(float=float32, half=float16, int=int32, long=int64)
_BY_HOST = {np.dtype(np.float32): float32, np.dtype(np.float16): float16,
            np.dtype(ml_dtypes.bfloat16): bfloat16, np.dtype(np.int32): int32,
            np.dtype(np.int64): int64, np.dtype(np.bool_): bool_}
INT32_MIN, INT32_MAX = int(np.iinfo(np.int32).min), int(np.iinfo(np.int32).max)


def as_dtype(value) -> dtype:
    """A ggrad dtype from a ggrad dtype, a name ("float16", "long"), a numpy dtype or
    type, a Python type (float, int, bool) or a torch dtype."""
    if isinstance(value, dtype):
        if value.is_quantized:
            raise TypeError(f"{value!r} is the storage of a frozen quantized weight, not a dtype to make or convert "
                            "tensors to: ggrad.functional.quantized.quantize makes one")
        return value
    if value is builtins.float:
        return float32
    if value is builtins.int:
        return int64
    if value is builtins.bool:
        return bool_
    if isinstance(value, str):
        found = _BY_NAME.get(value.removeprefix("torch.").removeprefix("ggrad."))
        if found is not None:
            return found
    elif type(value).__module__ == "torch":  # torch.float32 and friends, without importing torch
        return as_dtype(str(value))
    else:
        try:
            found = _BY_HOST.get(np.dtype(value))
        except TypeError:
            found = None
        if found is not None:
            return found
        if isinstance(value, type) and issubclass(value, np.generic) or isinstance(value, np.dtype):
            return of_numpy(np.dtype(value))
    raise TypeError(f"unknown dtype {value!r}; ggrad has {', '.join(d.name for d in ALL)}")


def of_numpy(host: np.dtype) -> dtype:
    """The dtype ``torch.tensor`` gives a numpy array of `host`'s dtype."""
    found = _BY_HOST.get(host)
    if found is not None:
        return found
    if host.kind == "f":
        return float32
    if host.kind == "b":
        return bool_
    if host.kind in "iu":
        return int32 if host.itemsize < 4 else int64
    raise TypeError(f"tensor data of numpy dtype {host} is not numeric")


def check_int32_range(array: np.ndarray, dt: dtype) -> None:
    """Raise where integer data for a `dt` tensor lies outside int32's range (ggml's storage)."""
    if dt.category == _INT and array.size and not np.can_cast(array.dtype, np.int32):
        check_int32_extremes(np.minimum.reduce(array, axis=None), np.maximum.reduce(array, axis=None), dt)


def check_int32_extremes(low, high, dt: dtype) -> None:
    """`check_int32_range` of data whose least and greatest values are `low` and `high`."""
    if dt.category == _INT and (low < INT32_MIN or high > INT32_MAX):
        raise ValueError(f"{dt.name} tensor data out of range: ggml stores integers in 32 bits "
                         f"(min {low}, max {high}); values must lie in [{INT32_MIN}, {INT32_MAX}]")


def to_storage(array: np.ndarray, dt: dtype) -> np.ndarray:
    """`array` in `dt`'s storage form; integers out of int32's range raise."""
    if dt.category == _INT and array.dtype.kind in "iu":
        check_int32_range(array, dt)
    elif dt.category == _INT and array.dtype.kind == "f" and array.size:
        if not np.isfinite(array).all():
            raise ValueError(f"cannot convert non-finite values to {dt.name}")
        return to_storage(array.astype(np.int64), dt)  # truncation toward zero, as torch
    if dt is bool_ and array.dtype.kind != "b":
        array = array != 0
    return array.astype(dt.storage, copy=False)


def from_storage(array: np.ndarray, dt: dtype) -> np.ndarray:
    """A storage-form array as the user sees it (int64, bool)."""
    if dt is bool_:
        return array != 0
    return array.astype(dt.host, copy=False)


def _promote(a: dtype | None, b: dtype | None) -> dtype | None:
    """torch.promote_types for ggrad's dtypes (None: no operand of that kind)."""
    if a is None or a is b:
        return b
    if b is None:
        return a
    if a.category != b.category:
        return a if a.category > b.category else b
    if a.rank == b.rank:  # float16 with bfloat16
        return float32
    return a if a.rank > b.rank else b


def _combine(higher: dtype | None, lower: dtype | None) -> dtype | None:
    """c10's combine_categories: a lower-priority operand changes the result only when
    it belongs to a higher category."""
    if higher is not None and higher.category == _FLOAT:
        return higher
    if higher is bool_ or (lower is not None and lower.category == _FLOAT):
        return _promote(higher, lower)
    return higher if higher is not None else lower


def scalar_dtype(value) -> dtype:
    if isinstance(value, (builtins.bool, np.bool_)):
        return bool_
    if isinstance(value, numbers.Integral):
        return int64
    if isinstance(value, numbers.Real):
        return float32
    raise TypeError(f"expected a number, got {type(value).__name__}")


def result_type(*operands) -> dtype:
    """torch.result_type: tensors with dimensions first, then 0-d tensors, then Python
    scalars, each only lifting the category (float16 tensor + 1.5 stays float16)."""
    if len(operands) == 2:  # two tensors of one dtype: every binary op of a model
        first = getattr(operands[0], "dtype", None)
        if first is getattr(operands[1], "dtype", None) and isinstance(first, dtype):
            return first
    dims = zero = wrapped = None
    for x in operands:
        if hasattr(x, "dtype") and hasattr(x, "ndim") and isinstance(x.dtype, dtype):
            if x.ndim:
                dims = _promote(dims, x.dtype)
            else:
                zero = _promote(zero, x.dtype)
        else:
            wrapped = _promote(wrapped, scalar_dtype(x))
    result = _combine(dims, _combine(zero, wrapped))
    if result is None:
        raise TypeError("result_type needs at least one operand")
    return result
