"""torch.utils.data's name for `ggrad.data`: `from ggrad.utils.data import DataLoader`."""

from ..data import *  # noqa: F401,F403
from ..data import __all__  # noqa: F401
