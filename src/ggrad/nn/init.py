"""torch.nn.init on ggrad tensors: fill a parameter in place (same buffer), with numbers
drawn on the device from ggrad's seeded generator (`ggrad.manual_seed`): no upload.

Normal numbers come from two uniforms (Box-Muller), truncated ones from the inverse
normal CDF of a uniform between the bounds' CDFs (torch's method; erfinv is Giles'
single-precision approximation). `orthogonal_` needs a QR decomposition: it runs on the
host, from the same generator's host side, and uploads the result.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .. import functional as F
from ..autograd import no_grad
from ..random import generator
from .. import dtypes
from ..tensor import Tensor, tensor as ggrad_tensor

_GAINS = {"linear": 1.0, "identity": 1.0, "conv1d": 1.0, "conv2d": 1.0, "conv3d": 1.0, "conv_transpose1d": 1.0,
          "conv_transpose2d": 1.0, "conv_transpose3d": 1.0, "sigmoid": 1.0, "tanh": 5.0 / 3, "relu": math.sqrt(2.0),
          "selu": 3.0 / 4}


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """torch's recommended gain for a nonlinearity (leaky_relu's from its slope `param`)."""
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        if not isinstance(slope, numbers.Real) or isinstance(slope, bool):
            raise ValueError(f"negative_slope {slope!r} is not a valid number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity not in _GAINS:
        raise ValueError(f"unsupported nonlinearity {nonlinearity!r}")
    return _GAINS[nonlinearity]


def _calculate_fan_in_and_fan_out(t: Tensor) -> tuple[int, int]:
    if t.ndim < 2:
        raise ValueError("fan in and fan out can not be computed for a tensor with fewer than 2 dimensions")
    receptive = math.prod(t.shape[2:])
    return t.shape[1] * receptive, t.shape[0] * receptive


def _fan(t: Tensor, mode: str) -> int:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(t)
    return fan_in if mode == "fan_in" else fan_out


def _fill(t: Tensor, value: Tensor) -> Tensor:
    if not isinstance(t, Tensor) or not t.dtype.is_floating_point:
        raise TypeError(f"init fills a floating-point ggrad Tensor, got {type(t).__name__}")
    with no_grad():
        t.assign_(F.cast(value, t.dtype))
    return t


def _uniform(t: Tensor) -> Tensor:
    """U[0, 1) shaped like `t`, float32, on the device."""
    return F.rand_like(F.cast(F.fill(t, 0.0), dtypes.float32))


def _standard_normal(t: Tensor) -> Tensor:
    radius = F.sqrt(F.log(F.affine(_uniform(t), -1.0, 1.0)) * -2.0)  # 1 - u lies in (0, 1]
    return radius * F.cos(_uniform(t) * (2 * math.pi))


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
    return _fill(tensor, F.affine(_uniform(tensor), b - a, a))


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    return _fill(tensor, F.affine(_standard_normal(tensor), std, mean))


def constant_(tensor: Tensor, val: float) -> Tensor:
    return _fill(tensor, F.fill(tensor, float(val)))


def ones_(tensor: Tensor) -> Tensor:
    return constant_(tensor, 1.0)


def zeros_(tensor: Tensor) -> Tensor:
    return constant_(tensor, 0.0)


def xavier_uniform_(tensor: Tensor, gain: float = 1.0) -> Tensor:
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -bound, bound)


def xavier_normal_(tensor: Tensor, gain: float = 1.0) -> Tensor:
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)))


def kaiming_uniform_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu") -> Tensor:
    bound = math.sqrt(3.0) * calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode))
    return uniform_(tensor, -bound, bound)


def kaiming_normal_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu") -> Tensor:
    return normal_(tensor, 0.0, calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode)))


def trunc_normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0) -> Tensor:
    """N(mean, std) restricted to [a, b]: the inverse CDF of a uniform drawn between the
    CDFs of the bounds, as torch's."""
    if not a < b:
        raise ValueError(f"trunc_normal_ needs a < b, got {a}, {b}")
    low, high = (0.5 * (1 + math.erf((v - mean) / (std * math.sqrt(2.0)))) for v in (a, b))
    u = F.affine(_uniform(tensor), 2 * (high - low), 2 * low - 1)  # in [2 low - 1, 2 high - 1)
    return _fill(tensor, F.clamp(F.affine(_erfinv(u), std * math.sqrt(2.0), mean), a, b))


def _erfinv(x: Tensor) -> Tensor:
    """Giles' single-precision erfinv ("Approximating the erfinv function", 2010)."""
    w = -F.log(F.affine(x, -1.0, 1.0) * F.affine(x, 1.0, 1.0))
    central = F.affine(w, 1.0, -2.5)
    p = central * 0.0 + 2.81022636e-08
    for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503, -0.00417768164,
              0.246640727, 1.50140941):
        p = p * central + c
    tail = F.affine(F.sqrt(w), 1.0, -3.0)
    q = tail * 0.0 - 0.000200214257
    for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613, 0.00943887047,
              1.00167406, 2.83297682):
        q = q * tail + c
    return F.where(w < 5.0, p, q) * x


def orthogonal_(tensor: Tensor, gain: float = 1.0) -> Tensor:
    """A (semi-)orthogonal matrix over the first axis and the rest flattened, as torch's
    (QR of a Gaussian matrix, signs fixed by R's diagonal); computed on the host."""
    if tensor.ndim < 2:
        raise ValueError("orthogonal_ needs a tensor of at least 2 dimensions")
    rows, cols = tensor.shape[0], tensor.numel() // tensor.shape[0]
    flat = generator().standard_normal((rows, cols))
    if rows < cols:
        flat = flat.T
    q, r = np.linalg.qr(flat)
    q *= np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    return _fill(tensor, ggrad_tensor((q * gain).reshape(tensor.shape).astype(np.float32)))
