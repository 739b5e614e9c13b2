"""The old name of `memarray.cluster.mpi`: the same module."""

import sys
from typing import TYPE_CHECKING

from .cluster import mpi as _module

if TYPE_CHECKING:  # the names, for type checkers; at run time the module itself
    from .cluster.mpi import *  # noqa: F403

sys.modules[__name__] = _module
