"""torch allocates through memarray: one pool for torch, CuPy, Numba, RMM and memarray.

Process-wide, before torch touches CUDA (``import torch`` alone does not)::

    import memarray.torch
    memarray.torch.install()          # torch.cuda.memory.change_current_allocator
    x = torch.empty(1 << 20, device="cuda")   # from memarray's default resource

or for a block only, as a ``torch.cuda.MemPool``::

    with torch.cuda.use_mem_pool(memarray.torch.pool()):
        y = torch.empty(1 << 20, device="cuda")

Memory comes from ``memarray.resources.get_default_resource(device)`` (a caching pool by
default) with torch's stream: frees are ordered on the stream torch allocated on, and
``Tensor.record_stream(s)`` is honoured (the free also waits for ``s``'s work). torch's
allocations show in memarray's statistics and tracking under the source ``"torch"``.
Out of memory, memarray releases its caches and CuPy's and RMM's and retries once; then
torch raises RuntimeError ("CUDA out of memory (memarray) ..."). torch's own statistics
(``memory_allocated``, ``memory_snapshot``) do not see a pluggable allocator: use
memarray's.
"""

from __future__ import annotations

import threading
from typing import Any

from . import _memarray

__all__ = ["AllocatorInstalledTooLate", "allocator", "install", "installed", "pool"]

_lock = threading.Lock()
_allocator: Any = None
_installed = False


class AllocatorInstalledTooLate(RuntimeError):
    """torch initialised CUDA (and its own allocator) before ``install()``."""


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError("memarray.torch needs PyTorch: pip install torch") from e
    return torch


def allocator():
    """The ``torch.cuda.memory.CUDAPluggableAllocator`` over memarray (one per process)."""
    global _allocator
    torch = _torch()
    with _lock:
        if _allocator is None:
            _allocator = torch.cuda.memory.CUDAPluggableAllocator(
                _memarray.__file__, "memarray_torch_malloc", "memarray_torch_free"
            )
            _patch_record_stream(torch)
        return _allocator


def install() -> None:
    """Makes memarray torch's CUDA allocator for the rest of the process. Must run before
    torch initialises CUDA: afterwards AllocatorInstalledTooLate (torch cannot swap an
    allocator that has handed out memory). A second call does nothing."""
    global _installed
    torch = _torch()
    a = allocator()
    with _lock:
        if _installed:
            return
        if torch.cuda.is_initialized():
            raise AllocatorInstalledTooLate(
                "torch has already initialised CUDA and its caching allocator; call "
                "memarray.torch.install() before torch's first CUDA use (or use "
                "torch.cuda.use_mem_pool(memarray.torch.pool()) for a block)"
            )
        try:
            torch.cuda.memory.change_current_allocator(a)
        except RuntimeError as e:
            raise AllocatorInstalledTooLate(str(e)) from e
        _installed = True


def installed() -> bool:
    """Whether ``install()`` made memarray torch's process allocator."""
    return _installed


def pool():
    """A ``torch.cuda.MemPool`` whose memory comes from memarray, for
    ``torch.cuda.use_mem_pool``."""
    torch = _torch()
    return torch.cuda.MemPool(allocator().allocator())


def _patch_record_stream(torch) -> None:
    """Tells memarray about ``Tensor.record_stream`` calls (torch's pluggable allocator
    drops them): the free of a block memarray gave torch then waits for that stream."""
    original = torch.Tensor.record_stream
    if getattr(original, "_memarray", False):
        return
    record = _memarray._interop.torch_record_stream

    def record_stream(self, stream):
        original(self, stream)
        if self.is_cuda:
            record(self.untyped_storage().data_ptr(), int(stream.cuda_stream))

    record_stream._memarray = True  # type: ignore[attr-defined]
    record_stream.__doc__ = original.__doc__
    torch.Tensor.record_stream = record_stream


#: Blocks torch holds from memarray right now.
def live_blocks() -> int:
    return _memarray._interop.torch_live_blocks()
