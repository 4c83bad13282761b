"""NCCL through ctypes: collectives from device memory to device memory for CUDA devices,
so gradients need not cross to the host (issue 14).

The library is the NCCL ggml-cuda links when it was built with one (one copy per
process), else the file `GGRAD_NCCL_LIBRARY` names, else the `nvidia-nccl-cu12` (or
`-cu13`) wheel's ``nvidia/nccl/lib/libnccl.so.2``, else a system NCCL. The CUDA runtime
is the one ggml-cuda links, so streams and device pointers belong to the same runtime as
ggrad's buffers.

Enum values and signatures are those of nccl.h 2.32 (the header in the nvidia-nccl-cu12
2.32.3 wheel, `nvidia/nccl/include/nccl.h`; unchanged since 2.10 for what is used here):
ncclDataType_t ncclInt8=0, ncclUint8=1, ncclInt32=2, ncclUint32=3, ncclInt64=4,
ncclUint64=5, ncclFloat16=6, ncclFloat32=7, ncclFloat64=8, ncclBfloat16=9 (2.10+);
ncclRedOp_t ncclSum=0, ncclProd=1, ncclMax=2, ncclMin=3, ncclAvg=4 (2.10+);
ncclUniqueId is 128 bytes (NCCL_UNIQUE_ID_BYTES), passed by value to ncclCommInitRank.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import importlib.util
import os

import ml_dtypes
import numpy as np

from .. import runtime

UNIQUE_ID_BYTES = 128
_INSTALL_HINT = "pip install nvidia-nccl-cu12 (nvidia-nccl-cu13 for CUDA 13)"

# numpy dtype -> ncclDataType_t
DATATYPES: dict[np.dtype, int] = {
    np.dtype(np.uint8): 1,
    np.dtype(np.int32): 2,
    np.dtype(np.int64): 4,
    np.dtype(np.float16): 6,
    np.dtype(np.float32): 7,
    np.dtype(ml_dtypes.bfloat16): 9,
}
# op name (as ggrad.distributed's collectives) -> ncclRedOp_t
REDOPS: dict[str, int] = {"sum": 0, "max": 2, "min": 3, "mean": 4}
_CUDA_STREAM_NON_BLOCKING = 1  # cudaStreamNonBlocking: no implicit sync with the legacy stream


class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]


# ---- pure argument checks: bad input never reaches NCCL ------------------------------------

def datatype(dtype, version: tuple[int, int, int] = (2, 10, 0)) -> int:
    """The ncclDataType_t of a numpy dtype (or its name, e.g. 'bfloat16')."""
    try:
        key = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be a numpy dtype or its name (a Handle's .dtype), got {dtype!r}") from None
    if key not in DATATYPES:
        raise ValueError(f"NCCL binding takes dtypes {sorted(str(d) for d in DATATYPES)}, got {key}")
    if key == np.dtype(ml_dtypes.bfloat16):
        _need_2_10("bfloat16 (ncclBfloat16)", version)
    return DATATYPES[key]


def redop(op: str, version: tuple[int, int, int] = (2, 10, 0)) -> int:
    """The ncclRedOp_t of an op name: sum, mean, max, min."""
    if op not in REDOPS:
        raise ValueError(f"op must be one of {tuple(REDOPS)}, got {op!r}")
    if op == "mean":
        _need_2_10("op 'mean' (ncclAvg)", version)
    return REDOPS[op]


def _need_2_10(what: str, version: tuple[int, int, int]) -> None:
    if version < (2, 10, 0):
        raise RuntimeError(f"{what} needs NCCL 2.10 or newer; this is {'.'.join(map(str, version))}")


def check_count(count: int) -> int:
    """A positive element count (NCCL takes size_t)."""
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)):
        raise TypeError(f"count must be an int, got {type(count).__name__}")
    if not 0 < count < 2 ** 63:
        raise ValueError(f"count must be > 0, got {count}")
    return int(count)


def check_buffers(send: int, send_bytes: int, recv: int, recv_bytes: int, in_place_send: int) -> None:
    """Non-null device addresses whose ranges are either apart or in NCCL's in-place layout
    (`send == in_place_send`); any other overlap gives garbage, so it is refused."""
    for name, addr in (("send", send), ("recv", recv)):
        if isinstance(addr, bool) or not isinstance(addr, (int, np.integer)):
            raise TypeError(f"{name} must be a device address (an int, e.g. Handle.ptr), got {type(addr).__name__}")
        if not 0 < addr < 2 ** 64:
            raise ValueError(f"{name} must be a non-null device address, got {addr:#x}")
    apart = send + send_bytes <= recv or recv + recv_bytes <= send
    if not apart and send != in_place_send:
        raise ValueError(f"send [{send:#x}, +{send_bytes}) and recv [{recv:#x}, +{recv_bytes}) overlap "
                         f"but are not in place (in place, send is {in_place_send:#x})")


def check_root(root: int, size: int) -> int:
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < size:
        raise ValueError(f"root must be a rank in [0, {size}), got {root!r}")
    return int(root)


# ---- the libraries ------------------------------------------------------------------------

def _wheel_file(package: str, name: str) -> str | None:
    """`name` inside an installed `nvidia` namespace wheel (which has no __init__.py)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, name)
        if os.path.exists(path):
            return path
    return None


