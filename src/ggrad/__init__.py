"""ggrad: PyTorch-style autograd and device-resident training on ggml backends."""

from . import amp, data, distributed, dtypes, functional, nn, optim, runtime, utils
from .amp import autocast
from .anomaly import detect_anomaly, is_anomaly_enabled, set_detect_anomaly
from .autograd import backward, grad_tape, no_grad
from .capture import compile
from .creation import (arange, empty, empty_like, eye, linspace, rand, rand_like, randint, randint_like,
                       randn, randn_like)
from .data import DataLoader
from .dtypes import bfloat16, bool_ as bool, dtype, float16, float32, int32, int64, result_type
from .functional import (abs, all, amax, amin, any, argmax, argmin, argsort, cat, chunk, clamp, concat, cumsum, div, einsum,
                         eq, exp, flatten, ge, gt, isfinite, isinf, isnan, le, log, logical_and, logical_not,
                         logical_or, logical_xor, lt, masked_fill, matmul, maximum, mean, minimum, movedim, narrow, ne, norm,
                         permute, reshape, sigmoid, softmax, sort, split, sqrt, squeeze, stack, std, sum,
                         tanh, topk, transpose, unsqueeze, var, where)
from .gradcheck import gradcheck
from .io import export_gguf, load, save
from .random import get_rng_state, manual_seed, set_rng_state
from .runtime import count_transfers, device, devices, get_device, gpu_available, set_device
from .runtime.precision import get_float32_matmul_precision, set_float32_matmul_precision
from .tensor import (Tensor, from_dlpack, from_numpy, full, full_like, ones, ones_like, param, realize, tensor,
                     zeros, zeros_like)
from .train import EarlyStopping, History, ModelCheckpoint, evaluate, fit

__version__ = "0.1.0"

float, half, long, int = float32, float16, int64, int32  # torch's aliases  # noqa: A001
clip = clamp

__all__ = [
    "DataLoader", "EarlyStopping", "amp", "distributed", "autocast", "get_float32_matmul_precision",
    "set_float32_matmul_precision", "History", "ModelCheckpoint", "Tensor", "abs", "all", "amax", "amin", "any",
    "arange",
    "argmax", "argmin", "argsort", "backward", "bfloat16", "bool", "cat", "chunk", "clamp", "clip",
    "compile", "concat", "count_transfers", "cumsum", "data", "div", "device", "devices", "dtype", "dtypes",
    "einsum", "empty", "empty_like", "eq", "evaluate", "exp", "export_gguf", "eye", "fit", "flatten",
    "float", "float16", "float32", "from_dlpack", "from_numpy", "full", "full_like", "functional", "ge",
    "get_device", "gpu_available", "grad_tape", "gradcheck", "gt", "half", "int", "int32", "int64",
    "is_anomaly_enabled", "isfinite", "isinf", "isnan", "le", "linspace", "load", "log", "logical_and", "logical_not",
    "logical_or", "logical_xor", "long", "lt", "manual_seed", "get_rng_state", "set_rng_state", "masked_fill", "matmul", "maximum", "mean",
    "minimum", "movedim", "narrow", "ne", "nn", "no_grad", "norm", "ones", "ones_like", "optim", "param", "permute", "rand",
    "rand_like", "randint", "randint_like", "randn", "randn_like", "realize", "reshape", "result_type",
    "runtime", "save", "set_detect_anomaly", "set_device", "sigmoid", "softmax", "sort", "split", "sqrt", "squeeze", "stack",
    "std", "sum", "tanh", "tensor", "topk", "transpose", "unsqueeze", "var", "where", "zeros",
    "utils", "zeros_like",
]
