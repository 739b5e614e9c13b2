"""What ``memarray.dask.setup`` does on a worker (apart from ``memarray.dask``, so the
worker plugin and the module that registers it do not import each other)."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from typing import Any

from ... import _env, resources, spill
from ..._env import HOOKS, RESOURCES


class _Settings(dict):  # type: ignore[type-arg]
    """What ``setup`` applies on a worker (plain data: it travels to the workers)."""


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


def worker_gpu(name: Any, count: int, chosen: int | None) -> tuple[int, str]:
    """The GPU a worker that sees ``count`` devices serves, and why: ``chosen`` (the
    ``MEMARRAY_DASK_DEVICE`` of its environment, read by ``memarray._env``) when given; the
    one device it sees (one GPU per worker, as dask-cuda runs them); else its name modulo
    ``count`` when the name is a number (a LocalCluster's workers are 0, 1, ...); else
    device 0, saying so."""
    if chosen is not None:
        if not 0 <= chosen < count:
            msg = f"MEMARRAY_DASK_DEVICE={chosen}, but this worker sees {count} device(s)"
            raise ValueError(msg)
        return chosen, f"MEMARRAY_DASK_DEVICE={chosen}"
    if count == 1:
        return 0, "the one device this worker sees"
    if isinstance(name, int) and not isinstance(name, bool):
        return name % count, f"worker {name} of a cluster on {count} devices"
    return 0, (
        f"device 0 of {count}: worker name {name!r} is not a number; give each worker one GPU "
        "(CUDA_VISIBLE_DEVICES) or MEMARRAY_DASK_DEVICE"
    )


def _apply(settings: Mapping[str, Any], worker_name: Any = None) -> dict[str, Any]:
    """Makes memarray this process's memory manager as ``settings`` say; returns what was
    done. The worker's GPU (``worker_gpu``) becomes the device of its task threads
    (``cuda.set_default_device``); device settings apply to every device the process
    sees; without a device they are recorded as skipped (a CPU worker still serialises
    and sizes MemArrays). Checks first (``_check``): a refusal changes nothing."""
    from ... import cuda

    _check(settings)
    # Read before the device check, so a bad value fails on a worker without CUDA too.
    chosen = _env.device_number("MEMARRAY_DASK_DEVICE")
    done: dict[str, Any] = {"devices": 0, "hooks": []}
    if not cuda.is_available():
        done["skipped"] = f"no CUDA device: {cuda.unavailable_reason()}"
        return done
    n = cuda.device_count()
    done["devices"] = n
    gpu, why = worker_gpu(worker_name, n, chosen)
    cuda.set_default_device(gpu)
    done["device"], done["device_reason"] = gpu, why
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
            from ...interop import torch as torch_glue

            torch_glue.install()
        elif hook == "cupy":
            import cupy

            from ...interop import cupy as cupy_glue

            cupy.cuda.set_allocator(cupy_glue.allocator)
        elif hook == "rmm":
            from ...interop import rmm as rmm_glue

            for d in range(n):
                rmm_glue.set_current(d)
        elif hook == "numba":
            from numba import cuda as ncuda

            from ...interop import numba as numba_glue

            ncuda.set_memory_manager(numba_glue.MemarrayNumbaManager)
        else:
            raise ValueError(f"hooks are {HOOKS}, not {hook!r}")
        done["hooks"].append(hook)
    done["spill"] = bool(settings.get("spill"))
    return done
