"""The old name of `memarray.cluster.dask`: the same module."""

import sys
from typing import TYPE_CHECKING

from .cluster import dask as _module

if TYPE_CHECKING:  # the names, for type checkers; at run time the module itself
    from .cluster.dask import *  # noqa: F403

sys.modules[__name__] = _module
