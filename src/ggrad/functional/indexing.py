"""Indexing as numpy and torch do it: `x[...]` (ints, slices with steps, None,
Ellipsis, one integer array or tensor, bool masks), `x[...] = v`, and the gathers
beneath them (embedding, one_hot).

A bool mask selects a number of elements that depends on its values, so the mask is
read on the host (one counted download when it was computed on the device; none when
it came from the host). Inside `ggrad.compile` that refuses capture: the size would be
frozen at trace time.
"""

from __future__ import annotations

import numbers

import numpy as np

from .. import autograd, checks, dtypes, replay
from ._core import Tensor, _apply, _as_tensor, _float, cast, full_like, reshape, tensor
from .compare import where
from .layout import _slice, _unstride, permute, unsqueeze


# ---- gathers ---------------------------------------------------------------------------------
def checked_index(index: Tensor, size: int, what: str, of: str, wrap: bool = False) -> Tensor:
    """`index`, safe to gather with from a table of `size` rows. Indices known on the
    host are checked there (IndexError now; a captured step runs the same check on every
    new batch); device-computed ones are clamped into range and counted on the device,
    raising IndexError at the next host read (checks.py). With `wrap`, negative indices
    count from the end (as x[idx])."""
    host = index.node.host
    if host is None:
        return checks.bounded(index, size, f"{what} ({size} {of})", wrap)

    def check(values: np.ndarray) -> None:
        low = -size if wrap else 0
        if values.size and (values.min() < low or values.max() >= size):
            raise IndexError(f"{what} out of range for {size} {of} (min {values.min()}, max {values.max()})")
    check(host)
    replay.on_input(index.node, check, passes=(-size if wrap else 0, size))
    return checks.wrapped(index, size) if wrap else index


def _integer_index(index, what: str) -> Tensor:
    index = _as_tensor(index)
    if index.dtype.category != dtypes.int32.category:
        raise TypeError(f"{what} needs an integer index, got {index.dtype}")
    return index


def gather(table, index, *, wrap: bool = False) -> Tensor:
    """Rows of `table` picked by integer `index` (any shape): the result has shape
    ``index.shape + table.shape[1:]``. The gradient sums into the picked rows. With
    `wrap`, negative indices count from the end."""
    table = _as_tensor(table)
    index = _integer_index(index, "gather")
    if table.ndim != 2:
        raise ValueError(f"gather picks rows of a 2-d table, got shape {table.shape}")
    if index.ndim + 1 > 4:
        raise ValueError("gather index may have at most 3 dimensions")
    index = checked_index(index, table.shape[0], "gather index", "rows", wrap)

    def rule(ctx, g):
        t, ix = ctx.parents
        return _apply("scatter_rows", (g, ix), t.shape, dtype=g.dtype), None
    return _apply("gather_rows", (table, index), index.shape + table.shape[1:], rule, dtype=table.dtype)


def embedding(index, weight, padding_idx: int | None = None, max_norm: float | None = None) -> Tensor:
    """PyTorch's F.embedding: rows of `weight` for each id in `index`; the row of
    `padding_idx` is read but gets no gradient."""
    if max_norm is not None:
        raise NotImplementedError("embedding(max_norm=...) is not supported (it renormalises rows in place)")
    weight = _float(_as_tensor(weight), "embedding")
    rows = gather(weight, index)
    if padding_idx is None:
        return rows
    from .compare import where
    padding = int(padding_idx) % weight.shape[0] if -weight.shape[0] <= padding_idx < weight.shape[0] else None
    if padding is None:
        raise ValueError(f"padding_idx {padding_idx} is out of range for {weight.shape[0]} embeddings")
    index = _as_tensor(index)
    return where(reshape(index == padding, index.shape + (1,)), rows.detach(), rows)


def take(x: Tensor, index, axis: int) -> Tensor:
    """x's entries along `axis` picked by an integer array or tensor (any shape): the
    index's axes replace `axis`, as numpy's ``x[:, idx]``."""
    index = _integer_index(index, "indexing")
    n = x.shape[axis]
    if index.node.host is not None:
        _from_the_end(index.node.host, n, axis)  # the error names the axis
    moved = permute(x, (axis,) + tuple(a for a in range(x.ndim) if a != axis)) if axis else x
    rest = moved.shape[1:]
    picked = gather(reshape(moved, (n, int(np.prod(rest, dtype=np.int64)))), index, wrap=True)
    return _to_axis(reshape(picked, index.shape + rest), index.ndim, axis)


