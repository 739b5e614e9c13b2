"""``memarray.resources.torch_snapshot``: a Tracking snapshot in torch's memory-snapshot
format (``torch.cuda.memory._snapshot()``'s dict), so torch's own viewers open it:
``python -m torch.cuda._memory_viz trace_plot snap.pickle -o out.html`` and the
memory_viz page. No torch is needed to write one.

What torch's format has no place for goes under the extra key ``"memarray"``, which torch's
tools ignore: host, pinned and file memory (a *tier*: drawn as a device index past the
GPUs, named in ``tiers``), and spills and restores (``events``).
"""

from __future__ import annotations

import os
import pickle
from typing import Any

#: Device indices a snapshot may name: torch's format has one trace list per index up to the
#: largest, so an index is bounded to keep the output proportional to the snapshot.
MAX_DEVICE = 1023


def _device(d: object) -> int | None:
    if d is None:
        return None
    if not isinstance(d, int) or isinstance(d, bool) or not 0 <= d <= MAX_DEVICE:
        raise ValueError(f"device {d!r} is not a CUDA device index in 0..={MAX_DEVICE} or None")
    return d


def _frames(stack: object) -> list[dict[str, Any]]:
    """torch's frames (innermost first) from a memarray stack (outermost first, one
    ``file:line in function`` per line)."""
    if stack is None:
        return []
    if not isinstance(stack, str):
        raise ValueError(f"a stack is a str or None, not {type(stack).__name__}")
    frames = []
    for line in reversed(stack.splitlines()):
        where, _, name = line.partition(" in ")
        filename, _, lineno = where.rpartition(":")
        try:
            number = int(lineno)
        except ValueError:
            filename, number = where, 0
        frames.append({"filename": filename, "line": number, "name": name or "?"})
    return frames


def torch_snapshot(snapshot: dict) -> dict:
    """The ``snapshot()`` of a ``memarray.resources.Tracking`` (made with ``stacks=True``
    for the trace and the frames) as torch's memory snapshot: ``segments`` (each live
    allocation a segment of one active block, with its frames) and ``device_traces`` (one
    list per device: ``alloc``, ``free_requested`` and ``free_completed`` entries with
    ``addr``, ``size``, ``stream``, ``time_us`` and ``frames``), plus ``"memarray"``:
    ``tiers`` (device index -> ``"cuda:N"`` or ``"host"``) and ``events`` (spills and
    restores: ``time_us``, ``action``, ``size``). Devices are indices 0..=1023 or None (the
    host). ValueError for anything else."""
    if not isinstance(snapshot, dict) or not {"live", "timeline", "sources"} <= snapshot.keys():
        raise ValueError(
            "torch_snapshot takes a memarray.resources Tracking snapshot() dict "
            "(keys 'live', 'timeline', 'sources')"
        )
    try:
        live = list(snapshot["live"])
        trace = list(snapshot.get("trace", []))
        devices = {_device(a["device"]) for a in live} | {_device(row[5]) for row in trace}
        gpus = sorted(d for d in devices if d is not None)
        host_index = (max(gpus) + 1) if gpus else 0
        index: dict[int | None, int] = {d: d for d in gpus}
        index[None] = host_index
        n = max([host_index, *gpus]) + 1
        segments = []
        for a in live:
            frames = _frames(a.get("stack"))
            size = int(a["size"])
            block = {
                "address": int(a["address"]),
                "size": size,
                "requested_size": size,
                "state": "active_allocated",
                "frames": frames,
            }
            segments.append(
                {
                    "device": index[a["device"]],
                    "address": int(a["address"]),
                    "total_size": size,
                    "allocated_size": size,
                    "active_size": size,
                    "requested_size": size,
                    "stream": int(a["stream"] or 0),
                    "segment_type": "large",
                    "segment_pool_id": (0, 0),
                    "is_expandable": False,
                    "frames": frames,
                    "blocks": [block],
                }
            )
        traces: list[list[dict[str, Any]]] = [[] for _ in range(n)]
        for ns, action, address, size, stream, device, source, stack in trace:
            entry = {
                "addr": int(address),
                "size": int(size),
                "stream": int(stream or 0),
                "time_us": int(ns) // 1000,
                "frames": _frames(stack),
                "memarray_source": source,
            }
            if action == "alloc":
                traces[index[device]].append({"action": "alloc", **entry})
            else:
                traces[index[device]].append({"action": "free_requested", **entry})
                traces[index[device]].append({"action": "free_completed", **entry})
        events = [
            {"time_us": int(ns) // 1000, "action": str(kind), "size": int(size)}
            for ns, kind, size in snapshot.get("events", [])
        ]
    except (KeyError, TypeError, ValueError, IndexError, OverflowError, AttributeError) as e:
        raise ValueError(f"not a valid Tracking snapshot: {e!r}") from e
    tiers = {i: ("host" if d is None else f"cuda:{d}") for d, i in index.items()}
    return {
        "segments": segments,
        "device_traces": traces,
        "allocator_settings": {},
        "memarray": {"resource": snapshot.get("resource"), "tiers": tiers, "events": events},
    }


def save_torch_snapshot(snapshot: dict, path: str | os.PathLike) -> str:
    """Writes ``torch_snapshot(snapshot)`` to ``path`` as the pickle torch's tools read;
    returns the path."""
    out = os.fspath(path)
    data = torch_snapshot(snapshot)
    with open(out, "wb") as f:
        pickle.dump(data, f)
    return out
