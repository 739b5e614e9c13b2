"""The old name of `memarray.interop.numba`: the same module."""

import sys
from typing import TYPE_CHECKING

from .interop import numba as _module

if TYPE_CHECKING:  # the names, for type checkers; at run time the module itself
    from .interop.numba import *  # noqa: F403

sys.modules[__name__] = _module
