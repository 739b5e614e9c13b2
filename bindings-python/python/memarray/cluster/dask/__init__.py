"""MemArrays in Dask: sizes, tokens, serializers, and memarray as every worker's memory
manager.

Active once memarray and Dask are both imported, in either order (memarray registers with
Dask's dispatchers when ``dask``, ``distributed`` or ``dask_cuda`` finish importing); no
registration code is needed:

- ``dask.sizeof(a)`` is ``a.nbytes``, without touching device data;
- ``dask.base.tokenize(a)`` hashes the data where it lives (a kernel over device data: no
  device-to-host copy), so it is deterministic for an unchanged array and changes with any
  write, as NumPy arrays' tokens do;
- distributed's ``"dask"`` serializers send one host frame (a snapshot of the data taken
  under the array's lock: device data is downloaded, a spilled array is read from its host
  copy without coming back) and land the array on the device it left when the receiving
  worker has that device, on the host otherwise; its ``"cuda"`` serializers send the
  device buffer itself (its pending work complete first) with the CUDA Array Interface in
  the header, and take any device frame that has one (``rmm.DeviceBuffer``, CuPy memory, a
  MemArray) zero-copy;
- a ``memarray.Bundle`` is its pack to all of these: ``sizeof`` its bytes, a token of its
  pack and table, and either family's frame of its pack with its table in the header (a
  device Bundle goes worker to worker as one device frame, not through pickle and host);
- dask-cuda's device-to-host spilling leaves MemArrays to memarray's spilling where it is
  on (``is_spillable_object``).

Worker set-up: ``setup(client, device_budget=..., spill_dir=...)`` makes memarray each
worker's memory manager (now and for workers that join later), and with ``dashboard=True``
puts each worker's GPU memory on the dashboard (``/memarray``); ``dask worker --preload
memarray.dask`` does it from the environment (``MEMARRAY_SPILL`` and friends, see
docs/spilling.md; ``MEMARRAY_DASK_HOOKS=torch,cupy,rmm,numba``). ``statistics(client)``
gathers each worker's figures.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from ... import _env, _memarray, _progress, resources, spill
from ..._bundle import Bundle
from ..._memarray import MAX_NDIM, SUPPORTED_DTYPES, MemArray
from ._worker import HOOKS, RESOURCES, _apply, _check, _Settings

__all__ = ["dask_setup", "deserialize", "serialize", "setup", "statistics", "tokenize"]


# ---------------------------------------------------------------- sizes and tokens


def sizeof(a: MemArray) -> int:
    """``dask.sizeof`` of a MemArray: its bytes (metadata only)."""
    return int(a.nbytes)


_HASH_SRC = r"""
struct Ix1 { const unsigned char* data; unsigned long long n; };
struct Out1 { unsigned long long* data; unsigned long long n; };
__device__ unsigned long long mix(unsigned long long x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33; return x;
}
// Sum and xor of mix(word ^ position): order-independent reductions of position-keyed
// hashes, so the result does not depend on the launch shape.
extern "C" __global__ void memarray_hash(Ix1 a, Out1 out) {
    unsigned long long words = a.n / 8, sum = 0, x = 0;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < words; i += stride) {
        unsigned long long w;
        memcpy(&w, a.data + 8 * i, 8);
        unsigned long long h = mix(w ^ mix(i + 0x9e3779b97f4a7c15ULL));
        sum += h; x ^= h;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        for (unsigned long long i = 8 * words; i < a.n; ++i) {
            unsigned long long h = mix((unsigned long long)a.data[i] ^ mix(~i));
            sum += h; x ^= h;
        }
    }
    for (int o = 16; o > 0; o /= 2) {
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
        x ^= __shfl_xor_sync(0xffffffffu, x, o);
    }
    if ((threadIdx.x & 31) == 0) { atomicAdd(out.data, sum); atomicXor(out.data + 1, x); }
}
"""

_hash_lock = threading.Lock()
_hash_fns: dict[int, Any] = {}


def _hash_fn(device: int) -> Any:
    with _hash_lock:
        f = _hash_fns.get(device)
        if f is None:
            from ...cuda import Module

            mod = Module.from_source(_HASH_SRC, "memarray_hash.cu", device_id=device)
            f = _hash_fns[device] = mod.function("memarray_hash")
        return f


def _device_digest(a: MemArray) -> tuple[int, int]:
    """(sum, xor) of position-keyed hashes of the array's device bytes, computed on its
    device; the array's pending work is ordered first (the CUDA Array Interface export
    completes it on the legacy default stream, where the kernel runs)."""
    from ...cuda import In, _Memory, from_cuda_array_interface

    device = a.device_id
    f = _hash_fn(device)
    cai = a.__cuda_array_interface__
    data = from_cuda_array_interface(_Memory(a, cai["data"][0], (a.nbytes,), "|u1"), copy=False)
    acc = _memarray.zeros((2,), "uint64", device=f"cuda:{device}")
    grid, block = f.config_grid_stride(max(1, (a.nbytes + 7) // 8))
    f.launch(In(data), acc, grid=grid, block=block)
    s, x = acc.to_numpy().tolist()
    return int(s), int(x)


def tokenize(a: MemArray) -> tuple[Any, ...]:
    """What ``dask.base.normalize_token`` makes of a MemArray: its layout and a hash of its
    data where the data is (device: a kernel, no copy back; host: Dask's hash of the
    buffer, as for NumPy)."""
    from dask.base import normalize_token

    head = ("memarray.MemArray", a._dtype_name, tuple(a.shape), a.device)
    if a.nbytes == 0:
        return head
    if a.on_device and not a.spilled:
        try:
            return (*head, _device_digest(a))
        except _memarray.CudaUnavailableError:
            pass  # no NVRTC here: hash a host copy
    host = np.asarray(a) if not a.on_device else a.to_numpy()
    return (*head, normalize_token(np.ascontiguousarray(host).reshape(-1).view(np.uint8)))


# ---------------------------------------------------------------- serializers


HOST_MEMORY = ("pageable", "pinned", "managed", "auto")


def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_header(header: object, keys: tuple[str, ...]) -> Mapping[str, Any]:
    """The header's dtype (a name, as ``serialize`` writes it), shape and, where given,
    ``nbytes`` agreeing with them; every refusal is a ValueError."""
    if not isinstance(header, Mapping) or not all(k in header for k in keys):
        raise ValueError(f"a memarray frame header must be a dict with keys {list(keys)}")
    dtype, shape = header["dtype"], header["shape"]
    if not isinstance(dtype, str) or dtype not in SUPPORTED_DTYPES:
        raise ValueError(
            f"a memarray frame header names dtype {dtype!r}; it must be one of the names "
            f"{sorted(SUPPORTED_DTYPES)}"
        )
    if (
        not isinstance(shape, list | tuple)
        or len(shape) > MAX_NDIM
        or not all(_int(d) and d >= 0 for d in shape)
    ):
        raise ValueError(f"a memarray frame header has an invalid shape {shape!r}")
    if "nbytes" in header:
        need = _itemsize(dtype) * int(np.prod(shape, dtype=object))
        if not _int(header["nbytes"]) or header["nbytes"] != need:
            raise ValueError(
                f"a memarray frame header's nbytes {header['nbytes']!r} is not the "
                f"{need} bytes of {dtype} {list(shape)}"
            )
    return header


def _itemsize(dtype: str) -> int:
    return 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize


def _device_frame(frame: object) -> tuple[int, int, bool]:
    """``(pointer, bytes, read_only)`` of a device frame, from its own CUDA Array Interface:
    a well-formed v3 dict describing dense C-order memory (the only memory a header's
    shape can be laid over). ValueError otherwise."""
    cai = getattr(frame, "__cuda_array_interface__", None)
    if not isinstance(cai, Mapping):
        raise ValueError(f"a cuda frame must have __cuda_array_interface__, not {type(frame)}")
    data, shape, typestr = cai.get("data"), cai.get("shape"), cai.get("typestr", "|u1")
    if (
        not isinstance(data, tuple)
        or len(data) != 2
        or not _int(data[0])
        or not isinstance(data[1], bool)
    ):
        raise ValueError(f"a cuda frame's data must be a (pointer, read_only) tuple, not {data!r}")
    if not isinstance(shape, tuple) or not all(_int(d) and d >= 0 for d in shape):
        raise ValueError(f"a cuda frame's shape must be a tuple of extents, not {shape!r}")
    try:
        if not isinstance(typestr, str):
            raise TypeError
        item = np.dtype(typestr).itemsize
    except (TypeError, ValueError):
        raise ValueError(f"a cuda frame has an unknown typestr {typestr!r}") from None
    nbytes = item * int(np.prod(shape, dtype=object))
    strides = cai.get("strides")
    if strides is not None and nbytes > 0:
        if not isinstance(strides, tuple) or len(strides) != len(shape):
            raise ValueError(f"a cuda frame has invalid strides {strides!r} for shape {shape}")
        dense, step = [], item
        for extent in reversed(shape):
            dense.append(step)
            step *= extent
        if any(s != d for s, d, e in zip(strides, reversed(dense), shape, strict=True) if e > 1):
            raise ValueError(
                f"a cuda frame with strides {strides} over shape {shape} is not dense C-order "
                "memory: its bytes cannot carry an array"
            )
    return data[0], nbytes, data[1]


def serialize(a: MemArray) -> tuple[dict[str, Any], list[memoryview]]:
    """distributed's ``"dask"`` family: ``(header, [one host frame])``."""
    from ..._pickle import Snapshot

    snap = Snapshot.of(a)
    frame = snap.data.raw() if hasattr(snap.data, "raw") else memoryview(snap.data)
    header = {
        "dtype": snap.dtype,
        "shape": list(snap.shape),
        "device": snap.device,
        "device_id": int(snap.device_id),
        "host_memory": snap.host_memory,
        "nbytes": frame.nbytes,
    }
    return header, [frame]


