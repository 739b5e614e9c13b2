"""torch allocates through memarray: one pool for torch, CuPy, Numba, RMM and memarray.

Process-wide, on every device, for every thread and stream, before or after torch's first
CUDA use::

    import memarray.torch
    memarray.torch.install()
    x = torch.empty(1 << 20, device="cuda")   # a block of a segment memarray allocated

torch's caching allocator stays on top and takes its segments from memarray: each
device's allocations go to a ``torch.cuda.MemPool`` over memarray's allocator (torch's
``_cuda_beginAllocateToPool`` with a filter that takes every stream), so every feature of
torch's allocator keeps working: cuDNN autotuning, ``memory_allocated`` / ``memory_stats``
/ ``memory_summary`` / peak statistics, ``_record_memory_history`` and snapshots, CUDA
graphs and ``torch.compile(mode="reduce-overhead")``, ``empty_cache``. While torch
routes allocations to a pool of its own (a graph's capture, cudagraph trees' warm-up,
``use_mem_pool``), memarray's routing of that device steps aside. For a block
only, a ``torch.cuda.MemPool`` works the same way::

    with torch.cuda.use_mem_pool(memarray.torch.pool()):
        y = torch.empty(1 << 20, device="cuda")

Segments come from ``memarray.resources.get_default_resource(device)`` (a caching pool by
default) and show in memarray's statistics and tracking under the source ``"torch"``.
Pressure is shared: when another library's allocation through memarray runs out of memory,
memarray asks torch to give back its cached segments (``release``) before it fails or
spills.
"""

from __future__ import annotations

import atexit
import threading
from typing import Any

from .. import _memarray

__all__ = ["allocator", "install", "installed", "live_blocks", "pool", "release"]

_lock = threading.RLock()
_allocator: Any = None
# install(cache=False): memarray is torch's allocator itself (no cache of torch's on top).
_direct = False
# device -> the MemPool every allocation on it goes to, while installed.
_routes: dict[int, Any] = {}
# device -> routings of torch's own pools active now (memarray's steps aside meanwhile).
_aside: dict[int, int] = {}
# torch's own routing functions (before memarray wrapped them).
_begin: Any = None
_end_routing: Any = None
_release_pool: Any = None
_empty_cache: Any = None


def _end(device: int, pool_id) -> None:
    """Ends memarray's routing to ``pool_id``: each begin took a use of the pool (as
    ``use_mem_pool`` does), given back here, so the pool can go when its object does."""
    _end_routing(device, pool_id)
    _release_pool(device, pool_id)


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError("memarray.torch needs PyTorch: pip install torch") from e
    return torch


def allocator():
    """The ``torch.cuda.memory.CUDAPluggableAllocator`` over memarray (one per process):
    what the pools' segments come from."""
    global _allocator
    torch = _torch()
    with _lock:
        if _allocator is None:
            # Segments only: torch's caching allocator on top orders the reuse and the
            # release of its blocks after `Tensor.record_stream`'s streams itself.
            _allocator = torch.cuda.memory.CUDAPluggableAllocator(
                _memarray.__file__, "memarray_torch_malloc", "memarray_torch_free"
            )
        return _allocator


def _new_pool(torch, device: int):
    with torch.cuda.device(device):
        return torch.cuda.MemPool(allocator().allocator())


