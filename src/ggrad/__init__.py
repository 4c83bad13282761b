"""ggrad: PyTorch-style autograd and device-resident training on ggml backends."""

from . import accelerator, amp, backends, cuda, data, distributed, dtypes, functional, nn, optim, runtime, utils
from .amp import autocast
from .anomaly import detect_anomaly, is_anomaly_enabled, set_detect_anomaly
from .autograd import backward, grad_tape, no_grad
from .capture import compile
from .creation import (arange, empty, empty_like, eye, linspace, rand, rand_like, randint, randint_like,
                       randn, randn_like)
from .data import DataLoader
from .dtypes import bfloat16, bool_ as bool, dtype, float16, float32, int32, int64, result_type
from .functional import (abs, add, addcdiv, addcmul, all, amax, amin, any, argmax, argmin, argsort, avg_pool1d,
                         broadcast_to, cat, ceil, chunk, clamp, concat, conv1d, conv2d, conv_transpose2d, cos, cumsum, div,
                         einsum, eq, exp, flatten, floor, floor_divide, ge, gt, isfinite, isinf, isnan, layer_norm, le, log,
                         log_softmax, logical_and, logical_not, logical_or, logical_xor, logsumexp, lt, masked_fill, matmul,
                         max_pool1d, max_pool2d, maximum, mean, minimum, movedim, mul, multinomial, narrow, ne, neg, norm, permute, pow,
                         relu, remainder, reshape, round, sigmoid, sign, sin, softmax, sort, split, sqrt, square, squeeze,
                         stack, std, sub, sum, tanh, topk, transpose, tril, triu, trunc, unflatten, unsqueeze, var, where)
from .gradcheck import gradcheck
from .io import export_gguf, load, save
from .random import get_rng_state, manual_seed, set_rng_state
from .runtime import count_transfers, device, devices, get_device, gpu_available, set_device
from .runtime.precision import get_float32_matmul_precision, set_float32_matmul_precision
from .tensor import (Tensor, from_dlpack, from_numpy, full, full_like, ones, ones_like, param, realize, tensor,
                     zeros, zeros_like)
from .tensor import top_level_max as max, top_level_min as min  # noqa: A004  (torch's names)
from .train import CSVLogger, EarlyStopping, History, ModelCheckpoint, TensorBoard, evaluate, fit

__version__ = "0.1.0"

float, half, long, int = float32, float16, int64, int32  # torch's aliases  # noqa: A001
clip = clamp

__all__ = [
    "abs", "accelerator", "add", "addcdiv", "addcmul", "all", "amax", "amin", "amp", "any", "arange",
    "argmax", "argmin", "argsort", "autocast", "avg_pool1d", "backends", "backward", "bfloat16", "bool",
    "broadcast_to", "cat", "ceil", "chunk", "clamp", "clip", "compile", "concat", "conv1d", "conv2d",
    "conv_transpose2d", "cos", "count_transfers", "CSVLogger", "cuda", "cumsum", "data", "DataLoader",
    "device", "devices", "distributed", "div", "dtype", "dtypes", "EarlyStopping", "einsum", "empty",
    "empty_like", "eq", "evaluate", "exp", "export_gguf", "eye", "fit", "flatten", "float", "float16",
    "float32", "floor", "floor_divide", "from_dlpack", "from_numpy", "full", "full_like", "functional", "ge",
    "get_device", "get_float32_matmul_precision", "get_rng_state", "gpu_available", "grad_tape", "gradcheck",
    "gt", "half", "History", "int", "int32", "int64", "is_anomaly_enabled", "isfinite", "isinf", "isnan",
    "layer_norm", "le", "linspace", "load", "log", "log_softmax", "logical_and", "logical_not", "logical_or",
    "logical_xor", "logsumexp", "long", "lt", "manual_seed", "masked_fill", "matmul", "max", "max_pool1d",
    "max_pool2d", "maximum", "mean", "min", "minimum", "ModelCheckpoint", "movedim", "mul", "multinomial", "narrow", "ne",
    "neg", "nn", "no_grad", "norm", "ones", "ones_like", "optim", "param", "permute", "pow", "rand",
    "rand_like", "randint", "randint_like", "randn", "randn_like", "realize", "relu", "remainder", "reshape",
    "result_type", "round", "runtime", "save", "set_detect_anomaly", "set_device",
    "set_float32_matmul_precision", "set_rng_state", "sigmoid", "sign", "sin", "softmax", "sort", "split",
    "sqrt", "square", "squeeze", "stack", "std", "sub", "sum", "tanh", "tensor", "Tensor", "TensorBoard", "topk",
    "transpose", "tril", "triu", "trunc", "unflatten", "unsqueeze", "utils", "var", "where", "zeros",
    "zeros_like",
]
