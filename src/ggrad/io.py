"""Checkpoints: state dicts, models and optimizer state in safetensors; GGUF export.

One file holds a whole training state: `save` takes a nested dict of state dicts and
Python values, stores its tensors in safetensors under their flattened paths
("model.0.weight", "optimizer.state.0.exp_avg") and the structure as JSON in the
header's metadata. Nothing is pickled. `load` also reads PyTorch's zip checkpoints as
torch.load(weights_only=True) does (torch_checkpoint.py), and refuses any other pickle,
a GGUF file or anything else, saying what it is.

Writes are atomic and durable: the file is written beside its destination under a
temporary name (``.ggrad-<host>-<pid>-*.tmp``), flushed to disk (fsync), renamed over
the destination and the folder's entry flushed too, so a crash or power loss mid-save
leaves the previous file as it was. A writer killed mid-save (SIGKILL, OOM) cannot
remove its temporary file: the next save into that folder does, once its writer is
gone (its pid no longer runs on this host) or, for another host's or an unnamed one,
once it is older than STALE_SECONDS.
"""

from __future__ import annotations

import glob
import json
import math
import os
import secrets
import socket
import stat
import tempfile
import time
from typing import Any, Callable

import numpy as np

from . import torch_checkpoint
from .tensor import Tensor

FORMAT_KEY = "ggrad.format"
SAFETENSORS_METADATA = "__metadata__"  # the header's key for the metadata: no tensor can have this name
STALE_SECONDS = 3600.0  # a temporary file whose writer cannot be checked is stale after this
GGUF_MAX_NAME = 63  # ggml's GGML_MAX_NAME is 64 bytes with the terminating NUL


def _temp_prefix() -> str:
    host = socket.gethostname().replace("-", "_").replace(os.sep, "_") or "host"
    return f".ggrad-{host}-{os.getpid()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _remove_stale(folder: str) -> None:
    """Remove the temporary files of saves that died in `folder`."""
    host = socket.gethostname().replace("-", "_").replace(os.sep, "_") or "host"
    now = time.time()
    for path in glob.glob(os.path.join(glob.escape(folder), ".ggrad-*.tmp")):
        parts = os.path.basename(path).split("-")
        try:
            if len(parts) >= 4 and parts[1] == host and parts[2].isdigit():
                stale = not _alive(int(parts[2]))
            else:  # another host's, or an older ggrad's name: by age
                stale = now - os.path.getmtime(path) > STALE_SECONDS
            if stale:
                os.remove(path)
        except OSError:  # gone already, or not ours to remove
            continue