def _from_the_end(positions: np.ndarray, n: int, axis: int) -> np.ndarray:
    """Host indices into an axis of size n, negative ones counting from the end."""
    if positions.size and (positions.min() < -n or positions.max() >= n):
        bad = positions.min() if positions.min() < -n else positions.max()
        raise IndexError(f"index {bad} is out of range for axis {axis} of size {n}")
    return np.where(positions < 0, positions + n, positions)


def _to_axis(out: Tensor, k: int, axis: int) -> Tensor:
    """Move the first k axes (an index's) to start at `axis`."""
    dims = list(range(k, k + axis)) + list(range(k)) + list(range(k + axis, out.ndim))
    return permute(out, dims) if dims != list(range(out.ndim)) else out


# Up to this many classes, one_hot picks rows of a kept identity matrix (one ggml node);
# past it, it compares indices with a range (seven nodes, no num_classes^2 memory).
IDENTITY_MAX = 1024
_identities: dict[int, Tensor] = {}


def one_hot(index, num_classes: int) -> Tensor:
    """float32 one-hot rows (ggrad's F.one_hot is float, for the losses; torch's is int64)."""
    index = _integer_index(index, "one_hot")
    if index.ndim + 1 > 4:
        raise ValueError("one_hot index may have at most 3 dimensions")
    num_classes = int(num_classes)
    index = checked_index(index, num_classes, "class index", "classes")
    if num_classes <= IDENTITY_MAX:
        identity = _identities.get(num_classes)
        if identity is None:  # uploaded once per device, then read where it is
            identity = _identities[num_classes] = tensor(np.eye(num_classes, dtype=np.float32))
        return _apply("gather_rows", (identity, index), index.shape + (num_classes,))
    return _apply("onehot", (index,), index.shape + (num_classes,), None, num_classes)


def fill(x: Tensor, value: float) -> Tensor:
    """A float tensor shaped like `x`, every element `value` (made on the device)."""
    x = _as_tensor(x)
    return full_like(x, value, x.dtype if x.dtype.is_floating_point else dtypes.float32)


# ---- x[index] --------------------------------------------------------------------------------
def _is_int(ix) -> bool:
    return isinstance(ix, numbers.Integral) and not isinstance(ix, (bool, np.bool_))


def _is_array_index(ix) -> bool:
    return isinstance(ix, (Tensor, np.ndarray, list)) or isinstance(ix, (bool, np.bool_))


def _mask_to_indices(mask, what: str) -> np.ndarray:
    """The positions where a bool mask holds, read on the host (see the module's note)."""
    if isinstance(mask, Tensor):
        replay.refuse("boolean-mask indexing: the result's size depends on the mask's values")
        host = mask.node.host
        values = dtypes.from_storage(host, dtypes.bool_) if host is not None and not mask.node.pending \
            else mask.numpy()
    else:
        values = np.asarray(mask, dtype=bool)
    positions = np.flatnonzero(values)
    if positions.size == 0:
        raise IndexError(f"{what} selects no element; ggml tensors cannot be empty")
    return positions


def _is_bool(ix) -> bool:
    if isinstance(ix, Tensor):
        return ix.dtype is dtypes.bool_
    if isinstance(ix, (bool, np.bool_)):
        return True
    return isinstance(ix, (np.ndarray, list)) and np.asarray(ix).dtype == np.bool_


def _expand_index(x: Tensor, index) -> list:
    """The index as one entry per axis: Ellipsis spread out, None kept, bool masks over
    several axes kept whole, trailing axes taken whole."""
    index = list(index) if isinstance(index, tuple) else [index]
    used = sum(_mask_ndim(ix) if _is_bool(ix) else (0 if ix is None or ix is Ellipsis else 1) for ix in index)
    if sum(ix is Ellipsis for ix in index) > 1:
        raise IndexError("an index can have only one ellipsis (...)")
    if used > x.ndim:
        raise IndexError(f"too many indices ({used}) for a tensor of shape {x.shape}")
    rest = [slice(None)] * (x.ndim - used)
    if any(ix is Ellipsis for ix in index):
        at = next(i for i, ix in enumerate(index) if ix is Ellipsis)
        index = index[:at] + rest + index[at + 1:]
    else:
        index = index + rest
    picked = [i for i, ix in enumerate(index) if _is_int(ix) or _is_array_index(ix)]
    if any(_is_array_index(index[i]) for i in picked) and picked[-1] - picked[0] + 1 != len(picked):
        raise NotImplementedError("integers and an array index apart from each other: numpy would move "
                                  "the indexed axes to the front; index in two steps instead")
    return index


def _mask_ndim(ix) -> int:
    return ix.ndim if isinstance(ix, Tensor) else np.ndim(ix)


