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
import ctypes
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .. import _memarray
from .._memarray import MemArray
from .._memarray import empty as memarray_empty
from . import numpy_dtype


def _import_mpi() -> Any:
    try:
        from mpi4py import MPI
    except ImportError as e:  # the message is the product
        raise ImportError("memarray.mpi needs mpi4py (and an MPI): pip install mpi4py") from e
    return MPI


MPI = _import_mpi()

__all__ = [
    "Request",
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


# ---------------------------------------------------------------- CUDA awareness


def _mpi_library() -> ctypes.CDLL | None:
    """The MPI library mpi4py loaded, opened again (the same handle) for its extensions."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libmpi" in line and ".so" in line}
    except OSError:
        return None
    for p in sorted(paths, key=len):
        with contextlib.suppress(OSError):
            return ctypes.CDLL(p)
    return None


def _ask_library() -> bool:
    lib = _mpi_library()
    if lib is None:
        return False
    version = MPI.Get_library_version()
    if "Open MPI" in version:
        query = getattr(lib, "MPIX_Query_cuda_support", None)
        if query is None:
            return False
        query.restype = ctypes.c_int
        return bool(query())
    query = getattr(lib, "MPIX_GPU_query_support", None)  # MPICH 4 and derivatives
    if query is None:
        return False
    supported = ctypes.c_int(0)
    query.restype = ctypes.c_int
    cuda = 0  # MPIX_GPU_SUPPORT_CUDA
    return query(ctypes.c_int(cuda), ctypes.byref(supported)) == 0 and bool(supported.value)


_aware: bool | None = None


def _env_cuda_aware() -> bool | None:
    """``MEMARRAY_MPI_CUDA_AWARE``: ``0`` / ``1``, None when unset or empty; any other
    value (``yes``, bytes that are not UTF-8) is a ValueError naming it."""
    env = os.environ.get("MEMARRAY_MPI_CUDA_AWARE")
    if env is None or env.strip() == "":
        return None
    if env.strip() not in ("0", "1"):
        raise ValueError(f"MEMARRAY_MPI_CUDA_AWARE must be 0 or 1, not {env!r}")
    return env.strip() == "1"


_env_cuda_aware()  # a bad value fails the import, as every memarray variable does


def is_cuda_aware(comm: Any = None) -> bool:
    """Whether MPI takes device pointers: ``MEMARRAY_MPI_CUDA_AWARE`` (``0`` or ``1``) if
    set, else the library's answer (Open MPI's ``MPIX_Query_cuda_support``, MPICH's
    ``MPIX_GPU_query_support``; any other library: no). ``comm`` is accepted for symmetry
    with the other calls (the answer is the library's)."""
    del comm
    env = _env_cuda_aware()
    if env is not None:
        return env
    global _aware
    if _aware is None:
        _aware = _ask_library()
    return _aware


# ---------------------------------------------------------------- buffers


def _check(a: Any, what: str) -> MemArray:
    if not isinstance(a, MemArray):
        raise TypeError(f"{what} must be a memarray.MemArray, not {type(a).__name__}")
    return a


def _typed(raw: np.ndarray, like: MemArray) -> np.ndarray:
    """``raw`` bytes as ``like``'s dtype and shape, for ``read_numpy_array``."""
    return raw.view(numpy_dtype(str(like.dtype))).reshape(tuple(like.shape))


class _Buf:
    """``a``'s bytes as MPI reads or writes them: the device memory itself with a
    CUDA-aware MPI (its pending work complete first, held in place until ``done``), else
    host memory: the array's own for host arrays, a download of device data to read, a
    host landing uploaded by ``done`` to write."""

    def __init__(self, a: MemArray, write: bool) -> None:
        self.a, self.write = a, write
        self.scope: Any = None
        self.landing: np.ndarray | None = None
        bf16 = str(a.dtype) == "bfloat16"  # no buffer protocol: copied either way
        if a.nbytes and a.on_device and is_cuda_aware():
            self.scope = a.device_view()
            self.mem: Any = self.scope.__enter__()
            a.synchronize()  # the array's event: nothing queued still reads or writes it
        elif write and (a.on_device or bf16):
            self.mem = self.landing = np.empty(a.nbytes, np.uint8)
        elif a.on_device or bf16:
            self.mem = np.ascontiguousarray(a.to_numpy()).reshape(-1).view(np.uint8)
        else:
            self.mem = np.asarray(a).reshape(-1).view(np.uint8)

    def spec(self, count: int | None = None, mpitype: Any = None) -> list[Any]:
        """``[memory, count, type]``: bytes unless ``mpitype`` is given."""
        if mpitype is None:
            return [self.mem, self.a.nbytes if count is None else count, MPI.BYTE]
        return [self.mem, self.a.size if count is None else count, mpitype]

    def done(self) -> None:
        if self.scope is not None:
            self.scope.__exit__(None, None, None)
            self.scope = None
        if self.landing is not None:
            self.a.read_numpy_array(_typed(self.landing, self.a))
            self.landing = None


@contextlib.contextmanager
def _bufs(*pairs: tuple[MemArray | None, bool]) -> Iterator[list[_Buf | None]]:
    """``_Buf``s for (array, write) pairs (None stays None), finished on the way out: a
    written array gets its data only if MPI returned."""
    made: list[_Buf | None] = []
    ok = False
    try:
        for a, write in pairs:
            made.append(_Buf(a, write) if a is not None else None)
        yield made
        ok = True
    finally:
        _finish(made, ok)


def _finish(made: list[_Buf | None], ok: bool) -> None:
    for b in made:
        if b is None:
            continue
        if not ok:
            b.landing = None  # nothing arrived: leave the array as it was
        b.done()


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
    return _memarray.empty(tuple(shape), str(a.dtype), device=a.device)


# ---------------------------------------------------------------- point to point

#: Bytes of one message of a chunked device send or receive.
CHUNK = 8 << 20
#: Device arrays of this many bytes or more are sent and received in chunks (without a
#: CUDA-aware MPI).
PIPELINE_FROM = 2 * CHUNK


def _chunked(a: MemArray) -> bool:
    """Whether ``send`` cuts ``a`` into chunks."""
    return bool(a.on_device) and a.nbytes >= PIPELINE_FROM and not is_cuda_aware()


def _incoming_chunks(comm: Any, a: MemArray, source: int, tag: int) -> Any:
    """The status of the next message for ``a`` when it is the first of a chunked send
    (``CHUNK`` bytes of a larger array), else None (one message: receive as it is)."""
    if a.nbytes < PIPELINE_FROM or is_cuda_aware():
        return None
    status = MPI.Status()
    comm.Probe(source=source, tag=tag, status=status)
    return status if status.Get_count(MPI.BYTE) == CHUNK else None


def _pieces(nbytes: int) -> list[tuple[int, int]]:
    return [(off, min(CHUNK, nbytes - off)) for off in range(0, nbytes, CHUNK)]


def _bounce() -> list[np.ndarray]:
    """Two ``CHUNK``-byte host buffers for a chunked transfer: pinned where CUDA is (the
    device copies are then the DMA alone, no bounce through the staging slots; memarray's
    pinned pool keeps them for the next call), else pageable."""
    try:
        return [
            np.asarray(memarray_empty((CHUNK,), "uint8", host_memory="pinned")) for _ in range(2)
        ]
    except Exception:  # no CUDA here, or no pinned memory left: pageable works too
        return [np.empty(CHUNK, np.uint8), np.empty(CHUNK, np.uint8)]


def _send_chunks(comm: Any, a: MemArray, dest: int, tag: int) -> None:
    """Chunk k is copied off the device into one of two host buffers while chunk k - 1's
    message is in flight from the other."""
    _chunk_loop(
        a,
        lambda buf, off, n: comm.Isend([buf, n, MPI.BYTE], dest=dest, tag=tag),
        before=True,
        after=False,
    )


def _recv_chunks(comm: Any, a: MemArray, probed: Any) -> Any:
    """Every chunk from the probed sender and tag (MPI matches them in posting order), two
    receives posted at a time, each buffer copied into the array while the other fills.
    Returns the probed status, counting the whole array's bytes."""
    source, tag = probed.Get_source(), probed.Get_tag()
    _chunk_loop(
        a,
        lambda buf, off, n: comm.Irecv([buf, n, MPI.BYTE], source=source, tag=tag),
        before=False,
        after=True,
    )
    probed.Set_elements(MPI.BYTE, a.nbytes)
    return probed


def send(comm: Any, a: MemArray, dest: int, tag: int = 0) -> None:
    """Sends ``a``'s data to ``dest`` (blocking)."""
    a = _check(a, "a")
    if _chunked(a):
        _send_chunks(comm, a, dest, tag)
        return
    with _bufs((a, False)) as (b,):
        assert b is not None
        comm.Send(b.spec(), dest=dest, tag=tag)


def recv(comm: Any, a: MemArray, source: int = MPI.ANY_SOURCE, tag: int = MPI.ANY_TAG) -> Any:
    """Receives into ``a`` (its shape and dtype say how much); returns the MPI.Status."""
    status = MPI.Status()
    a = _check(a, "a")
    probed = _incoming_chunks(comm, a, source, tag)
    if probed is not None:
        a._read_range(0, np.empty(0, np.uint8))  # a locked array refuses before any chunk
        return _recv_chunks(comm, a, probed)
    with _bufs((a, True)) as (b,):
        assert b is not None
        comm.Recv(b.spec(), source=source, tag=tag, status=status)
    return status


class Request:
    """A pending ``isend`` / ``irecv``: ``wait()`` (a received array holds its data after
    it), ``test()``. Holds the array's memory (or the staged host copy) until done."""

    def __init__(self, request: Any, buf: _Buf) -> None:
        self._request = request
        self._buf: _Buf | None = buf

    def _finish(self) -> None:
        if self._buf is not None:
            buf, self._buf = self._buf, None
            buf.done()

    def wait(self) -> Any:
        status = MPI.Status()
        self._request.Wait(status)
        self._finish()
        return status

    def test(self) -> bool:
        done = bool(self._request.Test())
        if done:
            self._finish()
        return done


def isend(comm: Any, a: MemArray, dest: int, tag: int = 0) -> Request:
    """Starts sending ``a``; staged data is a snapshot taken now."""
    b = _Buf(_check(a, "a"), False)
    try:
        return Request(comm.Isend(b.spec(), dest=dest, tag=tag), b)
    except BaseException:
        b.done()
        raise


def irecv(comm: Any, a: MemArray, source: int = MPI.ANY_SOURCE, tag: int = MPI.ANY_TAG) -> Request:
    """Starts receiving into ``a``; ``a`` holds the data once the request is waited on."""
    b = _Buf(_check(a, "a"), True)
    try:
        return Request(comm.Irecv(b.spec(), source=source, tag=tag), b)
    except BaseException:
        b.landing = None
        b.done()
        raise


def waitall(requests: Sequence[Request]) -> None:
    """Waits for every request."""
    for r in requests:
        r.wait()


# ---------------------------------------------------------------- collectives


def _collective_chunked(a: MemArray) -> bool:
    """Whether a collective over ``a`` goes in chunks: decided by size alone, so every
    rank (whatever its array's placement) cuts the same messages."""
    return isinstance(a, MemArray) and a.nbytes >= PIPELINE_FROM and not is_cuda_aware()


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


def _in_place(a: MemArray) -> np.ndarray | None:
    """A host array's own bytes, for MPI to read and write in place (None for device
    data and bfloat16, which has no buffer protocol: those go through bounce buffers)."""
    if a.on_device or str(a.dtype) == "bfloat16":
        return None
    return np.asarray(a).reshape(-1).view(np.uint8)


def _chunk_loop(
    a: MemArray, start: Any, before: bool, after: bool, into: MemArray | None = None
) -> None:
    """Runs ``start(buffer, offset, nbytes)`` (which starts a non-blocking MPI call on the
    buffer and returns its request) on each chunk of ``a``, two at a time: each chunk is
    copied into its bounce buffer first when ``before``, and after its call into ``into``
    (``a`` itself when None) when ``after``, while the other buffer's call runs. Host
    arrays MPI can use in place (``into`` None) go without copies."""
    dst = a if into is None else into
    own = _in_place(a) if into is None else None
    bufs = _bounce() if own is None else []
    pending: list[Any] = [None, None]

    def finish(k: int) -> None:
        req, off, n = pending[k]
        pending[k] = None
        req.Wait()
        if after and own is None:
            dst._write_range(off, bufs[k][:n])

    pieces = _pieces(a.nbytes)
    try:
        for i, (off, n) in enumerate(pieces):
            k = i % 2
            if pending[k] is not None:
                finish(k)
            if own is not None:
                buf = own[off : off + n]
            else:
                buf = bufs[k][:n]
                if before:
                    a._read_range(off, buf)
            pending[k] = (start(buf, off, n), off, n)
        for k in (len(pieces) % 2, (len(pieces) + 1) % 2):  # the older chunk first
            if pending[k] is not None:
                finish(k)
    finally:
        for p in pending:
            if p is not None:
                p[0].Wait()  # never leave MPI writing a buffer


def _overlapped(a: MemArray, call: Any, after: bool, into: MemArray) -> None:
    """Runs the blocking ``call(buffer, offset, nbytes)`` on each chunk of ``a`` in turn,
    each chunk copied into one of two bounce buffers by a helper thread while the call
    before it blocks in MPI (and, when ``after``, the call's result copied into ``into``
    the same way). For reductions: Open MPI's blocking ``Reduce`` is tuned where its
    non-blocking one is not, and a non-blocking collective only moves while its rank is in
    MPI, not while it copies; copies release the GIL and MPI is only ever called from this
    thread."""
    from concurrent.futures import ThreadPoolExecutor

    bufs = _bounce()
    pieces = _pieces(a.nbytes)
    with ThreadPoolExecutor(1, thread_name_prefix="memarray-mpi") as copier:
        off, n = pieces[0]
        read = copier.submit(a._read_range, off, bufs[0][:n])
        written = None
        for i, (off, n) in enumerate(pieces):
            k = i % 2
            read.result()  # chunk i is in bufs[k]
            if written is not None:
                written.result()  # chunk i - 1 left bufs[1 - k]
                written = None
            if i + 1 < len(pieces):
                noff, nn = pieces[i + 1]
                read = copier.submit(a._read_range, noff, bufs[1 - k][:nn])
            call(bufs[k][:n], off, n)
            if after:
                written = copier.submit(into._write_range, off, bufs[k][:n])
        if written is not None:
            written.result()


def bcast(comm: Any, a: MemArray, root: int = 0) -> MemArray:
    """Root's data into ``a`` on every rank (in place); returns ``a``."""
    if _collective_chunked(a):
        _agreed(comm, lambda: [a])
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
        t = TYPES[str(a.dtype)]
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
        t = TYPES[str(a.dtype)]
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
            _check_op(str(a.dtype), op)
            out = _like(a.shape, a) if mine else None
            return [a]

        _agreed(comm, check_chunked)
        t = TYPES[str(a.dtype)]
        item = a.nbytes // max(a.size, 1)

        def call(buf: Any, off: int, n: int) -> None:
            if mine:
                comm.Reduce(MPI.IN_PLACE, [buf, n // item, t], op=op, root=root)
            else:
                comm.Reduce([buf, n // item, t], None, op=op, root=root)

        _overlapped(a, call, after=mine, into=out if out is not None else a)
        return out

    def check() -> list[tuple[MemArray | None, bool]]:
        nonlocal out
        _check_op(str(_check(a, "a").dtype), op)
        out = _like(a.shape, a) if comm.rank == root else None
        return [(a, False), (out, True)]

    with _collective(comm, check) as (src, dst):
        assert src is not None
        t = TYPES[str(a.dtype)]
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
        if tuple(src_array.shape) != (comm.size, *out.shape) or str(src_array.dtype) != str(
            out.dtype
        ):
            raise ValueError(
                f"scatter's a must be {(comm.size, *out.shape)} of {out.dtype} on root, "
                f"not {tuple(src_array.shape)} of {src_array.dtype}"
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
