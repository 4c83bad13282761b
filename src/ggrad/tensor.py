"""`Tensor`: what users hold. A lazy value on the current device, with autograd.

A tensor wraps a `lazy.Node`. Operations add nodes; reading a value (`numpy`, `item`,
`float`, printing) runs everything pending as one graph. Data made from host arrays is
uploaded once, on first use, into the persistent pool, so constant inputs cross once.
"""

from __future__ import annotations

import math
import numbers
from typing import Callable

import numpy as np

from . import autograd, lazy, runtime
from .runtime.graph import as_host_array


def _host_array(data) -> np.ndarray:
    """Floats become float32, integers and bools int32; anything else is refused."""
    try:
        array = np.asarray(data)
    except ValueError as err:
        raise ValueError(f"tensor data is ragged (rows of different lengths): {err}") from None
    if array.dtype.kind == "f":
        array = array.astype(np.float32, copy=False)
    elif array.dtype.kind in "iub":
        if array.size and array.dtype.kind != "b" and (array.min() < -2**31 or array.max() >= 2**31):
            raise ValueError("integer tensor data does not fit in int32")
        array = array.astype(np.int32, copy=False)
    return as_host_array(array, "tensor data")


# Called before any read of a tensor's values on the host (set while ggrad.compile traces).
host_read_hook: Callable[[], None] | None = None


def _check_device(device) -> None:
    if device is not None and runtime.backend.resolve(device) != runtime.get_device():
        raise ValueError(f"ggrad runs on one device at a time (now {runtime.get_device()!r}); "
                         f"call ggrad.set_device({device!r}) first")


