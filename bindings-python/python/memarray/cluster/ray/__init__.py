"""MemArrays in Ray: objects, and Ray Direct Transport between actors.

Active once memarray and Ray are both imported, in either order; no registration code is
needed.

Objects (``ray.put``, task and actor arguments and returns) carry a MemArray as its pickle
does: a snapshot taken under the array's lock, handed to Ray's pickle 5 out of band, so a
host array's bytes are written into the object store once, with no pickle copy. The
receiver builds a new, writable MemArray from the store's buffer (one copy: the store's
objects are immutable); a device array's snapshot lands on the device it left when the
receiving process has that device (a Ray actor with ``num_gpus=1`` sees its GPU as device
0), else on the host.

The ``"memarray"`` tensor transport (``@ray.method(tensor_transport="memarray")`` on an
actor made with ``@ray.remote(enable_tensor_transport=True)``) keeps device MemArrays out
of the object store. It is one-sided: the sending actor keeps its arrays and publishes
their CUDA IPC handles, each with an event recorded after the array's queued work; the
receiver (another actor, or the driver's ``ray.get``) on the same node maps them into its
own GPU's context and copies the data there (one device copy: over NVLink, peer to peer,
when the sender's GPU is another), and waits for the copies before returning, so the
arrays it gets are its own and outlive the sender. The sender's arrays stay in Ray's store
until Ray collects the object. The sender's GPU need not be visible to the receiver: with
Ray's default (each actor sees only its own GPU through ``CUDA_VISIBLE_DEVICES``) CUDA maps
the other GPU's memory by its IPC handle all the same, given peer access between the two.
Where the handles cannot be opened, the receiver fetches the arrays from the sending actor
through the object store instead, and :func:`statistics` counts which way each object
came: host arrays, another node, memory that cannot be exported, and two GPUs without peer
access (counted as ``peer_refused`` and warned about once per pair of GPUs: the
``"memarray_nccl"`` transport is the fast way between them). An object of many small device
arrays on one device (``PACK_FROM`` or more, each at most ``PACK_EACH`` bytes) travels as
one pack: the sender copies them into one allocation (one SM copy kernel launch) and
publishes its one handle; the receiver copies it once and gets slices of its copy.

The ``"memarray_nccl"`` transport carries device MemArrays over NCCL, actor to actor on
any nodes, once :func:`create_nccl_group` joined the actors (see ``_nccl``'s text).

Ray itself pays per array in an object; :class:`Bundle` makes many arrays one for Ray (see
``memarray._bundle``'s text).
"""

from __future__ import annotations

import os
import pickle
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.experimental.rdt.tensor_transport_manager import (
    CommunicatorMetadata,
    TensorTransportMetadata,
)

from ... import _memarray, cuda
from ..._asarray import asarray
from ..._bundle import Bundle
from ..._memarray import IpcHandle, MemArray
from ..._pickle import Snapshot, rebuild
from . import _base as base
from ._base import phases, statistics, use_assigned_gpu
from ._nccl import (
    NCCL_TRANSPORT,
    MemArrayNcclTransport,
    create_nccl_group,
    destroy_nccl_group,
)

__all__ = [
    "Bundle",
    "NCCL_TRANSPORT",
    "TRANSPORT",
    "MemArrayNcclTransport",
    "MemArrayTransport",
    "MemArrayTransportMetadata",
    "create_nccl_group",
    "destroy_nccl_group",
    "phases",
    "register",
    "statistics",
    "use_assigned_gpu",
]

#: The transport's name in ``@ray.method(tensor_transport=...)``.
TRANSPORT = "memarray"

# ---------------------------------------------------------------- the transport


class _Mappings:
    """Imported arrays kept after a receive so the next receive from the same sender's
    memory reuses its IPC mapping (an open of a 256 MiB allocation costs milliseconds, a
    reuse a microsecond): the last KEEP, dropped with their sender's process."""

    KEEP = 32

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: list[tuple[int, MemArray]] = []

    def keep(self, pid: int, arrays: list[MemArray]) -> None:
        with self._lock:
            self._kept = [(p, a) for p, a in self._kept if _alive(p)]
            self._kept.extend((pid, a) for a in arrays[-self.KEEP :])
            del self._kept[: max(0, len(self._kept) - self.KEEP)]

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_mappings = _Mappings()