def install(*, cache: bool = True) -> None:
    """Makes memarray the source of torch's CUDA memory for the rest of the process: on
    every device, for every thread and stream, whether or not torch has used CUDA yet
    (memory torch already cached stays in its own pool until freed). A second call with
    the same ``cache`` does nothing. RuntimeError without a CUDA device.

    ``cache=False``: memarray is torch's allocator itself, with no cache of torch's on top
    (``torch.cuda.memory.change_current_allocator``): every tensor is a block of memarray's
    pool and goes back to it when freed, so a pool growing in place
    (``resources.Pool(..., grow_in_place=...)``) keeps torch's peak as close to its live
    bytes as memarray's own (torch's cache keeps its segments apart, and keeps them until
    ``empty_cache``). What torch then lacks is what it lacks with any allocator of this
    kind: its memory statistics and snapshots, private pools for CUDA graphs, and
    ``Tensor.record_stream`` (a tensor used on a stream other than its own must be waited
    for before it is freed). Only before torch's first CUDA allocation in the process
    (RuntimeError after), and not after ``install()`` with the cache (ValueError)."""
    global _direct
    torch = _torch()
    with _lock:
        if not cache:
            if _routes:
                raise ValueError(
                    "memarray.torch.install() routed torch's cache through memarray "
                    "already: install(cache=False) must be the process's first install"
                )
            if _direct:
                return
            if torch.cuda.device_count() == 0:
                raise RuntimeError("memarray.torch.install() needs a CUDA device (torch sees none)")
            try:
                torch.cuda.memory.change_current_allocator(allocator())
            except RuntimeError as e:
                raise RuntimeError(
                    "memarray.torch.install(cache=False) must come before torch's first "
                    f"CUDA allocation in the process (torch: {e})"
                ) from e
            _direct = True
            return
        if _direct:
            raise ValueError(
                "memarray is torch's allocator without its cache (install(cache=False)); "
                "the cache cannot be put back in the same process"
            )
        if _routes:
            return
        n = torch.cuda.device_count()
        if n == 0:
            raise RuntimeError("memarray.torch.install() needs a CUDA device (torch sees none)")
        _patch_routing(torch)
        for d in range(n):
            p = _new_pool(torch, d)
            _begin(d, p.id)
            _routes[d] = p
        # A pool's last reference empties its cache, which torch refuses (ending the
        # process) while a routing is active: the routings end before interpreter exit.
        atexit.register(_end_all)


def _end_all() -> None:
    with _lock:
        for d, p in list(_routes.items()):
            if not _aside.get(d):
                _end(d, p.id)
        _routes.clear()


def installed() -> bool:
    """Whether ``install()`` made memarray the source of torch's CUDA memory (with torch's
    cache on top or without it)."""
    return bool(_routes) or _direct


def release(device: int) -> int:
    """Makes torch give the cached (free) segments it took from memarray back (on every
    device: torch empties its caches all at once); returns the bytes torch's reserved
    memory on ``device`` fell by. Allocations go on to fresh pools; blocks still in use stay
    valid, and their segments go back when freed and the cache is emptied. 0 when memarray
    is not installed, or while torch routes to a pool of its own (a graph's capture: torch
    cannot empty a cache then)."""
    torch = _torch()
    with _lock:
        if _direct or device not in _routes or any(_aside.values()):
            return 0  # without torch's cache, nothing is cached above memarray's pool
        before = torch.cuda.memory_reserved(device)
        _rotate(torch)
        return max(0, before - torch.cuda.memory_reserved(device))


def _rotate(torch) -> None:
    """Swaps every device's pool for a fresh one and empties torch's cache. torch asserts
    (ending the process) if a cache is emptied while any routing is active, so memarray's
    routings end first and begin again on the fresh pools after."""
    devices = list(_routes)
    for d in devices:
        _end(d, _routes[d].id)
    for d in devices:
        # Dropping the old pool's last reference: torch releases it and empties its cache.
        _routes[d] = _new_pool(torch, d)
    _empty_cache()
    for d in devices:
        _begin(d, _routes[d].id)


