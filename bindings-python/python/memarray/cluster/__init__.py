"""Beyond one process: Dask (serializers, worker setup), MPI (``memarray.mpi``) and NCCL
communicators (``memarray.distributed``). ``memarray.dask``, ``memarray.mpi`` and
``memarray.distributed`` still import these.
"""

from typing import Any

import numpy as np


def numpy_dtype(name: str) -> np.dtype[Any]:
    """NumPy's dtype for a MemArray dtype name (bfloat16 through ml_dtypes)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)
