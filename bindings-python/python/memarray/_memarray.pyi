"""Type stubs for the ``memarray._memarray`` extension module (bindings-python/src)."""

import os
from collections.abc import Iterable, Iterator, Sequence
from typing import (
    Any,
    ClassVar,
    Literal,
    NoReturn,
    Protocol,
    Self,
    SupportsIndex,
    TypeAlias,
    TypedDict,
    final,
    type_check_only,
)

import numpy as np
import numpy.typing as npt
from typing_extensions import CapsuleType

from . import cuda as cuda

__all__ = [
    "__version__",
    "MAX_NDIM",
    "SUPPORTED_DTYPES",
    "CaptureError",
    "OutOfMemoryError",
    "CudaUnavailableError",
    "DLPackContext",
    "DeviceScope",
    "HostBytes",
    "IpcHandle",
    "LockError",
    "MemArray",
    "_Progress",
    "_device_pair",
    "_producer_device",
    "_dlpack_live_exports",
    "_env_bytes",
    "_env_switch",
    "_env_text",
    "_from_pickle",
    "_interop",
    "_ipc_handle_from_bytes",
    "_last_batch_profile",
    "_numpy_to_device",
    "_pack",
    "_pack_layout",
    "_share",
    "_check_table",
    "_unpack",
    "_resources",
    "_spill_allow",
    "_spill_bytes",
    "_spill_disable",
    "_spill_enable",
    "_spill_evict",
    "_spill_from_env",
    "_spill_settings",
    "_spill_statistics",
    "cuda",
    "distributed",
    "empty",
    "from_dlpack",
    "from_ipc_handle",
    "full",
    "gather",
    "load",
    "load_safetensors",
    "move_many",
    "save_safetensors",
    "scatter",
    "zeros",
]

#: The package version.
__version__: str
#: Names of the fifteen element types, in DType::ALL order.
SUPPORTED_DTYPES: list[str]
#: Largest ndim an array may have (32).
MAX_NDIM: int

class LockError(RuntimeError):
    """The array is locked by another holder (a ``with a.get_dlpack(...)`` block)."""

class CudaUnavailableError(RuntimeError):
    """No usable CUDA driver or device on this machine."""

class OutOfMemoryError(MemoryError):
    """An allocation through memarray ran out of memory; ``report`` says who holds what
    (``str(e.report)``, ``e.report.to_dict()``; None if it could not be built)."""

    report: Any

class CaptureError(RuntimeError):
    """Work a CUDA graph cannot replay, asked for on a stream being captured; nothing
    was enqueued and the capture is still valid."""

@type_check_only
class _HasCudaStream(Protocol):
    """torch.cuda.Stream and friends."""
    @property
    def cuda_stream(self) -> int: ...

@type_check_only
class _HasPtr(Protocol):
    """cupy.cuda.Stream and friends."""
    @property
    def ptr(self) -> int: ...

@type_check_only
class _CudaStreamProtocol(Protocol):
    """The CUDA stream protocol (cuda.core streams, newer CuPy): ``(0, handle)``."""
    def __cuda_stream__(self) -> tuple[int, int]: ...

#: What ``move_memory``, ``add_index_tuple``, ``get_dlpack`` and ``Event.record`` take as
#: ``stream``: an int handle (0 = legacy default stream), a memarray.cuda.Stream, an
#: object with ``__cuda_stream__`` (version 0), or an object with ``cuda_stream`` (torch)
#: or ``ptr`` (CuPy). For arrays, None is the array's
#: last stream if it is persistent (default or memarray.cuda.Stream), else the legacy
#: default stream; for ``Event.record`` None is the legacy default stream.
_StreamLike: TypeAlias = int | cuda.Stream | _CudaStreamProtocol | _HasCudaStream | _HasPtr

@type_check_only
class _DLPackProducer(Protocol):
    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...

@type_check_only
class _CudaArrayInterface(TypedDict):
    version: int
    shape: tuple[int, ...]
    typestr: str
    data: tuple[int, bool]
    strides: None
    stream: int | None

_HostMemory: TypeAlias = Literal["pageable", "pinned", "managed"]
_Index: TypeAlias = SupportsIndex | tuple[SupportsIndex, ...]
_Scalar: TypeAlias = bool | int | float | complex
_ScalarIn: TypeAlias = complex | np.generic | str  # strings parse, as NumPy stores them