def _fsync(path: str, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _create_temp(folder: str) -> str:
    """A new empty file in `folder`, created as open() creates files: mode 0666 less the
    umask (mkstemp's are always 0600)."""
    while True:
        tmp = os.path.join(folder, f"{_temp_prefix()}{secrets.token_hex(8)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue


def _mode_for(path: str, tmp: str) -> int:
    """The permissions of the file at `path`, or, where there is none, those open() gave
    `tmp` (0666 less the umask): a writer (safetensors') may leave its file 0600."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return stat.S_IMODE(os.stat(tmp).st_mode)


def _atomic_write(path: str, write) -> str:
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    _remove_stale(folder)
    tmp = _create_temp(folder)
    try:
        mode = _mode_for(path, tmp)
        write(tmp)
        os.chmod(tmp, mode)
        _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    try:
        _fsync(folder, directory=True)
    except OSError:  # a file system that cannot sync a folder: the rename happened anyway
        pass
    return path


def _host(value) -> np.ndarray:
    array = value.numpy() if isinstance(value, Tensor) else np.asarray(value)
    return array if array.flags.c_contiguous else array.copy(order="C")  # 0-d stays 0-d


def _flatten_optimizer(state: dict) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    tensors, scalars = {}, {"param_groups": state["param_groups"], "micro_steps": state["micro_steps"],
                            "state": {}, "group_state": []}
    for i, s in state["state"].items():
        scalars["state"][str(i)] = {}
        for k, v in s.items():
            if isinstance(v, np.ndarray):
                tensors[f"state.{i}.{k}"] = v
            else:
                scalars["state"][str(i)][k] = v
    for gi, s in enumerate(state.get("group_state", [])):
        scalars["group_state"].append({})
        for k, v in s.items():
            if isinstance(v, np.ndarray):
                tensors[f"group_state.{gi}.{k}"] = v
            else:
                scalars["group_state"][gi][k] = v
    return tensors, scalars


def _unflatten_optimizer(tensors: dict[str, np.ndarray], scalars: dict) -> dict:
    state = {int(i): dict(s) for i, s in scalars["state"].items()}
    group_state = [dict(s) for s in scalars["group_state"]]
    for name, array in tensors.items():
        kind, index, key = name.split(".", 2)
        (state[int(index)] if kind == "state" else group_state[int(index)])[key] = array
    for s in group_state:
        if "constants_of" in s:
            s["constants_of"] = tuple(s["constants_of"])
    groups = scalars["param_groups"]
    for g in groups:
        if "betas" in g:
            g["betas"] = tuple(g["betas"])
    return {"state": state, "param_groups": groups, "group_state": group_state,
            "micro_steps": scalars["micro_steps"]}


_TAGS = ("__tensor__", "__tuple__", "__items__", "__float__")


def _tensor_name(path: tuple, tensors: dict) -> str:
    """The tensor's place in the structure, joined by dots ("model.0.weight",
    "optimizer.state.0.exp_avg"); a name taken already (a key with a dot in it) gets a
    "#n" suffix, and so does safetensors' reserved name. The structure refers to tensors by
    name, so names need only be unique."""
    base = ".".join(path) or "tensor"
    name, n = base, 1
    while name in tensors or name == SAFETENSORS_METADATA:
        name, n = f"{base}#{n}", n + 1
    return name


def _encode(value, tensors: dict[str, np.ndarray], path: tuple = ()):
    """A strict-JSON copy of `value`, every tensor or array replaced by a reference to its
    entry in `tensors` (named by its path); tuples, dicts with non-string keys (or keys
    that look like tags) and non-finite floats are tagged so `_decode` gives them back as
    they were. An object with a `state_dict()` (module, optimizer, scheduler) is stored
    as its state dict."""
    if isinstance(value, (Tensor, np.ndarray)):
        array = _host(value)
        if array.dtype.kind not in "biuf":
            raise TypeError(f"save cannot store the {array.dtype} array at {'.'.join(path) or 'the top'} "
                            "(numbers and booleans only)")
        name = _tensor_name(path, tensors)
        tensors[name] = array
        return {"__tensor__": name}
    if callable(getattr(value, "state_dict", None)):
        return _encode(value.state_dict(), tensors, path)
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return {"__float__": repr(value)}  # "inf", "-inf", "nan": JSON has none of them
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and not any(k in _TAGS for k in value):
            return {k: _encode(v, tensors, path + (k,)) for k, v in value.items()}
        return {"__items__": [[_encode(k, tensors, path + ("key",)), _encode(v, tensors, path + (str(k),))]
                              for k, v in value.items()]}
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, tensors, path + (str(i),)) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, tensors, path + (str(i),)) for i, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"save cannot store a {type(value).__name__} (at {'.'.join(path) or 'the top'}: tensors, "
                    "arrays, numbers, strings, lists, tuples, dicts and objects with a state_dict only: "
                    "ggrad never pickles)")


def _decode(value, tensors: dict[str, np.ndarray]):
    if isinstance(value, dict):
        if "__tensor__" in value:
            name = value["__tensor__"]
            if not isinstance(name, str) or name not in tensors:
                raise ValueError(f"it refers to a tensor {name!r} that the file does not hold")
            return tensors[name]
        if "__tuple__" in value:
            return tuple(_decode(v, tensors) for v in value["__tuple__"])
        if "__items__" in value:
            return {_decode(k, tensors): _decode(v, tensors) for k, v in value["__items__"]}
        if "__float__" in value:
            return float(value["__float__"])
        return {k: _decode(v, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    return value


def _is_flat_state(obj: dict) -> bool:
    return all(isinstance(v, (Tensor, np.ndarray)) for v in obj.values())


def save(obj, path, metadata: dict[str, str] | None = None):
    """Save a state dict (name -> tensor/array), a Module, an Optimizer, or a nested dict of
    them and Python values (``{"model": m.state_dict(), "optimizer": opt.state_dict(),
    "scheduler": sched.state_dict(), "epoch": 3, "rng": ggrad.get_rng_state()}``) to
    `path` (or a binary file object, as torch.save takes): tensors in safetensors, the
    structure as JSON in its metadata; never pickle.

    Under a process group of more than one rank, rank 0 writes (the replicas are equal)
    and every rank waits at a barrier until it has, so that any rank may `load` the file
    next: call it on every rank. A failed write raises on rank 0 only (after the barrier)."""
    from . import distributed as dist

    if _is_file(path):
        with tempfile.TemporaryDirectory() as folder:
            written = save(obj, os.path.join(folder, "checkpoint.safetensors"), metadata)
            with open(written, "rb") as f:
                path.write(f.read())
        return path
    if dist.is_initialized() and dist.get_world_size() > 1:
        try:
            if dist.get_rank() == 0:
                _save(obj, path, metadata)
        finally:
            dist.barrier()
        return os.fspath(path)
    return _save(obj, path, metadata)


def _save(obj, path: str, metadata: dict[str, str] | None) -> str:
    from safetensors.numpy import save_file

    from .nn.module import Module
    from .optim.optimizer import Optimizer

    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    if isinstance(obj, dict) and not _is_flat_state(obj):
        tensors: dict[str, np.ndarray] = {}
        structure = json.dumps(_encode(obj, tensors), allow_nan=False)
        meta[FORMAT_KEY], meta["ggrad.structure"] = "nested", structure
    elif isinstance(obj, Module):
        tensors, meta[FORMAT_KEY] = {k: _host(v) for k, v in obj.state_dict().items()}, "state_dict"
        meta["ggrad.module"] = type(obj).__name__
    elif isinstance(obj, Optimizer):
        tensors, scalars = _flatten_optimizer(obj.state_dict())
        meta[FORMAT_KEY], meta["ggrad.optimizer"] = "optimizer", json.dumps(scalars)
        meta["ggrad.optimizer_class"] = type(obj).__name__
    elif isinstance(obj, dict):
        tensors, meta[FORMAT_KEY] = {str(k): _host(v) for k, v in obj.items()}, "state_dict"
    elif callable(getattr(obj, "state_dict", None)):  # a scheduler: load gives back its state dict
        return _save(obj.state_dict(), path, metadata)
    else:
        raise TypeError(f"save takes a state dict, a Module, an Optimizer or a dict of them and Python values, "
                        f"got {type(obj).__name__}")
    if SAFETENSORS_METADATA in tensors:  # the file would hold two headers' worth of "__metadata__"
        raise ValueError(f"save: a state dict entry cannot be named {SAFETENSORS_METADATA!r}: safetensors keeps the "
                         "file's metadata under that name. Rename it, or save the state dict inside a dict "
                         "(ggrad.save({'state': state})), which names its tensors itself")
    return _atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=meta))


def _is_file(target) -> bool:
    return hasattr(target, "read") or hasattr(target, "write")


def load(path, map_location=None, weights_only: bool = True) -> dict:
    """What `save` wrote: a state dict (name -> numpy array), an optimizer state dict, or
    the nested dict (its tensors as numpy arrays, its optimizer state dicts as
    `load_state_dict` takes them). `path` may be a binary file object.

    A PyTorch checkpoint (torch.save's zip format) is read too, as torch.load(weights_only=
    True) reads it: tensors (as numpy arrays), numbers, strings and containers, and nothing
    else (torch_checkpoint.py; any other object in it raises pickle.UnpicklingError, never
    runs). `model.load_state_dict(ggrad.load("model.pt"))` takes PyTorch's weights. Values
    are host arrays, so `map_location` is accepted and has nothing to move; `weights_only
    =False` is refused. A file of another kind (GGUF, a legacy PyTorch pickle, numpy's)
    raises a ValueError saying what it is; a damaged one says what is wrong."""
    if not weights_only:
        raise ValueError("load(weights_only=False) would run the pickle's code: ggrad reads tensors and plain "
                         "containers only (weights_only=True, the default)")
    if _is_file(path):  # read through a file, so that a path and a file object are told apart alike
        with tempfile.TemporaryDirectory() as folder:
            copy = os.path.join(folder, "checkpoint")
            with open(copy, "wb") as f:
                f.write(path.read())
            return load(copy)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    if _is_torch_zip(path):
        return torch_checkpoint.load(path)
    _check_kind(path)
    meta, tensors = _read_safetensors(path)
    kind = meta.get(FORMAT_KEY, "state_dict")  # a safetensors file from elsewhere: its tensors
    if kind == "state_dict":
        return tensors
    if kind not in ("optimizer", "nested"):
        raise ValueError(f"{path} is a ggrad checkpoint of kind {kind!r}, which this ggrad does not know "
                         "(written by a newer version?)")
    key = "ggrad.optimizer" if kind == "optimizer" else "ggrad.structure"
    structure = _structure(path, meta, key)
    try:
        if kind == "optimizer":
            return _unflatten_optimizer(tensors, structure)
        value = _decode(structure, tensors)
        if not isinstance(value, dict):
            raise ValueError(f"it holds a {type(value).__name__}, where save writes a dict")
        return value
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError) as e:
        raise ValueError(f"{path} is a damaged ggrad checkpoint: its {key!r} metadata does not describe its "
                         f"tensors ({_reason(e)})") from None


def _reason(error: Exception) -> str:
    """What a parser's exception says was wrong, in words."""
    if isinstance(error, RecursionError):
        return "it nests too deeply to read"
    if isinstance(error, KeyError):
        return f"it has no entry {error.args[0]!r}" if error.args else "an entry is missing"
    if isinstance(error, ValueError):
        return str(error)
    return f"{type(error).__name__}: {error}"


def _read_safetensors(path: str) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """The metadata and the tensors of a safetensors file; a ValueError naming the file
    for anything safetensors or numpy cannot read."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(os.fspath(path), framework="numpy") as f:
            return f.metadata() or {}, {name: _read_tensor(path, f, name) for name in f.keys()}
    except SafetensorError as e:
        raise ValueError(f"{path} is not a readable safetensors file ({e})") from None


def _read_tensor(path: str, file, name: str) -> np.ndarray:
    try:
        return file.get_tensor(name)
    except (AttributeError, TypeError):  # safetensors' numpy path fails on dtypes numpy lacks (F8_*, F4...)
        raise ValueError(f"{path}: tensor {name!r} is {file.get_slice(name).get_dtype()}, a type numpy does not "
                         "have: ggrad.load reads booleans, integers and float16, bfloat16, float32 and float64 "
                         "tensors") from None


def _structure(path: str, meta: dict[str, str], key: str):
    """The JSON document stored under `key` in the metadata."""
    if key not in meta:
        raise ValueError(f"{path} is a damaged ggrad checkpoint: its metadata says {FORMAT_KEY} = "
                         f"{meta[FORMAT_KEY]!r} but has no {key!r}")
    try:
        return json.loads(meta[key])
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is a damaged ggrad checkpoint: its {key!r} metadata is not JSON ({e})") from None
    except RecursionError:
        raise ValueError(f"{path} is a damaged ggrad checkpoint: its {key!r} metadata nests too deeply to "
                         "read") from None


_TORCH_ADVICE = ("ggrad reads torch.save's zip format only (its tensors and containers, as torch.load("
                 "weights_only=True)): save it again with torch.save's default format")


def _is_torch_zip(path: str) -> bool:
    import zipfile
    with open(path, "rb") as f:
        if f.read(4) != b"PK\x03\x04":
            return False
    try:
        with zipfile.ZipFile(path) as z:
            return any(n.endswith("data.pkl") for n in z.namelist())
    except zipfile.BadZipFile:
        return False


def _zip_kind(path: str) -> str:
    """What a zip archive holds, from its list of names (nothing in it is read)."""
    import zipfile
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except zipfile.BadZipFile:
        return f"{path} is a damaged zip archive, not a safetensors checkpoint"
    if names and all(n.endswith(".npy") for n in names):
        return f"{path} is a numpy .npz archive, not a safetensors checkpoint: read it with np.load(path)"
    return f"{path} is a zip archive, not a safetensors checkpoint"


def _check_kind(path: str) -> None:
    """ValueError naming what the file is, unless it looks like safetensors (an 8-byte
    little-endian header length, then a JSON object)."""
    with open(path, "rb") as f:
        head = f.read(9)
    size = os.path.getsize(path)
    if len(head) == 9 and int.from_bytes(head[:8], "little") <= size - 8 and head[8:9] == b"{":
        return  # first: a header length can start with a magic byte (0x80 is a pickle's)
    if head[:4] == b"GGUF":
        raise ValueError(f"{path}: this is a GGUF file: ggrad.load reads safetensors checkpoints; read GGUF with "
                         "the gguf package's GGUFReader (ggrad.export_gguf writes GGUF for llama.cpp's tools)")
    if head[:4] == b"PK\x03\x04":
        raise ValueError(_zip_kind(path))
    if head[:1] == b"\x80" and head[1:2] and 2 <= head[1] <= 5:  # the PROTO opcode of pickle protocols 2-5
        raise ValueError(f"{path} is a pickle (torch.save's legacy format, or another pickle), which ggrad never "
                         f"unpickles; {_TORCH_ADVICE}")
    if head[:6] == b"\x93NUMPY":
        raise ValueError(f"{path} is a numpy .npy file, not a safetensors checkpoint: read it with np.load(path)")
    if head[:8] == b"\x89HDF\r\n\x1a\n":
        raise ValueError(f"{path} is an HDF5 file (a Keras .h5 model?), not a safetensors checkpoint")
    if size == 0:
        raise ValueError(f"{path} is empty, not a safetensors checkpoint")
    raise ValueError(f"{path} is not a safetensors checkpoint (no safetensors header: it starts with "
                     f"{head[:8]!r}); ggrad.load reads what ggrad.save writes")


def export_gguf(model, path: str, architecture: str = "ggrad", metadata: dict | None = None) -> str:
    """Write the model's parameters and buffers to a GGUF file (float32 tensors, named as
    in its state dict) that llama.cpp's tools and `gguf.GGUFReader` can open.

    ggml's C reader refuses a tensor name longer than 63 bytes (GGML_MAX_NAME is 64 with
    the terminating NUL), so such a name is refused here with a ValueError naming it,
    before anything is written; rename the module attributes (or export a state dict of
    your own naming through `save`) to fit. Names are not shortened silently."""
    state = model.state_dict()
    for name in state:
        if len(name.encode("utf-8")) > GGUF_MAX_NAME:
            raise ValueError(f"export_gguf: tensor name {name!r} is {len(name.encode('utf-8'))} bytes; ggml's GGUF "
                             f"reader takes at most {GGUF_MAX_NAME} (GGML_MAX_NAME = 64 with the NUL). Give the "
                             "module a shorter attribute name")
    tensors = {k: _host(v).astype(np.float32) for k, v in state.items()}

    def keys(writer) -> None:
        writer.add_name(type(model).__name__)
        for key, value in (metadata or {}).items():
            writer.add_string(f"{architecture}.{key}", str(value))

    return write_gguf(path, architecture, keys, tensors)


def write_gguf(path: str, architecture: str, keys: Callable, tensors: dict) -> str:
    """A GGUF file written atomically: `keys(writer)` adds the metadata, `tensors` maps
    each name to an array, or to (raw bytes, ggml quantization type)."""
    import gguf

    def write(tmp: str) -> None:
        writer = gguf.GGUFWriter(tmp, architecture)
        keys(writer)
        for name, data in tensors.items():
            array, raw_dtype = data if isinstance(data, tuple) else (data, None)
            writer.add_tensor(name, array, raw_dtype=raw_dtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()

    return _atomic_write(path, write)