def _ggml_cuda() -> str | None:
    """ggml-cuda's library: symbols looked up through it resolve in its dependencies."""
    from ..runtime.backend import ggml_library_path
    path = ggml_library_path("libggml-cuda.so")
    return path if os.path.exists(path) else None


def _nccl_candidates() -> list[str]:
    """The NCCL ggml-cuda links, when it was built with one (a second copy in the process
    does not know the first's communicators: NCCL then calls them corrupted; seen on the
    H200 host, whose ggml-cuda links the system NCCL); else the file GGRAD_NCCL_LIBRARY
    names; else the wheel's; else the system's."""
    found = [_ggml_cuda()]
    if os.environ.get("GGRAD_NCCL_LIBRARY"):
        return [c for c in found if c] + [os.environ["GGRAD_NCCL_LIBRARY"]]
    found += [_wheel_file("nvidia.nccl", os.path.join("lib", "libnccl.so.2")), ctypes.util.find_library("nccl")]
    return [c for c in found if c]


def _cudart_candidates() -> list[str]:
    """ggml-cuda's library first: the CUDA runtime ggrad's buffers come from, whichever
    others are loaded (torch brings its own). Then by soname, then the CUDA runtime wheels'
    copies."""
    wheels = [_wheel_file("nvidia.cu13", "lib/libcudart.so.13"),
              _wheel_file("nvidia.cuda_runtime", "lib/libcudart.so.12")]
    return [c for c in [_ggml_cuda(), "libcudart.so.13", "libcudart.so.12", *wheels] if c]


def _load_first(candidates: list[str], what: str, symbol: str, hint: str) -> ctypes.CDLL:
    errors = []
    for path in candidates:
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            errors.append(f"{path}: {e}")
            continue
        if hasattr(lib, symbol):
            return lib
        errors.append(f"{path}: no {symbol}")
    tried = "; ".join(errors) if errors else "no candidate found"
    raise RuntimeError(f"ggrad.distributed.nccl: could not load {what} ({tried}). {hint}")


