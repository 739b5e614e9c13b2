"""What both memarray Ray transports share: which GPU is which in an actor, the receipt
counters, and packs (many small device arrays sent as one allocation)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any, overload

import ray
from ray.experimental.rdt.tensor_transport_manager import (
    TensorTransportManager,
    TensorTransportMetadata,
)

from ... import _memarray, cuda
from ..._memarray import MemArray
from ._counts import (  # noqa: F401 - the transports' names for them
    Entries,
    _add,
    _counts,
    _counts_lock,
    add,
    count,
    count_abort,
    count_sent,
    phases,
    statistics,
    unpack,
)

# ---------------------------------------------------------------- which GPU is which


def visible() -> list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` as a list, or None when it does not narrow the devices."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return [part.strip() for part in value.split(",") if part.strip()]


def physical(ordinal: int) -> str:
    """The machine's name for this process's device ``ordinal``."""
    seen = visible()
    if seen is None:
        return str(ordinal)
    return seen[ordinal] if ordinal < len(seen) else f"?{ordinal}"


def local(name: str) -> int | None:
    """This process's ordinal of the machine's device ``name``; None where unseen."""
    seen = visible()
    if seen is not None:
        return seen.index(name) if name in seen else None
    if not name.isdigit():
        return None
    ordinal = int(name)
    return ordinal if cuda.is_available() and ordinal < cuda.device_count() else None


def home() -> int:
    """The device a received array lands on: the first GPU Ray assigned this worker, else
    the thread's default device."""
    try:
        assigned = ray.get_gpu_ids()
    except Exception:  # noqa: BLE001 - outside a worker (the driver): no assignment
        assigned = []
    for gpu in assigned:
        ordinal = local(str(gpu))
        if ordinal is not None:
            return ordinal
    return cuda.current_device()


def use_assigned_gpu() -> int:
    """Makes the first GPU Ray assigned this worker memarray's default device (for actors
    that see every GPU, as with ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1``) and
    returns its ordinal."""
    ordinal = home()
    cuda.set_default_device(ordinal)
    return ordinal


# ---------------------------------------------------------------- packs

#: An object of at least PACK_FROM device arrays, each at most PACK_EACH bytes and all on
#: one device, travels as one pack: one device copy on each side, one IPC handle or one
#: NCCL message, instead of one handle, event and copy (or message) per array.
PACK_FROM = 8
PACK_EACH = 1 << 20


