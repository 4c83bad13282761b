"""The NCCL binding (ggrad.distributed.nccl): argument checks and enum values without a GPU,
the library where the nvidia-nccl wheel is installed, collectives on ggrad's CUDA buffers
where there is a CUDA device (one rank; two under mpiexec where there are two GPUs)."""

import glob
import os
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

import ggrad
from ggrad.distributed import nccl

HAVE_NCCL = nccl.available()
needs_nccl = pytest.mark.skipif(not HAVE_NCCL, reason="no NCCL library: the nvidia-nccl-cu12 (or -cu13) wheel is "
                                                      "not installed (pip install nvidia-nccl-cu12)")
CUDA = [d.name for d in ggrad.devices() if d.kind == "cuda"]
needs_cuda = pytest.mark.skipif(not (CUDA and HAVE_NCCL), reason="needs a CUDA device and NCCL")
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")


# ---- without a GPU or the library ----------------------------------------------------------

def test_dtype_codes_are_nccl_h_values():
    # nccl.h 2.32: ncclUint8=1, ncclInt32=2, ncclInt64=4, ncclFloat16=6, ncclFloat32=7, ncclBfloat16=9
    expected = {np.uint8: 1, np.int32: 2, np.int64: 4, np.float16: 6, np.float32: 7, ml_dtypes.bfloat16: 9}
    for dtype, code in expected.items():
        assert nccl.datatype(dtype) == code
        assert nccl.datatype(np.dtype(dtype).name) == code  # 'bfloat16' by name too


@pytest.mark.parametrize("dtype", [np.float64, np.bool_, np.int8, "complex64"])
def test_dtypes_outside_the_binding_are_refused(dtype):
    with pytest.raises(ValueError, match="NCCL binding takes dtypes"):
        nccl.datatype(dtype)


def test_a_non_dtype_is_a_type_error():
    with pytest.raises(TypeError, match="numpy dtype"):
        nccl.datatype(ggrad.float32)  # ggrad's dtype: pass Handle.dtype (the storage dtype)


def test_op_codes_are_nccl_h_values():
    # ncclSum=0, ncclMax=2, ncclMin=3, ncclAvg=4
    assert {op: nccl.redop(op) for op in ("sum", "mean", "max", "min")} == {"sum": 0, "mean": 4, "max": 2, "min": 3}
    for bad in ("prod", "avg", "SUM", None):
        with pytest.raises(ValueError, match="op must be one of"):
            nccl.redop(bad)


def test_mean_and_bfloat16_need_nccl_2_10():
    with pytest.raises(RuntimeError, match=r"ncclAvg\) needs NCCL 2.10 or newer; this is 2.9.9"):
        nccl.redop("mean", (2, 9, 9))
    with pytest.raises(RuntimeError, match="ncclBfloat16"):
        nccl.datatype("bfloat16", (2, 9, 9))
    assert nccl.redop("sum", (2, 9, 9)) == 0 and nccl.datatype(np.float32, (2, 9, 9)) == 7


def test_count_must_be_a_positive_int():
    assert nccl.check_count(np.int64(5)) == 5
    for bad, error in ((0, ValueError), (-3, ValueError), (2.0, TypeError), (True, TypeError), ("4", TypeError)):
        with pytest.raises(error, match="count"):
            nccl.check_count(bad)


def test_buffers_are_addresses_apart_or_in_place():
    nccl.check_buffers(0x1000, 64, 0x2000, 64, in_place_send=0x2000)  # apart
    nccl.check_buffers(0x1000, 64, 0x1040, 64, in_place_send=0x1040)  # touching, apart
    nccl.check_buffers(0x1000, 64, 0x1000, 64, in_place_send=0x1000)  # in place
    with pytest.raises(ValueError, match="overlap but are not in place"):
        nccl.check_buffers(0x1000, 64, 0x1020, 64, in_place_send=0x1020)
    # all_gather in place on rank 1 of 2: send is the second half of recv
    nccl.check_buffers(0x1040, 64, 0x1000, 128, in_place_send=0x1000 + 1 * 64)
    with pytest.raises(ValueError, match="overlap"):
        nccl.check_buffers(0x1000, 64, 0x1000, 128, in_place_send=0x1040)
    for bad, error in ((0, ValueError), (-8, ValueError), (None, TypeError), (1.0, TypeError), (False, TypeError)):
        with pytest.raises(error, match="send"):
            nccl.check_buffers(bad, 4, 0x2000, 4, in_place_send=0x2000)


