"""memarray.mpi's lower half: mpi4py itself, whether MPI takes device pointers, and a
MemArray's bytes as MPI reads and writes them (``_Buf``; the two-buffer chunk loops that
overlap device copies with messages). ``__init__.py`` (collectives) and ``_p2p.py``
(point to point) build on it."""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from typing import Any

import numpy as np

from ... import _env
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
    if not isinstance(a, MemArray):
        raise TypeError(f"{what} must be a memarray.MemArray, not {type(a).__name__}")
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
) -> None:
    """Runs ``start(buffer, offset, nbytes)`` (which starts a non-blocking MPI call on the
    buffer and returns its request) on each of ``pieces`` (``a``'s chunks when None), two
    at a time: each chunk is copied into its bounce buffer first when ``before``, and
    after its call into ``into`` (``a`` itself when None) when ``after``, while the other
    buffer's call runs; ``check(k, offset, nbytes, status)`` sees each call's status.
    Host arrays MPI can use in place (``into`` None) go without copies; ``a`` None (a
    stream received only to drop it) goes through the bounce buffers."""
    dst = a if into is None else into
    own = _in_place(a) if into is None and a is not None else None
    if pieces is None:
        assert a is not None
        pieces = _pieces(a.nbytes)
    bufs = _bounce(max((n for _, n in pieces), default=0)) if own is None else []
    pending: list[Any] = [None, None]

    def finish(k: int) -> None:
        req, i, off, n = pending[k]
        pending[k] = None
        status = MPI.Status()
        req.Wait(status)
        if check is not None:
            check(i, off, n, status)
        if after and own is None and dst is not None:
            dst._write_range(off, bufs[k][:n])

    try:
        for i, (off, n) in enumerate(pieces):
            k = i % 2
            if pending[k] is not None:
                finish(k)
            if own is not None:
                buf = own[off : off + n]
            else:
                buf = bufs[k][:n]
                if before and a is not None:
                    a._read_range(off, buf)
            pending[k] = (start(buf, off, n), i, off, n)
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
