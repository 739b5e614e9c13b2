"""memarray: typed N-d arrays mirrored between host and CUDA devices.

Arrays live on the host, on a CUDA device, or both; ``move_memory`` copies them
asynchronously on CUDA streams, ``get_dlpack`` locks them while an outside observer
holds them, and DLPack / the buffer protocol / the CUDA Array Interface hand them to
NumPy, PyTorch, CuPy, JAX and Numba without copying.
"""

from __future__ import annotations

import os
import sys
from typing import Any

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


def load_safetensors(
    path: str | os.PathLike[str],
    device: object = None,
    *,
    names: list[str] | None = None,
    host_memory: str | None = None,
    metadata: bool = False,
) -> Any:
    """Reads a safetensors file (the format models ship in) into a dict of new arrays on
    ``device`` (None: the host), name to MemArray in the file's data order, each read from
    the file straight there (parallel reads into host arrays; for a device, through pinned
    staging with no host copy). ``names`` (a list of str) reads only those. With
    ``metadata=True`` returns ``(arrays, metadata)``, the file's ``__metadata__`` a dict of
    str. The whole header is checked before any data is read: a file that breaks the format
    (a header past the file or past 100 MB, offsets out of range, overlapping or with gaps,
    sizes that disagree with shape and dtype, a name given twice, an unknown dtype), a name
    the file does not have, or a tensor of a dtype memarray does not hold (float8, float6,
    float4) is ValueError; a missing or unreadable file OSError. In an interactive session a
    load still running after about a second shows a progress bar."""
    if names is not None and (isinstance(names, str) or not all(isinstance(n, str) for n in names)):
        raise TypeError("names must be a list of str or None")
    arrays, meta = _progress.load_safetensors(
        path, device, host_memory, None if names is None else list(names)
    )
    return (arrays, meta) if metadata else arrays


def save_safetensors(
    path: str | os.PathLike[str], arrays: dict[str, Any], metadata: dict[str, str] | None = None
) -> None:
    """Writes ``arrays`` (a dict of name to MemArray, or anything ``asarray`` takes) to
    ``path`` as a safetensors file that safetensors' own loaders read, with ``metadata``
    (a dict of str to str) as its ``__metadata__``: tensors laid out as safetensors' own
    writer lays them (larger elements first, then by name), each array's current data
    (read back from a device in pieces where it is there). complex128, which safetensors
    does not define, and the reserved name ``__metadata__`` are ValueError before the file
    is created."""
    if not isinstance(arrays, dict):
        raise TypeError(f"arrays must be a dict of name to array, not {type(arrays).__name__}")
    pairs = []
    for name, a in arrays.items():
        if not isinstance(name, str):
            raise TypeError(f"array names must be str, not {type(name).__name__}")
        pairs.append((name, a if isinstance(a, MemArray) else asarray(a)))
    meta = {} if metadata is None else metadata
    if not isinstance(meta, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
    ):
        raise TypeError("metadata must be a dict of str to str or None")
    _progress.save_safetensors(path, pairs, list(meta.items()))


def offload(device: int = 0, *, sources: object = None) -> int:
    """Puts ``device``'s memory to sleep: its default resource, a
    ``resources.Pool(resources.Device(device), grow_in_place=...)``, copies every block
    handed out (whichever library holds it: torch, CuPy, memarray's arrays) to page-locked
    host memory and releases the device memory while every address stays reserved
    (``Pool.offload``); torch's cache above memarray (``memarray.torch.install()``) gives
    its free blocks back first, so they are dropped, not copied. Returns the bytes
    released. ``sources`` must be None: the pool offloads every library's blocks
    together. Until ``restore(device)`` nothing may use the pool's memory. ValueError when
    the default resource cannot offload."""
    if sources is not None:
        raise ValueError("offload takes every library's blocks in the pool: sources must be None")
    pool = _default_pool(device, "offload")
    # torch's cache above memarray (memarray.torch.install()) holds blocks torch has freed,
    # handed out as far as the pool knows: torch gives them back first, so they are
    # dropped, not copied.
    ours = sys.modules.get("memarray.interop.torch")
    if ours is not None and ours.installed():
        ours.release(device)
    return pool.offload()


def restore(device: int = 0) -> int:
    """Wakes ``device``'s memory after ``offload``: the same addresses are backed again and
    every offloaded block's bytes copied back; returns the bytes restored."""
    return _default_pool(device, "restore").restore()


def _default_pool(device: int, what: str) -> resources.Pool:
    """``device``'s default resource, which must be a Pool to ``what`` (ValueError else)."""
    pool = resources.get_default_resource(device)
    if not isinstance(pool, resources.Pool):
        raise ValueError(
            f"cuda:{device}'s default resource is {pool.name}: {what} needs "
            "resources.Pool(resources.Device(d), grow_in_place=...) as the default resource"
        )
    return pool


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
    "load_safetensors",
    "offload",
    "restore",
    "save_safetensors",
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
