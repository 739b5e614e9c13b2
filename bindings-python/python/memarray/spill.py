"""Spilling past a device's capacity (docs/spilling.md).

With spilling on for a device, memarray keeps its arrays there within a device budget
(or, without one, until an allocation fails): arrays chosen by a policy that does well on
both reuse and scans move their data to the host (pinned within a host budget, to a file
in ``file_dir`` beyond it) and free their device memory. A spilled array keeps its place
(``a.device`` is still ``"cuda:0"``, ``a.spilled`` is True) and comes back by itself on
its next device use: exports, kernels, moves, element access on the device, IPC, NCCL.
``a.prefetch(stream)`` brings it back ahead of use; ``evict(a)`` spills on request.

Arrays that are locked, exported (a live DLPack consumer such as a CuPy or torch array
made with ``from_dlpack``, a ``__cuda_array_interface__`` pointer, an IPC handle, a
``device_view`` scope) or still in use on a stream are never spilled. A CUDA Array
Interface pointer has no release: ``allow(a)`` says its holders are done.

The environment turns it on once, at import: ``MEMARRAY_SPILL`` (``1``/``all``, or
``cuda:0,cuda:1``), ``MEMARRAY_DEVICE_BUDGET`` and ``MEMARRAY_HOST_BUDGET`` (bytes, or
``"4GiB"`` style), ``MEMARRAY_SPILL_DIR``.
"""

from __future__ import annotations

import os
from typing import Any

from . import _memarray

__all__ = ["allow", "disable", "enable", "evict", "settings", "statistics"]

_memarray._spill_from_env()


def enable(
    device: int = 0,
    *,
    device_budget: int | str | None = None,
    host_budget: int | str | None = None,
    file_dir: str | os.PathLike[str] | None = None,
) -> None:
    """Turns spilling on for ``device`` (settings replace earlier ones).

    ``device_budget``: bytes of memarray arrays kept on the device (``None``: spill only
    when an allocation fails). ``host_budget``: host bytes spilling may allocate for host
    copies; beyond it copies go to a file in ``file_dir`` (without one, spilling stops
    there). Byte counts are ints or strings such as ``"4GiB"``.
    """
    _memarray._spill_enable(device, device_budget, host_budget, file_dir)


def disable(device: int = 0) -> None:
    """Turns spilling off for ``device``; spilled arrays still come back when used."""
    _memarray._spill_disable(device)


def settings(device: int = 0) -> dict[str, Any] | None:
    """``device``'s settings, or None when spilling is off there."""
    return _memarray._spill_settings(device)


def statistics(device: int = 0) -> dict[str, Any] | None:
    """``device``'s counters, or None when spilling is off there.

    Keys: ``spilled_arrays``, ``spilled_bytes``, ``restored_arrays``,
    ``restored_bytes`` (totals), ``current_spilled_bytes``, ``resident_bytes`` (now),
    ``spill_seconds``, ``restore_seconds``, ``skipped_busy`` (victims passed over),
    ``host_bytes`` and ``file_bytes`` (host copies spilling made, live now).
    """
    return _memarray._spill_statistics(device)


def evict(a: _memarray.MemArray) -> None:
    """Spills ``a`` now. ValueError says why when it cannot go (not on a device,
    locked, exported, work still queued on it, a CUDA graph uses it, spilling off on its
    device)."""
    _memarray._spill_evict(a)


def allow(a: _memarray.MemArray) -> int:
    """Lets ``a`` spill although it handed out ``__cuda_array_interface__`` pointers:
    their holders promise not to use them any more. Returns how many were held."""
    return _memarray._spill_allow(a)