def test_root_must_be_a_rank():
    assert nccl.check_root(1, 2) == 1
    for bad in (-1, 2, 1.0, None, True):
        with pytest.raises(ValueError, match=r"root must be a rank in \[0, 2\)"):
            nccl.check_root(bad, 2)


@pytest.mark.parametrize("args, match", [((0, 0, b"\0" * 128, 0), "size"), ((2, 2, b"\0" * 128, 0), "rank"),
                                         ((1, 0, b"\0" * 127, 0), "uid"), ((1, 0, "x" * 128, 0), "uid"),
                                         ((1, 0, b"\0" * 128, -1), "device")])
def test_communicator_checks_its_arguments_before_any_library(args, match):
    with pytest.raises(ValueError, match=match):
        nccl.Communicator(*args)


@pytest.fixture
def no_nccl_here(monkeypatch):
    monkeypatch.setenv("GGRAD_NCCL_LIBRARY", "/nonexistent/libnccl.so.2")
    monkeypatch.setattr(nccl, "_ggml_cuda", lambda: None)  # a CUDA build's own NCCL would be found first
    nccl._nccl.cache_clear()
    yield
    monkeypatch.undo()
    nccl._nccl.cache_clear()


def test_a_missing_library_says_how_to_install(no_nccl_here):
    assert not nccl.available()
    with pytest.raises(RuntimeError, match=r"/nonexistent/libnccl.so.2.*pip install nvidia-nccl-cu12"):
        nccl.unique_id()


# ---- the library, still without a GPU ------------------------------------------------------

@needs_nccl
def test_version_and_unique_id():
    major, minor, patch = nccl.version()
    assert (major, minor) >= (2, 10), nccl.version()
    a, b = nccl.unique_id(), nccl.unique_id()
    assert isinstance(a, bytes) and len(a) == 128 and a != b


@needs_nccl
@pytest.mark.skipif(bool(CUDA or glob.glob("/dev/nvidia[0-9]*")), reason="there is an NVIDIA GPU here")
def test_without_a_gpu_the_cuda_error_text_comes_through():
    try:
        nccl._cudart()
    except RuntimeError:
        pytest.skip("no CUDA runtime library here")
    with pytest.raises(RuntimeError, match=r"cudaSetDevice\(0\) failed: .+ \(cudaError_t \d+\)"):
        nccl.Communicator(1, 0, nccl.unique_id(), 0)


# ---- on a CUDA device: one rank -----------------------------------------------------------

@pytest.fixture
def comm():
    """A one-rank communicator on cuda:0, the current ggrad device meanwhile."""
    previous = ggrad.set_device(CUDA[0])
    c = nccl.Communicator(1, 0, nccl.unique_id(), int(CUDA[0].split(":")[1]))
    try:
        yield c
    finally:
        c.destroy()
        ggrad.set_device(previous)


FLOATS = [ggrad.float32, ggrad.float16, ggrad.bfloat16]


@needs_cuda
@pytest.mark.parametrize("dtype", FLOATS + [ggrad.int32])
def test_collectives_of_one_rank_copy_and_keep_values(comm, dtype):
    values = np.arange(1, 13).reshape(3, 4)
    x = ggrad.tensor(values, dtype=dtype)
    h = x.handle
    for op in ("sum", "max", "min") + (("mean",) if dtype.is_floating_point else ()):
        out = ggrad.zeros(3, 4, dtype=dtype)
        comm.all_reduce(h.ptr, out.handle.ptr, 12, h.dtype, op)
        np.testing.assert_array_equal(out.numpy().astype(np.float64), values, err_msg=op)
    for call in (lambda o: comm.broadcast(h.ptr, o, 12, h.dtype, root=0),
                 lambda o: comm.all_gather(h.ptr, o, 12, h.dtype),
                 lambda o: comm.reduce_scatter(h.ptr, o, 12, h.dtype, "sum")):
        out = ggrad.zeros(3, 4, dtype=dtype)
        call(out.handle.ptr)
        np.testing.assert_array_equal(out.numpy().astype(np.float64), values)
    np.testing.assert_array_equal(x.numpy().astype(np.float64), values)  # the source is untouched


