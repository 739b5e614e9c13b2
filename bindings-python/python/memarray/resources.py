"""Memory resources: where memarray's memory comes from, composed like the Rust ones.

    from memarray import resources as mr

    stats = mr.Statistics(mr.Pool(mr.Device(0)))
    mr.set_default_resource(stats, device=0)     # device buffers on cuda:0 come from it
    a = memarray.MemArray([1 << 20], "float32")
    a.move_memory(memarray.dlpack.kDLCUDA)
    stats.statistics()["current_bytes"]           # 4 MiB

    with mr.using(mr.Limiting(mr.Device(0), 1 << 30)):   # a resource for a block
        ...

Resources: ``Device`` (``cuMemAlloc``), ``Async`` (the driver's stream-ordered pool),
``Pinned`` and ``Managed`` (host memory reachable from the device), ``Host`` (aligned
host memory), ``File(path)`` (regions of a file, memory-mapped). Adaptors over any of
them: ``Pool`` (caching pool; ``release_threshold`` bytes kept cached at most),
``Statistics`` (``statistics()`` as a dict, per library under ``by_source``),
``Limiting`` (MemoryError past ``max_bytes``), ``Logging`` (one CSV row per call: time,
event, device, address, size, stream, source), ``Retry`` (on MemoryError, give cached
memory back and try once more), ``Tracking`` (every live allocation, with Python stacks
on request: ``snapshot()``, drawn by ``plot()``). ``Rmm(device)`` allocates through RMM.

Out of device memory, every allocation through memarray first releases memarray's caches,
then asks torch, CuPy and RMM (those loaded) to release theirs, and retries once; then
your own relievers (``register_reliever``), one at a time with a retry after each
(``pressure_statistics()`` counts each step).

The default resource is per device and process-wide (``using`` sets it for every thread
while its block runs). Buffers keep the resource they came from, so changing the
default never affects memory already handed out.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import TYPE_CHECKING, Any

from . import _memarray
from ._html import resource_html, size_text
from ._memarray import _resources as _r
from ._torch_snapshot import save_torch_snapshot, torch_snapshot

if TYPE_CHECKING:
    from ._memarray import _Allocation, _Resource

__all__ = [
    "Allocation",
    "Async",
    "Device",
    "File",
    "Host",
    "Limiting",
    "Logging",
    "Managed",
    "Pinned",
    "Pool",
    "Resource",
    "Reliever",
    "Retry",
    "Rmm",
    "Statistics",
    "Tracking",
    "budgets",
    "get_default_resource",
    "library_usage",
    "numpy_pool_statistics",
    "plot",
    "pressure_statistics",
    "register_reliever",
    "release_numpy_pool",
    "save_torch_snapshot",
    "set_budget",
    "set_default_resource",
    "set_watermark",
    "snapshot",
    "statistics",
    "torch_snapshot",
    "using",
    "watermarks",
]

#: The libraries allocations are attributed to (``source=``).
SOURCES = ("memarray", "torch", "cupy", "numba", "rmm", "cuda_core")

if TYPE_CHECKING:
    from ._memarray import _Allocation as Allocation
else:
    Allocation = _r.Allocation


class Resource:
    """A memory resource. Use the subclasses; ``upstream`` is the resource below."""

    _handle: _Resource
    upstream: Resource | None = None

    @property
    def name(self) -> str:
        return self._handle.name

    @property
    def kind(self) -> str:
        """ "host", "pinned", "device", "managed" or "file"."""
        return self._handle.kind

    @property
    def device_id(self) -> int | None:
        return self._handle.device_id

    def memory_info(self) -> tuple[int, int] | None:
        """``(free, total)`` bytes where known."""
        return self._handle.memory_info()

    def allocate(self, nbytes: int, stream=None, source: str | None = None) -> _Allocation:
        """``nbytes`` from this resource (256-byte aligned), freed by
        ``Allocation.free()`` or when the Allocation is collected. ``source`` (one of
        ``SOURCES``) is the library the memory is for, in statistics and tracking."""
        return self._handle.allocate(nbytes, stream, source)

    def release_cached(self) -> int:
        """Gives cached memory back (pools below); returns the bytes released."""
        return self._handle.release_cached()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"

    def _repr_html_(self) -> str:
        """The notebook's view: kind, device and the figures this resource keeps."""
        return resource_html(self)

    def _figures(self) -> list[tuple[str, str]]:
        """The figures this resource keeps, as ``(name, value)`` rows for its views."""
        return []


