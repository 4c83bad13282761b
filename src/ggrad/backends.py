"""torch.backends' switches a training script sets: `cuda.matmul.allow_tf32` and
`cudnn.allow_tf32` are ggrad's float32 matmul precision ("high" allows TF32, "highest" does
not: `ggrad.set_float32_matmul_precision`); ggrad has no cuDNN, so cudnn's other switches
are kept and read back without effect."""

from __future__ import annotations

from .runtime import devices, precision


class _TF32Switch:
    """`allow_tf32`, read from and written to the matmul precision."""

    @property
    def allow_tf32(self) -> bool:
        return precision.get_float32_matmul_precision() != "highest"

    @allow_tf32.setter
    def allow_tf32(self, value: bool) -> None:
        precision.set_float32_matmul_precision("high" if value else "highest")


class _Matmul(_TF32Switch):
    allow_bf16_reduced_precision_reduction = True
    allow_fp16_reduced_precision_reduction = True


class _Cuda:
    matmul = _Matmul()

    @staticmethod
    def is_built() -> bool:
        """Whether this ggml build sees a CUDA device (ggrad.cuda.is_available)."""
        return any(d.kind == "cuda" for d in devices())


class _Cudnn(_TF32Switch):
    enabled = True
    benchmark = False
    deterministic = False

    @staticmethod
    def is_available() -> bool:
        return False


cuda = _Cuda()
cudnn = _Cudnn()
