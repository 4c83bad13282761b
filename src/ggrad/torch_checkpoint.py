"""PyTorch's checkpoints (torch.save's zip format), read without torch and without running
any code from the file: a pickle whose globals may only be torch's tensor rebuilders,
its storage types and OrderedDict, as `torch.load(weights_only=True)` allows. Tensors
come back as numpy arrays (bfloat16 through ml_dtypes), containers and numbers as they
were; a tensor stored once under two names (tied weights) is one array under both."""

from __future__ import annotations

import collections
import pickle
import zipfile

import ml_dtypes
import numpy as np

_STORAGES = {
    "FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
    "BFloat16Storage": ml_dtypes.bfloat16, "LongStorage": np.int64, "IntStorage": np.int32,
    "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8, "BoolStorage": np.bool_,
}


def _rebuild_tensor(storage: np.ndarray, offset: int, size, stride, requires_grad=False, hooks=None,
                    metadata=None) -> np.ndarray:
    """torch._utils._rebuild_tensor_v2: the elements of `storage` at `offset` with `size`
    and `stride` (in elements), bounds checked before any memory is read."""
    size, stride = tuple(int(n) for n in size), tuple(int(s) for s in stride)
    offset = int(offset)
    if not isinstance(storage, np.ndarray) or len(size) != len(stride) or offset < 0 \
            or any(n < 0 for n in size) or any(s < 0 for s in stride):
        raise pickle.UnpicklingError(f"a tensor of size {size} and stride {stride} at offset {offset} is malformed")
    if 0 in size:
        return np.zeros(size, dtype=storage.dtype)
    last = offset + sum((n - 1) * s for n, s in zip(size, stride))
    if last >= storage.size:
        raise pickle.UnpicklingError(f"a tensor of size {size} and stride {stride} at offset {offset} reads past "
                                     f"its storage of {storage.size} elements")
    view = np.lib.stride_tricks.as_strided(storage[offset:], size, tuple(s * storage.itemsize for s in stride),
                                           writeable=False)
    return np.array(view)


def _rebuild_parameter(data: np.ndarray, requires_grad=True, hooks=None, state=None) -> np.ndarray:
    return data


_GLOBALS = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch", "Size"): tuple,
    # a storage type stands for itself as a tuple: immutable, so a pickle cannot BUILD
    # another element type into it (the element type is looked up by name when read)
    **{("torch", name): ("torch", name) for name in _STORAGES},
}


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, archive: zipfile.ZipFile, prefix: str) -> None:
        super().__init__(file)
        self._archive, self._prefix = archive, prefix
        self._storages: dict[str, np.ndarray] = {}

    def find_class(self, module: str, name: str):
        found = _GLOBALS.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(
                f"{module}.{name} is not allowed: ggrad reads tensors, numbers, strings and containers from "
                "PyTorch checkpoints (torch.load(weights_only=True)'s rule), never other objects or code")
        return found

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], tuple)
                and len(pid[1]) == 2 and pid[1][0] == "torch" and pid[1][1] in _STORAGES):
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}: not a tensor storage")
        _, (_, kind), key, _location, numel = pid
        dtype, key = np.dtype(_STORAGES[kind]), str(key)
        if key not in self._storages:
            raw = self._archive.read(f"{self._prefix}data/{key}")
            count = len(raw) // dtype.itemsize
            if int(numel) > count:
                raise pickle.UnpicklingError(f"storage {key} claims {numel} elements, its file holds {count}")
            self._storages[key] = np.frombuffer(raw, dtype=dtype, count=count)
        return self._storages[key]


def load(path_or_file):
    """The object torch.save wrote (its zip format), tensors as numpy arrays. A global
    other than torch's tensor rebuilders and OrderedDict raises pickle.UnpicklingError
    before anything is built from it."""
    with zipfile.ZipFile(path_or_file) as archive:
        names = archive.namelist()
        pickles = [n for n in names if n.endswith("data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise ValueError("not a PyTorch checkpoint: no single <name>/data.pkl in the archive")
        prefix = pickles[0][:-len("data.pkl")]
        order = archive.read(prefix + "byteorder").decode().strip() if prefix + "byteorder" in names else "little"
        if order != "little":
            raise ValueError(f"a PyTorch checkpoint written in {order}-endian byte order: ggrad reads little-endian")
        with archive.open(pickles[0]) as data:
            return _Unpickler(data, archive, prefix).load()