class Tensor:
    """A lazy n-d array (at most 4 dimensions) on the current device."""

    __slots__ = ("_node", "requires_grad", "_ctx", "_grad", "__weakref__")
    __array_priority__ = 100  # numpy defers to our reflected operators

    def __init__(self, data, requires_grad: bool = False, device: str | None = None) -> None:
        _check_device(device)
        if isinstance(data, Tensor):
            node = lazy.apply("cont", (data._node,), data.shape, data.dtype)
            node.scope = "persistent"
        else:
            node = lazy.from_host(_host_array(data))
        self._node = None
        self.node = node
        self._ctx: autograd.Context | None = None
        self._grad: Tensor | None = None
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
        t.requires_grad = requires_grad
        return t

    def __del__(self) -> None:
        node = getattr(self, "_node", None)
        if node is not None:
            node.owners -= 1

    @property
    def node(self) -> lazy.Node:
        return self._node

    @node.setter
    def node(self, node: lazy.Node) -> None:
        if self._node is not None:
            self._node.owners -= 1
        node.owners += 1
        self._node = node

    # ---- what a tensor is --------------------------------------------------------
    shape = property(lambda self: self._node.shape)
    dtype = property(lambda self: self._node.dtype)
    ndim = property(lambda self: len(self._node.shape))
    size = property(lambda self: math.prod(self._node.shape))
    is_leaf = property(lambda self: self._ctx is None)

    @property
    def device(self) -> str:
        handle = self._node.handle
        return handle.device if handle is not None and handle.live else runtime.get_device()

    def requires_grad_(self, flag: bool = True) -> Tensor:
        if flag and self.dtype != np.float32:
            raise TypeError(f"only float tensors can require grad, this one is {self.dtype}")
        self.requires_grad = flag
        return self

    # ---- values: reading is where work runs ----------------------------------------
    @property
    def handle(self) -> runtime.Handle:
        """The runtime handle holding this value on the device (runs pending work)."""
        return lazy.ensure_on_device(self._node)

    def numpy(self) -> np.ndarray:
        if host_read_hook is not None:
            host_read_hook()
        node = self._node
        if not node.pending and node.handle is None:
            return node.host.copy()  # never uploaded: no crossing
        if not node.pending and not node.handle.live and node.handle.host_copy is not None:
            return node.handle.host_copy.copy()
        if node.pending or lazy.pending_write(node.handle):  # a write not yet run: run it first
            lazy.realize([node])
        return node.handle.numpy()

    def __array__(self, dtype=None, copy=None):
        array = self.numpy()
        return array if dtype is None else array.astype(dtype)

    def item(self) -> float | int:
        if self.size != 1:
            raise ValueError(f"item() needs a tensor of one element, this one has shape {self.shape}")
        return self.numpy().reshape(()).item()

    def tolist(self):
        return self.numpy().tolist()

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __bool__(self) -> bool:
        return bool(self.item())

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        grad = ", requires_grad=True" if self.requires_grad else ""
        try:
            body = np.array2string(self.numpy(), separator=", ", prefix="tensor(")
        except RuntimeError as err:  # a dead pass value: say so instead of failing to print
            body = f"<{err}>"
        return f"tensor({body}{grad})"

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
            node = lazy.from_host(_host_array(value))
        if node.shape != self.shape:
            raise ValueError(f"grad of shape {node.shape} assigned to a tensor of shape {self.shape}")
        if node.dtype != np.float32:
            raise TypeError(f"grad must be float, got {node.dtype}")
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
            self._grad._assign(self._grad + g)

    def backward(self, grad=None) -> None:
        autograd.backward(self, grad)

    def detach(self) -> Tensor:
        return Tensor._wrap(self._node)

    # ---- in place --------------------------------------------------------------------
    def _assign(self, value: Tensor) -> Tensor:
        """Make `value` this tensor's new value; a kept buffer is written in place."""
        if autograd.is_recording() and self.requires_grad:
            raise RuntimeError("in-place update of a tensor that requires grad inside a grad_tape; "
                               "do it under `with ggrad.no_grad():`")
        if value.shape != self.shape:
            raise ValueError(f"shape mismatch: cannot assign {value.shape} into {self.shape}")
        if value.dtype != self.dtype:
            raise TypeError(f"dtype mismatch: cannot assign {value.dtype} into {self.dtype}")
        old, new = self._node, value.node
        if new.owners > 0 or not new.pending:  # never let two tensors share a written node
            new = lazy.apply("cont", (new,), new.shape, new.dtype)
        new.scope = old.scope
        if not old.pending and old.scope == "persistent":
            lazy.store(old, new)
        self.node = new
        return self

    def _write_now(self, array: np.ndarray) -> bool:
        """Overwrite this tensor's value with host data right away (one upload, no graph),
        when nothing recorded still reads or writes it; False (nothing done) otherwise."""
        node = self._node
        if node.pending or lazy.pending_reader(node):
            return False
        handle = node.handle
        if handle is None:
            node.host = np.array(array, dtype=node.dtype).reshape(node.shape)  # not uploaded yet
            return True
        if not handle.live or handle.device != runtime.get_device() or lazy.pending_write(handle):
            return False
        handle.write(np.ascontiguousarray(array, dtype=node.dtype).reshape(node.shape))
        return True

    def assign_(self, value) -> Tensor:
        return self._assign(value if isinstance(value, Tensor) else Tensor(value))

    def __iadd__(self, other):
        return self._assign(self + other)

    def __isub__(self, other):
        return self._assign(self - other)

    def __imul__(self, other):
        return self._assign(self * other)

    def __itruediv__(self, other):
        return self._assign(self / other)

    add_ = __iadd__
    sub_ = __isub__
    mul_ = __imul__
    div_ = __itruediv__

    def zero_(self) -> Tensor:
        return self._assign(zeros_like(self))

    # ---- operators (functional.py holds the rules) -------------------------------------
    def __add__(self, other): return F.add(self, other)
    def __radd__(self, other): return F.add(other, self)
    def __sub__(self, other): return F.sub(self, other)
    def __rsub__(self, other): return F.sub(other, self)
    def __mul__(self, other): return F.mul(self, other)
    def __rmul__(self, other): return F.mul(other, self)
    def __truediv__(self, other): return F.div(self, other)
    def __rtruediv__(self, other): return F.div(other, self)
    def __matmul__(self, other): return F.matmul(self, other)
    def __rmatmul__(self, other): return F.matmul(other, self)
    def __pow__(self, p): return F.pow(self, p)
    def __neg__(self): return F.neg(self)
    def __getitem__(self, index): return F.getitem(self, index)

    @property
    def T(self) -> Tensor:
        return F.transpose(self)

    def transpose(self, dim0: int = -2, dim1: int = -1) -> Tensor: return F.transpose(self, dim0, dim1)
    def permute(self, *axes) -> Tensor: return F.permute(self, *axes)
    def reshape(self, *shape) -> Tensor: return F.reshape(self, *shape)
    def sum(self, axis=None, keepdims: bool = False) -> Tensor: return F.sum(self, axis, keepdims)
    def mean(self, axis=None, keepdims: bool = False) -> Tensor: return F.mean(self, axis, keepdims)
    def max(self, axis=None, keepdims: bool = False) -> Tensor: return F.max(self, axis, keepdims)
    def argmax(self, axis: int = -1) -> Tensor: return F.argmax(self, axis)
    def exp(self) -> Tensor: return F.exp(self)
    def log(self) -> Tensor: return F.log(self)
    def sqrt(self) -> Tensor: return F.sqrt(self)
    def abs(self) -> Tensor: return F.abs(self)
    def relu(self) -> Tensor: return F.relu(self)
    def sigmoid(self) -> Tensor: return F.sigmoid(self)
    def tanh(self) -> Tensor: return F.tanh(self)
    def softmax(self, axis: int = -1) -> Tensor: return F.softmax(self, axis)
    def log_softmax(self, axis: int = -1) -> Tensor: return F.log_softmax(self, axis)
    def clamp(self, min=None, max=None) -> Tensor: return F.clamp(self, min, max)
    def float(self) -> Tensor: return F.cast(self, np.float32)
    def int(self) -> Tensor: return F.cast(self, np.int32)