@needs_cuda
def test_in_place_between_ggml_work(comm):
    """ggml computes, NCCL writes in place, ggml reads NCCL's result: host sync orders them."""
    a = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)
    x = ggrad.tensor(a) * 2  # pending until its handle is asked for
    h = x.handle
    comm.all_reduce(h.ptr, h.ptr, a.size, h.dtype, "mean")
    comm.broadcast(h.ptr, h.ptr, a.size, h.dtype, root=0)
    np.testing.assert_array_equal((x + 1).numpy(), a * 2 + 1)


@needs_cuda
def test_destroy_is_idempotent_and_final(comm):
    h = ggrad.tensor(np.ones(4, np.float32)).handle
    comm.destroy()
    comm.destroy()
    assert "destroyed" in repr(comm)
    with pytest.raises(RuntimeError, match="destroyed"):
        comm.all_reduce(h.ptr, h.ptr, 4, h.dtype)


@needs_cuda
def test_bad_arguments_raise_before_nccl(comm):
    h = ggrad.tensor(np.ones(8, np.float32)).handle
    with pytest.raises(ValueError, match="op must be"):
        comm.all_reduce(h.ptr, h.ptr, 8, h.dtype, "prod")
    with pytest.raises(ValueError, match="root must be a rank"):
        comm.broadcast(h.ptr, h.ptr, 8, h.dtype, root=1)
    with pytest.raises(ValueError, match="overlap"):
        comm.all_reduce(h.ptr, h.ptr + 4, 4, h.dtype)
    with pytest.raises(ValueError, match="count"):
        comm.all_reduce(h.ptr, h.ptr, 0, h.dtype)


# ---- on two CUDA devices: two ranks under mpiexec -----------------------------------------

TWO_RANKS = """
    import numpy as np, ggrad
    from ggrad import distributed as dist
    from ggrad.distributed import nccl
    dist.init_process_group()  # takes cuda:<local rank>
    rank, size = dist.get_rank(), dist.get_world_size()
    uid = dist.group.comm().bcast(nccl.unique_id() if rank == 0 else None, root=0)
    comm = nccl.Communicator(size, rank, uid, int(ggrad.get_device().split(":")[1]))
    mine = np.arange(6, dtype=np.float32) + 10 * rank
    every = np.stack([np.arange(6, dtype=np.float32) + 10 * r for r in range(size)])
    x = ggrad.tensor(mine)
    h = x.handle
    comm.all_reduce(h.ptr, h.ptr, 6, h.dtype, "sum")
    assert np.array_equal(x.numpy(), every.sum(0)), x.numpy()
    y = ggrad.tensor(mine)
    comm.all_reduce(y.handle.ptr, y.handle.ptr, 6, y.handle.dtype, "mean")
    assert np.allclose(y.numpy(), every.mean(0)), y.numpy()
    z = ggrad.tensor(mine)
    comm.broadcast(z.handle.ptr, z.handle.ptr, 6, z.handle.dtype, root=size - 1)
    assert np.array_equal(z.numpy(), every[-1]), z.numpy()
    src, out = ggrad.tensor(mine), ggrad.zeros(size, 6)
    comm.all_gather(src.handle.ptr, out.handle.ptr, 6, np.float32)
    assert np.array_equal(out.numpy(), every), out.numpy()
    part = ggrad.zeros(6 // size)
    comm.reduce_scatter(src.handle.ptr, part.handle.ptr, 6 // size, np.float32, "max")
    assert np.array_equal(part.numpy(), every.max(0).reshape(size, -1)[rank]), part.numpy()
    comm.destroy()
    print("rank", rank, "ok")
"""


@needs_cuda
@pytest.mark.skipif(len(CUDA) < 2 or not os.path.exists(MPIEXEC), reason="needs two CUDA devices and mpiexec")
def test_two_ranks_on_two_gpus():
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-c", textwrap.dedent(TWO_RANKS)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONFAULTHANDLER": "1", "NCCL_NVLS_ENABLE": "0"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert proc.stdout.count(" ok") == 2
