"""`memarray.ray`: `memarray.cluster.ray` under its short name (the same module)."""

import sys
from typing import TYPE_CHECKING

from .cluster import ray as _module

if TYPE_CHECKING:  # the names, for type checkers; at run time the module itself
    from .cluster.ray import *  # noqa: F403

sys.modules[__name__] = _module
