"""memarray.mpi's lower half: mpi4py itself, whether MPI takes device pointers, and a
MemArray's bytes as MPI reads and writes them (``_Buf``; the one two-buffer chunk pipeline
that overlaps device copies with messages). ``__init__.py`` (collectives) and ``_p2p.py``
(point to point) build on it."""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from typing import Any

import numpy as np

from ... import _env
from ..._capture import refuse_if_capturing
from ..._memarray import MemArray
from ..._memarray import empty as memarray_empty
from .. import numpy_dtype


def _import_mpi() -> Any:
    try:
        from mpi4py import MPI
    except ImportError as e:  # the message is the product
        raise ImportError("memarray.mpi needs mpi4py (and an MPI): pip install mpi4py") from e
    return MPI


MPI = _import_mpi()


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
    """``MEMARRAY_MPI_CUDA_AWARE``, a switch (``memarray._env``): None when unset or
    empty; a value not understood is a ValueError naming it."""
    return _env.switch("MEMARRAY_MPI_CUDA_AWARE")


_env_cuda_aware()  # a bad value fails the import, as every memarray variable does


def is_cuda_aware(comm: Any = None) -> bool:
    """Whether MPI takes device pointers: ``MEMARRAY_MPI_CUDA_AWARE`` (a switch: ``1``,
    ``on``, ... or ``0``, ``off``, ...) if set, else the library's answer (Open MPI's
    ``MPIX_Query_cuda_support``, MPICH's ``MPIX_GPU_query_support``; any other library:
    no). ``comm`` is accepted for symmetry with the other calls (the answer is the
    library's)."""
    del comm
    env = _env_cuda_aware()
    if env is not None:
        return env
    global _aware
    if _aware is None:
        _aware = _ask_library()
    return _aware


# ---------------------------------------------------------------- buffers

#: Bytes of one message of a chunked device send or receive.
CHUNK = 8 << 20
#: Device arrays of this many bytes or more are sent and received in chunks (without a
#: CUDA-aware MPI).
PIPELINE_FROM = 2 * CHUNK


def _check(a: Any, what: str) -> MemArray:
    """``a`` as a MemArray; a device array is refused (``CaptureError``) while this
    thread's torch or CuPy stream is being captured: MPI waits on the host for it."""
    if not isinstance(a, MemArray):
        raise TypeError(f"{what} must be a memarray.MemArray, not {type(a).__name__}")
    if a.on_device:
        refuse_if_capturing(f"memarray.mpi with a device array ({what})")
    return a


def _typed(raw: np.ndarray, like: MemArray) -> np.ndarray:
    """``raw`` bytes as ``like``'s dtype and shape, for ``read_numpy_array``."""
    return raw.view(numpy_dtype(like._dtype_name)).reshape(tuple(like.shape))


class _Buf:
    """``a``'s bytes as MPI reads or writes them: the device memory itself with a
    CUDA-aware MPI (its pending work complete first, held in place until ``done``), else
    host memory: the array's own for host arrays, a download of device data to read, a
    host landing uploaded by ``done`` to write."""

    def __init__(self, a: MemArray, write: bool) -> None:
        self.a, self.write = a, write
        self.scope: Any = None
        self.landing: np.ndarray | None = None
        bf16 = a._dtype_name == "bfloat16"  # no buffer protocol: copied either way
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

    def done(self, count: int | None = None) -> None:
        """Lets go of the memory; a landing goes into the array (its first ``count``
        bytes when given: what a shorter message brought)."""
        if self.scope is not None:
            self.scope.__exit__(None, None, None)
            self.scope = None
        if self.landing is not None:
            landing, self.landing = self.landing, None
            if count is None or count == self.a.nbytes:
                self.a.read_numpy_array(_typed(landing, self.a))
            elif count:
                self.a._write_range(0, landing[:count])


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


def _pieces(nbytes: int, chunk: int | None = None) -> list[tuple[int, int]]:
    chunk = CHUNK if chunk is None else chunk
    return [(off, min(chunk, nbytes - off)) for off in range(0, nbytes, chunk)]


def _bounce(chunk: int | None = None) -> list[np.ndarray]:
    """Two ``chunk``-byte host buffers for a chunked transfer: pinned where CUDA is (the
    device copies are then the DMA alone, no bounce through the staging slots; memarray's
    pinned pool keeps them for the next call), else pageable."""
    chunk = CHUNK if chunk is None else chunk
    try:
        return [
            np.asarray(memarray_empty((chunk,), "uint8", host_memory="pinned")) for _ in range(2)
        ]
    except Exception:  # no CUDA here, or no pinned memory left: pageable works too
        return [np.empty(chunk, np.uint8), np.empty(chunk, np.uint8)]


