"""Quantized weights (runtime/quants.py, functional/quantized.py): blocks made as llama.cpp
makes them, values close to the floats they stand for, and every misuse refused with a
Python exception (ggml asserts, or divides by zero, on the same input)."""

import gguf
import numpy as np
import pytest

import ggrad
from ggrad import dtypes
from ggrad.functional import quantized
from ggrad.runtime import backend, quants
from conftest import without_quantized_backward_kernel

KINDS = list(dtypes.QUANTIZED)
# the largest error of a dequantized weight, relative to its row's largest magnitude:
# about half a step of the type's grid (4 bits: 1/16 of the range, 8 bits: 1/256)
WORST = {"q4_0": 0.15, "q4_1": 0.08, "q5_0": 0.07, "q5_1": 0.04, "q8_0": 0.006, "q4_k": 0.1, "q5_k": 0.05,
         "q6_k": 0.03}


def weights(rows=8, cols=512, seed=0):
    return np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)


@pytest.mark.parametrize("kind", KINDS)
def test_blocks_stand_for_the_weights_within_their_types_step(kind):
    w = weights()
    q = quantized.quantize(w, dtypes.QUANTIZED[kind])
    error = np.abs(quantized.dequantize(q) - w).max(axis=1) / np.abs(w).max(axis=1)
    assert error.max() <= WORST[kind], error.max()
    assert error.max() >= WORST[kind] / 8  # the values were quantized at all: not a float copy


@pytest.mark.parametrize("kind", KINDS)
def test_blocks_are_llama_cpps(kind):
    """gguf-py's reference code (llama.cpp's, in numpy) reads the same values from ggrad's
    blocks, and for the legacy types it writes the same bytes."""
    w = weights()
    q = quantized.quantize(w, dtypes.QUANTIZED[kind])
    qtype = getattr(gguf.GGMLQuantizationType, kind.upper())
    raw = quantized.block_bytes(q)
    np.testing.assert_array_equal(gguf.quants.dequantize(raw, qtype).reshape(w.shape), quantized.dequantize(q))
    if not kind.endswith("_k"):  # gguf-py does not quantize the K-quants
        np.testing.assert_array_equal(gguf.quants.quantize(w, qtype), raw)


def test_misuse_is_refused_before_ggml_sees_it():
    w = weights(4, 256)
    with pytest.raises(ValueError, match="positive multiple"):
        quantized.quantize(np.zeros((4, 0), np.float32), dtypes.q4_0)  # ggml divided by zero on it
    with pytest.raises(ValueError, match="positive multiple of 256"):
        quantized.quantize(weights(4, 96), dtypes.q4_k)
    with pytest.raises(ValueError, match="NaN or inf"):
        quantized.quantize(np.where(w > 2, np.nan, w), dtypes.q8_0)
    with pytest.raises(ValueError, match="overflow"):
        quantized.quantize(np.full((1, 256), 1e7, np.float32), dtypes.q4_0)  # its float16 scale would be inf
    with pytest.raises(TypeError, match="quantized dtype"):
        quantized.quantize(w, dtypes.float16)
    q = quantized.quantize(w, dtypes.q4_k)
    with pytest.raises(TypeError, match="blocks of q4_k given for a q6_k weight"):
        quantized.from_blocks(quantized.block_bytes(q).view(quants.BLOCK_TYPES["q4_k"].storage), (4, 256), dtypes.q6_k)
    with pytest.raises(ValueError, match="do not hold"):
        quantized.from_blocks(quantized.block_bytes(q), (4, 512), dtypes.q4_k)
    for misuse in (lambda: q.T, lambda: q + 1, lambda: q.float(), lambda: q.sum()):
        with pytest.raises(TypeError, match="quantized weight is read only by"):
            misuse()  # a transpose's view of the blocks aborted the process in ggml
    for make in (lambda: ggrad.zeros(2, 256, dtype=dtypes.q8_0), lambda: ggrad.tensor(w, dtype=dtypes.q4_0),
                 lambda: ggrad.ones(4, 256).to(dtypes.q8_0)):
        with pytest.raises(TypeError, match="storage of a frozen quantized weight"):
            make()