def _at(x: Tensor, axis: int, ix) -> Tensor:
    """x[..., ix, ...] at `axis`, the axis kept (length 1)."""
    n = x.shape[axis]
    if not -n <= ix < n:
        raise IndexError(f"index {ix} is out of range for axis {axis} of size {n}")
    start = int(ix) % n
    return _slice(x, axis, start, start + 1)


def _sliced(x: Tensor, axis: int, ix: slice) -> Tensor:
    n = x.shape[axis]
    if ix.step is not None and ix.step <= 0:
        raise ValueError(f"slice step must be positive, got {ix.step} (torch refuses negative steps too)")
    start, stop, step = ix.indices(n)
    if len(range(start, stop, step)) == 0:
        raise IndexError(f"slice {ix} of axis {axis} (size {n}) is empty; ggml tensors cannot be empty")
    if step != 1 and x.ndim > 3 and axis == x.ndim - 1:
        raise ValueError("a stepped slice of the last axis needs a tensor of at most 3 dimensions")
    return _slice(x, axis, start, stop, step)


def getitem(x: Tensor, index) -> Tensor:
    """numpy/torch basic and advanced indexing: ints, slices (positive steps), None,
    Ellipsis, and one integer array/tensor or bool mask (over one axis or several)."""
    if x.ndim and (type(index) is int or type(index) is slice):  # x[i], x[a:b]: no general walk
        return reshape(_at(x, 0, index), x.shape[1:]) if type(index) is int else _sliced(x, 0, index)
    index = _expand_index(x, index)
    out, axis, drop, advanced = x, 0, [], None
    for ix in index:
        if ix is None:
            out = unsqueeze(out, axis)
            axis += 1
        elif _is_int(ix):
            out = _at(out, axis, ix)
            drop.append(axis)
            axis += 1
        elif isinstance(ix, slice):
            out = _sliced(out, axis, ix)
            axis += 1
        elif _is_bool(ix):
            if advanced is not None:
                raise NotImplementedError("only one integer array or mask per index is supported")
            k = _mask_ndim(ix)
            mshape = tuple(ix.shape) if isinstance(ix, Tensor) else np.shape(ix)
            if k == 0:
                raise NotImplementedError("indexing with a bool scalar is not supported")
            if mshape != out.shape[axis:axis + k]:
                raise IndexError(f"mask of shape {mshape} does not match axes {axis}..{axis + k - 1} "
                                 f"of shape {out.shape}")
            merged = reshape(out, out.shape[:axis] + (int(np.prod(mshape)),) + out.shape[axis + k:])
            positions = _mask_to_indices(ix, "the mask")
            out = take(merged, tensor(positions.astype(np.int64)), axis)
            advanced = axis
            axis += 1
        elif _is_array_index(ix):
            if advanced is not None:
                raise NotImplementedError("only one integer array or mask per index is supported")
            idx = ix if isinstance(ix, Tensor) else tensor(np.asarray(ix))
            out = take(out, idx, axis)
            advanced = axis
            axis += idx.ndim
        else:
            raise TypeError(f"unsupported index {ix!r}: use ints, slices, None, ..., an integer "
                            "array or tensor, or a bool mask")
    if drop:
        out = reshape(out, tuple(n for i, n in enumerate(out.shape) if i not in drop))
    return out


# ---- x[index] = value ------------------------------------------------------------------------
def setitem(x: Tensor, index, value) -> None:
    """``x[index] = value`` in place (the same buffer, as every in-place write): a bool
    mask, ints and slices (stepped too, with Ellipsis), or one integer array of distinct
    indices known on the host. `value` broadcasts to the selection."""
    if autograd.is_recording() and x.requires_grad:
        raise RuntimeError("a tensor that requires grad is being used in an in-place assignment inside "
                           "a grad_tape (as torch refuses for a leaf); do it under ggrad.no_grad()")
    with autograd.no_grad():
        x._assign(_assigned(x, index, value))


def _value(value, like: Tensor, shape: tuple) -> Tensor:
    """`value` (a number, tensor or array) as a tensor of like's dtype broadcast to `shape`."""
    from ._core import broadcast_to
    from .compare import _scalar_like
    if isinstance(value, numbers.Number):
        one = _slice(reshape(like, (like.numel(),)), 0, 0, 1)
        v = _scalar_like(value, one, like.dtype)  # made on the device: no upload
    elif isinstance(value, Tensor):
        v = cast(value, like.dtype)
    else:
        v = tensor(np.asarray(value), dtype=like.dtype)
    if v.numel() == 1 and len(shape) < v.ndim:
        v = reshape(v, (1,) * len(shape))
    try:
        return broadcast_to(v, shape)
    except ValueError:
        raise ValueError(f"cannot assign a value of shape {v.shape} to a selection of shape {shape}") from None