def _bind(lib: ctypes.CDLL, signatures: dict[str, tuple]) -> None:
    for name, (restype, *argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes


_P, _I, _SZ = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t


@functools.cache
def _nccl() -> ctypes.CDLL:
    # NVLink multicast (NVLS) can put a shared host's GPUs out of service (PLATFORM.md);
    # NCCL reads this when a communicator starts. The user's own setting wins.
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    lib = _load_first(_nccl_candidates(), "NCCL (libnccl.so.2)", "ncclCommInitRank", _INSTALL_HINT)
    _bind(lib, {
        "ncclGetVersion": (_I, ctypes.POINTER(_I)),
        "ncclGetUniqueId": (_I, ctypes.POINTER(_UniqueId)),
        "ncclGetErrorString": (ctypes.c_char_p, _I),
        "ncclCommInitRank": (_I, ctypes.POINTER(_P), _I, _UniqueId, _I),
        "ncclCommDestroy": (_I, _P),
        "ncclCommAbort": (_I, _P),
        "ncclCommGetAsyncError": (_I, _P, ctypes.POINTER(_I)),
        "ncclAllReduce": (_I, _P, _P, _SZ, _I, _I, _P, _P),
        "ncclBroadcast": (_I, _P, _P, _SZ, _I, _I, _P, _P),
        "ncclAllGather": (_I, _P, _P, _SZ, _I, _P, _P),
        "ncclReduceScatter": (_I, _P, _P, _SZ, _I, _I, _P, _P),
    })
    if hasattr(lib, "ncclGetLastError"):  # NCCL 2.13+
        _bind(lib, {"ncclGetLastError": (ctypes.c_char_p, _P)})
    return lib


@functools.cache
def _cudart() -> ctypes.CDLL:
    lib = _load_first(_cudart_candidates(), "the CUDA runtime (libcudart)", "cudaStreamCreateWithFlags",
                      "ggml-cuda links it; else pip install nvidia-cuda-runtime-cu12")
    _bind(lib, {
        "cudaGetErrorString": (ctypes.c_char_p, _I),
        "cudaSetDevice": (_I, _I),
        "cudaStreamCreateWithFlags": (_I, ctypes.POINTER(_P), ctypes.c_uint),
        "cudaStreamSynchronize": (_I, _P),
        "cudaStreamDestroy": (_I, _P),
    })
    return lib


def _check_nccl(result: int, call: str, comm: ctypes.c_void_p | None = None) -> None:
    if result != 0:
        lib = _nccl()
        last = lib.ncclGetLastError(comm) if hasattr(lib, "ncclGetLastError") else None
        detail = (last or b"").decode(errors="replace")
        text = lib.ncclGetErrorString(result).decode(errors="replace")
        raise RuntimeError(f"{call} failed: {text} (ncclResult_t {result})" + (f": {detail}" if detail else ""))


_IN_PROGRESS = 7  # ncclInProgress: a non-blocking communicator (NCCL_COMM_BLOCKING=0) is still working


def _settle(result: int, call: str, comm: ctypes.c_void_p) -> None:
    """Raise for `result`; if it is ncclInProgress, wait until the communicator is done
    (polling its state, as NCCL's non-blocking mode asks) and raise for how it ended."""
    state = ctypes.c_int(result)
    while state.value == _IN_PROGRESS:
        _check_nccl(_nccl().ncclCommGetAsyncError(comm, ctypes.byref(state)), "ncclCommGetAsyncError", comm)
    _check_nccl(state.value, call, comm)


def _check_cuda(err: int, call: str) -> None:
    if err != 0:
        text = _cudart().cudaGetErrorString(err).decode(errors="replace")
        raise RuntimeError(f"{call} failed: {text} (cudaError_t {err})")


# ---- the API ------------------------------------------------------------------------------

def available() -> bool:
    """Whether an NCCL library can be loaded here."""
    try:
        _nccl()
    except RuntimeError:
        return False
    return True


@functools.cache
def version() -> tuple[int, int, int]:
    """NCCL's (major, minor, patch), from ncclGetVersion."""
    code = ctypes.c_int()
    _check_nccl(_nccl().ncclGetVersion(ctypes.byref(code)), "ncclGetVersion")
    v = code.value  # NCCL_VERSION: X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z after
    return (v // 10000, v % 10000 // 100, v % 100) if v >= 10000 else (v // 1000, v % 1000 // 100, v % 100)


def unique_id() -> bytes:
    """A new communicator id (ncclGetUniqueId): rank 0 makes it and sends it to the others
    (over MPI), who pass it to `Communicator`."""
    uid = _UniqueId()
    _check_nccl(_nccl().ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
    return ctypes.string_at(ctypes.addressof(uid), UNIQUE_ID_BYTES)


class Communicator:
    """One rank's NCCL communicator on CUDA device `device` (ggrad's ``cuda:<device>``),
    with its own non-blocking CUDA stream. Every rank must construct it at the same time
    (ncclCommInitRank waits for all); it makes `device` this thread's current device.

    The collectives take raw device addresses (`Handle.ptr`), element counts and the buffer's
    element type (`Handle.dtype`: ggrad stores int64 tensors as int32). Ordering is
    by host synchronization on both sides: ggml-cuda runs on its own non-blocking streams,
    so the caller must have run ggrad's pending work (reading `tensor.handle` does) before
    calling; each collective first waits for ggml's queued graphs (runtime.synchronize) and
    then for its own stream before returning, so ggml's next work sees the results. Writing a
    buffer behind ggrad's back is the caller's business: the tensor must be a realized leaf
    with no pending write (an integer leaf also keeps a host copy for index checks, which
    such a write leaves stale). One thread at a time per communicator.
    """

    def __init__(self, size: int, rank: int, uid: bytes, device: int) -> None:
        self._comm: ctypes.c_void_p | None = None
        self._stream: ctypes.c_void_p | None = None
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be an int >= 1, got {size!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < size:
            raise ValueError(f"rank must be in [0, {size}), got {rank!r}")
        if not isinstance(uid, (bytes, bytearray)) or len(uid) != UNIQUE_ID_BYTES:
            raise ValueError(f"uid must be the {UNIQUE_ID_BYTES} bytes of nccl.unique_id(), got {uid!r:.40}")
        if isinstance(device, bool) or not isinstance(device, int) or device < 0:
            raise ValueError(f"device must be a CUDA device index >= 0, got {device!r}")
        self.size, self.rank, self.device = size, rank, device
        self._version = version()
        cuda = _cudart()
        _check_cuda(cuda.cudaSetDevice(device), f"cudaSetDevice({device})")
        stream = ctypes.c_void_p()
        _check_cuda(cuda.cudaStreamCreateWithFlags(ctypes.byref(stream), _CUDA_STREAM_NON_BLOCKING),
                    "cudaStreamCreateWithFlags")
        self._stream = stream
        comm = ctypes.c_void_p()
        call = f"ncclCommInitRank(size={size}, rank={rank}, device={device})"
        result = _nccl().ncclCommInitRank(ctypes.byref(comm), size, _UniqueId.from_buffer_copy(bytes(uid)), rank)
        if comm.value:
            _settle(result, call, comm)
            _settle(_IN_PROGRESS, call, comm)  # its init may still run in the background
        else:
            _check_nccl(result, call)
        self._comm = comm

    def _live(self) -> ctypes.c_void_p:
        if self._comm is None:
            raise RuntimeError("this NCCL communicator was destroyed")
        return self._comm

    def _run(self, name: str, *args) -> None:
        comm = self._live()
        runtime.synchronize()
        _settle(getattr(_nccl(), name)(*args, comm, self._stream), name, comm)
        self.synchronize()

    def all_reduce(self, send: int, recv: int, count: int, dtype, op: str = "sum") -> None:
        """`recv` = `op` over the ranks of `send` (count elements); in place when send == recv."""
        dt, code, n = datatype(dtype, self._version), redop(op, self._version), check_count(count)
        nbytes = n * np.dtype(dtype).itemsize
        check_buffers(send, nbytes, recv, nbytes, in_place_send=recv)
        self._run("ncclAllReduce", send, recv, n, dt, code)

    def broadcast(self, send: int, recv: int, count: int, dtype, root: int = 0) -> None:
        """`recv` on every rank = `send` of rank `root` (send is read on the root only)."""
        dt, n, root = datatype(dtype, self._version), check_count(count), check_root(root, self.size)
        nbytes = n * np.dtype(dtype).itemsize
        check_buffers(send, nbytes, recv, nbytes, in_place_send=recv)
        self._run("ncclBroadcast", send, recv, n, dt, root)

    def all_gather(self, send: int, recv: int, count_per_rank: int, dtype) -> None:
        """`recv` (size * count_per_rank elements) = every rank's `send`, in rank order; in
        place when send == recv + rank * count_per_rank elements."""
        dt, n = datatype(dtype, self._version), check_count(count_per_rank)
        nbytes = n * np.dtype(dtype).itemsize
        check_buffers(send, nbytes, recv, nbytes * self.size, in_place_send=recv + self.rank * nbytes)
        self._run("ncclAllGather", send, recv, n, dt)

    def reduce_scatter(self, send: int, recv: int, recv_count: int, dtype, op: str = "sum") -> None:
        """`recv` on rank i = block i (recv_count elements) of `op` over the ranks of `send`
        (size * recv_count elements); in place when recv == send + rank * recv_count elements."""
        dt, code, n = datatype(dtype, self._version), redop(op, self._version), check_count(recv_count)
        nbytes = n * np.dtype(dtype).itemsize
        check_buffers(send, nbytes * self.size, recv, nbytes, in_place_send=recv - self.rank * nbytes)
        self._run("ncclReduceScatter", send, recv, n, dt, code)

    def synchronize(self) -> None:
        """Wait for this communicator's stream, then raise any error NCCL met meanwhile."""
        comm = self._live()
        _check_cuda(_cudart().cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")
        _settle(_IN_PROGRESS, "an NCCL collective (asynchronous error)", comm)

    def destroy(self) -> None:
        """Free the communicator (ncclCommDestroy) and the stream; a second call does nothing.
        Call it on every rank at the same point in the program."""
        self._free("ncclCommDestroy")

    def _free(self, how: str) -> None:
        comm, self._comm = self._comm, None
        stream, self._stream = self._stream, None
        if comm is not None:
            _check_nccl(getattr(_nccl(), how)(comm), how)
        if stream is not None:
            _check_cuda(_cudart().cudaStreamDestroy(stream), "cudaStreamDestroy")

    def __del__(self) -> None:
        # ncclCommAbort, not Destroy: it is local, so a communicator collected on one rank
        # only cannot wait on the others (every collective here has already finished).
        with contextlib.suppress(Exception):
            self._free("ncclCommAbort")

    def __repr__(self) -> str:
        state = "destroyed" if self._comm is None else "live"
        return f"Communicator(size={self.size}, rank={self.rank}, device={self.device}, {state})"