def deserialize(header: Mapping[str, Any], frames: list[Any]) -> MemArray:
    """The inverse of ``serialize``: a new, writable MemArray; a malformed header or a
    frame of the wrong size is a ValueError."""
    from ..._pickle import rebuild

    h = _check_header(header, ("dtype", "shape", "device", "device_id", "host_memory"))
    if not isinstance(frames, list | tuple) or len(frames) != 1:
        raise ValueError("a memarray array travels in one frame")
    device, device_id = h["device"], h["device_id"]
    if not _int(device_id) or device_id < 0:
        raise ValueError(f"a memarray frame header has an invalid device id {device_id!r}")
    if device is not None and (not _int(device) or device < 0):
        raise ValueError(f"a memarray frame header has an invalid device {device!r}")
    if h["host_memory"] not in HOST_MEMORY or not isinstance(h["host_memory"], str):
        raise ValueError(
            f"a memarray frame header's host_memory must be one of {HOST_MEMORY}, "
            f"not {h['host_memory']!r}"
        )
    try:
        view = memoryview(frames[0])
    except TypeError:
        raise ValueError(f"a memarray host frame must be a buffer, not {type(frames[0])}") from None
    if not view.c_contiguous:
        raise ValueError(f"a memarray host frame must be C-contiguous (shape {view.shape})")
    return rebuild(view, h["dtype"], h["shape"], device, device_id, h["host_memory"])


