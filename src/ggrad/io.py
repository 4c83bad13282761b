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


def save(obj, path: str, metadata: dict[str, str] | None = None) -> str:
    """Save a state dict (name -> tensor/array), a Module or an Optimizer to `path`."""
    from safetensors.numpy import save_file

    from .nn.module import Module
    from .optim.optimizer import Optimizer

    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    if isinstance(obj, Module):
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
    """What `save` wrote: a state dict (name -> numpy array) or an optimizer state dict."""
    from safetensors import safe_open

    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    with safe_open(os.fspath(path), framework="numpy") as f:
        meta = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    if meta.get(FORMAT_KEY) == "optimizer":
        return _unflatten_optimizer(tensors, json.loads(meta["ggrad.optimizer"]))
    return tensors


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