@dataclass
class MemArrayTransportMetadata(TensorTransportMetadata):
    """What the receiver needs: each array's IPC handle (None: fetch through the store),
    or for a pack its one handle and the entries to unpack, the sending process and node,
    each handle's GPU by the machine's name, and the sending actor's handle pickled (bytes:
    an ActorHandle object in the metadata costs Ray 0.4-0.8 ms an object to carry,
    `benches/ray_sides.py`; a receiver unpickles it only to fetch from the sender)."""

    handles: list[IpcHandle] | None = None
    packed: base.Entries | None = None
    gpus: list[str] = field(default_factory=list)
    node_id: str | None = None
    pid: int = 0
    source: bytes | None = None


class MemArrayTransport(base.Transport):
    """Ray Direct Transport for MemArrays: CUDA IPC with events on one node, the object
    store through the sending actor otherwise (see the module's text)."""

    NAME = TRANSPORT
    ONE_SIDED = True

    def describe(self, obj_id: str, arrays: list[Any]) -> MemArrayTransportMetadata:
        if not arrays:
            return MemArrayTransportMetadata(tensor_meta=[])
        _serializer.take_over()
        meta = MemArrayTransportMetadata(
            tensor_meta=[],
            tensor_device="cuda",
            node_id=ray.get_runtime_context().get_node_id(),
            pid=os.getpid(),
            source=_own_handle(),
        )
        entries = self.packs.make(obj_id, arrays)
        if entries is not None:
            meta.tensor_meta, meta.packed = base.TensorMeta(entries), entries
            shared = [self.packs.get(obj_id)]
        else:
            arrays = base.check_arrays(TRANSPORT, arrays)
            meta.tensor_meta = [(tuple(a.shape), a._dtype_name) for a in arrays]
            if not arrays[0].on_device:
                meta.tensor_device = "cpu"
                return meta
            shared = arrays
        try:
            meta.handles = [a.ipc_handle() for a in shared]
        except RuntimeError:  # LockError too
            meta.handles = None  # memory IPC cannot share: the store carries it
        meta.gpus = [base.physical(int(a.device.split(":")[1])) for a in shared]
        return meta

    def get_communicator_metadata(
        self, src_actor: Any, dst_actor: Any, backend: str | None = None
    ) -> CommunicatorMetadata:
        return CommunicatorMetadata()

    def recv_multiple_tensors(
        self,
        obj_id: str,
        tensor_transport_metadata: TensorTransportMetadata,
        communicator_metadata: CommunicatorMetadata,
        target_buffers: list[Any] | None = None,
    ) -> list[Any]:
        meta = tensor_transport_metadata
        if not isinstance(meta, MemArrayTransportMetadata):
            raise TypeError(f"not the memarray transport's metadata: {type(meta)!r}")
        if target_buffers:
            raise ValueError("the memarray transport does not receive into given buffers")
        if not meta.tensor_meta:
            return []
        opened = self._open(meta)
        if opened is not None:
            return opened
        start = time.perf_counter()
        arrays = self._through_store(obj_id, meta)
        base.count("store", len(arrays), store_s=time.perf_counter() - start)
        return arrays

    def _open(self, meta: MemArrayTransportMetadata) -> list[MemArray] | None:
        """The arrays copied from the sender's memory by IPC; None where that cannot be."""
        if meta.handles is None or meta.pid == os.getpid():
            return None
        if meta.node_id != ray.get_runtime_context().get_node_id():
            return None
        if not cuda.is_available():
            return None
        home = base.home()
        start = time.perf_counter()
        try:
            # Mapped into this GPU's context whichever GPU holds the memory (CUDA enables
            # peer access for a mapping of another GPU's, seen here or not).
            opened = [_memarray.from_ipc_handle(handle, device=home) for handle in meta.handles]
        except RuntimeError as e:
            elsewhere = sorted({g for g in meta.gpus if base.local(g) != home})
            if not elsewhere:
                raise  # this GPU's own memory: the sender is gone or freed it
            _refused(elsewhere, base.physical(home), e)
            return None
        mapped = time.perf_counter()
        # Copies of our own (the sender frees its memory when Ray collects the object),
        # queued after the sender's event: device copies, peer to peer from another GPU.
        received = [theirs.copy() for theirs in opened]
        for a in received:
            a.synchronize()  # done before the sender may free its memory
        _mappings.keep(meta.pid, opened)
        if meta.packed is not None:
            received = base.unpack(received[0], meta.packed)
        done = time.perf_counter()
        base.count("ipc", len(received), ipc_open_s=mapped - start, ipc_copy_s=done - mapped)
        return received

    def _through_store(self, obj_id: str, meta: MemArrayTransportMetadata) -> list[Any]:
        """The arrays from the sending actor through the object store: snapshots handed
        out of band (one copy into the store), copied once here, device arrays uploaded
        in one batch."""
        if meta.source is None:
            raise ValueError(
                "these MemArrays cannot be opened here by CUDA IPC and were not sent by an "
                "actor to fetch them from; send them from an actor on this node and GPU"
            )
        source = pickle.loads(meta.source)
        ref = source.__ray_call__.options(concurrency_group="_ray_system").remote(
            _snapshots, obj_id
        )
        arrays = _unpack(ray.get(ref))
        if meta.tensor_device == "cuda" and cuda.is_available():
            return _memarray.move_many(arrays, device=f"cuda:{base.home()}")
        return [a if isinstance(a, MemArray) else asarray(a) for a in arrays]

    def send_multiple_tensors(
        self,
        tensors: list[Any],
        tensor_transport_metadata: TensorTransportMetadata,
        communicator_metadata: CommunicatorMetadata,
    ) -> None:
        raise NotImplementedError("the memarray transport is one-sided: the receiver fetches")

    def abort_transport(self, obj_id: str, communicator_metadata: CommunicatorMetadata) -> None:
        return None