def cuda_serialize(a: MemArray) -> tuple[dict[str, Any], list[MemArray]]:
    """distributed's ``"cuda"`` family: the device buffer itself as the frame, its pending
    work complete; host, spilled and bfloat16 arrays are declined (NotImplementedError,
    distributed's signal to try the next family, ``"dask"``)."""
    if not a.on_device or a.spilled or a._dtype_name == "bfloat16":
        # bfloat16 has no CUDA Array Interface type.
        raise NotImplementedError(
            "a MemArray on the host, spilled or of bfloat16 travels as host frames"
        )
    a.synchronize()
    cai = a.__cuda_array_interface__
    header = {
        "dtype": a._dtype_name,
        "shape": list(a.shape),
        "typestr": cai["typestr"],
        "device_id": int(a.device_id),
        "nbytes": int(a.nbytes),
    }
    return header, [a]


def cuda_deserialize(header: Mapping[str, Any], frames: list[Any]) -> MemArray:
    """The inverse of ``cuda_serialize``, zero-copy over any device frame with a CUDA Array
    Interface (``rmm.DeviceBuffer``, CuPy memory, a MemArray); the array keeps the frame
    alive. The frame's own interface is checked before it is viewed: dense C-order memory
    of at least the header's ``nbytes``; a read-only frame gives a copy. Anything else is
    a ValueError."""
    from ...cuda import _Memory, from_cuda_array_interface

    h = _check_header(header, ("dtype", "shape", "typestr", "nbytes"))
    if not isinstance(frames, list | tuple) or len(frames) != 1:
        raise ValueError("a memarray array travels in one frame")
    shape, dtype = tuple(h["shape"]), h["dtype"]
    if dtype == "bfloat16" or h["typestr"] != np.dtype(dtype).str:
        raise ValueError(f"typestr {h['typestr']!r} does not match dtype {dtype!r}")
    ptr, have, read_only = _device_frame(frames[0])
    need = h["nbytes"]
    if have < need:
        raise ValueError(f"a cuda frame of {have} bytes for nbytes {need} of {dtype} {list(shape)}")
    if need == 0:
        return _memarray.zeros(shape, dtype, device="cuda")
    typed = _Memory(frames[0], ptr, shape, h["typestr"], read_only=read_only)
    return from_cuda_array_interface(typed, copy=None if read_only else False)


