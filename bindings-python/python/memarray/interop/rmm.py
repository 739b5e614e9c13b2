"""RMM and memarray share one pool, both ways (as umem's ``umemRMM``,
github.com/xnd-project/umem).

RMM allocating through memarray, so cuDF, cuML and ``rmm.allocators.cupy`` / ``numba`` /
``torch`` users draw from memarray's pool::

    import memarray.rmm
    memarray.rmm.set_current(device=0)        # rmm.mr.set_per_device_resource(0, ...)

memarray allocating through RMM: ``memarray.resources.Rmm(device)``.

RMM is optional: without it, ImportError naming the package (``rmm-cu13``).
"""

from __future__ import annotations

from typing import Any

from .. import _memarray, resources
from ..resources import _rmm

__all__ = ["resource", "set_current"]


def resource(upstream: resources.Resource | None = None, device: int = 0) -> Any:
    """An ``rmm.mr.CallbackMemoryResource`` whose memory comes from ``upstream`` (default:
    memarray's default resource of ``device``), stream-ordered on RMM's stream and
    attributed to the source ``"rmm"`` (``memarray.resources.statistics()["by_source"]``
    shows what RMM holds)."""
    rmm = _rmm()
    r = upstream if upstream is not None else resources.get_default_resource(device)
    if not isinstance(r, resources.Resource):
        raise TypeError(f"upstream must be a memarray.resources.Resource, not {type(r).__name__}")
    if r.kind not in ("device", "managed"):
        raise ValueError(f"RMM serves device memory; {r.name} serves {r.kind} memory")
    callbacks = _memarray._interop.resource_callbacks(r._handle, "rmm")
    return rmm.mr.CallbackMemoryResource(callbacks.allocate, callbacks.deallocate)


def set_current(device: int = 0, upstream: resources.Resource | None = None) -> Any:
    """Makes ``resource(upstream, device)`` RMM's resource for ``device``; returns it."""
    rmm = _rmm()
    mr = resource(upstream, device)
    rmm.mr.set_per_device_resource(device, mr)
    return mr
