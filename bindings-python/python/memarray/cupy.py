"""The old name of `memarray.interop.cupy`: the same module."""

import sys
from typing import TYPE_CHECKING

from .interop import cupy as _module

if TYPE_CHECKING:  # the names, for type checkers; at run time the module itself
    from typing import Any

    from .interop.cupy import *  # noqa: F403

    def __getattr__(name: str) -> Any: ...  # `allocator`, made on first use


sys.modules[__name__] = _module
