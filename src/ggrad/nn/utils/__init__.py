"""torch.nn.utils: gradient clipping (ggrad.optim's, on the device), a model's
parameters as one flat vector and back, and `rnn`'s packed sequences."""

from __future__ import annotations

from ... import autograd
from ... import functional as F
from ...optim.clip import clip_grad_norm_, clip_grad_value_
from ...tensor import Tensor
from . import rnn

__all__ = ["clip_grad_norm_", "clip_grad_value_", "parameters_to_vector", "rnn", "vector_to_parameters"]


def _listed(parameters, what: str) -> list[Tensor]:
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    for p in params:
        if not isinstance(p, Tensor):
            raise TypeError(f"{what} expects tensors, got {type(p).__name__}")
    return params


def parameters_to_vector(parameters) -> Tensor:
    """The parameters flattened and joined in order, one 1-d tensor (gradients flow back
    to each, as torch's view + cat)."""
    params = _listed(parameters, "parameters_to_vector")
    if not params:
        raise ValueError("parameters_to_vector needs at least one parameter")
    flat = [F.reshape(p, (p.numel(),)) for p in params]
    return F.cat(flat) if len(flat) > 1 else flat[0]


def vector_to_parameters(vec: Tensor, parameters) -> None:
    """Write consecutive slices of the 1-d `vec` into the parameters, in place (their
    buffers keep their addresses), as torch's."""
    if not isinstance(vec, Tensor):
        raise TypeError(f"expected vec to be a Tensor, but got {type(vec).__name__}")
    params = _listed(parameters, "vector_to_parameters")
    total = sum(p.numel() for p in params)
    if vec.ndim != 1 or vec.shape[0] != total:
        raise ValueError(f"vector_to_parameters: vec has shape {vec.shape}, the parameters hold {total} elements")
    offset = 0
    with autograd.no_grad():
        for p in params:
            n = p.numel()
            p.copy_(F.reshape(vec[offset:offset + n], p.shape))
            offset += n