_refusals_lock = threading.Lock()
_refusals: set[tuple[str, str]] = set()


def _refused(gpus: list[str], home: str, error: Exception) -> None:
    """Counts an object whose memory on ``gpus`` could not be mapped on ``home`` and warns
    once per pair of GPUs: it comes through the object store, far slower than a peer copy."""
    base.add(peer_refused=1)
    with _refusals_lock:
        new = [g for g in gpus if (g, home) not in _refusals]
        _refusals.update((g, home) for g in new)
    if new:
        warnings.warn(
            f"the memarray transport cannot map GPU {', '.join(new)}'s memory on GPU {home} "
            f"({error}); such arrays come through the object store, by the host. Between "
            "GPUs without peer access use the memarray_nccl transport.",
            RuntimeWarning,
            stacklevel=2,
        )


def _snapshots(actor: Any, obj_id: str) -> list[tuple[Any, ...]]:
    """Runs on the sending actor: the object's arrays as NumPy views Ray's pickle 5 takes
    out of band (its serializer for MemArray, set for the transport, pickles in band).
    Device arrays of one dtype, trailing shape and device come down in one ``gather``
    (one download and one wait, not one per array): ``("pack", data, lengths, places)``;
    any other array is ``("one", bytes, dtype, shape, host memory)`` from its snapshot, and
    the places a pack fills are ``("in",)``."""
    import numpy as np
    from ray._private.worker import global_worker

    arrays = global_worker.rdt_manager.rdt_store.wait_and_get_object(obj_id)
    out: list[tuple[Any, ...]] = [("in",)] * len(arrays)
    groups: dict[tuple[str, tuple[int, ...], str], list[int]] = {}
    for i, a in enumerate(arrays):
        if a.on_device and a.ndim >= 1 and a._dtype_name != "bfloat16":
            groups.setdefault((a._dtype_name, tuple(a.shape[1:]), a.device), []).append(i)
        else:
            out[i] = _one(a)
    for places in groups.values():
        if len(places) == 1:
            out[places[0]] = _one(arrays[places[0]])
            continue
        packed = np.asarray(_memarray.gather([arrays[i] for i in places], device="cpu"))
        out[places[0]] = ("pack", packed, [arrays[i].shape[0] for i in places], places)
    return out


def _one(a: MemArray) -> tuple[Any, ...]:
    import numpy as np

    snap = Snapshot.of(a)
    return (
        "one",
        np.frombuffer(snap.data, np.uint8),
        snap.dtype,
        tuple(snap.shape),
        snap.host_memory,
    )


