"""`Tensor`: what users hold. A lazy value on the current device, with autograd.

A tensor wraps a `lazy.Node`. Operations add nodes; reading a value (`numpy`, `item`,
`float`, printing) runs everything pending as one graph. Data made from host arrays is
uploaded once, on first use, into the persistent pool, so constant inputs cross once.
"""

from __future__ import annotations

import math
import numbers
from operator import attrgetter
from typing import Callable, NamedTuple

import numpy as np

from . import autograd, dtypes, lazy, runtime
from .runtime import pinned
from .runtime.graph import as_host_array


def _host_array(data, dtype=None, keep: bool = True) -> tuple[np.ndarray, dtypes.dtype]:
    """Host data in its dtype's storage form, and that dtype (see dtypes.py for the
    rules: float64 -> float32, Python ints -> int64, ...). `keep`: the array is kept until
    it is uploaded, so it is a copy of the caller's memory, as torch.tensor's: a later
    write into the caller's array (a torch parameter's .numpy(), a reused batch buffer)
    must not change the tensor."""
    try:
        array = np.asarray(data)
    except ValueError as err:
        raise ValueError(f"tensor data is ragged (rows of different lengths): {err}") from None
    if array.dtype == object:
        raise TypeError(f"tensor data must be numeric, got {type(data).__name__} of objects")
    dt = dtypes.of_numpy(array.dtype) if dtype is None else dtypes.as_dtype(dtype)
    stored = as_host_array(dtypes.to_storage(array, dt), "tensor data")
    if keep and (stored is data or not stored.flags.owndata):
        stored = runtime.aligned_copy(stored)
    return stored, dt


# Called before a value is read on the host: errors found on the device are raised there
# (checks.py registers its index-range check).
read_checks: list[Callable[[], None]] = []


def _check_device(device) -> None:
    if device is not None and runtime.backend.resolve(device) != runtime.get_device():
        raise ValueError(f"ggrad runs on one device at a time (now {runtime.get_device()!r}); "
                         f"call ggrad.set_device({device!r}) first")


