"""The old name of `memarray.interop.torch`: the same module."""

import sys
from typing import TYPE_CHECKING

from .interop import torch as _module

if TYPE_CHECKING:  # the names, for type checkers; at run time the module itself
    from .interop.torch import *  # noqa: F403

sys.modules[__name__] = _module
