"""The old name of `memarray.interop.cuda_core`: the same module."""

import sys
from typing import TYPE_CHECKING

from .interop import cuda_core as _module

if TYPE_CHECKING:  # the names, for type checkers; at run time the module itself
    from .interop.cuda_core import *  # noqa: F403

sys.modules[__name__] = _module