# ---------------------------------------------------------------- Bundles


def bundle_sizeof(b: Bundle) -> int:
    """``dask.sizeof`` of a Bundle: its pack's bytes."""
    return int(b.pack.nbytes)


def bundle_tokenize(b: Bundle) -> tuple[Any, ...]:
    """``normalize_token`` of a Bundle: its pack's token (a hash where the data is) and its
    table."""
    return ("memarray.Bundle", tokenize(b.pack), b._entries.to_bytes())


def _bundle_header(b: Bundle, pack_header: dict[str, Any]) -> dict[str, Any]:
    return {"pack": pack_header, "table": b._entries.to_bytes()}


def _bundle_of(header: object, frames: list[Any], read_pack: Any) -> Bundle:
    """The Bundle of a header (``pack``: the pack's header, ``table``: its table's bytes)
    and the pack's frames, read by ``read_pack``; the table is checked first, then against
    the pack. ValueError for anything malformed."""
    if not isinstance(header, Mapping) or "pack" not in header or "table" not in header:
        raise ValueError("a memarray Bundle header must be a dict with keys ['pack', 'table']")
    table = header["table"]
    if not isinstance(table, bytes | bytearray | memoryview):
        raise ValueError(f"a memarray Bundle header's table must be bytes, not {type(table)}")
    entries = _memarray._pack_table(bytes(table))
    return Bundle._of(read_pack(header["pack"], frames), entries)


def bundle_serialize(b: Bundle) -> tuple[dict[str, Any], list[memoryview]]:
    """The ``"dask"`` family for a Bundle: its pack's host frame, its table in the header."""
    header, frames = serialize(b.pack)
    return _bundle_header(b, header), frames


def bundle_deserialize(header: Mapping[str, Any], frames: list[Any]) -> Bundle:
    """The inverse of ``bundle_serialize``; ValueError for a malformed header or frame."""
    return _bundle_of(header, frames, deserialize)


def bundle_cuda_serialize(b: Bundle) -> tuple[dict[str, Any], list[MemArray]]:
    """The ``"cuda"`` family for a Bundle: its device pack as the one frame, its table in
    the header; a host Bundle is declined (NotImplementedError) as a host array is."""
    header, frames = cuda_serialize(b.pack)
    return _bundle_header(b, header), frames


