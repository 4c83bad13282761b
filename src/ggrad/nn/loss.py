"""Loss modules, torch.nn's: each holds its options (and, as torch's, a class `weight` or
`pos_weight` as a buffer) and calls the functional form."""

from __future__ import annotations

from .. import functional as F
from ..tensor import Tensor, tensor
from .module import Module


class _Loss(Module):
    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def _buffer(self, name: str, value) -> None:
        if value is None:
            setattr(self, name, None)
        else:
            self.register_buffer(name, value if isinstance(value, Tensor) else tensor(value))

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"


class CrossEntropyLoss(_Loss):
    def __init__(self, weight=None, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0) -> None:
        super().__init__(reduction)
        self._buffer("weight", weight)
        self.ignore_index, self.label_smoothing = int(ignore_index), float(label_smoothing)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(input, target, self.weight, self.ignore_index, self.reduction, self.label_smoothing)


class NLLLoss(_Loss):
    def __init__(self, weight=None, ignore_index: int = -100, reduction: str = "mean") -> None:
        super().__init__(reduction)
        self._buffer("weight", weight)
        self.ignore_index = int(ignore_index)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.nll_loss(input, target, self.weight, self.ignore_index, self.reduction)


class MSELoss(_Loss):
    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.mse_loss(input, target, self.reduction)


class L1Loss(_Loss):
    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.l1_loss(input, target, self.reduction)


class SmoothL1Loss(_Loss):
    def __init__(self, reduction: str = "mean", beta: float = 1.0) -> None:
        super().__init__(reduction)
        self.beta = float(beta)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.smooth_l1_loss(input, target, self.reduction, self.beta)


class HuberLoss(_Loss):
    def __init__(self, reduction: str = "mean", delta: float = 1.0) -> None:
        super().__init__(reduction)
        self.delta = float(delta)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.huber_loss(input, target, self.reduction, self.delta)


class BCELoss(_Loss):
    def __init__(self, weight=None, reduction: str = "mean") -> None:
        super().__init__(reduction)
        self._buffer("weight", weight)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.binary_cross_entropy(input, target, self.weight, self.reduction)


class BCEWithLogitsLoss(_Loss):
    def __init__(self, weight=None, reduction: str = "mean", pos_weight=None) -> None:
        super().__init__(reduction)
        self._buffer("weight", weight)
        self._buffer("pos_weight", pos_weight)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.binary_cross_entropy_with_logits(input, target, self.weight, self.reduction, self.pos_weight)


class KLDivLoss(_Loss):
    def __init__(self, reduction: str = "mean", log_target: bool = False) -> None:
        super().__init__(reduction)
        self.log_target = bool(log_target)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.kl_div(input, target, self.reduction, self.log_target)
