"""Registration with libraries memarray knows, when they are imported, in either order.

``memarray.dask`` registers MemArrays with Dask's dispatchers (sizeof, tokenize), with
distributed's serializers and with dask-cuda's ``is_spillable_object``; ``memarray.ray``
registers its tensor transport with Ray. Those libraries offer no plugin entry point for
all of them, so memarray watches their imports: a finder
at the front of ``sys.meta_path`` wraps the loader of each watched module and runs the
registration once the module has executed. A module imported before memarray is
registered with at once. A registration that fails warns and leaves the import alone.
A glue module that imports its library at its top (``memarray.cluster.ray``) may be the
very import that finishes the library's: it is then still executing, and registers at its
own end instead.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

#: module -> (the memarray.cluster module, its function registering with it).
WATCHED = {
    "dask": ("dask", "_register_dask"),
    "distributed": ("dask", "_register_distributed"),
    "dask_cuda.is_spillable_object": ("dask", "_register_dask_cuda"),
    "ray": ("ray", "_register_ray"),
}

_lock = threading.Lock()
_done: set[str] = set()


def _register(name: str, module: ModuleType) -> None:
    with _lock:
        if name in _done:
            return
        _done.add(name)
    glue, function = WATCHED[name]
    own = sys.modules.get(f"{__package__}.cluster.{glue}")
    if own is not None and getattr(own.__spec__, "_initializing", False):
        return  # the glue module imported the library: it registers when it finishes
    try:
        getattr(importlib.import_module(f".cluster.{glue}", __package__), function)(module)
    except Exception as e:  # noqa: BLE001 - the user's import must go on
        warnings.warn(
            f"memarray could not register with {name}: {type(e).__name__}: {e}",
            RuntimeWarning,
            stacklevel=2,
        )


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched module it asks the finders after it and wraps
    the loader's ``exec_module``."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> Any:
        if fullname not in WATCHED or fullname in _done:
            return None
        finders = sys.meta_path[sys.meta_path.index(self) + 1 :] if self in sys.meta_path else []
        for finder in finders:
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module: Callable[[ModuleType], None] | None = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_and_register(module: ModuleType) -> None:
            exec_module(module)
            _register(fullname, module)

        try:
            loader.exec_module = exec_and_register  # type: ignore[method-assign]
        except AttributeError:  # a loader that refuses attributes: registered on next use
            return spec
        return spec


_finder = _Finder()


def install() -> None:
    """Watches the modules in ``WATCHED``; registers at once with those already imported."""
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    for name in WATCHED:
        module = sys.modules.get(name)
        if module is not None:
            _register(name, module)