def tensor(data, requires_grad: bool = False, device: str | None = None) -> Tensor:
    """A tensor from array-like data (float -> float32, integer -> int32)."""
    return Tensor(data, requires_grad=requires_grad, device=device)


def param(data, device: str | None = None) -> Tensor:
    """A trainable tensor: requires grad, kept in the persistent pool."""
    return Tensor(data, requires_grad=True, device=device)


def zeros(*shape, dtype=np.float32) -> Tensor:
    return Tensor(np.zeros(_shape_args(shape), dtype=dtype))


def ones(*shape, dtype=np.float32) -> Tensor:
    return Tensor(np.ones(_shape_args(shape), dtype=dtype))


def full(shape, value: float, dtype=np.float32) -> Tensor:
    return Tensor(np.full(_shape_args((shape,)), value, dtype=dtype))


def zeros_like(t: Tensor) -> Tensor:
    return F.fill(t, 0.0)


def ones_like(t: Tensor) -> Tensor:
    return F.fill(t, 1.0)


def inplace(op: str, inputs: tuple[Tensor, ...], targets: tuple[Tensor, ...], arg=None) -> None:
    """Record an op that writes `targets` (all among `inputs`) in place, like ggml's fused
    optimizer steps; each target then holds its new value (same buffer)."""
    versions = lazy.inplace(op, tuple(t.node for t in inputs), tuple(t.node for t in targets), arg)
    for t, version in zip(targets, versions):
        t.node = version


def realize(*tensors: Tensor) -> None:
    """Run everything pending now (as one graph) without reading any value back."""
    lazy.realize([t.node for t in tensors])


def _shape_args(shape) -> tuple:
    if len(shape) == 1 and not isinstance(shape[0], numbers.Integral):
        shape = tuple(shape[0])
    return tuple(shape)


from . import functional as F  # noqa: E402  (functional builds on Tensor)
