"""Checkpoints: state dicts, models and optimizer state in safetensors; GGUF export.

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
import os
import socket
import tempfile
import time
from typing import Any

import numpy as np

from .tensor import Tensor

FORMAT_KEY = "ggrad.format"
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


def _atomic_write(path: str, write) -> str:
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    _remove_stale(folder)
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(), suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        write(tmp)
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


def _encode(value, tensors: dict[str, np.ndarray]):
    """A JSON-able copy of `value` with every tensor or array replaced by a reference to
    its entry in `tensors`; tuples and dicts with non-string keys are tagged so that
    `_decode` gives them back as they were."""
    if isinstance(value, (Tensor, np.ndarray)):
        name = f"t{len(tensors)}"
        tensors[name] = _host(value)
        return {"__tensor__": name}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {k: _encode(v, tensors) for k, v in value.items()}
        return {"__items__": [[_encode(k, tensors), _encode(v, tensors)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, tensors) for v in value]}
    if isinstance(value, list):
        return [_encode(v, tensors) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"save cannot store a {type(value).__name__} (tensors, arrays, numbers, strings, lists, "
                    "tuples and dicts only: ggrad never pickles)")


def _decode(value, tensors: dict[str, np.ndarray]):
    if isinstance(value, dict):
        if "__tensor__" in value:
            return tensors[value["__tensor__"]]
        if "__tuple__" in value:
            return tuple(_decode(v, tensors) for v in value["__tuple__"])
        if "__items__" in value:
            return {_decode(k, tensors): _decode(v, tensors) for k, v in value["__items__"]}
        return {k: _decode(v, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    return value


def _is_flat_state(obj: dict) -> bool:
    return all(isinstance(v, (Tensor, np.ndarray)) for v in obj.values())


def save(obj, path: str, metadata: dict[str, str] | None = None) -> str:
    """Save a state dict (name -> tensor/array), a Module, an Optimizer, or a nested dict of
    them and Python values (``{"model": m.state_dict(), "optimizer": opt.state_dict(),
    "scheduler": sched.state_dict(), "epoch": 3, "rng": ggrad.get_rng_state()}``) to
    `path`: tensors in safetensors, the structure as JSON in its metadata; never pickle."""
    from safetensors.numpy import save_file

    from .nn.module import Module
    from .optim.optimizer import Optimizer

    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    if isinstance(obj, dict) and not _is_flat_state(obj):
        tensors: dict[str, np.ndarray] = {}
        meta[FORMAT_KEY], meta["ggrad.structure"] = "nested", json.dumps(_encode(obj, tensors))
    elif isinstance(obj, Module):
        tensors, meta[FORMAT_KEY] = {k: _host(v) for k, v in obj.state_dict().items()}, "state_dict"
        meta["ggrad.module"] = type(obj).__name__
    elif isinstance(obj, Optimizer):
        tensors, scalars = _flatten_optimizer(obj.state_dict())
        meta[FORMAT_KEY], meta["ggrad.optimizer"] = "optimizer", json.dumps(scalars)
        meta["ggrad.optimizer_class"] = type(obj).__name__
    elif isinstance(obj, dict):
        tensors, meta[FORMAT_KEY] = {str(k): _host(v) for k, v in obj.items()}, "state_dict"
    else:
        raise TypeError(f"save takes a state dict, a Module or an Optimizer, got {type(obj).__name__}")
    return _atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=meta))


def load(path: str) -> dict:
    """What `save` wrote: a state dict (name -> numpy array), an optimizer state dict, or
    the nested dict. A file of another kind (GGUF, a PyTorch checkpoint) is refused saying
    what it is: nothing is ever unpickled."""
    from safetensors import safe_open

    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    _check_kind(path)
    with safe_open(os.fspath(path), framework="numpy") as f:
        meta = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    if meta.get(FORMAT_KEY) == "optimizer":
        return _unflatten_optimizer(tensors, json.loads(meta["ggrad.optimizer"]))
    if meta.get(FORMAT_KEY) == "nested":
        return _decode(json.loads(meta["ggrad.structure"]), tensors)
    return tensors


def _check_kind(path: str) -> None:
    """ValueError naming what the file is, unless it looks like safetensors (an 8-byte
    little-endian header length, then a JSON object)."""
    with open(path, "rb") as f:
        head = f.read(9)
    size = os.path.getsize(path)
    if head[:4] == b"GGUF":
        raise ValueError(f"{path} is a GGUF file: ggrad.load reads safetensors checkpoints (read GGUF with the "
                         "gguf package's GGUFReader)")
    if head[:4] == b"PK\x03\x04" or head[:1] == b"\x80":
        raise ValueError(f"{path} is a PyTorch checkpoint (a {'zip' if head[:1] == b'P' else 'pickle'} file): "
                         "ggrad never unpickles. Load it with torch.load and pass its state_dict to "
                         "load_state_dict, or save it with ggrad.save")
    if len(head) < 9 or int.from_bytes(head[:8], "little") > size - 8 or head[8:9] != b"{":
        raise ValueError(f"{path} is not a safetensors checkpoint (no safetensors header)")


def export_gguf(model, path: str, architecture: str = "ggrad", metadata: dict | None = None) -> str:
    """Write the model's parameters and buffers to a GGUF file (float32 tensors, named as
    in its state dict) that llama.cpp's tools and `gguf.GGUFReader` can open.

    ggml's C reader refuses a tensor name longer than 63 bytes (GGML_MAX_NAME is 64 with
    the terminating NUL), so such a name is refused here with a ValueError naming it,
    before anything is written; rename the module attributes (or export a state dict of
    your own naming through `save`) to fit. Names are not shortened silently."""
    import gguf

    state = model.state_dict()
    for name in state:
        if len(name.encode("utf-8")) > GGUF_MAX_NAME:
            raise ValueError(f"export_gguf: tensor name {name!r} is {len(name.encode('utf-8'))} bytes; ggml's GGUF "
                             f"reader takes at most {GGUF_MAX_NAME} (GGML_MAX_NAME = 64 with the NUL). Give the "
                             "module a shorter attribute name")
    tensors = {k: _host(v).astype(np.float32) for k, v in state.items()}

    def write(tmp: str) -> None:
        writer = gguf.GGUFWriter(tmp, architecture)
        writer.add_name(type(model).__name__)
        for key, value in (metadata or {}).items():
            writer.add_string(f"{architecture}.{key}", str(value))
        for name, array in tensors.items():
            writer.add_tensor(name, array)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()

    return _atomic_write(path, write)