def test_the_vulkan_banner_is_read_into_each_devices_traits(monkeypatch):
    from ggml import ggml as G
    monkeypatch.setattr(backend, "_vulkan_traits", {})
    line = (b"ggml_vulkan: 7 = NVIDIA H200 (NVIDIA) | uma: 0 | fp16: dot2 | bf16: 0 | warp size: 32 | "
            b"shared memory: 49152 | int dot: 1 | matrix cores: NV_coopmat2\n")
    backend._to_logger(G.GGML_LOG_LEVEL_DEBUG, line, None)
    assert backend.vulkan_traits("vulkan:7") == {"uma": "0", "fp16": "dot2", "bf16": "0", "warp size": "32",
                                                 "shared memory": "49152", "int dot": "1",
                                                 "matrix cores": "NV_coopmat2"}
    assert backend.vulkan_traits("vulkan:3") == {} and backend.vulkan_traits("cpu") == {}


@pytest.mark.parametrize("path", ["kernel", "composed"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows,cols", [(1, 512), (37, 512), (20, 768)], ids=["one row", "37 rows", "768 columns"])
def test_the_input_gradient_through_a_quantized_weight_is_g_times_its_values(dev, kind, rows, cols, path, monkeypatch):
    """x @ W^T's gradient to x for a quantized W (the kernels: the CPU's from chunks of W,
    CUDA's, Vulkan's reading W's blocks in a shader; composed: OUT_PROD or chunks of rows
    read to float32, 128 rows a chunk here) equals g @ dequantize(W) in float64, over more
    than one chunk of W's rows (300), with the CPU's threads sharing W's blocks of columns,
    and rows and columns that part-fill Vulkan's workgroups (16 rows, 512 columns)."""
    from ggrad import ops
    monkeypatch.setattr(ops, "QUANT_BACK_CHUNK_BYTES", 128 * cols * 4)
    if path == "composed":
        without_quantized_backward_kernel(monkeypatch)
    w = weights(rows=300, cols=cols, seed=3)
    q = quantized.quantize(w, dtypes.QUANTIZED[kind])
    rng = np.random.default_rng(4)
    x = ggrad.tensor(rng.standard_normal((rows, cols)).astype(np.float32), requires_grad=True)
    g = rng.standard_normal((rows, 300)).astype(np.float32)
    if path == "composed" and dev.startswith("cuda") and kind.endswith("_k"):
        # ggml-cuda's GET_ROWS reads no K-quant blocks: without the kernel, a clear refusal
        with pytest.raises(NotImplementedError, match="does not support GET_ROWS"), ggrad.grad_tape():
            quantized.linear(x, q).backward(ggrad.tensor(g))
        return
    with ggrad.grad_tape():
        quantized.linear(x, q).backward(ggrad.tensor(g))
    expected = g.astype(np.float64) @ quantized.dequantize(q).astype(np.float64)
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize("kind", ["q8_0", "q4_k"])
def test_the_quantized_backward_kernel_reads_the_blocks_without_float_rows(dev, kind):
    """Where the backend has the kernel (CPU, CUDA, Vulkan from kernel set 41), a compiled
    step's gradient through a quantized weight is one GGRAD node: no GET_ROWS of W's rows
    in float32, no OUT_PROD."""
    from ggrad.runtime import kernels
    if not kernels.supported(ggrad.runtime.current().backend, kernels.QMATMUL_BACK):
        pytest.skip(f"{dev}: no quantized backward kernel in this build")
    q = quantized.quantize(weights(rows=64, cols=256, seed=5), dtypes.QUANTIZED[kind])
    x = ggrad.tensor(weights(rows=8, cols=256, seed=6), requires_grad=True)

    @ggrad.compile
    def step(x):
        with ggrad.grad_tape():
            y = quantized.linear(x, q).sum()
            y.backward()
        return y

    step(x)
    step(x)
    counts = step.op_counts()
    assert counts.get("GGRAD") == 1 and not {"GET_ROWS", "OUT_PROD"} & set(counts), counts