def _assigned(x: Tensor, index, value) -> Tensor:
    """x with `value` written where `index` points (a new lazy value)."""
    single = index[0] if isinstance(index, tuple) and len(index) == 1 else index
    if _is_bool(single) and not isinstance(single, (bool, np.bool_)):
        mask = single if isinstance(single, Tensor) else tensor(np.asarray(single, dtype=bool))
        if mask.shape != x.shape[:mask.ndim]:
            raise IndexError(f"mask of shape {mask.shape} does not match the tensor's shape {x.shape}")
        if isinstance(value, numbers.Number) or (isinstance(value, Tensor) and value.numel() == 1):
            return where(reshape(mask, mask.shape + (1,) * (x.ndim - mask.ndim)), _value(value, x, ()), x)
        flat = reshape(x, (mask.numel(),) + x.shape[mask.ndim:])  # one value per selected element
        return reshape(_assigned_rows(flat, _mask_to_indices(mask, "the mask"), value), x.shape)
    if _is_array_index(single) and not isinstance(single, (bool, np.bool_)):
        return _assigned_rows(x, single, value)
    return _assigned_box(x, index, value)


def _assigned_box(x: Tensor, index, value) -> Tensor:
    entries = _expand_index(x, index)
    bounds, kept = [], []
    axis = 0
    for ix in entries:
        if ix is None:
            continue
        n = x.shape[axis]
        if _is_int(ix):
            if not -n <= ix < n:
                raise IndexError(f"index {ix} is out of range for axis {axis} of size {n}")
            start = int(ix) % n
            bounds.append((start, 1, 1))
        elif isinstance(ix, slice):
            if ix.step is not None and ix.step <= 0:
                raise ValueError(f"slice step must be positive, got {ix.step} (torch refuses negative steps too)")
            start, stop, step = ix.indices(n)
            count = len(range(start, stop, step))
            if not count:
                return x  # an empty selection writes nothing
            bounds.append((start, count, step))
            kept.append(axis)
        else:
            raise NotImplementedError(f"assignment through index {ix!r} mixed with other indices is not "
                                      "supported (use a mask, or ints and slices)")
        axis += 1
    region = tuple(count for _, count, _ in bounds)
    v = reshape(_value(value, x, tuple(region[a] for a in kept)), region)
    placed, inside = v, full_like(v, 1.0, dtypes.bool_)
    for axis, (start, count, step) in enumerate(bounds):
        n = x.shape[axis]
        if count == n:
            continue
        if step != 1:  # pe[:, 0::2] = ...: the values spread to every step-th place (a stepped slice's gradient)
            placed, inside = _unstride(placed, axis, start, step, n), _unstride(inside, axis, start, step, n)
            continue
        shape = placed.shape[:axis] + (n,) + placed.shape[axis + 1:]
        placed = _apply("pad", (placed,), shape, None, (axis, start, n - start - count), x.dtype)
        inside = _apply("pad", (inside,), shape, None, (axis, start, n - start - count), dtypes.bool_)
    return where(inside, placed, x)


def _assigned_rows(x: Tensor, index, value) -> Tensor:
    """x[idx] = value for distinct integer indices known on the host (rows of axis 0)."""
    idx = index if isinstance(index, Tensor) else tensor(np.asarray(index))
    _integer_index(idx, "assignment")
    host = idx.node.host if not idx.node.pending else None
    if host is None:
        raise NotImplementedError("assignment through an integer tensor computed on the device is not "
                                  "supported; use a mask")
    n = x.shape[0]
    positions = _from_the_end(np.asarray(host).reshape(-1).astype(np.int64), n, 0)
    if len(np.unique(positions)) != positions.size:
        raise NotImplementedError("assignment through repeated indices is not supported (which write wins "
                                  "is unspecified in torch too)")
    rest = x.shape[1:]
    width = int(np.prod(rest, dtype=np.int64))
    rows = reshape(_value(value, x, (positions.size,) + rest), (positions.size, width))
    spread = _apply("scatter_rows", (cast(rows, dtypes.float32), tensor(positions.astype(np.int32))), (n, width),
                    dtype=dtypes.float32)
    hit = np.zeros((n, 1), dtype=bool)
    hit[positions] = True
    new = where(tensor(hit), cast(spread, x.dtype), reshape(x, (n, width)))
    return reshape(new, x.shape)