class Packs:
    """The packs one transport made in this process, each held from its object's
    ``describe`` until Ray collects the object (``garbage_collect``) or aborts its
    transfer: the IPC receiver maps the pack's memory, the NCCL ``send`` sends it. Ray
    hands ``send`` and ``garbage_collect`` only the object's id and a copy of the metadata
    made at ``describe``, so the id is the pack's key; each transport (one per process,
    made by Ray) keeps its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, MemArray] = {}

    def make(self, key: str, arrays: list[Any]) -> Entries | None:
        """Packs `arrays` under `key` and returns their entries for ``_memarray._unpack``;
        None, with nothing copied, unless they are PACK_FROM or more MemArrays of at most
        PACK_EACH bytes each, all on one device (one pass in Rust checks them), or views
        of one allocation (``_memarray._share``: a span of it, not copied)."""
        if len(arrays) < PACK_FROM or not getattr(arrays[0], "on_device", False):
            return None  # host objects go by Ray's store as they are
        start = time.perf_counter()
        try:
            # Views of one allocation (a received list, a Bundle's items) go as a span of
            # it, with no copy; other arrays are copied into a new pack. Anything but
            # MemArrays is a TypeError of either.
            pack, entries = _memarray._share(arrays) or _memarray._pack(arrays, PACK_EACH)
        except (TypeError, ValueError, RuntimeError, MemoryError):
            # Not packable (a part locked, no memory for the pack): the caller takes the
            # arrays one by one and raises its own errors.
            return None
        with self._lock:
            self._held[key] = pack
        with _counts_lock:
            _counts["packed_objects"] += 1
            _add("pack_s", time.perf_counter() - start)
        return entries

    def get(self, key: str) -> MemArray:
        with self._lock:
            pack = self._held.get(key)
        if pack is None:
            raise ValueError(f"no pack is held for object {key} here (collected already?)")
        return pack

    def drop(self, key: str) -> None:
        with self._lock:
            self._held.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)


class TensorMeta(Sequence[tuple[tuple[int, ...], str]]):
    """A pack's ``tensor_meta`` in a transport's metadata: each array's ``(shape, dtype)``,
    read from the pack's table when asked. Ray only counts it (and reads it for target
    buffers, which the transports refuse); it pickles as the table, which the metadata's
    ``packed`` holds too, so a pickle of the metadata carries the table once instead of
    another 1,000 tuples (about 0.15 ms an object to build, pickle and load)."""

    __slots__ = ("_table",)

    def __init__(self, table: Entries) -> None:
        self._table = table

    def __len__(self) -> int:
        return len(self._table)

    @overload
    def __getitem__(self, i: int) -> tuple[tuple[int, ...], str]: ...
    @overload
    def __getitem__(self, i: slice) -> list[tuple[tuple[int, ...], str]]: ...
    def __getitem__(
        self, i: int | slice
    ) -> tuple[tuple[int, ...], str] | list[tuple[tuple[int, ...], str]]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        dtype, shape, _ = self._table[i]
        return (tuple(shape), dtype)

    def __eq__(self, other: object) -> bool:
        return list(self) == (list(other) if isinstance(other, TensorMeta) else other)

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (TensorMeta, (self._table,))


def check_arrays(transport: str, rdt_object: list[Any]) -> list[MemArray]:
    """The object's arrays, each a MemArray, all on devices or all on the host."""
    arrays = list(rdt_object)
    for a in arrays:
        if not isinstance(a, MemArray):
            raise TypeError(f"the {transport} transport carries MemArrays, not {type(a)!r}")
    if len({a.on_device for a in arrays}) > 1:
        raise ValueError(
            "one object's MemArrays must all be on devices or all on the host "
            "(move them first, e.g. with memarray.move_many)"
        )
    return arrays


class Transport(TensorTransportManager):
    """What memarray's two transports share: the name Ray knows them by (``NAME``), every
    actor may send (a refusal comes with the transfer), the sender's description timed
    (``describe`` does the work), and the sender's pack dropped when Ray collects the
    object."""

    NAME = ""
    #: Whether the receiver alone moves the data (IPC) or both sides take part (NCCL).
    ONE_SIDED = False

    def __init__(self) -> None:
        super().__init__()
        self.packs = Packs()

    @classmethod
    def is_one_sided(cls) -> bool:  # type: ignore[override]
        return cls.ONE_SIDED

    @staticmethod
    def can_abort_transport() -> bool:
        # Both can: a one-sided receive is one synchronous call with no peer waiting on
        # it (an error ends it); a two-sided one is freed by aborting the communicator.
        return True

    @property
    def tensor_transport_backend(self) -> str:  # type: ignore[override]
        return self.NAME.upper()

    def actor_has_tensor_transport(self, actor: Any) -> bool:
        return True

    def extract_tensor_transport_metadata(
        self, obj_id: str, rdt_object: list[Any]
    ) -> TensorTransportMetadata:
        start = time.perf_counter()
        meta = self.describe(obj_id, list(rdt_object))
        count_sent(time.perf_counter() - start)
        return meta

    def describe(self, obj_id: str, arrays: list[Any]) -> TensorTransportMetadata:
        raise NotImplementedError

    def garbage_collect(
        self, obj_id: str, tensor_transport_meta: TensorTransportMetadata, tensors: list[Any]
    ) -> None:
        # Ray's store drops the sender's arrays after this; receivers hold their own.
        self.packs.drop(obj_id)
