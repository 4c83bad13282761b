"""Operations on tensors, PyTorch's torch.nn.functional on ggrad: each primitive with its
gradient rule right below it, and the operations composed from them (micrograd's habit:
derived ops through basic ones).

A primitive validates its inputs (ggml aborts on a failed assert, so nothing invalid may
reach a builder), adds a lazy node, and -- inside a grad tape -- records its rule. Rules
are written with these same operations, so the backward pass is more lazy nodes.
"""

from ._core import broadcast_to, reshape, sum_to
from .elementwise import (abs, add, affine, clamp, div, exp, gelu, leaky_relu, log, mul, neg, pow,
                          relu, scale, sigmoid, sign, silu, sqrt, square, step, sub, tanh)
from .layout import (cast, concat, embedding, fill, gather, getitem, matmul, matmul_nt, one_hot,
                     permute, transpose, where)
from .losses import (binary_cross_entropy_with_logits, cross_entropy, dropout, l1_loss, mse_loss,
                     rand_like)
from .reduce import argmax, log_softmax, logsumexp, max, mean, one_hot_argmax, softmax, sum

__all__ = [
    "abs", "add", "affine", "argmax", "binary_cross_entropy_with_logits", "broadcast_to", "cast",
    "clamp", "concat", "cross_entropy", "div", "dropout", "embedding", "exp", "fill", "gather",
    "gelu", "getitem", "l1_loss", "leaky_relu", "log", "log_softmax", "logsumexp", "matmul",
    "matmul_nt", "max", "mean", "mse_loss", "mul", "neg", "one_hot", "one_hot_argmax", "permute",
    "pow", "rand_like", "relu", "reshape", "scale", "sigmoid", "sign", "silu", "softmax", "sqrt",
    "square", "step", "sub", "sum", "sum_to", "tanh", "transpose", "where",
]
