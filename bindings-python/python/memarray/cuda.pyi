"""Type stubs for ``memarray.cuda`` (the ``cuda`` submodule of ``memarray._memarray``,
bindings-python/src/cuda.rs). Stream and Event report ``__module__ == "memarray.cuda"``."""

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, Self, final, type_check_only

import numpy as np

from ._memarray import MemArray, _StreamLike

__all__ = [
    "Capture",
    "Event",
    "Function",
    "Graph",
    "In",
    "Module",
    "Out",
    "Stream",
    "check_errors",
    "copy_engine",
    "current_device",
    "default_device",
    "device",
    "device_count",
    "set_default_device",
    "set_device",
    "from_cuda_array_interface",
    "is_available",
    "pinned_fallbacks",
    "set_staging_config",
    "staging_config",
    "synchronize",
    "unavailable_reason",
]

@type_check_only
class _HasCudaArrayInterface(Protocol):
    @property
    def __cuda_array_interface__(self) -> Mapping[str, object]: ...

@final
class Stream:
    """An owned non-blocking CUDA stream on one device. Dropped streams are recycled,
    never destroyed, so a handle copied out of one stays valid."""

    def __new__(cls, device_id: int | None = None) -> Self: ...
    @property
    def handle(self) -> int: ...
    @property
    def ptr(self) -> int:
        """Alias of ``handle`` (CuPy's name)."""
    @property
    def cuda_stream(self) -> int:
        """Alias of ``handle`` (torch's name)."""
    def __cuda_stream__(self) -> tuple[int, int]: ...
    def synchronize(self) -> None: ...
    def wait_event(self, event: Event) -> None: ...
    def record_event(self) -> Event: ...
    def capture(self, mode: str = "thread_local") -> Capture:
        """A ``with`` block that records the work enqueued on this stream into a CUDA
        graph (``Capture.graph``) instead of running it. ``mode``: ``"thread_local"``,
        ``"global"`` or ``"relaxed"``."""
    def is_capturing(self) -> bool: ...

@final
class Capture:
    """A capture of one stream (``Stream.capture()``); its graph once the block ends."""

    def __enter__(self) -> Self: ...
    def __exit__(self, exc_type: object, exc: object = None, tb: object = None) -> bool: ...
    @property
    def graph(self) -> Graph: ...

@final
class Graph:
    """An instantiated CUDA graph: one launch runs everything its capture recorded."""

    def launch(self, stream: _StreamLike | None = None) -> None: ...
    def replay(self, n: int, stream: _StreamLike | None = None) -> None: ...
    def upload(self, stream: _StreamLike | None = None) -> None: ...
    @property
    def node_count(self) -> int: ...
    @property
    def array_count(self) -> int:
        """How many memarray arrays the graph holds (kept alive, checked at each launch)."""

@final
class Event:
    """A CUDA event; ``timing=True`` enables ``elapsed_time``."""

    def __new__(cls, device_id: int | None = None, timing: bool = False) -> Self: ...
    def record(self, stream: _StreamLike | None = None) -> None: ...
    def synchronize(self) -> None: ...
    def query(self) -> bool: ...
    def elapsed_time(self, end: Event) -> float:
        """Milliseconds from this event to ``end`` (torch's and CuPy's order)."""

def is_available() -> bool: ...
def unavailable_reason() -> str | None: ...
def device_count() -> int: ...
def current_device() -> int:
    """The calling thread's current CUDA device (shared with torch and CuPy); the process
    default (``default_device()``) when none was set."""

def set_default_device(device: int | str) -> None:
    """Makes ``device`` the device of every thread that has not chosen one."""

def check_errors() -> None:
    """Raises the first error memarray could not report where it happened (a failing
    free or drop), and forgets them."""

def default_device() -> int:
    """The device of threads that have not chosen one (0 unless set)."""

def set_device(device: int | str) -> None:
    """Makes ``device`` the calling thread's current CUDA device."""

def device(n: int | str) -> AbstractContextManager[int]:
    """``with memarray.cuda.device(n):``: device ``n`` current for the block."""

def synchronize(device_id: int | None = None) -> None: ...
def from_cuda_array_interface(
    obj: _HasCudaArrayInterface, copy: bool | None = None
) -> MemArray: ...
def staging_config() -> dict[str, dict[str, int]]: ...
def pinned_fallbacks() -> dict[str, int]: ...
def copy_engine(device_id: int | None = None) -> dict[str, Any]: ...
def set_staging_config(
    direction: str | None = None,
    threads: int | None = None,
    chunk_bytes: int | None = None,
    direct_below: int | None = None,
    lane_min: int | None = None,
    short_below: int | None = None,
    fill_threads: int | None = None,
) -> None: ...

_Dims = int | tuple[int] | tuple[int, int] | tuple[int, int, int]

@final
class Module:
    """A loaded kernel module (PTX text, a cubin or a fatbin) of one device."""

    def __new__(cls, image: str | bytes, device_id: int | None = None) -> Self: ...
    @staticmethod
    def from_source(
        source: str,
        name: str | None = None,
        options: Sequence[str] | None = None,
        device_id: int | None = None,
    ) -> Module:
        """Compiles CUDA C++ with NVRTC (kernels ``extern "C"``) and loads it; ``name``
        (default ``"kernel.cu"``) names it in NVRTC's log. Text that is not valid
        Unicode (a lone surrogate) is ValueError naming the argument."""
    @property
    def device_id(self) -> int: ...
    def function(self, name: str) -> Function: ...

@final
class Function:
    """A kernel of a Module. ``launch`` passes MemArrays as Indexers, orders the launch
    after their pending work and records it as their pending work."""

    @property
    def name(self) -> str: ...
    @property
    def param_sizes(self) -> list[int]: ...
    def config_for(self, n: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]: ...
    def config_grid_stride(self, n: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]: ...
    def launch(
        self,
        *args: MemArray | In | Out | np.generic | bytes,
        grid: _Dims | None = None,
        block: _Dims | None = None,
        shared_bytes: int = 0,
        stream: _StreamLike | None = None,
    ) -> None: ...

@final
class In:
    """An array the kernel only reads."""

    def __new__(cls, array: MemArray) -> Self: ...
    @property
    def array(self) -> MemArray: ...

@final
class Out:
    """An array the kernel writes (as a bare MemArray is)."""

    def __new__(cls, array: MemArray) -> Self: ...
    @property
    def array(self) -> MemArray: ...

class _Memory:
    """Device memory at ``ptr`` as ``shape`` of ``typestr`` through the CUDA Array
    Interface, keeping ``owner`` alive."""

    owner: Any
    __cuda_array_interface__: dict[str, Any]
    def __init__(
        self,
        owner: Any,
        ptr: int,
        shape: tuple[int, ...],
        typestr: str,
        *,
        read_only: bool = False,
    ) -> None: ...
