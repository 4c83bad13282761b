"""The Tensor methods that the functional layer implements (operators, torch's methods,
conversions), installed on `Tensor` by `functional/__init__.py` once every function
exists: the tensor layer below knows nothing of this one.

`F` is the functional namespace, given to `install`."""

from __future__ import annotations

from types import ModuleType

from .. import dtypes
from ..tensor import Sort, Tensor, TopK, _check_device, _is_dtype_name

F: ModuleType  # set by install


class TensorMethods:
    """Written as methods (self is the Tensor); `install` copies them onto Tensor."""

    # ---- in place --------------------------------------------------------------------
    def copy_(self, src) -> Tensor:
        """Write `src` (broadcast, converted to this dtype) into this tensor, in place."""
        src = src if isinstance(src, Tensor) else Tensor(src, dtype=self.dtype)
        return self._assign(F.broadcast_to(src.to(self.dtype), self.shape))

    def __setitem__(self, index, value) -> None:
        F.setitem(self, index, value)

    def add_(self, other, *, alpha=1) -> Tensor:
        return self._inplace_result(F.add(self, other, alpha))

    def sub_(self, other, *, alpha=1) -> Tensor:
        return self._inplace_result(F.sub(self, other, alpha))

    __iadd__ = add_
    __isub__ = sub_

    def addcmul(self, tensor1, tensor2, *, value=1) -> Tensor: return F.addcmul(self, tensor1, tensor2, value=value)

    def addcdiv(self, tensor1, tensor2, *, value=1) -> Tensor: return F.addcdiv(self, tensor1, tensor2, value=value)

    def addcmul_(self, tensor1, tensor2, *, value=1) -> Tensor:
        return self._inplace_result(F.addcmul(self, tensor1, tensor2, value=value))

    def addcdiv_(self, tensor1, tensor2, *, value=1) -> Tensor:
        return self._inplace_result(F.addcdiv(self, tensor1, tensor2, value=value))

    def clamp_(self, min=None, max=None) -> Tensor:
        return self._inplace_result(F.clamp(self, min, max))

    def masked_fill_(self, mask, value) -> Tensor:
        return self._inplace_result(F.masked_fill(self, mask, value))

    # ---- operators (functional/ holds the rules) ---------------------------------------
    def __add__(self, other): return F.add(self, other)

    def __radd__(self, other): return F.add(other, self)

    def __sub__(self, other): return F.sub(self, other)

    def __rsub__(self, other): return F.sub(other, self)

    def __mul__(self, other): return F.mul(self, other)

    def __rmul__(self, other): return F.mul(other, self)

    def __truediv__(self, other): return F.div(self, other)

    def __rtruediv__(self, other): return F.div(other, self)

    def __floordiv__(self, other): return F.floor_divide(self, other)

    def __rfloordiv__(self, other): return F.floor_divide(other, self)

    def __mod__(self, other): return F.remainder(self, other)

    def __rmod__(self, other): return F.remainder(other, self)

    def __matmul__(self, other): return F.matmul(self, other)

    def __rmatmul__(self, other): return F.matmul(other, self)

    def __pow__(self, p): return F.pow(self, p)

    def __neg__(self): return F.neg(self)

    def __abs__(self): return F.abs(self)

    def __getitem__(self, index): return F.getitem(self, index)

    def __eq__(self, other): return F.eq(self, other)  # type: ignore[override]

    def __ne__(self, other): return F.ne(self, other)  # type: ignore[override]

    def __lt__(self, other): return F.lt(self, other)

    def __le__(self, other): return F.le(self, other)

    def __gt__(self, other): return F.gt(self, other)

    def __ge__(self, other): return F.ge(self, other)

    def __and__(self, other): return F.compare._bitwise("&", self, other)

    def __rand__(self, other): return F.compare._bitwise("&", other, self)

    def __or__(self, other): return F.compare._bitwise("|", self, other)

    def __ror__(self, other): return F.compare._bitwise("|", other, self)

    def __xor__(self, other): return F.compare._bitwise("^", self, other)

    def __rxor__(self, other): return F.compare._bitwise("^", other, self)

    def __invert__(self):
        if self.dtype is not dtypes.bool_:
            raise TypeError(f"~ is supported on bool tensors only, got {self.dtype}")
        return F.logical_not(self)

    # ---- torch-style methods ------------------------------------------------------------
    @property
    def T(self) -> Tensor:
        return F.permute(self, tuple(reversed(range(self.ndim)))) if self.ndim > 2 else F.transpose(self)

    @property
    def mT(self) -> Tensor:
        return F.transpose(self, -2, -1)

    def t(self) -> Tensor:
        if self.ndim > 2:
            raise ValueError(f"t() expects a tensor of at most 2 dimensions, got {self.ndim}")
        return F.transpose(self)

    def transpose(self, dim0: int = -2, dim1: int = -1) -> Tensor: return F.transpose(self, dim0, dim1)

    def permute(self, *dims) -> Tensor: return F.permute(self, *dims)

    def reshape(self, *shape) -> Tensor: return F.reshape(self, *shape)

    view = reshape

    def view_as(self, other: Tensor) -> Tensor: return F.reshape(self, other.shape)

    def reshape_as(self, other: Tensor) -> Tensor: return F.reshape(self, other.shape)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor: return F.flatten(self, start_dim, end_dim)

    def unflatten(self, dim: int, sizes) -> Tensor: return F.unflatten(self, dim, sizes)

    def squeeze(self, dim=None) -> Tensor: return F.squeeze(self, dim)

    def unsqueeze(self, dim: int) -> Tensor: return F.unsqueeze(self, dim)

    def expand(self, *sizes) -> Tensor: return F.expand(self, *sizes)

    def expand_as(self, other: Tensor) -> Tensor: return F.broadcast_to(self, other.shape)

    def repeat(self, *repeats) -> Tensor: return F.repeat(self, *repeats)

    def movedim(self, source: int, destination: int) -> Tensor: return F.movedim(self, source, destination)

    def narrow(self, dim: int, start: int, length: int) -> Tensor: return F.narrow(self, dim, start, length)

    def chunk(self, chunks: int, dim: int = 0): return F.chunk(self, chunks, dim)

    def split(self, split_size, dim: int = 0): return F.split(self, split_size, dim)

    def clone(self) -> Tensor:
        """A copy with its own buffer; gradients flow through it to this tensor."""
        return F._core._apply("cont", (self,), self.shape, lambda ctx, g: (g,), dtype=self.dtype)

    def sum(self, dim=None, keepdim: bool = False, *, axis=None, keepdims=None, dtype=None) -> Tensor:
        return F.sum(self, dim, keepdim, axis=axis, keepdims=keepdims, dtype=dtype)

    def mean(self, dim=None, keepdim: bool = False, *, axis=None, keepdims=None, dtype=None) -> Tensor:
        return F.mean(self, dim, keepdim, axis=axis, keepdims=keepdims, dtype=dtype)

    def var(self, dim=None, keepdim: bool = False, *, correction=1, unbiased=None) -> Tensor:
        return F.var(self, dim, keepdim, correction=correction, unbiased=unbiased)

    def std(self, dim=None, keepdim: bool = False, *, correction=1, unbiased=None) -> Tensor:
        return F.std(self, dim, keepdim, correction=correction, unbiased=unbiased)

    def norm(self, p=2, dim=None, keepdim: bool = False) -> Tensor:
        return F.norm(self, p, dim, keepdim)

    def max(self, dim=None, keepdim: bool = False, *, axis=None, keepdims=None):
        """The largest value; with `dim`, (values, indices) as torch's; with a tensor,
        the elementwise maximum."""
        return self._extreme(F.max, F.argmax, F.maximum, dim, keepdim, axis, keepdims)

    def min(self, dim=None, keepdim: bool = False, *, axis=None, keepdims=None):
        return self._extreme(F.min, F.argmin, F.minimum, dim, keepdim, axis, keepdims)

    def amax(self, dim=None, keepdim: bool = False) -> Tensor: return F.amax(self, dim, keepdim)

    def amin(self, dim=None, keepdim: bool = False) -> Tensor: return F.amin(self, dim, keepdim)

    def argmax(self, dim=None, keepdim: bool = False, *, axis=None) -> Tensor: return F.argmax(self, dim, keepdim, axis=axis)

    def argmin(self, dim=None, keepdim: bool = False, *, axis=None) -> Tensor: return F.argmin(self, dim, keepdim, axis=axis)

    def cumsum(self, dim: int, *, dtype=None) -> Tensor: return F.cumsum(self, dim, dtype=dtype)

    def multinomial(self, num_samples: int, replacement: bool = False, *, generator=None) -> Tensor:
        return F.multinomial(self, num_samples, replacement, generator=generator)

    def topk(self, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
        return TopK(*F.topk(self, k, dim, largest, sorted))

    def sort(self, dim: int = -1, descending: bool = False):
        return Sort(*F.sort(self, dim, descending))

    def argsort(self, dim: int = -1, descending: bool = False) -> Tensor: return F.argsort(self, dim, descending)

    def any(self, dim=None, keepdim: bool = False) -> Tensor: return F.any(self, dim, keepdim)

    def all(self, dim=None, keepdim: bool = False) -> Tensor: return F.all(self, dim, keepdim)

    def exp(self) -> Tensor: return F.exp(self)

    def log(self) -> Tensor: return F.log(self)

    def sqrt(self) -> Tensor: return F.sqrt(self)

    def abs(self) -> Tensor: return F.abs(self)

    def neg(self) -> Tensor: return F.neg(self)

    def sign(self) -> Tensor: return F.sign(self)

    def square(self) -> Tensor: return F.square(self)

    def pow(self, p) -> Tensor: return F.pow(self, p)

    def floor(self) -> Tensor: return F.floor(self)

    def ceil(self) -> Tensor: return F.ceil(self)

    def round(self) -> Tensor: return F.round(self)

    def trunc(self) -> Tensor: return F.trunc(self)

    def relu(self) -> Tensor: return F.relu(self)

    def sigmoid(self) -> Tensor: return F.sigmoid(self)

    def tanh(self) -> Tensor: return F.tanh(self)

    def softmax(self, dim: int = -1) -> Tensor: return F.softmax(self, dim)

    def log_softmax(self, dim: int = -1) -> Tensor: return F.log_softmax(self, dim)

    def clamp(self, min=None, max=None) -> Tensor: return F.clamp(self, min, max)

    clip = clamp

    def maximum(self, other) -> Tensor: return F.maximum(self, other)

    def minimum(self, other) -> Tensor: return F.minimum(self, other)

    def where(self, condition, other) -> Tensor: return F.where(condition, self, other)

    def masked_fill(self, mask, value) -> Tensor: return F.masked_fill(self, mask, value)

    def isnan(self) -> Tensor: return F.isnan(self)

    def isinf(self) -> Tensor: return F.isinf(self)

    def isfinite(self) -> Tensor: return F.isfinite(self)

    def logical_and(self, other) -> Tensor: return F.logical_and(self, other)

    def logical_or(self, other) -> Tensor: return F.logical_or(self, other)

    def logical_xor(self, other) -> Tensor: return F.logical_xor(self, other)

    def logical_not(self) -> Tensor: return F.logical_not(self)

    def eq(self, other) -> Tensor: return F.eq(self, other)

    def ne(self, other) -> Tensor: return F.ne(self, other)

    def lt(self, other) -> Tensor: return F.lt(self, other)

    def le(self, other) -> Tensor: return F.le(self, other)

    def gt(self, other) -> Tensor: return F.gt(self, other)

    def ge(self, other) -> Tensor: return F.ge(self, other)

    def add(self, other, alpha=1) -> Tensor: return F.add(self, other, alpha)

    def sub(self, other, alpha=1) -> Tensor: return F.sub(self, other, alpha)

    def mul(self, other) -> Tensor: return F.mul(self, other)

    def div(self, other, rounding_mode=None) -> Tensor: return F.div(self, other, rounding_mode)

    def matmul(self, other) -> Tensor: return F.matmul(self, other)

    def tril(self, diagonal: int = 0) -> Tensor: return F.tril(self, diagonal)

    def triu(self, diagonal: int = 0) -> Tensor: return F.triu(self, diagonal)

    def tril_(self, diagonal: int = 0) -> Tensor: return self._inplace_result(F.tril(self, diagonal))

    def triu_(self, diagonal: int = 0) -> Tensor: return self._inplace_result(F.triu(self, diagonal))

    # ---- dtype and device ---------------------------------------------------------------
    def to(self, *args, dtype=None, device=None, copy: bool = False) -> Tensor:
        """``.to(dtype)``, ``.to(device)``, ``.to(device, dtype)`` or ``.to(other)``.
        ggrad runs one device at a time (the README says why): a device must be the
        current one; ``Module.to(device)`` (or ggrad.set_device) switches it."""
        for a in args:
            if isinstance(a, Tensor):
                dtype = a.dtype
            elif isinstance(a, str) and not _is_dtype_name(a):
                device = a
            else:
                dtype = a
        _check_device(device)
        out = self if dtype is None else F.cast(self, dtype)
        return out.clone() if copy and out is self else out

    def float(self) -> Tensor: return F.cast(self, dtypes.float32)

    def half(self) -> Tensor: return F.cast(self, dtypes.float16)

    def bfloat16(self) -> Tensor: return F.cast(self, dtypes.bfloat16)

    def int(self) -> Tensor: return F.cast(self, dtypes.int32)

    def long(self) -> Tensor: return F.cast(self, dtypes.int64)

    def bool(self) -> Tensor: return F.cast(self, dtypes.bool_)


# what Python puts in a class's namespace itself (__hash__: None, as the class defines
# __eq__; Tensor hashes by identity)
_CLASS_ENTRIES = {"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__firstlineno__",
                  "__static_attributes__", "__hash__"}


def install(functional: ModuleType) -> None:
    global F
    F = functional
    for name, member in vars(TensorMethods).items():
        if name not in _CLASS_ENTRIES:
            setattr(Tensor, name, member)
