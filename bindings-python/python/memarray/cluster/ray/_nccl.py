"""The ``"memarray_nccl"`` tensor transport: device MemArrays between actors over NCCL
(``memarray.distributed``), where CUDA IPC cannot reach (actors on different nodes) or
where actors should not see each other's GPUs.

Two-sided, as Ray's own ``"nccl"`` transport: Ray runs the send on the sending actor and
the receive on the receiving one, each on its system thread. The actors first join one
communicator with :func:`create_nccl_group` (called where the arrays are passed, usually
the driver); each joins on the first GPU Ray assigned it. The receiver's arrays are new
arrays on its GPU; an object of many small arrays on one device travels as one message (a
pack, unpacked into slices of one allocation on arrival). The sender waits for its sends
before its system thread takes the next transfer, so Ray may free its arrays afterwards.

A failed transfer is aborted, not fatal: when a send or receive fails or outlasts Ray's
transfer timeout (a peer died, or never called), Ray calls ``abort_transport`` on both
actors; each aborts its communicator of that group (``Communicator.abort``), which frees a
rank waiting for its peer, and the transfer raises on whichever side was waiting. The
actors live on; the group is unusable (later transfers in it raise, naming it) until the
driver calls :func:`destroy_nccl_group` and :func:`create_nccl_group` again.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import ray
from ray.experimental.rdt.tensor_transport_manager import (
    CommunicatorMetadata,
    TensorTransportMetadata,
)

from ... import _memarray
from . import _base as base

#: The transport's name in ``@ray.method(tensor_transport=...)``.
NCCL_TRANSPORT = "memarray_nccl"

#: The group :func:`create_nccl_group` makes when no name is given.
DEFAULT_GROUP = "memarray"


@dataclass
class MemArrayNcclMetadata(TensorTransportMetadata):
    """Each array's shape and dtype (``tensor_meta``), and for a pack the entries to
    unpack, its length and the key the sender holds it under."""

    packed: base.Entries | None = None
    pack_bytes: int = 0
    pack_key: str | None = None


@dataclass
class MemArrayNcclCommunicatorMetadata(CommunicatorMetadata):
    """The group carrying a transfer and the two actors' ranks in it; or, for a pair in no
    group, why not (the send then sends nothing and the receive raises it)."""

    group: str = ""
    src_rank: int = -1
    dst_rank: int = -1
    refused: str = ""


# The creating process: each group's actors, in rank order.
_members_lock = threading.Lock()
_members: dict[str, list[Any]] = {}
# Each actor: the communicators it joined, by group name, and the groups it aborted.
_comms_lock = threading.Lock()
_comms: dict[str, Any] = {}
_aborted: set[str] = set()


def _new_id(actor: Any) -> bytes:
    from .. import distributed

    return distributed.unique_id()


def _join(actor: Any, name: str, rank: int, size: int, uid: bytes) -> int:
    from .. import distributed

    device = base.home()
    comm = distributed.init(rank, size, device, unique_id=uid)
    with _comms_lock:
        _comms[name] = comm
        _aborted.discard(name)
    return device


def _leave(actor: Any, name: str) -> bool:
    with _comms_lock:
        _aborted.discard(name)
        return _comms.pop(name, None) is not None


def create_nccl_group(actors: list[Any], name: str = DEFAULT_GROUP) -> list[int]:
    """Joins ``actors`` (handles of actors made with ``enable_tensor_transport=True``,
    one GPU each) in an NCCL communicator for the ``"memarray_nccl"`` transport: rank
    ``i`` is ``actors[i]``, on the first GPU Ray assigned it. Call it in the process that
    passes the arrays between them (the driver), before the first transfer; an actor may
    be in several groups, a pair of actors in one. Returns each actor's device ordinal.
    Raises ValueError for fewer than two actors, a repeated actor or a name in use, and
    what NCCL raises where it cannot set up (no NCCL library, no GPU)."""
    actors = list(actors)
    if len(actors) < 2:
        raise ValueError(f"an NCCL group needs at least two actors, got {len(actors)}")
    if len({a._actor_id for a in actors}) != len(actors):
        raise ValueError("an actor appears twice in the group")
    with _members_lock:
        if name in _members:
            raise ValueError(f"an NCCL group named {name!r} exists; destroy it first")
        _members[name] = []  # claimed while the actors join
    try:
        uid = ray.get(actors[0].__ray_call__.remote(_new_id))
        devices = ray.get(
            [a.__ray_call__.remote(_join, name, r, len(actors), uid) for r, a in enumerate(actors)]
        )
    except BaseException:
        with _members_lock:
            _members.pop(name, None)
        raise
    with _members_lock:
        _members[name] = actors
    return list(devices)


def destroy_nccl_group(name: str = DEFAULT_GROUP) -> None:
    """Leaves the group ``name`` on each of its live actors (their communicators are
    destroyed) and forgets it here. Unknown names raise ValueError."""
    with _members_lock:
        actors = _members.pop(name, None)
    if actors is None:
        raise ValueError(f"no NCCL group named {name!r}")
    refs = [a.__ray_call__.remote(_leave, name) for a in actors]
    for ref in refs:
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError:
            pass  # a dead actor's communicator went with it


def _group_of(src: Any, dst: Any) -> MemArrayNcclCommunicatorMetadata | None:
    with _members_lock:
        groups = list(_members.items())
    for name, actors in groups:
        ids = [a._actor_id for a in actors]
        if src._actor_id in ids and dst._actor_id in ids:
            return MemArrayNcclCommunicatorMetadata(
                group=name, src_rank=ids.index(src._actor_id), dst_rank=ids.index(dst._actor_id)
            )
    return None


def _comm(name: str) -> Any:
    with _comms_lock:
        comm = _comms.get(name)
        aborted = name in _aborted
    if aborted:
        raise ValueError(
            f"the NCCL group {name!r} was aborted after a failed transfer: call "
            f"destroy_nccl_group({name!r}) and create_nccl_group again"
        )
    if comm is None:
        raise ValueError(f"this actor is not in the NCCL group {name!r} (create_nccl_group)")
    return comm


# Each actor: one stream per device for its transfers (Ray runs them one at a time, on its
# system thread; each waits for its stream before returning).
_streams_lock = threading.Lock()
_streams: dict[int, Any] = {}


def _stream(device: int) -> Any:
    with _streams_lock:
        stream = _streams.get(device)
        if stream is None:
            from ... import cuda

            stream = _streams[device] = cuda.Stream(device)
        return stream


def _each(call: Any, arrays: list[Any], peer: int, stream: Any) -> None:
    """``call(array, peer, stream)`` (a communicator's send or recv) for each array: one
    alone, several in one NCCL group (they run together)."""
    if len(arrays) == 1:
        call(arrays[0], peer, stream)
        return
    from .. import distributed

    with distributed.group():
        for a in arrays:
            call(a, peer, stream)


def _done(comm: Any, what: str) -> None:
    """Raises if ``comm`` was aborted while this side waited: the data did not move."""
    if comm.aborted:
        raise RuntimeError(f"the {what} was aborted (a failed transfer in its NCCL group)")


class MemArrayNcclTransport(base.Transport):
    """Ray Direct Transport for device MemArrays over NCCL (see the module's text)."""

    NAME = NCCL_TRANSPORT

    def describe(self, obj_id: str, arrays: list[Any]) -> MemArrayNcclMetadata:
        meta = MemArrayNcclMetadata(tensor_meta=[], tensor_device="cuda")
        entries = self.packs.make(obj_id, arrays)
        if entries is not None:
            meta.tensor_meta, meta.packed = base.TensorMeta(entries), entries
            meta.pack_bytes = self.packs.get(obj_id).nbytes
            meta.pack_key = obj_id
        else:
            arrays = base.check_arrays(NCCL_TRANSPORT, arrays)
            if arrays and not arrays[0].on_device:
                raise ValueError(
                    "the memarray_nccl transport carries device arrays; send host arrays "
                    "with the memarray transport or as Ray objects"
                )
            meta.tensor_meta = [(tuple(a.shape), a._dtype_name) for a in arrays]
        return meta

    def get_communicator_metadata(
        self, src_actor: Any, dst_actor: Any, backend: str | None = None
    ) -> MemArrayNcclCommunicatorMetadata:
        # Ray may call this on its core worker's thread, where an exception crashes the
        # process (Ray 2.60): a refusal travels to the receiver instead, which raises it
        # to whoever waits on the object.
        found = _group_of(src_actor, dst_actor) if src_actor is not None else None
        if found is None:
            return MemArrayNcclCommunicatorMetadata(
                refused=f"no NCCL group holds both {src_actor} and {dst_actor}: join them "
                "with memarray.ray.create_nccl_group([...]) before passing arrays between them"
                if src_actor is not None
                else "the memarray_nccl transport sends from actors, not the driver"
            )
        return found

    def send_multiple_tensors(
        self,
        tensors: list[Any],
        tensor_transport_metadata: TensorTransportMetadata,
        communicator_metadata: CommunicatorMetadata,
    ) -> None:
        meta, cm = _checked(tensor_transport_metadata, communicator_metadata)
        if cm.refused:
            return  # the receiver raises why; a raise here would make Ray kill both actors
        comm = _comm(cm.group)
        if meta.pack_key is not None:
            out = [self.packs.get(meta.pack_key)]
        else:
            out = [a for a in tensors if a.nbytes]
        stream = _stream(comm.device_id)
        start = time.perf_counter()
        _each(comm.send, out, cm.dst_rank, stream)
        queued = time.perf_counter()
        stream.synchronize()  # Ray may free the arrays once this returns
        _done(comm, "send")
        base.add(
            nccl_sends=1,
            nccl_send_s=queued - start,
            nccl_send_wait_s=time.perf_counter() - queued,
        )

    def recv_multiple_tensors(
        self,
        obj_id: str,
        tensor_transport_metadata: TensorTransportMetadata,
        communicator_metadata: CommunicatorMetadata,
        target_buffers: list[Any] | None = None,
    ) -> list[Any]:
        meta, cm = _checked(tensor_transport_metadata, communicator_metadata)
        if cm.refused:
            raise ValueError(cm.refused)
        if target_buffers:
            raise ValueError("the memarray_nccl transport does not receive into given buffers")
        start = time.perf_counter()
        comm = _comm(cm.group)
        where = f"cuda:{comm.device_id}"
        stream = _stream(comm.device_id)
        if meta.packed is not None:
            pack = _memarray.empty((meta.pack_bytes,), "uint8", device=where)
            allocated = time.perf_counter()
            comm.recv(pack, cm.src_rank, stream)
            # Waits for the receive (the pack's pending work): no stream wait besides.
            arrays = base.unpack(pack, meta.packed)
        else:
            arrays = [
                _memarray.empty(shape, dtype, device=where) for shape, dtype in meta.tensor_meta
            ]
            allocated = time.perf_counter()
            _each(comm.recv, [a for a in arrays if a.nbytes], cm.src_rank, stream)
            stream.synchronize()
        _done(comm, "receive")
        done = time.perf_counter()
        base.count(
            "nccl",
            len(arrays),
            nccl_s=done - start,
            nccl_alloc_s=allocated - start,
            nccl_wait_s=done - allocated,
        )
        return arrays

    def abort_transport(self, obj_id: str, communicator_metadata: CommunicatorMetadata) -> None:
        """Ray calls this on both actors (on a thread of its own) when a transfer failed
        or timed out: the group's communicator here is aborted, which frees a send or
        receive waiting on it, and the group marked unusable."""
        if not isinstance(communicator_metadata, MemArrayNcclCommunicatorMetadata):
            return
        name = communicator_metadata.group
        with _comms_lock:
            comm = _comms.pop(name, None)
            if comm is not None:
                _aborted.add(name)
        self.packs.drop(obj_id)
        if comm is not None:
            comm.abort()
            base.count_abort()


def _checked(
    meta: TensorTransportMetadata, cm: CommunicatorMetadata
) -> tuple[MemArrayNcclMetadata, MemArrayNcclCommunicatorMetadata]:
    if not isinstance(meta, MemArrayNcclMetadata):
        raise TypeError(f"not the memarray_nccl transport's metadata: {type(meta)!r}")
    if not isinstance(cm, MemArrayNcclCommunicatorMetadata):
        raise TypeError(f"not the memarray_nccl transport's group: {type(cm)!r}")
    return meta, cm