def _check(upstream) -> Resource:
    if not isinstance(upstream, Resource):
        raise TypeError(
            f"upstream must be a memarray.resources.Resource, not {type(upstream).__name__}"
        )
    return upstream


class Host(Resource):
    """Aligned host memory."""

    def __init__(self) -> None:
        self._handle = _r.host()


class Device(Resource):
    """Device memory from ``cuMemAlloc`` (its free waits for the device)."""

    def __init__(self, device_id: int = 0):
        self._handle = _r.device_memory(device_id)


class Async(Resource):
    """The driver's stream-ordered pool (``cuMemAllocAsync``)."""

    def __init__(self, device_id: int = 0):
        self._handle = _r.async_pool(device_id)


class Pinned(Resource):
    """Page-locked host memory (portable), reachable from every device."""

    def __init__(self, device_id: int = 0):
        self._handle = _r.pinned(device_id)


class Managed(Resource):
    """CUDA managed (unified) memory."""

    def __init__(self, device_id: int = 0):
        self._handle = _r.managed(device_id)


class File(Resource):
    """Regions of the file at ``path`` (created or truncated), memory-mapped."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self._handle = _r.file(self.path)


class Pool(Resource):
    """A caching pool over ``upstream``: freed blocks are kept and reused (on another
    stream only once the work queued on theirs has completed). At most
    ``release_threshold`` bytes stay cached (None: no limit).

    ``grow_in_place`` (bytes of address space to reserve) makes it a pool that grows in
    place: its large blocks live in one address range backed piece by piece as the pool
    grows (CUDA's virtual memory for a ``Device`` upstream, ``mmap`` for ``Host``), so
    blocks from different growths coalesce when freed, and giving memory back unmaps the
    range's free end. Such device memory has no CUDA IPC handle and no peer access."""

    def __init__(
        self,
        upstream: Resource,
        release_threshold: int | None = None,
        device_id: int | None = None,
        grow_in_place: int | None = None,
    ):
        self.upstream = _check(upstream)
        self._handle = _r.pool(upstream._handle, release_threshold, device_id, grow_in_place)

    def statistics(self) -> dict:
        """``used_bytes``, ``cached_bytes``, ``upstream_bytes``, ``hits``, ``misses``,
        ``largest_free_bytes`` (the largest free block: what one allocation can get from
        the cache; against ``cached_bytes``, how fragmented it is)."""
        return self._handle.statistics()

    def _figures(self) -> list[tuple[str, str]]:
        s = self.statistics()
        return [
            ("used", size_text(s["used_bytes"])),
            ("cached", size_text(s["cached_bytes"])),
            ("from upstream", size_text(s["upstream_bytes"])),
            ("hits / misses", f"{s['hits']:,} / {s['misses']:,}"),
        ]

    def trim(self) -> int:
        """Gives every cached block back, and the host copy an offload kept for the
        next one; returns the bytes released."""
        return self._handle.release_cached()

    def offload(self) -> int:
        """A pool growing in place: copies the bytes of every large block handed out to
        host memory (page-locked for a device) and releases the pool's memory while every
        address stays reserved; returns the bytes released. Until ``restore()``,
        allocations from the pool raise ``OutOfMemoryError`` and nothing may touch its
        memory (a read or write faults). Waits for the device first. ValueError for a pool
        with separate segments, one offloaded already, or one with blocks held for CUDA
        graphs. Small blocks (up to 1 MiB each) stay. Free blocks are not copied; the free
        end of the range (after the last block handed out) is not backed again."""
        return self._handle.pool_sleep("offload")

    def restore(self) -> int:
        """Backs an offloaded pool again at the same addresses, in the pieces it was
        backed in (runs of small ones joined), and copies its blocks back, each as soon as
        its pieces are backed (torch tensors, CuPy and memarray arrays in it are valid and
        bit-exact again); returns the bytes restored. The host copy stays with the pool for
        its next offload (pinning is most of a first offload's time): ``trim()`` gives it
        back. ValueError when not offloaded; OutOfMemoryError when the device has no room
        (it stays offloaded, what was backed released again, and a later ``restore()`` may
        succeed)."""
        return self._handle.pool_sleep("restore")

    @property
    def offloaded(self) -> bool:
        return self._handle.offloaded()


class Statistics(Resource):
    """Counts what goes through: current, peak and total bytes and allocations."""

    def __init__(self, upstream: Resource):
        self.upstream = _check(upstream)
        self._handle = _r.statistics(upstream._handle)

    def statistics(self) -> dict:
        """``current_bytes``, ``peak_bytes``, ``current_count``, ``peak_count``,
        ``total_bytes``, ``total_count``."""
        return self._handle.statistics()

    def reset_peaks(self) -> None:
        self._handle.reset_peaks()

    def _figures(self) -> list[tuple[str, str]]:
        s = self.statistics()
        rows = [
            (k, f"{size_text(s[k + '_bytes'])} in {s[k + '_count']:,} allocations")
            for k in ("current", "peak", "total")
        ]
        for source, b in s.get("by_source", {}).items():
            rows.append((f"  {source}", f"{size_text(b['current_bytes'])} now"))
        return rows


class Limiting(Resource):
    """Refuses (MemoryError) allocations that would take the bytes live through it past
    ``max_bytes``."""

    def __init__(self, upstream: Resource, max_bytes: int):
        self.upstream = _check(upstream)
        self._handle = _r.limiting(upstream._handle, max_bytes)

    @property
    def used(self) -> int:
        return self._handle.limit_usage()[0]

    @property
    def max_bytes(self) -> int:
        return self._handle.limit_usage()[1]

    def _figures(self) -> list[tuple[str, str]]:
        return [("used of limit", f"{size_text(self.used)} of {size_text(self.max_bytes)}")]


class Logging(Resource):
    """Writes one CSV row per allocation and free to ``path`` (header:
    ``time,event,device,address,size,stream,source``). Rows are buffered: ``flush()``."""

    def __init__(self, upstream: Resource, path: str | os.PathLike):
        self.upstream = _check(upstream)
        self.path = os.fspath(path)
        self._handle = _r.logging(upstream._handle, self.path)

    def flush(self) -> None:
        self._handle.flush()


class Retry(Resource):
    """On out-of-memory, asks the resources below to give cached memory back and tries
    once more."""

    def __init__(self, upstream: Resource):
        self.upstream = _check(upstream)
        self._handle = _r.retry(upstream._handle)

    @property
    def retries(self) -> int:
        return self._handle.retries()

    def _figures(self) -> list[tuple[str, str]]:
        return [("retries", f"{self.retries:,}")]


class Tracking(Resource):
    """Keeps every live allocation with its size, stream, device and source library
    (torch, CuPy, Numba and RMM allocating through memarray are told apart; the rest is
    ``source``), the Python stack where it was made when ``stacks=True`` and the Rust
    backtrace when ``backtraces=True`` (both cost microseconds per allocation), plus a
    timeline of live bytes per source. ``snapshot()`` returns them as plain data,
    ``plot()`` draws them."""

    def __init__(
        self,
        upstream: Resource,
        source: str = "memarray",
        stacks: bool = False,
        backtraces: bool = False,
    ):
        self.upstream = _check(upstream)
        self._handle = _r.tracking(upstream._handle, source, stacks, backtraces)

    def snapshot(self) -> dict:
        """``resource``, ``source``, ``sources`` (names of the timeline's columns),
        ``live`` (a dict per live allocation: ``address``, ``size``, ``stream``,
        ``device``, ``source``, ``time_ns``, ``stack``, ``backtrace``) and ``timeline``
        (``[time_ns, bytes of each source ...]`` after each call); ``json.dumps`` takes
        it."""
        return self._handle.snapshot()

    def live_bytes(self) -> dict[str, int]:
        """Live bytes per source (every library memarray knows), read from counters kept
        as allocations come and go: cheap at any number of allocations."""
        return self._handle.live_bytes()[0]

    def live_count(self) -> int:
        """The number of live allocations (a counter)."""
        return self._handle.live_bytes()[1]

    def live_by_stack(self) -> list[tuple[str, str, int]]:
        """With ``stacks=True``: ``(source, stack, bytes)`` of live bytes per source and
        allocation stack, from counters (allocations without a stack are not listed)."""
        return self._handle.live_by_stack()

    def _figures(self) -> list[tuple[str, str]]:
        by_source, count = self._handle.live_bytes()
        held = size_text(sum(by_source.values()))
        return [("live", f"{held} in {count:,} allocations")]


def _rmm():
    """RAPIDS' ``rmm`` (with ``rmm.mr``), or ImportError naming the package to install
    (here, not in ``memarray.rmm``, which imports this module)."""
    try:
        import rmm.mr
    except ImportError as e:
        raise ImportError(
            "memarray.rmm needs RMM (the RAPIDS Memory Manager): pip install rmm-cu13"
        ) from e
    return rmm


class Rmm(Resource):
    """Device memory from RMM's resource for ``device_id`` (the one current when this is
    made), stream-ordered on memarray's streams (as umem's ``umemRMM``,
    github.com/xnd-project/umem). Needs RMM
    (``pip install rmm-cu13``): ImportError naming it otherwise; ValueError for a device
    that does not exist."""

    def __init__(self, device_id: int = 0):
        from . import cuda

        rmm = _rmm()
        if not isinstance(device_id, int) or isinstance(device_id, bool):
            raise TypeError(f"device_id must be an int, not {type(device_id).__name__}")
        count = cuda.device_count()
        if not 0 <= device_id < count:
            raise ValueError(f"no CUDA device {device_id} for RMM (this machine has {count})")
        mr = rmm.mr.get_per_device_resource(device_id)
        stream_type = rmm.pylibrmm.stream.Stream
        self.rmm_resource = mr
        # RMM's bound methods are called straight from the extension, with an RMM stream
        # made once per stream handle.
        self._handle = _memarray._interop.callback_resource(
            mr.allocate,
            mr.deallocate,
            device_id,
            f"rmm({type(mr).__name__}, cuda:{device_id})",
            lambda handle: stream_type(_Handle(handle)),
        )


class _Handle:
    """A stream handle with the CUDA stream protocol, for ``rmm.pylibrmm.stream.Stream``."""

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


class _Opaque(Resource):
    """A default chosen by memarray (from MEMARRAY_MEMORY_RESOURCE), not set from Python."""

    def __init__(self, handle):
        self._handle = handle


_lock = threading.Lock()
_defaults: dict[int, Resource] = {}
#: device -> the default resource's allocate, for the glue's per-call path (cleared
#: whenever a default changes).
_allocate_cache: dict[int, object] = {}


def _allocate_fn(device: int):
    """The bound ``allocate(nbytes, stream, source)`` of ``device``'s default resource."""
    f = _allocate_cache.get(device)
    if f is None:
        with _lock:
            r = _defaults.get(device)
            handle = r._handle if r is not None else _r.get_default(device)
            f = _allocate_cache[device] = handle.allocate
    return f


def set_default_resource(resource: Resource, device: int = 0) -> None:
    """Makes ``resource`` the source of new device buffers on ``device``. It must serve
    memory that device can use (Device, Async, Managed, Pinned, or adaptors over them)."""
    _check(resource)
    with _lock:
        _r.set_default(resource._handle, device)
        _defaults[device] = resource
        _allocate_cache.clear()


def get_default_resource(device: int = 0) -> Resource:
    """The resource new device buffers on ``device`` come from."""
    with _lock:
        if device in _defaults:
            return _defaults[device]
        return _Opaque(_r.get_default(device))


@contextlib.contextmanager
def using(resource: Resource, device: int = 0):
    """Sets ``resource`` as ``device``'s default for the block, then restores the
    previous one (process-wide: other threads allocate from it meanwhile too)."""
    previous = get_default_resource(device)
    set_default_resource(resource, device)
    try:
        yield resource
    finally:
        with _lock:
            _r.set_default(previous._handle, device)
            _allocate_cache.clear()
            if isinstance(previous, _Opaque):
                _defaults.pop(device, None)
            else:
                _defaults[device] = previous


def snapshot(resource: Resource | None = None, device: int = 0) -> dict:
    """The snapshot of ``resource`` (default: ``device``'s default resource): of the first
    Tracking in its stack, from the top. TypeError if the stack tracks nothing."""
    r: Resource | None = _check(resource) if resource is not None else get_default_resource(device)
    top = r
    while r is not None:
        if isinstance(r, Tracking):
            return r.snapshot()
        r = r.upstream
    raise TypeError(
        f"{top.name if top is not None else 'the resource'} tracks no allocations; wrap it: "
        "memarray.resources.Tracking(...)"
    )


def statistics(device: int = 0) -> dict:
    """The statistics of ``device``'s default resource: of the first Statistics (or Pool)
    in its stack, from the top. TypeError if the stack keeps none."""
    r: Resource | None = get_default_resource(device)
    while r is not None:
        if isinstance(r, (Statistics, Pool)):
            return r.statistics()
        r = r.upstream
    raise TypeError(
        f"device {device}'s default resource keeps no statistics; set one with "
        "set_default_resource(Statistics(...))"
    )


def pressure_statistics() -> dict:
    """The process-wide counters of the out-of-memory relief path: ``events`` (allocations
    that ran out), ``recovered`` / ``failed`` (their retries), ``own_released_bytes``
    (memarray's caches given back), ``spills`` / ``spilled_bytes`` (events whose last step
    spilled arrays, memarray.spill, and the device bytes that freed), per library
    (``libraries``: torch, cupy, rmm) the ``calls`` made to release its cache and the
    ``released_bytes`` it reported, and your relievers (``relievers``, in the order they
    run: ``id``, ``name``, ``device``, ``source``, ``priority``, ``calls``,
    ``released_bytes``, ``failures``)."""
    return _memarray._interop.pressure_stats()


def set_budget(source: str, nbytes: int | str | None, *, device: int | str | None = None) -> None:
    """Caps what one library may hold through memarray: ``source`` is one of ``SOURCES``
    ("memarray" for memarray's own arrays), ``nbytes`` an int or a size ("4GiB"; None
    removes the budget), ``device`` None for each device (a device's own budget, where
    set, takes precedence), a device id (or "cuda:N") for one, "host" for host memory.

    An allocation that would take the library past its budget first spills memarray's
    arrays when it is memarray's budget and spilling is on there (``memarray.spill``), then
    raises ``OutOfMemoryError`` naming the budget; the other libraries keep allocating.
    What the library holds already stays. Counted are allocations through memarray's
    allocation path: memarray's device arrays, the allocators ``memarray.torch``,
    ``memarray.cupy``, ``memarray.rmm``, ``memarray.numba`` and ``memarray.cuda_core``
    install, and ``Resource.allocate``; the check costs about 10 ns an allocation."""
    if not isinstance(source, str):
        raise TypeError(f"source must be a library name, got {type(source).__name__}")
    _memarray._interop.set_budget(source, nbytes, device)


def library_usage() -> list[dict]:
    """What each library holds through memarray now, per place: rows of ``source``,
    ``device`` (a device id, or "host"), ``live_bytes``, ``budget`` (None without one)
    and ``refused`` (allocations its budget refused there), for every library that holds
    memory, has a budget or was refused there. Read from counters kept as allocations
    come and go (no walk over allocations)."""
    return _memarray._interop.library_usage()


def set_watermark(nbytes: int | str | None, callback: Any = None, *, device: int | str = 0) -> None:
    """A soft watermark on ``device`` (a device id, "cuda:N", or "host"): when what every
    library holds there through memarray (the bytes ``library_usage()`` counts) rises to
    ``nbytes`` (an int or a size such as "60GiB"), ``callback(device, held, watermark)`` is
    called, before anything fails: the moment to trim a cache or shrink a batch. It fires
    once per rise and re-arms when frees take the bytes below the watermark again. It runs
    on memarray's notifier thread, never on the allocating one: a slow callback holds no
    allocation up, and it may allocate or free through memarray; an exception is reported
    (``sys.unraisablehook``) and counted under ``failures``. One watermark per device (a
    second replaces the first); ``nbytes`` None removes it."""
    if nbytes is not None and not callable(callback):
        raise TypeError(f"set_watermark needs a callable callback, got {type(callback).__name__}")
    _memarray._interop.set_watermark(device, nbytes, callback)


def watermarks() -> list[dict]:
    """The watermarks set: rows of ``device``, ``watermark``, ``crossings`` (rises past
    it, each one call) and ``failures`` (calls that raised)."""
    return _memarray._interop.watermarks()


def budgets() -> list[dict]:
    """The rows of ``library_usage()`` that have a budget."""
    return [row for row in library_usage() if row["budget"] is not None]


class Reliever:
    """A reliever ``register_reliever`` registered: ``remove()`` takes it back (so does
    the end of a ``with`` block over it); ``statistics()`` is its row of
    ``pressure_statistics()["relievers"]`` (None once removed)."""

    def __init__(self, ident: int, name: str) -> None:
        self.id = ident
        self.name = name

    def remove(self) -> bool:
        """Unregisters it; False when it was not registered any more."""
        return bool(_memarray._interop.remove_reliever(self.id))

    def statistics(self) -> dict | None:
        rows = pressure_statistics()["relievers"]
        return next((r for r in rows if r["id"] == self.id), None)

    def __enter__(self) -> Reliever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"Reliever({self.name!r}, id={self.id})"


def register_reliever(
    fn,
    *,
    device: int | None = None,
    source: str | None = None,
    priority: int = 0,
    name: str | None = None,
) -> Reliever:
    """Registers ``fn(device, nbytes) -> int | None`` to free memory when an allocation
    through memarray runs out: a cache of your own, a model's KV blocks. ``device`` is the
    device it serves (None: every device and host memory); ``source`` the library whose
    memory it frees (one of ``SOURCES`` but "memarray"; None: your own), and it is not
    asked while that library allocates (freeing its memory from inside its allocator would
    re-enter it); higher ``priority`` runs first. Relievers run after memarray's and the
    libraries' caches were given back and the retry failed, one at a time, each followed
    by a retry, until the allocation fits; ``fn`` returns the bytes it freed where it
    knows them. They run with no lock of memarray's held and may free or allocate
    memarray memory (an allocation of theirs that runs out asks no reliever again); an
    exception is reported (``sys.unraisablehook``), counted under ``failures``, and the
    next one runs."""
    if not callable(fn):
        raise TypeError(f"register_reliever takes a callable, got {type(fn).__name__}")
    if device is not None and (not isinstance(device, int) or device < 0):
        raise ValueError(f"device must be None or a device id >= 0, got {device!r}")
    if source == "memarray":
        source = None
    if not isinstance(priority, int):
        raise TypeError(f"priority must be an int, got {type(priority).__name__}")
    if name is None:
        name = getattr(fn, "__qualname__", None) or repr(fn)
    return Reliever(_memarray._interop.add_reliever(fn, name, device, source, priority), name)


def release_numpy_pool() -> int:
    """Hands the cached blocks of memarray's NumPy block pool back to the system and
    returns the bytes released. ``to_numpy()`` of 1 MiB and more takes its NumPy array's
    memory from that pool (faulted in on reuse: no page-fault cost on the copy); the pool
    keeps at most ``MEMARRAY_NUMPY_POOL`` free bytes (default 2 GiB; 0 turns it off)."""
    return _r.release_numpy_pool()


def numpy_pool_statistics() -> dict | None:
    """The NumPy block pool's ``cached_bytes`` (free), ``used_bytes``, ``hits`` and
    ``misses``; None when ``MEMARRAY_NUMPY_POOL=0``."""
    return _r.numpy_pool_statistics()


def plot(snapshot_or_log: Any, path: Any = None, top: int = 10) -> Any:
    """Draws device memory over time per source library (stacked) and the ``top``
    largest live allocation sites (by Python stack's innermost frame, or source without
    stacks). Without ``path``, returns the matplotlib ``Figure`` (a notebook shows it
    inline); with one, writes the image there (its format from its suffix; ``.png`` is
    added when it has none) and returns the path written. matplotlib's pyplot is never
    used: the session's backend is not changed and no figure is left open.
    ``snapshot_or_log`` is a ``snapshot()`` dict or the path of a ``Logging`` CSV (sites
    are then its sources). Spills and restores (``memarray.spill``) are ticks along the
    time axis. A malformed snapshot or CSV is ValueError, a directory as ``path``
    IsADirectoryError, a missing CSV FileNotFoundError. Needs matplotlib (``pip install
    "memarray[plot]"``): ImportError without it."""
    from ._plot import plot as draw

    return draw(snapshot_or_log, path, top)
