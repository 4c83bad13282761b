"""Device work the host has not waited for yet.

ggml-cuda's graph compute returns once its work is queued on the backend's stream (a CUDA
graph launched), and ggml-vulkan's once its command buffers are submitted, so the host
records and uploads the next step while the GPU runs this one, as PyTorch's CUDA streams let
it. Whatever touches device memory from the host waits here first (`settle`): a download, an
upload (on CUDA one from pageable memory may instead be queued on the stream behind the graph:
QUEUED_UPLOADS), a buffer freed, a quantized tensor bound (its padding is cleared outside the
stream), an NCCL collective, `ggrad.cuda.synchronize()`. The CPU's graphs are waited for at
the end of each compute.
"""

from __future__ import annotations

import numpy as np
from ggml import ggml as G

from .critical import lock

# the backend kinds whose graphs are left running; `enabled` False waits for every graph
# (bench/train_step.py --synchronous times both in one process)
ASYNCHRONOUS_KINDS = frozenset({"cuda", "vulkan"})
# the kernel set a kind's ggml needs for that: ggml-vulkan ordered a graph after the running
# ones by lists of tensors the earlier graphs named, freed or re-pointed since (its check
# read stale memory); set 56 puts one barrier before each graph and empties the lists
# (scripts/patch_ggml_kernels.py). Older builds wait for each graph.
LEFT_RUNNING_SINCE = {"vulkan": 56}
# graphs a kind leaves running before its next one waits for them all: ggml-vulkan keeps each
# graph's command buffers and descriptor sets until the host waits, so a loop that never reads
# a value would grow them with every step
QUEUE_DEPTH = {"vulkan": 32}
enabled = True
# uploads queued behind a running graph (False: every upload waits for the device first);
# the suite passed both ways on an H100 (2026-12-05). Only where the backend orders them: a
# CUDA stream does; ggml-vulkan records a queued upload or device copy with no barrier before
# the shaders that read it, so its uploads and copies wait for the device.
QUEUED_UPLOADS = True
QUEUED_UPLOAD_KINDS = frozenset({"cuda"})

_queued: dict[int, object] = {}  # id(backend) -> its ggml backend handle, while work may run
_depth: dict[int, int] = {}  # id(backend) -> graphs queued since it was last waited for


def queue(backend, graph) -> None:
    """Start `graph` on the started `backend` (runtime/backend.py), returning once queued."""
    key = id(backend)
    limit = QUEUE_DEPTH.get(backend.info.kind)
    if limit is not None and _depth.get(key, 0) >= limit:
        settle()
    status = G.ggml_backend_graph_compute_async(backend.handle, graph)
    _queued[key] = backend.handle
    _depth[key] = _depth.get(key, 0) + 1
    if status != 0:
        settle()
        raise RuntimeError(f"ggml graph compute failed (status {status})")


def pageable(array: np.ndarray) -> bool:
    """Whether `array` lies in memory numpy allocated (pageable), which CUDA copies aside
    before an upload's call returns. Pinned memory would be read when the copy runs, after
    the caller may have reused it."""
    root = array
    while isinstance(root.base, np.ndarray):
        root = root.base
    return root.base is None and root.flags.owndata


def queues_upload(backend, from_pageable: bool) -> bool:
    """Whether an upload into `backend`'s memory may be queued on its stream behind the
    running graphs: only from pageable memory (`pageable`); others wait."""
    return from_pageable and QUEUED_UPLOADS and backend.info.kind in QUEUED_UPLOAD_KINDS and id(backend) in _queued


def settle() -> None:
    """Wait until every queued graph has finished, holding the ggml lock (critical.py): a
    thread that frees a graph or reads a value waits while another queues work, never beside
    it (ggml-vulkan's synchronize beside another thread's compute hung two threads training)."""
    with lock:
        for key, handle in list(_queued.items()):
            G.ggml_backend_synchronize(handle)
            _queued.pop(key, None)
            _depth.pop(key, None)