def _patch_routing(torch) -> None:
    """While torch routes allocations to a pool of its own (a CUDA graph's capture,
    cudagraph trees' warm-up in ``torch.compile(mode="reduce-overhead")``, ``use_mem_pool``),
    memarray's routing of that device steps aside: torch takes the first routing whose
    filter matches, memarray's takes every stream, and torch checks that a graph's outputs
    live in the graph's pool. Allocations on the device go to torch's default pool for that
    while (measured: with any routing of every stream present, even torch's own MemPool,
    cudagraph trees refuse their outputs)."""
    global _begin, _end_routing, _release_pool
    if _begin is not None:
        return
    _begin = torch._C._cuda_beginAllocateToPool
    _end_routing = torch._C._cuda_endAllocateToPool
    _release_pool = torch._C._cuda_releasePool
    others = _aside

    def step_aside(device: int) -> None:
        others[device] = others.get(device, 0) + 1
        route = _routes.get(device)
        if others[device] == 1 and route is not None:
            _end(device, route.id)

    def step_back(device: int) -> None:
        others[device] = max(0, others.get(device, 0) - 1)
        route = _routes.get(device)
        if others[device] == 0 and route is not None:
            _begin(device, route.id)

    def ours(device, pool_id) -> bool:
        route = _routes.get(int(device))
        return route is not None and tuple(pool_id) == tuple(route.id)

    def wrap_begin(original):
        def begin(device, pool_id, *args, **kwargs):
            with _lock:
                if ours(device, pool_id):
                    return original(device, pool_id, *args, **kwargs)
                step_aside(int(device))
                try:
                    return original(device, pool_id, *args, **kwargs)
                except BaseException:
                    step_back(int(device))
                    raise

        begin.__doc__ = original.__doc__
        return begin

    def wrap_end(original):
        def end(device, pool_id, *args, **kwargs):
            with _lock:
                result = original(device, pool_id, *args, **kwargs)
                if not ours(device, pool_id):
                    step_back(int(device))
                return result

        end.__doc__ = original.__doc__
        return end

    wrappers = {
        "_cuda_beginAllocateToPool": wrap_begin,
        "_cuda_beginAllocateCurrentThreadToPool": wrap_begin,
        "_cuda_beginAllocateCurrentStreamToPool": wrap_begin,
        "_cuda_endAllocateToPool": wrap_end,
    }
    for name, wrap in wrappers.items():
        original = getattr(torch._C, name, None)
        if original is None:
            continue
        wrapped = wrap(original)
        setattr(torch._C, name, wrapped)
        if hasattr(torch.cuda.memory, name):  # imported by name there (use_mem_pool)
            setattr(torch.cuda.memory, name, wrapped)

    # A graph's capture begins and ends its routing in C++ (CUDAGraph::capture_begin).
    cls = torch.cuda.CUDAGraph
    original_begin, original_end = cls.capture_begin, cls.capture_end

    def capture_begin(self, *args, **kwargs):
        device = torch.cuda.current_device()
        with _lock:
            step_aside(device)
            self._memarray_device = device
            try:
                return original_begin(self, *args, **kwargs)
            except BaseException:
                step_back(device)
                raise

    def capture_end(self, *args, **kwargs):
        try:
            return original_end(self, *args, **kwargs)
        finally:
            device = getattr(self, "_memarray_device", None)
            if device is not None:
                with _lock:
                    step_back(device)
                self._memarray_device = None

    capture_begin.__doc__ = original_begin.__doc__
    capture_end.__doc__ = original_end.__doc__
    cls.capture_begin = capture_begin
    cls.capture_end = capture_end

    # torch.cuda.empty_cache keeps its meaning: torch does not empty a pool in use, so
    # memarray's pools are swapped for fresh ones and the old ones' free segments go back.
    global _empty_cache
    _empty_cache = torch.cuda.empty_cache

    def empty_cache() -> None:
        with _lock:
            if _routes and not any(_aside.values()):
                _rotate(torch)
            else:
                _empty_cache()

    empty_cache.__doc__ = _empty_cache.__doc__
    torch.cuda.empty_cache = empty_cache
    torch.cuda.memory.empty_cache = empty_cache


def pool():
    """A ``torch.cuda.MemPool`` whose memory comes from memarray, for
    ``torch.cuda.use_mem_pool``."""
    torch = _torch()
    return torch.cuda.MemPool(allocator().allocator())


def live_blocks() -> int:
    """Segments torch holds from memarray right now."""
    return _memarray._interop.torch_live_blocks()
