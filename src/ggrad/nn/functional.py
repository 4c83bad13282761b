"""torch.nn.functional's name for `ggrad.functional`: the same functions, so a PyTorch
program's `import torch.nn.functional as F` ports by changing its import only."""

from ..functional import *  # noqa: F401,F403
from ..functional import __all__  # noqa: F401
