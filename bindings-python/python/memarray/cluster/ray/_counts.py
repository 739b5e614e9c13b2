"""The Ray transports' receipt counters (``statistics``) and their timed unpack: what
both transports and the serializer count, apart from the transports' classes."""

from __future__ import annotations

import threading
import time
from collections import deque

from ... import _memarray
from ..._bundle import Entries
from ..._memarray import MemArray

_counts_lock = threading.Lock()
_counts: dict[str, float] = {
    "ipc_objects": 0,
    "ipc_arrays": 0,
    "store_objects": 0,
    "store_arrays": 0,
    "nccl_objects": 0,
    "nccl_arrays": 0,
    "ipc_open_s": 0.0,
    "ipc_copy_s": 0.0,
    "store_s": 0.0,
    "nccl_s": 0.0,
    "nccl_alloc_s": 0.0,
    "nccl_wait_s": 0.0,
    "unpack_s": 0.0,
    "sent_objects": 0,
    "packed_objects": 0,
    "describe_s": 0.0,
    "pack_s": 0.0,
    "nccl_sends": 0,
    "nccl_send_s": 0.0,
    "nccl_send_wait_s": 0.0,
    "peer_refused": 0,
    "aborts": 0,
}


#: Per-object samples kept of each timed phase (its last SAMPLES), for medians.
SAMPLES = 256
_samples: dict[str, deque[float]] = {}


def _add(name: str, value: float) -> None:
    """Adds `value` to the counter `name` (``_counts_lock`` held); a phase's seconds (a
    name ending in ``_s``) are kept as a sample too."""
    _counts[name] += value
    if name.endswith("_s"):
        _samples.setdefault(name, deque(maxlen=SAMPLES)).append(value)


def phases(reset: bool = False) -> dict[str, list[float]]:
    """The seconds of each timed phase of :func:`statistics`, one per object (the last
    ``SAMPLES`` of each, oldest first), for medians: the sums ``statistics`` gives are
    swamped by one slow object (an NCCL pair's first transfer sets up its connection).
    ``reset``: forget them after reading."""
    with _counts_lock:
        out = {name: list(values) for name, values in _samples.items()}
        if reset:
            _samples.clear()
    return out


def statistics() -> dict[str, float]:
    """This process's receipts through memarray's transports: objects and arrays that came
    by CUDA IPC (``ipc_*``), by the sending actor through the object store (``store_*``)
    and over NCCL (``nccl_*``), and the seconds spent receiving them (``ipc_open_s``:
    mapping the sender's memory; ``ipc_copy_s``: copying it and waiting for the copies;
    ``store_s``: the fetch; ``nccl_s``: allocating, receiving and waiting, of which
    ``nccl_alloc_s`` finding the group and allocating and ``nccl_wait_s`` queueing the
    receive and waiting for it; ``unpack_s``, part of those: making a pack's arrays);
    ``peer_refused``: objects on another GPU whose memory could not be mapped here (no peer
    access), which came through the store instead. As a sender: objects described for a
    transport (``sent_objects``, ``describe_s``: the time Ray's call for their metadata
    took), of which sent as packs (``packed_objects``, ``pack_s``: packing them); NCCL sends
    (``nccl_sends``, ``nccl_send_s``: queueing them, ``nccl_send_wait_s``: waiting for them).
    ``aborts``: NCCL groups aborted here after a failed transfer (``memarray_nccl``)."""
    with _counts_lock:
        return dict(_counts)


def count(way: str, arrays: int, **seconds: float) -> None:
    with _counts_lock:
        _counts[f"{way}_objects"] += 1
        _counts[f"{way}_arrays"] += arrays
        for name, value in seconds.items():
            _add(name, value)


def count_abort() -> None:
    add(aborts=1)


def add(**amounts: float) -> None:
    """Adds each named amount to its counter."""
    with _counts_lock:
        for name, value in amounts.items():
            _add(name, value)


def count_sent(seconds: float) -> None:
    with _counts_lock:
        _counts["sent_objects"] += 1
        _add("describe_s", seconds)


def unpack(pack: MemArray, entries: Entries) -> list[MemArray]:
    """A pack's arrays (``_memarray._unpack``: waits for the pack's pending work), timed."""
    start = time.perf_counter()
    arrays = _memarray._unpack(pack, entries)
    with _counts_lock:
        _add("unpack_s", time.perf_counter() - start)
    return arrays
