"""The old name of `memarray.interop.rmm`: the same module."""

import sys
from typing import TYPE_CHECKING

from .interop import rmm as _module

if TYPE_CHECKING:  # the names, for type checkers; at run time the module itself
    from .interop.rmm import *  # noqa: F403

sys.modules[__name__] = _module
