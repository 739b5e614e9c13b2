"""NCCL collectives on memarray arrays, with or without torch.

memarray does not grow a transport of its own: this module drives NCCL, loaded at run time
by the Rust layer (``memarray_cuda::nccl``), on MemArray device data. Collectives run on
``stream`` (else the array's last stream, else the legacy default stream) after the
arrays' pending work (stream-wait-event, no host block) and record the output's event, so
host reads and work on other streams wait for the result.

Several processes, one GPU each (``torchrun``-style environment)::

    comm = memarray.distributed.init()          # RANK, WORLD_SIZE, LOCAL_RANK + an id file
    a = memarray.full((1 << 20,), 1.0, device=f"cuda:{comm.device_id}")
    comm.all_reduce(a)                           # in place, sum

One process, several GPUs::

    comms = memarray.distributed.communicators([0, 1])
    with memarray.distributed.group():
        for c, a in zip(comms, parts):
            c.all_reduce(a)

With torch.distributed (NCCL backend), a MemArray goes in zero-copy through DLPack::

    with memarray.distributed.as_torch(a) as t:
        torch.distributed.all_reduce(t)

NCCL is found from ``path`` / ``MEMARRAY_NCCL_LIBRARY``, then the ``nvidia-nccl-cu13`` (or
-cu12) wheel torch installs, then ``libnccl.so.2`` on the loader path.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import _env
from .._memarray import distributed as _d

if TYPE_CHECKING:
    from .._memarray import _Communicator as Communicator
else:
    Communicator = _d.Communicator

__all__ = [
    "Communicator",
    "as_torch",
    "communicators",
    "group",
    "init",
    "load",
    "nccl_library",
    "unique_id",
]


def nccl_library() -> str | None:
    """The libnccl memarray would load: ``MEMARRAY_NCCL_LIBRARY``, else the one in an
    installed ``nvidia-nccl`` wheel, else None (the loader path is searched)."""
    env = os.environ.get("MEMARRAY_NCCL_LIBRARY")
    if env:
        return env
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    for root in (spec.submodule_search_locations or []) if spec else []:
        lib = Path(root) / "nccl" / "lib" / "libnccl.so.2"
        if lib.is_file():
            return str(lib)
    return None


def load(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Loads libnccl (see ``nccl_library``) and returns ``{"path": ..., "version": (major,
    minor, patch)}``. Raises RuntimeError naming what was tried when none loads."""
    found, version = _d.load(path if path is not None else nccl_library())
    return {"path": str(found), "version": tuple(version)}


def _ensure_loaded() -> None:
    """Loads NCCL on first use only (the library lookup reads the file system)."""
    if not _d.is_loaded():
        load()


def unique_id() -> bytes:
    """A new NCCL unique id (128 bytes) for rank 0 to hand to the other ranks."""
    _ensure_loaded()
    return _d.unique_id()


def _env_int(name: str) -> int | None:
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else None


def init(
    rank: int | None = None,
    world_size: int | None = None,
    device: int | None = None,
    *,
    unique_id: bytes | str | None = None,
    id_file: str | os.PathLike[str] | None = None,
    timeout: float = 120.0,
    comm: Any = None,
) -> Communicator:
    """Joins a communicator of ``world_size`` processes as ``rank``, on CUDA device
    ``device``. Unset arguments come from the environment ``torchrun`` sets (RANK,
    WORLD_SIZE, LOCAL_RANK for the device).

    The id comes from ``unique_id``, else ``MEMARRAY_NCCL_ID`` (256 hex digits), else a
    file every rank can read: ``id_file``, ``MEMARRAY_NCCL_ID_FILE``, or (one machine) a
    file in the temp directory named after MASTER_ADDR, MASTER_PORT and the parent process
    (torchrun's agent, shared by its ranks). Rank 0 writes it, the others wait up to
    ``timeout`` seconds (``float("inf")``: as long as it takes; NaN or negative:
    ValueError); rank 0 deletes it once every rank has joined. Returns once every rank has
    joined.

    With ``comm`` (an mpi4py communicator, ``mpirun``-launched ranks), rank and size are
    the communicator's, the id is broadcast over it from rank 0, and the device is the
    rank's index among the ranks sharing its node (``Split_type(COMM_TYPE_SHARED)``)
    modulo the node's device count, unless ``device`` is given. That device becomes the
    calling thread's current device (``memarray.cuda.set_device``), so ``"cuda"`` in
    creation functions means it."""
    if comm is not None:
        return _init_mpi(comm, device)
    rank = rank if rank is not None else _env_int("RANK")
    world_size = world_size if world_size is not None else _env_int("WORLD_SIZE")
    if rank is None or world_size is None:
        raise ValueError(
            "init needs rank and world_size (arguments, or RANK and WORLD_SIZE as torchrun sets)"
        )
    if device is None:
        local = _env_int("LOCAL_RANK")
        device = local if local is not None else rank
    _ensure_loaded()
    if unique_id is None:
        unique_id = _env.nccl_id("MEMARRAY_NCCL_ID")
    path = None
    if unique_id is None:
        path = id_file if id_file is not None else os.environ.get("MEMARRAY_NCCL_ID_FILE")
        if path is None:
            tag = "-".join(
                [
                    os.environ.get("MASTER_ADDR", "local"),
                    os.environ.get("MASTER_PORT", "0"),
                    str(os.getppid()),
                ]
            )
            path = Path(tempfile.gettempdir()) / f"memarray-nccl-{tag}.id"
        unique_id = _d.exchange_id_file(os.fspath(path), rank, timeout)
    comm = _d.init_rank(device, world_size, rank, unique_id)
    _make_current(device)
    if path is not None and rank == 0:
        with contextlib.suppress(OSError):
            os.remove(path)
    return comm


def _init_mpi(comm: Any, device: int | None) -> Communicator:
    """``init`` over an mpi4py communicator."""
    from mpi4py import MPI

    from .. import cuda

    rank, size = comm.Get_rank(), comm.Get_size()
    if device is None:
        node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        try:
            device = node.Get_rank() % max(1, cuda.device_count())
        finally:
            node.Free()
    _ensure_loaded()
    uid = _d.unique_id() if rank == 0 else None
    uid = comm.bcast(uid, root=0)
    out = _d.init_rank(device, size, rank, uid)
    _make_current(device)
    return out


def _make_current(device: int) -> None:
    """The rank's GPU becomes the calling thread's current device: ``"cuda"`` in creation
    functions then means it (as it does for torch after ``torch.cuda.set_device``)."""
    from .. import cuda

    cuda.set_device(device)


def communicators(devices: Sequence[int]) -> list[Communicator]:
    """One communicator per device (rank i on ``devices[i]``) for one process driving
    several GPUs. Issue each collective on all of them inside ``group()``."""
    _ensure_loaded()
    return list(_d.init_all(list(devices)))


@contextlib.contextmanager
def group() -> Iterator[None]:
    """NCCL group: the collectives issued in the block (on several communicators of this
    process, or paired send / recv) launch together when it ends."""
    _ensure_loaded()
    _d.group_start()
    try:
        yield
    finally:
        _d.group_end()


@contextlib.contextmanager
def as_torch(array: Any) -> Iterator[Any]:
    """A torch tensor sharing ``array``'s device memory (DLPack, no copy) for
    torch.distributed. Entering orders torch's current stream after the array's pending
    work; leaving records torch's current stream as the array's pending work, so memarray
    operations afterwards wait for what torch queued (the collective) without blocking the
    host."""
    import torch

    t = torch.from_dlpack(array)
    try:
        yield t
    finally:
        array.record_stream(torch.cuda.current_stream(t.device))