class Tensor:
    """A lazy n-d array (at most 4 dimensions) on the current device."""

    __slots__ = ("_node", "requires_grad", "_ctx", "_grad", "_version", "__weakref__")
    __array_priority__ = 100  # numpy defers to our reflected operators

    def __init__(self, data, requires_grad: bool = False, device: str | None = None, dtype=None) -> None:
        _check_device(device)
        if isinstance(data, Tensor):
            source = data if dtype is None else data.to(dtype)
            node = lazy.apply("cont", (source._node,), source.shape, source.dtype)
            node.scope = "persistent"
        else:
            node = lazy.from_host(*_host_array(data, dtype))
        self._node = None
        self.node = node
        self._ctx: autograd.Context | None = None
        self._grad: Tensor | None = None
        self._version = 0  # in-place writes so far (autograd.py: a record keeps what it saw)
        self.requires_grad = False
        if requires_grad:
            self.requires_grad_()

    @classmethod
    def _wrap(cls, node: lazy.Node, requires_grad: bool = False) -> Tensor:
        t = cls.__new__(cls)
        node.owners += 1
        t._node = node
        t._ctx = None
        t._grad = None
        t._version = 0
        t.requires_grad = requires_grad
        return t

    def __del__(self) -> None:
        node = getattr(self, "_node", None)
        if node is not None:
            node.owners -= 1

    def _set_node(self, node: lazy.Node) -> None:
        if self._node is not None:
            self._node.owners -= 1
        node.owners += 1
        self._node = node

    # The getters are attrgetters: read in C, not a Python call each (ops read them often).
    node = property(attrgetter("_node"), _set_node, doc="The lazy value (`lazy.Node`) this tensor wraps.")

    # ---- what a tensor is --------------------------------------------------------
    shape = property(attrgetter("_node.shape"), doc="The shape, a tuple of ints.")
    dtype = property(attrgetter("_node.dtype"), doc="The element type, a ggrad dtype.")
    ndim = property(lambda self: len(self._node.shape))
    is_leaf = property(lambda self: self._ctx is None)

    def is_floating_point(self) -> bool:
        return self._node.dtype.is_floating_point

    def size(self, dim: int | None = None):
        """The shape (a tuple), or the size of axis `dim`, as torch's."""
        if dim is None:
            return self._node.shape
        return self._node.shape[axis_index(dim, self.ndim)] if self.ndim else 1

    def numel(self) -> int:
        return math.prod(self._node.shape)

    def dim(self) -> int:
        return len(self._node.shape)

    nelement = numel

    def element_size(self) -> int:
        return self._node.dtype.itemsize

    @property
    def device(self) -> str:
        handle = self._node.handle
        return handle.device if handle is not None and handle.live else runtime.get_device()

    def requires_grad_(self, flag: bool = True) -> Tensor:
        if flag and not self.dtype.is_floating_point:
            raise TypeError(f"only floating-point tensors can require grad, this one is {self.dtype}")
        self.requires_grad = flag
        return self

    # ---- values: reading is where work runs ----------------------------------------
    @property
    def handle(self) -> runtime.Handle:
        """The runtime handle holding this value on the device (runs pending work)."""
        return lazy.ensure_on_device(self._node)

    def pin_memory(self) -> Tensor:
        """torch's: a tensor whose data, still on the host, waits in the device's pinned
        memory, so that its upload is one direct copy (`DataLoader(pin_memory=True)`). A
        tensor already computed or uploaded, or on a device without pinned memory (the
        CPU), is returned as it is."""
        node = self._node
        if node.op is not None or node.handle is not None or node.host is None or pinned.is_pinned(node.host):
            return self
        array = pinned.pinned(node.host)
        if array is node.host:
            return self
        return Tensor._wrap(lazy.from_host(array, node.dtype, node.scope))

    def is_pinned(self) -> bool:
        """Whether this tensor's data waits in pinned memory (see `pin_memory`)."""
        host = self._node.host
        return self._node.handle is None and host is not None and pinned.is_pinned(host)

    def numpy(self) -> np.ndarray:
        """The values on the host, in the tensor's dtype (int64 and bool as numpy's)."""
        hook = lazy.local.host_read_hook
        if hook is not None:
            hook()
        node = self._node
        if node.pending or (node.handle is not None and node.handle.live and lazy.pending_write(node.handle)):
            lazy.realize([node])  # a value or a write not yet run: run it first
        for check in read_checks:
            check()
        if node.handle is None:
            stored = node.host.copy()  # never uploaded: no crossing
        elif not node.handle.live and node.handle.host_copy is not None:
            stored = node.handle.host_copy.copy()
        else:
            stored = node.handle.numpy()
        return dtypes.from_storage(stored, node.dtype)

    def __array__(self, dtype=None, copy=None):
        array = self.numpy()
        return array if dtype is None else array.astype(dtype)

    def __dlpack__(self, stream=None):
        """The values as a DLPack capsule (a host copy; numpy's exporter)."""
        return self.numpy().__dlpack__()

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU: the capsule holds host memory

    def item(self) -> float | int | bool:
        if self.numel() != 1:
            raise ValueError(f"item() needs a tensor of one element, this one has shape {self.shape}")
        return self.numpy().reshape(()).item()

    def tolist(self):
        return self.numpy().tolist()

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        value = lazy.host_integer(self._node)
        return int(self.item()) if value is None else value

    def __index__(self) -> int:
        if self.dtype.is_floating_point or self.numel() != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        value = lazy.host_integer(self._node)
        return int(self.item()) if value is None else value

    def __bool__(self) -> bool:
        if self.numel() != 1:
            raise RuntimeError(f"the truth value of a tensor of {self.numel()} elements is ambiguous; "
                               "use .any() or .all()")
        return bool(self.item())

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        """The rows along axis 0. Outside a recording tape (nothing to differentiate) the
        values are read once and the rows made from them: `[data[i] for i in ix]` costs
        one read, not one graph per element (nanoGPT's get_batch was 27x torch's)."""
        if not self.shape:
            raise TypeError("iteration over a 0-d tensor")
        if self.requires_grad and autograd.is_recording():
            return (self[i] for i in range(self.shape[0]))
        return (Tensor(row, dtype=self.dtype) for row in self.numpy())

    __hash__ = object.__hash__  # == is elementwise (as torch's); tensors hash by identity

    def __format__(self, spec: str) -> str:
        """f"{loss:.4f}" of a 0-d tensor formats its value (one read), as torch's."""
        if not self.shape:
            return format(self.item(), spec)
        return object.__format__(self, spec)

    # ---- new tensors like this one (torch's new_*: this dtype unless told) ---------------
    def new_tensor(self, data, dtype=None, device: str | None = None, requires_grad: bool = False) -> Tensor:
        return Tensor(data.numpy() if isinstance(data, Tensor) else data, dtype=dtype or self.dtype,
                      device=device, requires_grad=requires_grad)

    def new_full(self, size, fill_value, *, dtype=None, device: str | None = None,
                 requires_grad: bool = False) -> Tensor:
        return full(_shape_args((size,)), fill_value, dtype=dtype or self.dtype, device=device,
                    requires_grad=requires_grad)

    def new_zeros(self, *size, dtype=None, device: str | None = None, requires_grad: bool = False) -> Tensor:
        return self.new_full(_shape_args(size), 0, dtype=dtype, device=device, requires_grad=requires_grad)

    def new_ones(self, *size, dtype=None, device: str | None = None, requires_grad: bool = False) -> Tensor:
        return self.new_full(_shape_args(size), 1, dtype=dtype, device=device, requires_grad=requires_grad)

    def new_empty(self, *size, dtype=None, device: str | None = None, requires_grad: bool = False) -> Tensor:
        """Zeros: ggrad has no uninitialized memory to hand out (torch's values are unspecified)."""
        return self.new_zeros(*size, dtype=dtype, device=device, requires_grad=requires_grad)

    def __repr__(self) -> str:
        grad = ", requires_grad=True" if self.requires_grad else ""
        dtype = "" if self.dtype in (dtypes.float32, dtypes.int64, dtypes.bool_) else f", dtype={self.dtype}"
        try:
            body = np.array2string(self.numpy(), separator=", ", prefix="tensor(")
        except RuntimeError as err:  # a dead pass value: say so instead of failing to print
            body = f"<{err}>"
        return f"tensor({body}{dtype}{grad})"

    # ---- gradients -------------------------------------------------------------------
    @property
    def grad(self) -> Tensor | None:
        return self._grad

    @grad.setter
    def grad(self, value) -> None:
        if value is None:
            self._grad = None
            return
        if isinstance(value, Tensor):
            node = lazy.apply("cont", (value.node,), value.shape, value.dtype)
        else:
            node = lazy.from_host(*_host_array(value, self.dtype))
        if node.shape != self.shape:
            raise ValueError(f"grad of shape {node.shape} assigned to a tensor of shape {self.shape}")
        if node.dtype is not self.dtype:
            raise TypeError(f"grad of dtype {node.dtype} assigned to a tensor of dtype {self.dtype}")
        node.scope = "persistent"
        self._grad = Tensor._wrap(node)

    def _accumulate_grad(self, g: Tensor) -> None:
        """Add `g` into `.grad`, which stays on the device (persistent pool) until cleared."""
        if not self.requires_grad:
            return
        if self._grad is None:
            node = g.node
            if not (node.pending and node.scope == "pass"):  # shared or already kept: copy
                node = lazy.apply("cont", (node,), g.shape, g.dtype)
            node.scope = "persistent"  # claimed: a second claim of this node copies
            self._grad = Tensor._wrap(node)
        else:
            self._grad._assign(self._grad + g, temporary=True)

    def backward(self, grad=None) -> None:
        autograd.backward(self, grad)

    def _seed(self, grad) -> Tensor:
        """backward's starting gradient: `grad`, or 1 for a one-element tensor."""
        if grad is None:
            return ones_like(self)
        return grad if isinstance(grad, Tensor) else Tensor(grad)

    def detach(self) -> Tensor:
        return Tensor._wrap(self._node)

    # ---- copy.copy / copy.deepcopy (a model copied for an EMA or a best checkpoint) -------
    def __copy__(self) -> Tensor:
        """The same value, history and gradient (a holder of the value: counted, so a
        compiled step never writes over it while the copy lives)."""
        t = Tensor._wrap(self._node, self.requires_grad)
        t._ctx, t._grad, t._version = self._ctx, self._grad, self._version
        return t

    def __deepcopy__(self, memo: dict) -> Tensor:
        """A value of its own (persistent, as a parameter's), with requires_grad and a
        copy of the gradient; as torch, only for tensors made by the user (graph leaves)."""
        if self._ctx is not None:
            raise RuntimeError("only tensors created explicitly by the user (graph leaves) support the "
                               "deepcopy protocol, as in torch; copy x.detach() instead")
        with autograd.no_grad():
            t = Tensor(self)
            t.requires_grad = self.requires_grad
            memo[id(self)] = t
            if self._grad is not None:
                t._grad = self._grad.__deepcopy__(memo)
        return t

    # ---- in place --------------------------------------------------------------------
    def _assign(self, value: Tensor, temporary: bool = False) -> Tensor:
        """Make `value` this tensor's new value; a kept buffer is written in place.
        `temporary`: `value` is a Tensor only the caller holds, about to be dropped, so its
        node needs no copy of its own."""
        if autograd.is_recording() and self.requires_grad:
            raise RuntimeError("in-place update of a tensor that requires grad inside a grad_tape; "
                               "do it under `with ggrad.no_grad():`")
        if value.shape != self.shape:
            raise ValueError(f"shape mismatch: cannot assign {value.shape} into {self.shape}")
        if value.dtype != self.dtype:
            raise TypeError(f"dtype mismatch: cannot assign {value.dtype} into {self.dtype}")
        old, new = self._node, value.node
        if new.owners > int(temporary) or not new.pending:  # never let two tensors share a written node
            new = lazy.apply("cont", (new,), new.shape, new.dtype)
        new.scope = old.scope
        if not old.pending and old.scope == "persistent":
            lazy.store(old, new)
        elif old.pending:
            lazy.restore(old, new)
        self.node = new
        self._version += 1
        return self

    def _write_now(self, array: np.ndarray) -> bool:
        """Overwrite this tensor's value with host data right away (one upload, no graph),
        when nothing recorded still reads or writes it; False (nothing done) otherwise."""
        node = self._node
        if node.pending or lazy.pending_reader(node):
            return False
        handle = node.handle
        if handle is None:
            node.host = np.array(dtypes.to_storage(np.asarray(array), node.dtype)).reshape(node.shape)  # not uploaded yet
            self._version += 1
            return True
        if not handle.live or handle.device != runtime.get_device() or lazy.pending_write(handle):
            return False
        handle.write(np.ascontiguousarray(dtypes.to_storage(np.asarray(array), node.dtype)).reshape(node.shape))
        self._version += 1
        return True

    def assign_(self, value) -> Tensor:
        return self._assign(value if isinstance(value, Tensor) else Tensor(value, dtype=self.dtype))

    def _inplace_result(self, value: Tensor) -> Tensor:
        if value.dtype is not self.dtype:  # torch: x += 1.5 on an int tensor refuses
            if not (value.dtype.category <= self.dtype.category):
                raise TypeError(f"result type {value.dtype} cannot be written into a {self.dtype} tensor in place")
            value = value.to(self.dtype)
        return self._assign(value)


    def __imul__(self, other):
        return self._inplace_result(self * other)

    def __itruediv__(self, other):
        return self._inplace_result(self / other)

    mul_ = __imul__
    div_ = __itruediv__

    def zero_(self) -> Tensor:
        return self._assign(zeros_like(self))

    def fill_(self, value) -> Tensor:
        return self._assign(full_like(self, value))

    # ---- operators and torch's methods: functional/methods.py installs the rest ----------
    def __pos__(self): return self

    @property
    def data(self) -> Tensor:
        """This tensor's value without its gradient history (shares the value)."""
        return self.detach()

    def contiguous(self) -> Tensor:
        return self  # every ggrad tensor is contiguous

    def _extreme(self, values, indices, pairwise, dim, keepdim, axis, keepdims):
        if isinstance(dim, Tensor):
            return pairwise(self, dim)
        if axis is not None or keepdims is not None:  # the numpy spelling: values only
            return values(self, dim, keepdim, axis=axis, keepdims=keepdims)
        if dim is None:
            return values(self)
        return MinMax(values(self, dim, keepdim), indices(self, dim, keepdim))

    # ---- dtype and device (to, float, long...: functional/methods.py) ---------------------
    def type(self, dtype=None):
        if dtype is None:
            return f"ggrad.{self.dtype.name}"
        return self.to(dtype)

    def type_as(self, other: Tensor) -> Tensor: return self.to(other.dtype)
    def cpu(self) -> Tensor: return self.to("cpu")


