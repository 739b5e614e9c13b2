"""MemArrays over MPI (mpi4py): point-to-point and collectives, device arrays included.

With a CUDA-aware MPI a device array goes to MPI as its device pointer, after the array's
own pending work is complete (its event; no device-wide sync), and what MPI receives is
visible to later work on any stream. With an MPI that is not CUDA-aware (``is_cuda_aware``
says which; Open MPI and MPICH are asked, ``MEMARRAY_MPI_CUDA_AWARE=0/1`` overrides) device
data goes through host buffers instead: downloaded before a send, uploaded after a
receive, so a device array never reaches MPI as a pointer it cannot read (mpi4py alone
would hand it one, and such an MPI ends the process). ``send`` and ``recv`` of device
arrays of ``PIPELINE_FROM`` bytes or more go in ``CHUNK``-byte messages through two reused
host buffers, each chunk's copy overlapping the previous chunk's message (no host copy of
the whole array is made). ``recv`` probes the first message and takes either form: the
chunks of a memarray device send, or one message (a host array's, or a plain MPI peer's);
a plain ``Recv`` on the other side of a large device ``send`` must be ``memarray.mpi.recv``.
Host arrays go to MPI as they are.

    from mpi4py import MPI
    import memarray, memarray.mpi as mm

    comm = MPI.COMM_WORLD
    a = memarray.full((1 << 20,), comm.rank, "float32", device="cuda")
    mm.allreduce(comm, a)                       # in place, MPI.SUM
    if comm.rank == 0:
        mm.send(comm, a, dest=1)
    elif comm.rank == 1:
        mm.recv(comm, a, source=0)

Every dtype moves (as bytes: send, recv, bcast, gather, allgather, scatter, alltoall);
reductions take the dtypes MPI has arithmetic for, with MPI's ops (SUM, PROD, MIN, MAX,
LAND, LOR, ...), and refuse the rest with a ValueError before anything is sent (MPI has no
float16 or bfloat16 arithmetic; complex numbers have no order; bool takes the logical ops).
Shapes and dtypes must agree across ranks, as MPI's own buffers must.

Collectives agree on refusals first: a rank that refuses locally (its array locked, a dtype
MPI cannot reduce, a wrong-shaped root array, no memory for the result) tells the others
through one small ``Allreduce``, and every rank raises the refusal of the lowest refusing
rank, of the same type, naming that rank; none is left waiting in MPI. Point-to-point calls
cannot agree with a peer that is not calling: a refused ``send`` leaves its ``recv``
waiting, as in MPI itself.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ... import _memarray
from ..._memarray import MemArray
from . import _buffers
from ._buffers import (
    MPI,
    _Buf,
    _check,
    _chunk_loop,
    _finish,
    _typed,
    is_cuda_aware,
)
from ._p2p import (
    HEADER,
    MAGIC,
    Request,
    TruncateError,
    irecv,
    isend,
    recv,
    send,
    waitall,
)

__all__ = [
    "CHUNK",
    "HEADER",
    "MAGIC",
    "PIPELINE_FROM",
    "Request",
    "TruncateError",
    "allgather",
    "allreduce",
    "alltoall",
    "bcast",
    "gather",
    "irecv",
    "is_cuda_aware",
    "isend",
    "recv",
    "reduce",
    "scatter",
    "send",
    "waitall",
]

# Bytes of one message of a chunked transfer, and the size from which device arrays go in
# chunks (without a CUDA-aware MPI). Declared for readers and type checkers; the values
# live in `_buffers`, read and set through this module's class (`_Module`, below).
CHUNK: int
PIPELINE_FROM: int

#: memarray dtype -> the MPI datatype reductions use (None: MPI has no arithmetic for it).
TYPES: dict[str, Any] = {
    "bool": MPI.C_BOOL,
    "int8": MPI.INT8_T,
    "int16": MPI.INT16_T,
    "int32": MPI.INT32_T,
    "int64": MPI.INT64_T,
    "uint8": MPI.UINT8_T,
    "uint16": MPI.UINT16_T,
    "uint32": MPI.UINT32_T,
    "uint64": MPI.UINT64_T,
    "float16": None,
    "bfloat16": None,
    "float32": MPI.FLOAT,
    "float64": MPI.DOUBLE,
    "complex64": MPI.C_FLOAT_COMPLEX,
    "complex128": MPI.C_DOUBLE_COMPLEX,
}

# MPI.Op objects compare equal but do not hash: lists.
_ARITH = [MPI.SUM, MPI.PROD]
_ORDER = [MPI.MIN, MPI.MAX]
_LOGIC = [MPI.LAND, MPI.LOR, MPI.LXOR]
_BITS = [MPI.BAND, MPI.BOR, MPI.BXOR]


def _check_op(dtype: str, op: Any) -> None:
    if not isinstance(op, MPI.Op):
        raise TypeError(f"op must be an mpi4py MPI.Op (MPI.SUM, ...), not {type(op).__name__}")
    if TYPES[dtype] is None:
        raise ValueError(f"MPI has no arithmetic for {dtype}: reduce it as float32")
    if dtype == "bool":
        ok = op in _LOGIC
    elif dtype.startswith("complex"):
        ok = op in _ARITH
    elif dtype.startswith("float"):
        ok = op in _ARITH + _ORDER
    else:
        ok = op in _ARITH + _ORDER + _LOGIC + _BITS
    if not ok:
        raise ValueError(f"MPI cannot reduce {dtype} with this op")


def _agree(comm: Any, error: Exception | None) -> None:
    """Every rank learns whether any rank refused, before anything is sent: one
    one-integer ``Allreduce`` when none did. When one did, every rank raises the refusal of
    the lowest refusing rank, of its type, naming that rank (a rank's own refusal, if
    different, is chained)."""
    flag = np.array([0 if error is None else 1], np.int32)
    comm.Allreduce(MPI.IN_PLACE, flag, op=MPI.MAX)
    if not flag[0]:
        return
    mine = None if error is None else (type(error), str(error))
    reports = comm.allgather(mine)
    rank, (cls, message) = next((r, e) for r, e in enumerate(reports) if e is not None)
    if rank == comm.rank and error is not None:
        raise error
    text = f"rank {rank} refused: {message}"
    try:
        agreed = cls(text)
    except Exception:  # a class that does not take one message
        agreed = RuntimeError(f"{cls.__name__} on {text}")
    raise agreed from error


@contextlib.contextmanager
def _collective(comm: Any, check: Any) -> Iterator[list[_Buf | None]]:
    """``_bufs`` for a collective: ``check()`` (which returns the (array, write) pairs to
    add) and the buffers' own refusals (a locked array, a wrong shape, a dtype MPI cannot
    reduce) are agreed on by every rank first (``_agree``), so all raise or none does and
    no rank is left waiting in MPI for one that left."""
    made: list[_Buf | None] = []
    error: Exception | None = None
    try:
        for a, write in check():
            made.append(_Buf(a, write) if a is not None else None)
    except Exception as e:
        error = e
    ok = False
    try:
        _agree(comm, error)
        yield made
        ok = True
    finally:
        _finish(made, ok)


def _like(shape: Sequence[int], a: MemArray) -> MemArray:
    return _memarray.empty(tuple(shape), a._dtype_name, device=a.device)


# ---------------------------------------------------------------- collectives


# ---------------------------------------------------------------- collectives


def _collective_chunked(a: MemArray) -> bool:
    """Whether a collective over ``a`` goes in chunks: decided by size alone, so every
    rank (whatever its array's placement) cuts the same messages."""
    return isinstance(a, MemArray) and a.nbytes >= _buffers.PIPELINE_FROM and not is_cuda_aware()


def _agreed(comm: Any, check: Any) -> None:
    """``check()`` (argument refusals) and the array's lock, agreed on by every rank
    (``_agree``) before a chunked collective sends anything."""
    error: Exception | None = None
    try:
        for x in check():
            x._read_range(0, np.empty(0, np.uint8))  # a locked array refuses here
    except Exception as e:
        error = e
    _agree(comm, error)


def bcast(comm: Any, a: MemArray, root: int = 0) -> MemArray:
    """Root's data into ``a`` on every rank (in place); returns ``a``."""
    if _collective_chunked(a):
        _agreed(comm, lambda: [_check(a, "a")])
        mine = comm.rank == root
        _chunk_loop(
            a,
            lambda buf, off, n: comm.Ibcast([buf, n, MPI.BYTE], root=root),
            before=mine,
            after=not mine,
        )
        return a
    with _collective(comm, lambda: [(_check(a, "a"), comm.rank != root)]) as (b,):
        assert b is not None
        comm.Bcast(b.spec(), root=root)
    return a


def allreduce(comm: Any, a: MemArray, op: Any = MPI.SUM) -> MemArray:
    """Every rank's ``a`` reduced with ``op`` into ``a`` on every rank (in place)."""

    def check() -> list[tuple[MemArray, bool]]:
        _check_op(str(_check(a, "a").dtype), op)
        return [(a, False)]

    if _collective_chunked(a):
        _agreed(comm, lambda: (check(), [a])[1])
        t = TYPES[a._dtype_name]
        item = a.nbytes // max(a.size, 1)
        _chunk_loop(
            a,
            lambda buf, off, n: comm.Iallreduce(MPI.IN_PLACE, [buf, n // item, t], op=op),
            before=True,
            after=True,
        )
        return a
    with _collective(comm, check) as (src,):
        assert src is not None
        t = TYPES[a._dtype_name]
        if src.scope is not None:  # device memory itself: in place
            comm.Allreduce(MPI.IN_PLACE, src.spec(mpitype=t), op=op)
            return a
        out = np.empty(a.nbytes, np.uint8)
        comm.Allreduce(src.spec(mpitype=t), [out, a.size, t], op=op)
    a.read_numpy_array(_typed(out, a))
    return a


def reduce(comm: Any, a: MemArray, op: Any = MPI.SUM, root: int = 0) -> MemArray | None:
    """Every rank's ``a`` reduced with ``op``: a new array on ``root`` (where ``a`` is),
    None elsewhere."""
    out: MemArray | None = None
    if _collective_chunked(a):
        mine = comm.rank == root

        def check_chunked() -> list[MemArray]:
            nonlocal out
            _check_op(_check(a, "a")._dtype_name, op)
            out = _like(a.shape, a) if mine else None
            return [a]

        _agreed(comm, check_chunked)
        t = TYPES[a._dtype_name]
        item = a.nbytes // max(a.size, 1)

        def call(buf: Any, off: int, n: int) -> None:
            if mine:
                comm.Reduce(MPI.IN_PLACE, [buf, n // item, t], op=op, root=root)
            else:
                comm.Reduce([buf, n // item, t], None, op=op, root=root)

        _chunk_loop(
            a, call, before=True, after=mine, into=out if out is not None else a, blocking=True
        )
        return out

    def check() -> list[tuple[MemArray | None, bool]]:
        nonlocal out
        _check_op(str(_check(a, "a").dtype), op)
        out = _like(a.shape, a) if comm.rank == root else None
        return [(a, False), (out, True)]

    with _collective(comm, check) as (src, dst):
        assert src is not None
        t = TYPES[a._dtype_name]
        comm.Reduce(src.spec(mpitype=t), dst.spec(mpitype=t) if dst else None, op=op, root=root)
    return out


def gather(comm: Any, a: MemArray, root: int = 0) -> MemArray | None:
    """Every rank's ``a`` stacked on ``root`` (shape ``(size, *a.shape)``, where ``a`` is);
    None elsewhere."""
    out: MemArray | None = None

    def check() -> list[tuple[MemArray | None, bool]]:
        nonlocal out
        out = _like((comm.size, *_check(a, "a").shape), a) if comm.rank == root else None
        return [(a, False), (out, True)]

    with _collective(comm, check) as (src, dst):
        assert src is not None
        comm.Gather(src.spec(), dst.spec(a.nbytes) if dst else None, root=root)
    return out


def allgather(comm: Any, a: MemArray) -> MemArray:
    """Every rank's ``a`` stacked on every rank (shape ``(size, *a.shape)``)."""
    out: MemArray | None = None

    def check() -> list[tuple[MemArray | None, bool]]:
        nonlocal out
        out = _like((comm.size, *_check(a, "a").shape), a)
        return [(a, False), (out, True)]

    with _collective(comm, check) as (src, dst):
        assert src is not None and dst is not None and out is not None
        comm.Allgather(src.spec(), dst.spec(a.nbytes))
    return out


def scatter(comm: Any, a: MemArray | None, out: MemArray, root: int = 0) -> MemArray:
    """Root's ``a`` (shape ``(size, *out.shape)``) split along its first axis: part ``i``
    into rank ``i``'s ``out``; returns ``out``. ``a`` is ignored except on root."""

    def check() -> list[tuple[MemArray | None, bool]]:
        _check(out, "out")
        if comm.rank != root:
            return [(None, False), (out, True)]
        src_array = _check(a, "a")
        if tuple(src_array.shape) != (comm.size, *out.shape) or (
            src_array._dtype_name != out._dtype_name
        ):
            raise ValueError(
                f"scatter's a must be {(comm.size, *out.shape)} of {out._dtype_name} on root, "
                f"not {tuple(src_array.shape)} of {src_array._dtype_name}"
            )
        return [(src_array, False), (out, True)]

    with _collective(comm, check) as (src, dst):
        assert dst is not None
        comm.Scatter(src.spec(out.nbytes) if src else None, dst.spec(), root=root)
    return out


def alltoall(comm: Any, a: MemArray) -> MemArray:
    """Part ``j`` of rank ``i``'s ``a`` (its first axis is ``size`` long) becomes part ``i``
    of rank ``j``'s result (same shape and place)."""
    out: MemArray | None = None

    def check() -> list[tuple[MemArray | None, bool]]:
        nonlocal out
        if not _check(a, "a").shape or a.shape[0] != comm.size:
            raise ValueError(f"alltoall's a must have {comm.size} parts along its first axis")
        out = _like(a.shape, a)
        return [(a, False), (out, True)]

    with _collective(comm, check) as (src, dst):
        assert src is not None and dst is not None and out is not None
        part = a.nbytes // comm.size
        comm.Alltoall(src.spec(part), dst.spec(part))
    return out


class _Module(types.ModuleType):
    """``mm.CHUNK`` and ``mm.PIPELINE_FROM`` read and set the values every part of
    memarray.mpi reads at each call (they live in ``_buffers``), so tuning them here
    tunes point to point and collectives alike."""

    @property
    def CHUNK(self) -> int:  # noqa: N802 - the documented constant's name
        return _buffers.CHUNK

    @CHUNK.setter
    def CHUNK(self, value: int) -> None:  # noqa: N802
        _buffers.CHUNK = value

    @property
    def PIPELINE_FROM(self) -> int:  # noqa: N802
        return _buffers.PIPELINE_FROM

    @PIPELINE_FROM.setter
    def PIPELINE_FROM(self, value: int) -> None:  # noqa: N802
        _buffers.PIPELINE_FROM = value


sys.modules[__name__].__class__ = _Module
