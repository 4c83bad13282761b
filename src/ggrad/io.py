"""Checkpoints: state dicts, models and optimizer state in safetensors; GGUF export.

Writes are atomic: the file is written beside its destination and renamed over it, so
a crash mid-save leaves the previous file as it was.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import numpy as np

from .tensor import Tensor

FORMAT_KEY = "ggrad.format"


def _atomic_write(path: str, write) -> str:
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".ggrad-", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path


def _host(value) -> np.ndarray:
    array = value.numpy() if isinstance(value, Tensor) else np.asarray(value)
    return np.ascontiguousarray(array)


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
    in its state dict) that llama.cpp's tools and `gguf.GGUFReader` can open."""
    import gguf

    tensors = {k: _host(v).astype(np.float32) for k, v in model.state_dict().items()}

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
