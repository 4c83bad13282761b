"""Operations on tensors, PyTorch's torch.nn.functional on ggrad: each primitive with its
gradient rule right below it, and the operations composed from them (micrograd's habit:
derived ops through basic ones).

A primitive validates its inputs (ggml aborts on a failed assert, so nothing invalid may
reach a builder), adds a lazy node, and -- inside a grad tape -- records its rule. Rules
are written with these same operations, so the backward pass is more lazy nodes.
"""

import sys

from . import methods
from ._core import broadcast_to, cast, reshape, sum_to
from .attention import rotary_embedding, scaled_dot_product_attention
from .conv import (adaptive_avg_pool2d, avg_pool1d, avg_pool2d, conv1d, conv2d, conv_transpose2d, fold,
                   interpolate, max_pool1d, max_pool2d, unfold, unfold_windows)
from .compare import (eq, ge, gt, isfinite, isinf, isnan, le, logical_and, logical_not,
                      logical_or, logical_xor, lt, masked_fill, ne, tril, triu, where)
from .elementwise import (abs, add, addcdiv, addcmul, affine, ceil, clamp, cos, div, exp, floor, floor_divide, gelu, leaky_relu,
                          log, maximum, minimum, mul, neg, pow, relu, remainder, round, scale, sigmoid,
                          sign, silu, sin, sqrt, square, step, sub, tanh, trunc)
from .indexing import embedding, fill, gather, getitem, one_hot, setitem, take
from .einsum import einsum
from .layout import (bilinear, cat, chunk, concat, expand, flatten, linear, matmul, matmul_nt, movedim, narrow, pad,
                     permute, pixel_shuffle, pixel_unshuffle, repeat, split, squeeze, stack, transpose, unflatten,
                     unsqueeze)
from .losses import (binary_cross_entropy, binary_cross_entropy_with_logits, cross_entropy, dropout, huber_loss,
                     kl_div, l1_loss, mse_loss, nll_loss, rand_like, smooth_l1_loss)
from .normalization import batch_norm, group_norm, instance_norm, layer_norm
from .reduce import (all, amax, amin, any, argmax, argmin, argsort, cumsum, log_softmax, logsumexp, max, mean, min,
                     norm, one_hot_argmax, softmax, sort, std, sum, take_along_last, topk, var)
from .sampling import multinomial

__all__ = [
    "abs", "adaptive_avg_pool2d", "add", "addcdiv", "addcmul", "affine", "all", "amax", "amin", "any", "argmax", "argmin", "argsort",
    "avg_pool1d", "avg_pool2d", "batch_norm", "bilinear", "conv1d", "conv2d", "conv_transpose2d", "max_pool1d", "max_pool2d", "unfold_windows",
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "broadcast_to", "cast", "cat", "ceil", "chunk", "clamp", "concat", "cos",
    "cross_entropy", "cumsum", "div", "dropout", "einsum", "embedding", "eq", "exp", "expand", "fill",
    "flatten", "floor", "fold", "floor_divide", "gather", "ge", "gelu", "getitem", "group_norm", "gt", "huber_loss", "isfinite", "isinf",
    "instance_norm", "interpolate", "isnan", "kl_div", "layer_norm", "l1_loss", "le", "leaky_relu", "linear", "log", "log_softmax", "logical_and", "logical_not",
    "logical_or", "logical_xor", "logsumexp", "lt", "masked_fill", "matmul", "matmul_nt", "max",
    "maximum", "mean", "min", "minimum", "movedim", "mse_loss", "mul", "multinomial", "narrow", "ne", "neg", "nll_loss", "norm",
    "one_hot", "one_hot_argmax", "pad", "permute", "pixel_shuffle", "pixel_unshuffle", "pow", "rand_like", "relu", "remainder", "repeat",
    "reshape", "rotary_embedding", "round", "scale", "scaled_dot_product_attention", "setitem", "sigmoid", "sign", "silu", "sin", "smooth_l1_loss", "softmax", "sort", "split",
    "sqrt", "square", "squeeze", "stack", "std", "step", "sub", "sum", "sum_to", "take",
    "take_along_last", "tanh", "topk", "transpose", "tril", "triu", "trunc", "unflatten", "unfold", "unsqueeze", "var", "where",
]

# The Tensor methods these functions implement go onto Tensor now that they all exist
# (the tensor layer below knows nothing of this one).
methods.install(sys.modules[__name__])
