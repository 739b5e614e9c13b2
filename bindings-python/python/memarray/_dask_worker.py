"""What ``memarray.dask.setup`` does on a worker (apart from ``memarray.dask``, so the
worker plugin and the module that registers it do not import each other)."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from typing import Any

from . import resources, spill

HOOKS = ("torch", "cupy", "rmm", "numba")


class _Settings(dict):  # type: ignore[type-arg]
    """What ``setup`` applies on a worker (plain data: it travels to the workers)."""


RESOURCES = ("pool", "device", "async", "managed")


def _resource(choice: str, device: int) -> resources.Resource:
    if choice == "pool":
        return resources.Pool(resources.Device(device))
    if choice == "device":
        return resources.Device(device)
    if choice == "async":
        return resources.Async(device)
    if choice == "managed":
        return resources.Managed(device)
    raise ValueError(f"resource must be one of {RESOURCES}, not {choice!r}")


def _check(settings: Mapping[str, Any]) -> None:
    """What could fail on this worker, checked before anything changes (so a refused
    setting leaves no worker half-configured): the spill directory is a writable
    directory here, each hook's library is installed here. ValueError otherwise."""
    d = settings.get("spill_dir")
    if settings.get("spill") and d is not None:
        if not os.path.isdir(d):
            raise ValueError(f"spill_dir {d!r} is not a directory on this worker")
        if not os.access(d, os.W_OK | os.X_OK):
            raise ValueError(f"spill_dir {d!r} is not writable on this worker")
    for hook in settings.get("hooks", ()):
        if hook not in HOOKS:
            raise ValueError(f"hooks are {HOOKS}, not {hook!r}")
        if importlib.util.find_spec(hook) is None:
            raise ValueError(f"hook {hook!r}: {hook} is not installed on this worker")


def _apply(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Makes memarray this process's memory manager as ``settings`` say; returns what was
    done. Device settings apply to every device the process sees; without a device they
    are recorded as skipped (a CPU worker still serialises and sizes MemArrays). Checks
    first (``_check``): a refusal changes nothing."""
    from . import cuda

    _check(settings)
    done: dict[str, Any] = {"devices": 0, "hooks": []}
    if not cuda.is_available():
        done["skipped"] = f"no CUDA device: {cuda.unavailable_reason()}"
        return done
    n = cuda.device_count()
    done["devices"] = n
    choice = settings.get("resource")
    for d in range(n):
        if choice is not None:
            resources.set_default_resource(_resource(choice, d), d)
        if settings.get("spill"):
            spill.enable(
                d,
                device_budget=settings.get("device_budget"),
                host_budget=settings.get("host_budget"),
                file_dir=settings.get("spill_dir"),
            )
    for hook in settings.get("hooks", ()):
        if hook == "torch":
            import memarray.torch

            memarray.torch.install()
        elif hook == "cupy":
            import cupy

            import memarray.cupy

            cupy.cuda.set_allocator(memarray.cupy.allocator)
        elif hook == "rmm":
            import memarray.rmm

            for d in range(n):
                memarray.rmm.set_current(d)
        elif hook == "numba":
            from numba import cuda as ncuda

            import memarray.numba

            ncuda.set_memory_manager(memarray.numba.MemarrayNumbaManager)
        else:
            raise ValueError(f"hooks are {HOOKS}, not {hook!r}")
        done["hooks"].append(hook)
    done["spill"] = bool(settings.get("spill"))
    return done