@final
class MemArray:
    """A typed N-d array mirrored between host and CUDA device memory."""

    def __new__(
        cls,
        shape: SupportsIndex | tuple[SupportsIndex, ...] | list[SupportsIndex],
        dtype: npt.DTypeLike | None = None,
        device_id: int | None = None,
        host_memory: _HostMemory | Literal["auto"] | None = None,
        host_resource: Any = None,
        device_resource: Any = None,
        device: None = None,
    ) -> Self: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> np.dtype[Any]: ...
    @property
    def _dtype_name(self) -> str: ...
    @property
    def ndim(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def device(self) -> str:
        """``"cpu"`` or ``"cuda:N"``: where the current data lives."""
    @property
    def on_device(self) -> bool: ...
    @property
    def device_id(self) -> int:
        """The CUDA device the array moves to by default."""
    @property
    def locked(self) -> bool: ...
    @property
    def lock_id(self) -> int | None:
        """The id of the lock token holding the array, or None."""
    @property
    def host_memory(self) -> _HostMemory: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[_Scalar]: ...
    def __bool__(self) -> bool: ...
    def __float__(self) -> float: ...
    def __int__(self) -> int: ...
    def __complex__(self) -> complex: ...
    def __index__(self) -> int: ...
    def __getitem__(self, key: _Index, /) -> _Scalar: ...
    def __setitem__(self, key: _Index, value: _ScalarIn, /) -> None: ...
    def __delitem__(self, key: _Index, /) -> None: ...
    def move_memory(
        self,
        device_type: int | str | tuple[int, int] | Any,
        device_id: int | None = None,
        stream: _StreamLike | None = None,
        async_copy: bool = False,
    ) -> None: ...
    def _read_range(self, offset: int, out: Any) -> None: ...
    def _write_range(self, offset: int, src: Any) -> None: ...
    def read_numpy_array(self, array: npt.ArrayLike) -> None: ...
    def to_numpy(self, out: npt.NDArray[Any] | None = None) -> npt.NDArray[Any]: ...
    def __array__(
        self, dtype: npt.DTypeLike | None = None, copy: bool | None = None
    ) -> npt.NDArray[Any]: ...
    def add_index_tuple(self, stream: _StreamLike | None = None) -> None: ...
    def synchronize(self) -> None: ...
    def to_device(
        self, device: int | str | tuple[int, int] | Any, /, *, stream: _StreamLike | None = None
    ) -> MemArray:
        """This array's data on ``device``: a new array, or this one when already there."""
    @property
    def pending_work(self) -> bool: ...
    def _repr_html_(self) -> str: ...
    # No arithmetic: each raises TypeError naming the libraries that compute.
    def __neg__(self) -> NoReturn: ...
    def __add__(self, other: object, /) -> NoReturn: ...
    def __radd__(self, other: object, /) -> NoReturn: ...
    def __sub__(self, other: object, /) -> NoReturn: ...
    def __rsub__(self, other: object, /) -> NoReturn: ...
    def __mul__(self, other: object, /) -> NoReturn: ...
    def __rmul__(self, other: object, /) -> NoReturn: ...
    def __truediv__(self, other: object, /) -> NoReturn: ...
    def __rtruediv__(self, other: object, /) -> NoReturn: ...
    def __floordiv__(self, other: object, /) -> NoReturn: ...
    def __rfloordiv__(self, other: object, /) -> NoReturn: ...
    def __matmul__(self, other: object, /) -> NoReturn: ...
    def __rmatmul__(self, other: object, /) -> NoReturn: ...
    @property
    def spilled(self) -> bool:
        """Whether the data is on the host for now, spilled from the array's device."""
    def prefetch(self, stream: _StreamLike | None = None) -> None: ...
    def device_view(self, stream: _StreamLike | None = None) -> DeviceScope: ...
    def record_stream(self, stream: _StreamLike) -> None: ...
    def ipc_handle(self) -> IpcHandle: ...
    def save(self, path: str | os.PathLike[str]) -> None: ...
    @property
    def has_host_copy(self) -> bool: ...
    def copy(self) -> MemArray: ...
    def __copy__(self) -> MemArray: ...
    def __deepcopy__(self, memo: Any, /) -> MemArray: ...
    def __reduce_ex__(self, protocol: SupportsIndex, /) -> tuple[Any, ...]:
        """Pickle support: a consistent snapshot; protocol 5 hands it out of band."""
    def swap(self, other: MemArray) -> None: ...
    def get_dlpack(
        self,
        device_type: int | None = None,
        device_id: int | None = None,
        stream: _StreamLike | None = None,
    ) -> DLPackContext: ...
    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> CapsuleType: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    __dlpack_c_exchange_api__: ClassVar[CapsuleType]
    """DLPack 1.3's C exchange table (a capsule named "dlpack_exchange_api")."""
    @property
    def __cuda_array_interface__(self) -> _CudaArrayInterface:
        """Only while the data is on a device; AttributeError otherwise."""
    # Python 3.12 makes these from the buffer slots; declared for every version so type
    # checkers see the buffer protocol (stubtest on 3.11 is told, in its allowlist).
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __release_buffer__(self, buffer: memoryview, /) -> None: ...

@final
class DLPackContext:
    """Returned by ``MemArray.get_dlpack``; locks the array inside its ``with`` block.
    Not constructible from Python."""

    def __enter__(self) -> Self: ...
    def __exit__(self, *args: object) -> Literal[False]: ...
    @property
    def lock_id(self) -> int | None: ...
    @property
    def array(self) -> MemArray: ...
    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> CapsuleType: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def to_numpy(self) -> npt.NDArray[Any]: ...
    def __getitem__(self, key: _Index, /) -> _Scalar: ...
    def __setitem__(self, key: _Index, value: _ScalarIn, /) -> None: ...

def from_dlpack(obj: _DLPackProducer | CapsuleType, copy: bool | None = None) -> MemArray: ...
def _dlpack_live_exports() -> tuple[int, int]: ...
def move_many(
    arrays: Iterable[MemArray | _DLPackProducer],
    device: object,
    stream: _StreamLike | None = None,
) -> list[MemArray]: ...
def _last_batch_profile() -> dict[str, float]: ...
def _numpy_to_device(obj: object, device: object) -> MemArray | None: ...
def _pack_layout(sizes: list[int]) -> tuple[list[int], int]: ...
def _check_table(pack_len: int, entries: object) -> list[tuple[str, list[int], int]]: ...
def _pack(
    arrays: Iterable[MemArray], max_each: int | None = None
) -> tuple[MemArray, list[tuple[str, list[int], int]]]: ...
def _share(
    arrays: Iterable[MemArray],
) -> tuple[MemArray, list[tuple[str, list[int], int]]] | None: ...
def _unpack(
    pack: MemArray, entries: Iterable[tuple[object, Sequence[int], int]]
) -> list[MemArray]: ...
def scatter(array: MemArray, devices: Iterable[object]) -> list[MemArray]: ...
def empty(
    shape: Iterable[int] | int,
    dtype: object = None,
    device: object = None,
    host_memory: str | None = None,
    stream: _StreamLike | None = None,
    resource: object = None,
) -> MemArray: ...
def zeros(
    shape: Iterable[int] | int,
    dtype: object = None,
    device: object = None,
    host_memory: str | None = None,
    stream: _StreamLike | None = None,
    resource: object = None,
) -> MemArray: ...
def full(
    shape: Iterable[int] | int,
    fill_value: _ScalarIn,
    dtype: object = None,
    device: object = None,
    host_memory: str | None = None,
    stream: _StreamLike | None = None,
    resource: object = None,
) -> MemArray: ...
def load(
    path: str | os.PathLike[str],
    device: object = None,
    host_memory: str | None = None,
    _progress: _Progress | None = None,
) -> MemArray: ...
def load_safetensors(
    path: str | os.PathLike[str],
    device: object = None,
    host_memory: str | None = None,
    names: list[str] | None = None,
    _progress: _Progress | None = None,
) -> tuple[dict[str, MemArray], dict[str, str]]: ...
def save_safetensors(
    path: str | os.PathLike[str],
    arrays: list[tuple[str, MemArray]],
    metadata: list[tuple[str, str]],
    _progress: _Progress | None = None,
) -> None: ...

@final
class _Progress:
    def __init__(self) -> None: ...
    @property
    def done(self) -> int: ...

def _device_pair(device: object) -> tuple[int, int]: ...
def _env_switch(name: str) -> bool | None: ...
def _env_bytes(name: str) -> int | None: ...
def _env_text(name: str) -> str | None: ...
def _producer_device(obj: object) -> tuple[int, int]: ...

@final
class IpcHandle:
    """A device array's memory (and an event after its work) as another process opens it."""

    @property
    def nbytes(self) -> int: ...
    @property
    def device_id(self) -> int: ...
    @property
    def pid(self) -> int: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...

def from_ipc_handle(handle: IpcHandle, device: int | None = None) -> MemArray: ...
def _ipc_handle_from_bytes(data: bytes, dtype: str, shape: list[int]) -> IpcHandle: ...
def gather(parts: Iterable[MemArray], device: object | None = None) -> MemArray: ...

@final
class HostBytes:
    """Host memory as a 1-d buffer of bytes: the writable block a NumPy array from
    ``to_numpy()`` owns (its base; back to memarray's NumPy block pool when the array is
    collected), or read-only bytes shared with a snapshot (a pickle payload)."""

    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...

def _from_pickle(
    data: Any,
    dtype: str,
    shape: tuple[int, ...],
    device: int | None,
    device_id: int,
    host_memory: str,
) -> MemArray: ...

@type_check_only
class _Communicator:
    """One rank of an NCCL communicator (``memarray.distributed.Communicator``)."""

    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def device_id(self) -> int: ...
    def all_reduce(
        self,
        array: MemArray,
        out: MemArray | None = None,
        op: str = "sum",
        stream: _StreamLike | None = None,
    ) -> None: ...
    def all_gather(
        self, array: MemArray, out: MemArray, stream: _StreamLike | None = None
    ) -> None: ...
    def reduce_scatter(
        self,
        array: MemArray,
        out: MemArray,
        op: str = "sum",
        stream: _StreamLike | None = None,
    ) -> None: ...
    def broadcast(
        self, array: MemArray, root: int = 0, stream: _StreamLike | None = None
    ) -> None: ...
    def send(self, array: MemArray, peer: int, stream: _StreamLike | None = None) -> None: ...
    def recv(self, array: MemArray, peer: int, stream: _StreamLike | None = None) -> None: ...
    def abort(self) -> None: ...
    @property
    def aborted(self) -> bool: ...

@type_check_only
class _DistributedModule:
    """The ``distributed`` submodule (NCCL through memarray-cuda's `nccl` feature)."""

    Communicator: type[_Communicator]
    @staticmethod
    def load(path: str | os.PathLike[str] | None = None) -> tuple[str, tuple[int, int, int]]: ...
    @staticmethod
    def is_loaded() -> bool: ...
    @staticmethod
    def unique_id() -> bytes: ...
    @staticmethod
    def exchange_id_file(path: str, rank: int, timeout: float) -> bytes: ...
    @staticmethod
    def init_rank(device: int, size: int, rank: int, unique_id: bytes | str) -> _Communicator: ...
    @staticmethod
    def init_all(devices: list[int]) -> list[_Communicator]: ...
    @staticmethod
    def group_start() -> None: ...
    @staticmethod
    def group_end() -> None: ...

distributed: _DistributedModule

@final
class _Resource:
    """A memory resource handle (``memarray.resources`` wraps it)."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def device_id(self) -> int | None: ...
    def memory_info(self) -> tuple[int, int] | None: ...
    def release_cached(self) -> int: ...
    def statistics(self) -> dict[str, int]: ...
    def pool_sleep(self, what: str) -> int: ...
    def offloaded(self) -> bool: ...
    def reset_peaks(self) -> None: ...
    def limit_usage(self) -> tuple[int, int]: ...
    def flush(self) -> None: ...
    def retries(self) -> int: ...
    def snapshot(self) -> dict[str, Any]: ...
    def live_bytes(self) -> tuple[dict[str, int], int]: ...
    def live_by_stack(self) -> list[tuple[str, str, int]]: ...
    def allocate(
        self, nbytes: int, stream: _StreamLike | None = None, source: str | None = None
    ) -> _Allocation: ...

@final
class _Allocation:
    """Memory from a resource, freed by ``free()`` or when collected
    (``memarray.resources.Allocation``)."""

    @property
    def ptr(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def freed(self) -> bool: ...
    @property
    def source(self) -> str | None: ...
    def __int__(self) -> int: ...
    def free(self, stream: _StreamLike | None = None) -> None: ...

_PathLike: TypeAlias = str | bytes | os.PathLike[str] | os.PathLike[bytes]

@type_check_only
class _ResourcesModule:
    """The ``_resources`` submodule behind ``memarray.resources``."""

    Allocation: type[_Allocation]
    @staticmethod
    def host() -> _Resource: ...
    @staticmethod
    def device_memory(device_id: int) -> _Resource: ...
    @staticmethod
    def pinned(device_id: int) -> _Resource: ...
    @staticmethod
    def managed(device_id: int) -> _Resource: ...
    @staticmethod
    def async_pool(device_id: int) -> _Resource: ...
    @staticmethod
    def file(path: _PathLike) -> _Resource: ...
    @staticmethod
    def pool(
        upstream: _Resource,
        release_threshold: int | None = None,
        device_id: int | None = None,
        grow_in_place: int | None = None,
    ) -> _Resource: ...
    @staticmethod
    def statistics(upstream: _Resource) -> _Resource: ...
    @staticmethod
    def limiting(upstream: _Resource, max_bytes: int) -> _Resource: ...
    @staticmethod
    def logging(upstream: _Resource, path: _PathLike) -> _Resource: ...
    @staticmethod
    def retry(upstream: _Resource) -> _Resource: ...
    @staticmethod
    def tracking(
        upstream: _Resource,
        source: str | None = None,
        stacks: bool = False,
        backtraces: bool = False,
    ) -> _Resource: ...
    @staticmethod
    def set_default(r: _Resource, device_id: int) -> None: ...
    @staticmethod
    def get_default(device_id: int) -> _Resource: ...
    @staticmethod
    def release_numpy_pool() -> int: ...
    @staticmethod
    def numpy_pool_statistics() -> dict[str, int] | None: ...

_resources: _ResourcesModule

@final
class _Pinning:
    """Host memory page-locked in place (Numba's ``mempin``)."""

    @property
    def ptr(self) -> int: ...
    @property
    def size(self) -> int: ...
    def release(self) -> None: ...

@final
class _ResourceCallbacks:
    """``allocate`` / ``deallocate`` over a resource, for RMM's callback resource."""

    def allocate(self, size: int, stream: _StreamLike) -> int: ...
    def deallocate(self, ptr: int, size: int, stream: _StreamLike) -> None: ...
    def live_blocks(self) -> int: ...

@final
class _CudaCoreCallbacks:
    """``allocate`` / ``deallocate`` of ``memarray.cuda_core.MemoryResource``."""

    def allocate(self, size: int, stream: _StreamLike | None = None) -> Any: ...
    def deallocate(self, ptr: int, size: int, stream: _StreamLike | None = None) -> None: ...
    def live_blocks(self) -> int: ...

@final
class _CupyAllocator:
    """CuPy's allocator hook over memarray (``memarray.cupy.allocator``)."""

    def __call__(self, nbytes: int) -> Any: ...

@type_check_only
class _InteropModule:
    """The ``_interop`` submodule: torch's allocator, pressure, RMM and Numba glue."""

    @staticmethod
    def torch_live_blocks() -> int: ...
    @staticmethod
    def pressure_stats() -> dict[str, Any]: ...
    @staticmethod
    def add_reliever(
        f: Any, name: str, device: int | None, source: str | None, priority: int
    ) -> int: ...
    @staticmethod
    def remove_reliever(id: int) -> bool: ...
    @staticmethod
    def set_budget(source: str, nbytes: int | str | None, device: int | str | None) -> None: ...
    @staticmethod
    def library_usage() -> list[dict[str, Any]]: ...
    @staticmethod
    def set_watermark(device: int | str, nbytes: int | str | None, f: Any) -> None: ...
    @staticmethod
    def watermarks() -> list[dict[str, Any]]: ...
    @staticmethod
    def callback_resource(
        allocate: Any, deallocate: Any, device_id: int, name: str, make_stream: Any = None
    ) -> _Resource: ...
    @staticmethod
    def pin(
        owner: object,
        ptr: int,
        size: int,
        device_id: int,
        mapped: bool = False,
        portable: bool = False,
    ) -> _Pinning: ...
    @staticmethod
    def pinned_source(device_id: int, write_combined: bool = False) -> _Resource: ...
    @staticmethod
    def resource_callbacks(resource: _Resource, source: str) -> _ResourceCallbacks: ...
    @staticmethod
    def cuda_core_callbacks(
        resource: _Resource, owner: Any, from_handle: Any
    ) -> _CudaCoreCallbacks: ...
    @staticmethod
    def cupy_allocator(
        get_device: Any, get_stream: Any, unowned_memory: Any, memory_pointer: Any
    ) -> _CupyAllocator: ...

_interop: _InteropModule

@final
class DeviceScope:
    """The scope ``MemArray.device_view`` returns: the array stays on its device inside."""
    def __enter__(self) -> DeviceScope: ...
    def __exit__(self, *exc: object) -> bool: ...
    @property
    def ptr(self) -> int: ...
    @property
    def shape(self) -> list[int]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def stream(self) -> int: ...
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]: ...

def _spill_bytes(value: int | str, what: str) -> int: ...
def _spill_enable(
    device: int,
    device_budget: int | str | None = None,
    host_budget: int | str | None = None,
    file_dir: str | os.PathLike[str] | None = None,
) -> None: ...
def _spill_disable(device: int) -> None: ...
def _spill_settings(device: int) -> dict[str, Any] | None: ...
def _spill_statistics(device: int) -> dict[str, Any] | None: ...
def _spill_evict(a: MemArray) -> None: ...
def _spill_allow(a: MemArray) -> int: ...
def _spill_from_env() -> None: ...