def bundle_cuda_deserialize(header: Mapping[str, Any], frames: list[Any]) -> Bundle:
    """The inverse of ``bundle_cuda_serialize`` (zero-copy over the frame)."""
    return _bundle_of(header, frames, cuda_deserialize)


# ---------------------------------------------------------------- registration


def _register_dask(_module: object = None) -> None:
    """sizeof and tokenize (called when ``dask`` is imported)."""
    from dask.base import normalize_token
    from dask.sizeof import sizeof as dask_sizeof

    dask_sizeof.register(MemArray)(sizeof)
    normalize_token.register(MemArray)(tokenize)
    dask_sizeof.register(Bundle)(bundle_sizeof)
    normalize_token.register(Bundle)(bundle_tokenize)


def _register_distributed(_module: object = None) -> None:
    """The ``"dask"`` and ``"cuda"`` serializer families (``distributed`` imported)."""
    from distributed.protocol import (
        cuda_deserialize as cuda_de,
    )
    from distributed.protocol import (
        cuda_serialize as cuda_ser,
    )
    from distributed.protocol import (
        dask_deserialize,
        dask_serialize,
    )

    dask_serialize.register(MemArray)(serialize)
    dask_deserialize.register(MemArray)(deserialize)
    cuda_ser.register(MemArray)(cuda_serialize)
    cuda_de.register(MemArray)(cuda_deserialize)
    dask_serialize.register(Bundle)(bundle_serialize)
    dask_deserialize.register(Bundle)(bundle_deserialize)
    cuda_ser.register(Bundle)(bundle_cuda_serialize)
    cuda_de.register(Bundle)(bundle_cuda_deserialize)


def spilling_handles(a: MemArray) -> bool:
    """Whether memarray's spilling looks after ``a`` (on, on its device): dask-cuda then
    leaves it where it is instead of spilling it a second time."""
    return bool(a.on_device and spill.settings(a.device_id) is not None)


def _register_dask_cuda(module: Any) -> None:
    """dask-cuda's ``is_spillable_object`` (``dask_cuda.is_spillable_object`` imported)."""
    module.is_spillable_object.register(MemArray)(spilling_handles)


# ---------------------------------------------------------------- workers


def _settings(
    device_budget: int | str | None,
    host_budget: int | str | None,
    spill_dir: str | os.PathLike[str] | None,
    resource: str | None,
    hooks: tuple[str, ...] | list[str],
    spilling: bool | None,
) -> _Settings:
    for h in hooks:
        if h not in HOOKS:
            raise ValueError(f"hooks are {HOOKS}, not {h!r}")
    if spilling is None:
        spilling = device_budget is not None or host_budget is not None or spill_dir is not None
    if spill_dir is not None:
        spill_dir = os.fspath(spill_dir)
    for name, b in (("device_budget", device_budget), ("host_budget", host_budget)):
        if b is not None:
            _memarray._spill_bytes(b, name)  # the workers' rules, checked here first
    if resource is not None and resource not in RESOURCES:
        raise ValueError(f"resource must be one of {RESOURCES}, not {resource!r}")
    return _Settings(
        device_budget=device_budget,
        host_budget=host_budget,
        spill_dir=spill_dir,
        resource=resource,
        hooks=list(hooks),
        spill=spilling,
    )


