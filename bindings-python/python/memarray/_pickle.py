"""Unpickling of MemArray (the inverse of ``MemArray.__reduce_ex__``)."""

from __future__ import annotations

from typing import Any

from ._memarray import IpcHandle, MemArray, _from_pickle, _ipc_handle_from_bytes


def rebuild(
    data: Any, dtype: str, shape: Any, device: int | None, device_id: int, host_memory: str
) -> MemArray:
    """A new MemArray holding ``data`` (any contiguous buffer of the array's bytes: the
    in-band ``bytes``, or the out-of-band buffer given to ``pickle.loads(buffers=...)``),
    on ``device`` when CUDA and that device exist here, else on the host."""
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return _from_pickle(view, dtype, tuple(shape), device, device_id, host_memory)


def ipc_handle(data: Any, dtype: str, shape: Any) -> IpcHandle:
    """Rebuilds a pickled ``memarray.IpcHandle``."""
    return _ipc_handle_from_bytes(bytes(data), dtype, list(shape))
