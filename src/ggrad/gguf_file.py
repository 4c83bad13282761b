"""A GGUF file's header walked with its counts, sizes and offsets checked against the bytes
that are there (gguf.py's loader checks a file with it before gguf's reader trusts it), and
its keys read without gguf's reader (the tokenizer's vocabularies)."""

from __future__ import annotations

import mmap
import os
import struct

import numpy as np


def walk(path: str, caller: str, visit):
    """`visit(layout)`'s result over the GGUF file at `path`, mapped read-only; errors name
    `caller` and the file (missing, empty, or a layout that does not hold)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{caller}: no file at {path}")
    if os.path.getsize(path) == 0:
        raise ValueError(f"{caller}: {path} is empty, not a GGUF file")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return visit(Layout(path, data, caller))


def read_keys(path: str, wanted, caller: str) -> dict:
    """The values of the keys of the GGUF file at `path` that `wanted(key)` accepts."""
    return walk(path, caller, lambda layout: layout.keys(wanted))


class Layout:
    """A walk over a GGUF file's header that checks each count, size and offset against the
    bytes that are there, as ggml's gguf_init_from_file does, before gguf's Python reader
    trusts them (that reader loops without end on an array whose count runs past the
    file's end, and a wrong size reaches the user as IndexError or "cannot reshape")."""

    MAX_DIMS = 4  # GGML_MAX_DIMS
    # struct formats of GGUF's scalar value types (gguf.GGUFValueType; 8 is STRING, 9 ARRAY)
    SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
    STRING, ARRAY = 8, 9

    def __init__(self, path: str, data, caller: str) -> None:
        self.path, self.data, self.offset, self.caller = path, data, 0, caller

    def fail(self, what: str) -> ValueError:
        return ValueError(f"{self.caller}: {self.path} is not a readable GGUF file: {what}")

    def take(self, fmt: str, what: str):
        size = struct.calcsize(fmt)
        if self.offset + size > len(self.data):
            raise self.fail(f"it ends inside {what}")
        (value,) = struct.unpack_from(fmt, self.data, self.offset)
        self.offset += size
        return value

    def skip(self, size: int, what: str) -> None:
        if size > len(self.data) - self.offset:
            raise self.fail(f"{what} runs {size} bytes past byte {self.offset} of {len(self.data)}")
        self.offset += size

    def string(self, what: str) -> bytes:
        size = self.take("<Q", what)
        self.skip(size, what)
        return bytes(self.data[self.offset - size:self.offset])

    def value(self, kind: int, key: str, keep: bool = False):
        """Step over one value of GGUF type `kind`; a scalar's value is returned, and with
        `keep` a string's (str) and an array's (a list), None else."""
        if kind == self.STRING:
            text = self.string(f"the value of {key!r}")
            return text.decode("utf-8", errors="replace") if keep else None
        if kind == self.ARRAY:
            item, count = self.take("<I", f"the value of {key!r}"), self.take("<Q", f"the value of {key!r}")
            if item == self.STRING:
                # 8 bytes a string at least: the walk ends with the file
                texts = [self.string(f"the array {key!r}") for _ in range(count)]
                return [t.decode("utf-8", errors="replace") for t in texts] if keep else None
            if item in self.SCALARS:
                fmt = self.SCALARS[item]
                start = self.offset
                self.skip(count * struct.calcsize(fmt), f"the array {key!r}")
                return np.frombuffer(self.data, np.dtype(fmt), count, start).tolist() if keep else None
            else:
                raise self.fail(f"key {key!r} is an array of the type {item}, which GGUF does not have (arrays "
                                "of arrays included)")
        if kind in self.SCALARS:
            return self.take(self.SCALARS[kind], f"the value of {key!r}")
        raise self.fail(f"key {key!r} has the type {kind}, which GGUF does not have")

    def header(self) -> tuple[int, int]:
        """The tensor and key counts, after the magic and version are checked."""
        if self.take("<4s", "the magic") != b"GGUF":
            raise self.fail("it does not start with GGUF's magic")
        version = self.take("<I", "the version")
        if version not in (2, 3):
            raise self.fail(f"GGUF version {version} (ggml reads versions 2 and 3, little-endian)")
        return self.take("<Q", "the tensor count"), self.take("<Q", "the key count")

    def keys(self, wanted) -> dict:
        """The values of the keys `wanted(key)` accepts (strings and arrays as Python lists):
        gguf's own reader builds a numpy view per string, seconds for a 150k-token vocabulary."""
        _, n_keys = self.header()
        found = {}
        for _ in range(n_keys):
            key = self.string("a key").decode("utf-8", errors="replace")
            keep = wanted(key)
            value = self.value(self.take("<I", f"the type of {key!r}"), key, keep)
            if keep:
                found[key] = value
        return found

    def check(self) -> None:
        import gguf

        n_tensors, n_keys = self.header()
        alignment = gguf.GGUF_DEFAULT_ALIGNMENT
        for _ in range(n_keys):  # each key takes 12 bytes at least: the walk ends with the file
            key = self.string("a key").decode("utf-8", errors="replace")
            value = self.value(self.take("<I", f"the type of {key!r}"), key)
            if key == "general.alignment":
                alignment = value
        if type(alignment) is not int or alignment < 1 or alignment & (alignment - 1):
            raise self.fail(f"general.alignment {alignment!r} is not a power of two")
        infos = [self.tensor_info() for _ in range(n_tensors)]
        names = [name for name, *_ in infos]
        if len(set(names)) != len(names):
            raise self.fail("two tensors have one name")
        data_start = -(-self.offset // alignment) * alignment
        expected = 0
        for name, offset, nbytes in infos:  # in order and packed, as ggml requires
            if offset != expected:
                raise self.fail(f"tensor {name!r} starts at offset {offset}, expected {expected}")
            if data_start + offset + nbytes > len(self.data):
                raise self.fail(f"tensor {name!r} runs past the end of the file")
            expected += -(-nbytes // alignment) * alignment

    def tensor_info(self) -> tuple[str, int, int]:
        """(name, offset, bytes) of the next tensor, its dims and type checked."""
        import gguf

        name = self.string("a tensor name").decode("utf-8", errors="replace")
        n_dims = self.take("<I", f"tensor {name!r}")
        if n_dims > self.MAX_DIMS:
            raise self.fail(f"tensor {name!r} has {n_dims} dimensions (ggml has at most {self.MAX_DIMS})")
        ne = [self.take("<Q", f"tensor {name!r}") for _ in range(n_dims)]
        kind, offset = self.take("<I", f"tensor {name!r}"), self.take("<Q", f"tensor {name!r}")
        try:
            block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            raise self.fail(f"tensor {name!r} has the unknown type {kind}") from None
        if ne and ne[0] % block:
            raise self.fail(f"tensor {name!r} has rows of {ne[0]} values, not a multiple of its type's block {block}")
        count = int(np.prod(ne, dtype=object))
        if count >= 2 ** 63:
            raise self.fail(f"tensor {name!r} has shape {ne}: more elements than ggml can count")
        return name, offset, count // block * block_bytes
