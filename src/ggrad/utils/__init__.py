"""torch.utils's names for ggrad's modules (`ggrad.utils.data` is `ggrad.data`)."""

from . import data

__all__ = ["data"]