def _unpack(items: list[tuple[Any, ...]]) -> list[Any]:
    """The inverse of ``_snapshots``: NumPy views where NumPy has the dtype (move_many and
    asarray copy them once), else MemArrays holding the bytes."""
    import numpy as np

    arrays: list[Any] = [None] * len(items)
    for i, item in enumerate(items):
        if item[0] == "one":
            _, data, dtype, shape, host_memory = item
            arrays[i] = (
                data.view(np.dtype(dtype)).reshape(shape)
                if dtype != "bfloat16"
                else rebuild(data, dtype, shape, None, 0, host_memory)
            )
        elif item[0] == "pack":
            _, packed, lengths, places = item
            bounds = np.cumsum([0, *lengths])
            for place, lo, hi in zip(places, bounds[:-1], bounds[1:], strict=True):
                arrays[place] = packed[lo:hi]
    if any(a is None for a in arrays):
        raise ValueError("the sending actor's arrays arrived incomplete")
    return arrays


class _Serializer:
    """Ray's serializer for MemArray in a process that sends by a tensor transport.

    Ray registers one for a transport's data type on that type's first transport send
    (``SerializationContext.serialize_rdt_objects``): it lifts the arrays out of a transport
    method's return, and pickles them in band (``pickle.dumps``) everywhere else, which
    makes a 64 MiB host MemArray returned as a plain Ray object from that actor several
    times slower. On the first ``extract_tensor_transport_metadata`` (right after Ray's
    registration) this puts in its place one that does the same lifting and hands every
    other MemArray over as its pickle snapshot, which Ray's pickle 5 takes out of band.
    Where Ray's private names have moved, Ray's own stays."""

    def __init__(self) -> None:
        self._done = False
        self._lock = threading.Lock()

    def take_over(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
            try:
                ctx = ray._private.worker.global_worker.get_serialization_context()
                flags = ctx._rdt_custom_serializer_registered
                local = ctx._thread_local
            except AttributeError:
                return
            flags[MemArray] = True  # Ray's registration is not repeated over this one

            def serialize(a: MemArray) -> Any:
                if getattr(local, "use_external_transport", False):
                    local.rdt_tensors.append(a)
                    return len(local.rdt_tensors) - 1
                return tuple(Snapshot.of(a))

            ray.util.register_serializer(MemArray, serializer=serialize, deserializer=_deserialize)


def _deserialize(value: Any) -> Any:
    """The inverse of ``_Serializer``'s: an index into the transport's received arrays, or
    a snapshot's fields."""
    if isinstance(value, int):
        return _received().rdt_tensors[value]
    return rebuild(*value)


def _received() -> Any:
    """Ray's thread-local of the arrays a transport received: read from the worker's map of
    serialization contexts (0.3 us; Ray's ``get_serialization_context``, which also makes
    a missing one, costs 3 us, once per array of a 1,000-array object). Not cached: a
    second ``ray.init`` in the process makes new contexts under the same job id."""
    worker = ray._private.worker.global_worker
    ctx = worker.serialization_context_map.get(worker.current_job_id)
    if ctx is None:
        ctx = worker.get_serialization_context()
    return ctx._thread_local


_serializer = _Serializer()


#: This process's actor (its id) and its handle pickled: made once, carried as bytes.
_own: tuple[str, bytes] | None = None


def _own_handle() -> bytes | None:
    """The running actor's handle, pickled (once per actor); None in the driver, where
    there is no actor to fetch from later."""
    global _own
    context = ray.get_runtime_context()
    actor_id = context.get_actor_id()
    if actor_id is None:
        return None
    if _own is None or _own[0] != actor_id:
        _own = (actor_id, pickle.dumps(context.current_actor))
    return _own[1]


def register() -> bool:
    """Registers the ``"memarray"`` and ``"memarray_nccl"`` transports with Ray (done on
    import; idempotent). False where this Ray has no custom tensor transports."""
    try:
        from ray.experimental.rdt import util
    except ImportError:
        return False
    register_transport = getattr(util, "register_tensor_transport", None)
    if register_transport is None:
        return False
    if TRANSPORT.upper() not in util.transport_manager_info:
        register_transport(TRANSPORT, ["cuda", "cpu"], MemArrayTransport, MemArray)
    if NCCL_TRANSPORT.upper() not in util.transport_manager_info:
        register_transport(NCCL_TRANSPORT, ["cuda"], MemArrayNcclTransport, MemArray)
    return True


def _register_ray(module: Any) -> None:
    """The import hook's entry: ``ray`` finished importing (with this module imported
    already, or imported by the hook for it)."""
    register()


# Imported first (`import memarray.ray` before Ray), this module's `import ray` above ran
# the hook while this module was still executing; the hook leaves it to this line.
register()