class MinMax(NamedTuple):
    values: Tensor
    indices: Tensor


class TopK(NamedTuple):
    values: Tensor
    indices: Tensor


class Sort(NamedTuple):
    values: Tensor
    indices: Tensor


def _is_dtype_name(name: str) -> bool:
    try:
        dtypes.as_dtype(name)
    except TypeError:
        return False
    return True


def tensor(data, dtype=None, device: str | None = None, requires_grad: bool = False) -> Tensor:
    """A tensor from array-like data, as torch.tensor: floats -> float32 (float16 stays),
    Python and int64 integers -> int64, int32 -> int32, bools -> bool; or `dtype`."""
    if isinstance(dtype, bool) or (dtype is not None and not isinstance(dtype, (str, dtypes.dtype, type, np.dtype))
                                   and type(dtype).__module__ != "torch"):
        raise TypeError("tensor(data, dtype=None, device=None, requires_grad=False): pass requires_grad "
                        "by keyword")
    return Tensor(data, requires_grad=requires_grad, device=device, dtype=dtype)


def top_level_max(input, *args, **kwargs):
    """torch.max (ggrad.max): `input.max(...)`: the largest value; with `dim`, (values,
    indices); with a tensor, the elementwise maximum. (Named apart here so that this
    module's own max stays the builtin.)"""
    return (input if isinstance(input, Tensor) else Tensor(input)).max(*args, **kwargs)


