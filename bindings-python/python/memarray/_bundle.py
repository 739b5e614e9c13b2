"""``memarray.Bundle`` (also ``memarray.ray.Bundle``): many arrays carried as one.

Engines pay per array: a Ray direct-transport object of 1,000 small arrays costs Ray
several times what one array costs, whatever the transport does with their bytes
(docs/benchmarks.md); a pickle, a Dask task or an MPI message pays per array too. A
Bundle packs its arrays into one allocation (one SM copy
kernel launch on a device, one memcpy per array on the host) and pickles as that one
MemArray and a table of where each array sits, so Ray lifts, sends and stores one array.
The receiver's Bundle hands out its arrays as slices of its one copy (no copy each).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

from . import _memarray
from ._memarray import MemArray

#: A pack's table: each array's dtype, shape and byte offset in the pack, parsed once (a
#: sequence of ``(dtype, shape, offset)`` tuples; it pickles as one bytes object).
Entries = _memarray._PackTable


class Bundle(Sequence[MemArray]):
    """A sequence of MemArrays, all on the host or all on one device, stored as one
    allocation. ``Bundle(arrays)`` copies them in once (they stay the caller's); indexing
    and iteration give arrays that are views of the bundle's allocation (writing one
    writes the bundle). Return one from an actor method with ``tensor_transport=
    "memarray"`` or ``"memarray_nccl"``, or pass it as a Ray object: Ray sees one array.

    ``Bundle(arrays, copy=False)`` copies nothing: the arrays must be views of one
    allocation (another Bundle's items, or arrays a transport unpacked, in any order or
    subset, spanning at most twice what a copy would take), and the bundle shares their
    memory; ValueError otherwise. 1,000 views of one array bundle for the cost of the
    array.

    Raises TypeError for anything but MemArrays, ValueError for arrays on different
    devices, and what a locked array raises."""

    __slots__ = ("_arrays", "_entries", "_pack")

    def __init__(self, arrays: Iterable[MemArray], *, copy: bool = True) -> None:
        arrays = list(arrays)
        self._arrays: list[MemArray] | None = None
        if not arrays:
            self._pack = _memarray.empty((0,), "uint8")
            self._entries = _memarray._check_table(0, [])
            return
        # Rust checks every item (a MemArray, one device) as it packs; on a refusal the
        # Bundle's own message names the item or the devices (a Python pass over 1,000
        # arrays first cost 0.09 ms, 40% of a Bundle of views).
        try:
            if copy:
                self._pack, self._entries = _memarray._pack(arrays)
                return
            shared = _memarray._share(arrays)
        except (TypeError, ValueError):
            _refuse(arrays)
            raise
        if shared is None:
            _refuse(arrays)
            raise ValueError(
                "Bundle(arrays, copy=False) needs views of one allocation (another "
                "Bundle's items), spanning at most twice their packed size; "
                "Bundle(arrays) copies them"
            )
        self._pack, self._entries = shared

    @classmethod
    def _of(cls, pack: MemArray, entries: Entries) -> Bundle:
        b = cls.__new__(cls)
        b._pack, b._entries, b._arrays = pack, _checked(pack, entries), None
        return b

    def __reduce__(self) -> tuple[Any, ...]:
        return (Bundle._of, (self._pack, self._entries))

    @property
    def pack(self) -> MemArray:
        """The one allocation (a 1-d uint8 MemArray) the arrays live in."""
        return self._pack

    @property
    def device(self) -> str:
        return str(self._pack.device)

    def _all(self) -> list[MemArray]:
        if self._arrays is None:
            self._arrays = _memarray._unpack(self._pack, self._entries)
        return self._arrays

    def __len__(self) -> int:
        return len(self._entries)

    @overload
    def __getitem__(self, i: int) -> MemArray: ...
    @overload
    def __getitem__(self, i: slice) -> list[MemArray]: ...
    def __getitem__(self, i: int | slice) -> MemArray | list[MemArray]:
        return self._all()[i]

    def __iter__(self) -> Iterator[MemArray]:
        return iter(self._all())

    def __repr__(self) -> str:
        return f"memarray.Bundle({len(self)} arrays, {self._pack.nbytes} bytes, {self.device})"


def _refuse(arrays: list[Any]) -> None:
    """Raises what a Bundle says of `arrays` that are not MemArrays on one device: a
    TypeError naming the first item that is not a MemArray, a ValueError naming the
    devices; returns where neither applies."""
    for i, a in enumerate(arrays):
        if not isinstance(a, MemArray):
            raise TypeError(f"a Bundle holds MemArrays; item {i} is {type(a).__name__}")
    where = {a.device for a in arrays}
    if len(where) > 1:
        raise ValueError(f"a Bundle's arrays must share one device; these are on {sorted(where)}")


def _checked(pack: Any, entries: Any) -> Entries:
    """A Bundle's table from a pickle (a ``_PackTable``, or a list from an older
    memarray), checked before anything is made from it: a 1-d uint8 MemArray pack; each
    entry a dtype memarray knows, a shape of at most MAX_NDIM non-negative ints, and a
    non-negative offset, its bytes inside the pack. ValueError naming the entry otherwise
    (host and device packs alike; one pass in Rust)."""
    if not isinstance(pack, MemArray) or pack._dtype_name != "uint8" or pack.ndim != 1:
        raise ValueError("a Bundle's pack must be a 1-d uint8 MemArray")
    return _memarray._check_table(pack.nbytes, entries)