def _in_place(a: MemArray) -> np.ndarray | None:
    """A host array's own bytes, for MPI to read and write in place (None for device
    data and bfloat16, which has no buffer protocol: those go through bounce buffers)."""
    if a.on_device or a._dtype_name == "bfloat16":
        return None
    return np.asarray(a).reshape(-1).view(np.uint8)


def _chunk_loop(
    a: MemArray | None,
    start: Any,
    before: bool,
    after: bool,
    into: MemArray | None = None,
    pieces: list[tuple[int, int]] | None = None,
    check: Any = None,
    blocking: bool = False,
) -> None:
    """The one chunk pipeline. ``start(buffer, offset, nbytes)`` runs MPI on each of
    ``pieces`` (``a``'s chunks when None), in order, through two bounce buffers: a
    non-blocking call returning its request (two chunks in MPI at once; ``check(k, offset,
    nbytes, status)`` sees each one's status), or (``blocking``) a blocking call (Open
    MPI's blocking ``Reduce`` is tuned where its non-blocking one is not). One helper
    thread copies: chunk i in from ``a`` before its call when ``before``, out into
    ``into`` (``a`` when None) after it when ``after``, each queued as soon as its buffer
    is free, so the copies run while MPI works on the other buffer. A buffer is handed to
    MPI only once the helper's last copy on it is done, and refilled only once MPI's call
    on it is complete. MPI is only ever called from the calling thread; the copies release
    the GIL. Host arrays MPI can use in place (``into`` None) go without copies; ``a`` None
    (a stream received only to drop it) goes through the bounce buffers."""
    dst = a if into is None else into
    own = _in_place(a) if into is None and a is not None else None
    if pieces is None:
        assert a is not None
        pieces = _pieces(a.nbytes)
    if not pieces:
        return
    copy_in = before and own is None and a is not None
    copy_out = after and own is None and dst is not None
    bufs = _bounce(max(n for _, n in pieces)) if own is None else []

    def view(i: int) -> np.ndarray:
        off, n = pieces[i]
        return own[off : off + n] if own is not None else bufs[i % 2][:n]

    from concurrent.futures import Future, ThreadPoolExecutor

    copier = (
        ThreadPoolExecutor(1, thread_name_prefix="memarray-mpi") if copy_in or copy_out else None
    )
    pending: list[tuple[Any, int] | None] = [None, None]  # per buffer: its call, its chunk
    busy: list[Future[Any] | None] = [None, None]  # per buffer: the helper's last copy on it
    loaded = [-1, -1]  # per buffer: the chunk whose copy in is queued

    def settle(k: int, block: bool) -> bool:
        """Buffer k's call complete (waited for, or only tested when not ``block``) and
        its copy out queued; False when a test finds it still running."""
        p = pending[k]
        if p is None:
            return True
        req, i = p
        if req is not None:
            status = MPI.Status()
            if block:
                req.Wait(status)
            elif not req.Test(status):
                return False
            if check is not None:
                check(i, pieces[i][0], pieces[i][1], status)
        pending[k] = None
        if copy_out:
            assert copier is not None and dst is not None
            busy[k] = copier.submit(dst._write_range, pieces[i][0], view(i))
        return True

    def load(i: int, block: bool) -> None:
        """Chunk i's buffer freed by its last call and chunk i's copy in queued."""
        k = i % 2
        if not settle(k, block):
            return
        if copy_in:
            assert copier is not None and a is not None
            busy[k] = copier.submit(a._read_range, pieces[i][0], view(i))
        loaded[k] = i

    try:
        for i, (off, n) in enumerate(pieces):
            k = i % 2
            if loaded[k] != i:
                load(i, True)
            if i + 1 < len(pieces):
                load(i + 1, False)  # the next copy in starts now if its buffer is free
            job, busy[k] = busy[k], None
            if job is not None:
                job.result()  # the helper is done with this buffer
            req = start(view(i), off, n)
            pending[k] = (None if blocking else req, i)
        last = (len(pieces) - 1) % 2
        for k in (1 - last, last):  # the older chunk first
            settle(k, True)
        for job in busy:
            if job is not None:
                job.result()
    finally:
        for p in pending:
            if p is not None and p[0] is not None:
                p[0].Wait()  # never leave MPI writing a buffer
        if copier is not None:
            copier.shutdown(wait=True)  # nor the helper copying one