def top_level_min(input, *args, **kwargs):
    """torch.min (ggrad.min), as `top_level_max`."""
    return (input if isinstance(input, Tensor) else Tensor(input)).min(*args, **kwargs)


def param(data, device: str | None = None) -> Tensor:
    """A trainable tensor: requires grad, kept in the persistent pool."""
    return Tensor(data, requires_grad=True, device=device)


def from_numpy(array: np.ndarray) -> Tensor:
    """A tensor of `array`'s dtype (float64 -> float32, the one dtype ggml lacks). Unlike
    torch's, it does not share memory: the data is uploaded on first use."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy expects a numpy array, got {type(array).__name__}")
    return Tensor(array)


def from_dlpack(obj) -> Tensor:
    """A tensor from any DLPack exporter on the host (numpy, torch CPU tensors...)."""
    return Tensor(np.from_dlpack(obj))


def _creation_dtype(dtype, default=dtypes.float32) -> dtypes.dtype:
    return default if dtype is None else dtypes.as_dtype(dtype)


def zeros(*size, dtype=None, device: str | None = None, requires_grad: bool = False) -> Tensor:
    return full(_shape_args(size), 0, dtype=_creation_dtype(dtype), device=device, requires_grad=requires_grad)


def ones(*size, dtype=None, device: str | None = None, requires_grad: bool = False) -> Tensor:
    return full(_shape_args(size), 1, dtype=_creation_dtype(dtype), device=device, requires_grad=requires_grad)


def full(size, fill_value, dtype=None, device: str | None = None, requires_grad: bool = False) -> Tensor:
    """A tensor of `size` holding `fill_value` (dtype from the value, as torch.full)."""
    dt = dtypes.scalar_dtype(fill_value) if dtype is None else dtypes.as_dtype(dtype)
    array = np.full(_shape_args((size,)), fill_value, dtype=dt.host)
    return Tensor(array, requires_grad=requires_grad, device=device, dtype=dt)


def full_like(t: Tensor, fill_value, dtype=None) -> Tensor:
    """Shaped like `t`, made on the device (ggml_fill: nothing uploaded)."""
    dt = t.dtype if dtype is None else dtypes.as_dtype(dtype)
    return Tensor._wrap(lazy.apply("fill", (t._node,), t.shape, dt, float(fill_value)))


def axis_index(axis: int, ndim: int) -> int:
    """`axis` (negative counts from the end) as an index into a shape of `ndim` axes (a
    0-d tensor takes axis 0 and -1, as torch's); the functional layer's `_axis`."""
    if not isinstance(axis, numbers.Integral) or not -ndim <= axis < max(ndim, 1):
        raise ValueError(f"axis {axis} is out of range for a tensor of {ndim} dimensions")
    return int(axis) % max(ndim, 1)


def zeros_like(t: Tensor, dtype=None) -> Tensor:
    return full_like(t, 0.0, dtype)


def ones_like(t: Tensor, dtype=None) -> Tensor:
    return full_like(t, 1.0, dtype)


def inplace(op: str, inputs: tuple[Tensor, ...], targets: tuple[Tensor, ...], arg=None, chained: bool = False) -> None:
    """Record an op that writes `targets` (all among `inputs`) in place, like ggml's fused
    optimizer steps; each target then holds its new value (same buffer). `chained`: see
    lazy.inplace."""
    versions = lazy.inplace(op, tuple([t._node for t in inputs]), tuple([t._node for t in targets]), arg, chained)
    for t, version in zip(targets, versions):
        t.node = version
        t._version += 1


def realize(*tensors: Tensor) -> None:
    """Run everything pending now (as one graph) without reading any value back."""
    lazy.realize([t.node for t in tensors])


def _shape_args(shape) -> tuple:
    if len(shape) == 1 and not isinstance(shape[0], numbers.Integral):
        shape = tuple(shape[0])
    return tuple(shape)

