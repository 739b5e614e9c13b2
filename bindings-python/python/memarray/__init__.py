"""memarray: typed N-d arrays mirrored between host and CUDA devices.

Arrays live on the host, on a CUDA device, or both; ``move_memory`` copies them
asynchronously on CUDA streams, ``get_dlpack`` locks them while an outside observer
holds them, and DLPack / the buffer protocol / the CUDA Array Interface hand them to
NumPy, PyTorch, CuPy, JAX and Numba without copying.
"""

from __future__ import annotations

from . import _env, _hooks, _progress, cuda, dlpack, resources, spill
from ._asarray import asarray
from ._bundle import Bundle
from ._memarray import (
    MAX_NDIM,
    SUPPORTED_DTYPES,
    CaptureError,
    CudaUnavailableError,
    DLPackContext,
    IpcHandle,
    LockError,
    MemArray,
    OutOfMemoryError,
    __version__,
    empty,
    from_dlpack,
    from_ipc_handle,
    full,
    gather,
    move_many,
    scatter,
    zeros,
)
from ._progress import set_progress
from .cluster import distributed

# Every variable the package reads is checked now (the extension checked its own when it
# loaded): a value memarray does not understand fails the import, naming the variable.
_env.check()


def load(path, device=None, host_memory=None) -> MemArray:
    """Reads a ``.npy`` file into a new array on ``device`` (None: the host), read from
    the file straight there (parallel reads; no host copy for a device). OSError for a
    missing, unreadable, in-use or non-regular file (or one that shrinks while read),
    ValueError for a bad or short one. In an interactive session a load still running
    after about a second shows a progress bar (``set_progress``)."""
    return _progress.load(path, device, host_memory)


# Dask, distributed and dask-cuda: MemArrays are registered with them once both are
# imported, in either order (memarray.dask).
_hooks.install()

__all__ = [
    "__version__",
    "MAX_NDIM",
    "SUPPORTED_DTYPES",
    "Bundle",
    "CaptureError",
    "OutOfMemoryError",
    "CudaUnavailableError",
    "DLPackContext",
    "IpcHandle",
    "LockError",
    "MemArray",
    "asarray",
    "cupy_allocator",
    "cuda",
    "distributed",
    "dlpack",
    "empty",
    "from_dlpack",
    "from_ipc_handle",
    "full",
    "gather",
    "load",
    "set_progress",
    "move_many",
    "resources",
    "scatter",
    "spill",
    "zeros",
]


#: Optional modules imported on first use as ``memarray.<name>``: a class pickled by value
#: (a Ray actor's, a Dask task's) that names ``memarray.ray`` works in a fresh process.
_LAZY = frozenset(
    {
        "cluster",
        "cuda_core",
        "cupy",
        "dask",
        "interop",
        "mpi",
        "notebook",
        "numba",
        "ray",
        "rmm",
        "torch",
    }
)


#: NumPy's and torch's creation functions that memarray spells another way.
_HINTS = {
    "ones": "memarray.full(shape, 1, dtype, device=...)",
    "array": "memarray.asarray(data, device=...)",
    "arange": "memarray.asarray(np.arange(...), device=...)",
    "linspace": "memarray.asarray(np.linspace(...), device=...)",
    "zeros_like": "memarray.zeros(a.shape, a.dtype, device=a.device)",
    "empty_like": "memarray.empty(a.shape, a.dtype, device=a.device)",
    "ones_like": "memarray.full(a.shape, 1, a.dtype, device=a.device)",
    "full_like": "memarray.full(a.shape, value, a.dtype, device=a.device)",
    "save": "a.save(path) (a method; memarray.load(path) reads the file back)",
    "copy": "a.copy() (a method), or memarray.asarray(a, copy=True)",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    if name in _HINTS:
        raise AttributeError(f"module 'memarray' has no attribute {name!r}: use {_HINTS[name]}")
    raise AttributeError(f"module 'memarray' has no attribute {name!r}")


def cupy_allocator(nbytes: int):
    """``cupy.cuda.set_allocator(memarray.cupy_allocator)``: CuPy allocates from memarray's
    default resource (see ``memarray.cupy``)."""
    from .interop.cupy import _make

    return _make()(nbytes)