def setup(
    client: Any,
    *,
    device_budget: int | str | None = None,
    host_budget: int | str | None = None,
    spill_dir: str | os.PathLike[str] | None = None,
    resource: str | None = None,
    hooks: tuple[str, ...] | list[str] = (),
    spilling: bool | None = None,
    dashboard: bool = False,
) -> dict[str, Any]:
    """Makes memarray the memory manager of every worker of ``client``, and of workers
    that join later: ``resource`` ("pool", "device", "async" or "managed") as each
    device's default resource, spilling with the budgets and spill directory given (on
    when any is given, or with ``spilling=True``; budgets are bytes or strings such as
    "4GiB"), and the allocator hooks named in ``hooks`` (torch, cupy, rmm, numba). Returns
    what each worker did, by address. A bad setting is a ValueError here, before any
    worker changes: values are checked on the client, and what only a worker can answer
    (``spill_dir`` is a writable directory there, each hook's library is installed there)
    on every worker first; a worker that joins later checks before it changes anything.

    With ``dashboard=True`` every worker sends memarray's figures with its heartbeats (per
    device what each library holds, memarray's cache, the spilled tiers, budgets, pressure
    events) and the scheduler's dashboard gets a page, ``/memarray``, drawing them per
    worker over time (``/memarray.json``: the same data)."""
    from ._plugin import MemarrayPlugin

    if not isinstance(dashboard, bool):
        raise TypeError(f"dashboard must be True or False, not {type(dashboard).__name__}")

    settings = _settings(device_budget, host_budget, spill_dir, resource, tuple(hooks), spilling)
    workers = len(client.scheduler_info().get("workers", {}))

    def work(count: _progress.Count) -> dict[str, Any]:
        # What only a worker can answer (its spill directory, its libraries), asked of
        # every worker before the plugin changes any: all or none.
        answers = client.run(_check, settings, on_error="return")
        refused = {w: e for w, e in answers.items() if isinstance(e, BaseException)}
        if refused:
            detail = "; ".join(f"{w}: {e}" for w, e in sorted(refused.items()))
            raise ValueError(f"memarray.dask.setup changed no worker: {detail}")
        count.done += workers
        if dashboard:
            from ._dashboard import Dashboard

            client.register_plugin(Dashboard(), name=Dashboard.name)
        client.register_plugin(MemarrayPlugin(settings, dashboard), name="memarray")
        count.done += workers
        done: dict[str, Any] = client.run(_worker_state)
        return done

    # Checked, then set up, on every worker: a bar (in worker steps) when it runs long.
    return _progress.run(
        work,
        2 * workers,
        f"memarray on {workers} worker{'s' if workers != 1 else ''}",
        counter=_progress.Count(),
        unit="worker step",
        smallest=1,
    )


def _worker_state(dask_worker: Any) -> Any:
    return getattr(dask_worker, "memarray", None)


def _worker_statistics() -> dict[str, Any]:
    from ... import cuda

    out: dict[str, Any] = {"pressure": resources.pressure_statistics(), "devices": {}}
    if cuda.is_available():
        for d in range(cuda.device_count()):
            r = resources.get_default_resource(d)
            try:
                counts: dict[str, Any] | None = resources.statistics(d)
            except TypeError:  # a default resource that keeps no statistics
                counts = None
            out["devices"][d] = {
                "resource": r.name,
                "memory_info": r.memory_info(),
                "statistics": counts,
                "spill": spill.statistics(d),
            }
    return out


def statistics(client: Any) -> dict[str, Any]:
    """Each worker's memarray figures, by address: per device, the default resource's name,
    ``(free, total)`` bytes and statistics (None unless a ``Statistics`` adaptor is in its
    stack) and spilling's counters (None where spilling is off), and pressure relief."""
    stats: dict[str, Any] = client.run(_worker_statistics)
    return stats


def dask_setup(worker: Any) -> None:
    """``dask worker --preload memarray.dask``: applies memarray's settings from the
    environment on ``worker`` (spilling from ``MEMARRAY_SPILL`` and its budgets, read when
    memarray is imported; ``MEMARRAY_DASK_HOOKS`` a comma-separated list of torch, cupy,
    rmm and numba)."""
    hooks = _env.names("MEMARRAY_DASK_HOOKS", _env.HOOKS)
    # ``MEMARRAY_DASK_RESOURCE``: each device's default resource (pool, device, async,
    # managed).
    resource = _env.choice("MEMARRAY_DASK_RESOURCE", _env.RESOURCES)
    settings = _settings(None, None, None, resource, hooks, False)
    worker.memarray = _apply(settings, getattr(worker, "name", None))
