"""memarray.mpi's point-to-point calls: ``send`` / ``recv``, ``isend`` / ``irecv``.

On the wire a ``send`` is one message, except a device array of ``PIPELINE_FROM`` bytes or
more without a CUDA-aware MPI: that is a ``HEADER``-byte message (``MAGIC``, the total and
the chunk size) and then the chunks, all from one source with one tag. A receive matches
the first message (``Mprobe``, so no other receive takes it between probe and receive) and
so always knows what is coming: a shorter message or stream fills the array's first bytes
(MPI's rule), a longer one is taken off the queue whole and raises ``TruncateError`` (MPI's
``MPI_ERR_TRUNCATE``), never left for the next receive.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..._memarray import MemArray
from . import _buffers as _tunables  # CHUNK and PIPELINE_FROM, read at each call
from ._buffers import (
    MPI,
    _Buf,
    _bufs,
    _check,
    _chunk_loop,
    _in_place,
    _pieces,
    is_cuda_aware,
)

#: A chunked send opens with one ``HEADER``-byte message: these 16 bytes, then the
#: stream's total and its chunk size in bytes (little-endian 64-bit each). The chunks
#: follow from the same source with the same tag.
MAGIC = b"memarray.mpi\x00v1\x00"
HEADER = 32
#: The largest chunk a header may announce (a forged one is refused before any receive).
_CHUNK_CEILING = 1 << 30


class TruncateError(ValueError):
    """A message longer than the receiving array (MPI's ``MPI_ERR_TRUNCATE``). The message
    has been taken off the queue (every chunk of a chunked one), so the next receive gets
    the next message; the array is unchanged unless ``irecv``'s own buffer got part of it.
    ``message_bytes``, ``buffer_bytes``, ``source`` and ``tag`` say which."""

    __module__ = "memarray.mpi"

    def __init__(self, message_bytes: int | None, buffer_bytes: int, source: int, tag: int) -> None:
        size = "" if message_bytes is None else f"of {message_bytes} bytes "
        fix = "a larger array" if message_bytes is None else f"at least {message_bytes} bytes"
        super().__init__(
            f"a message {size}from rank {source} (tag {tag}) is longer than the receiving "
            f"array ({buffer_bytes} bytes); it was received and dropped: receive into {fix}"
        )
        self.message_bytes, self.buffer_bytes = message_bytes, buffer_bytes
        self.source, self.tag = source, tag


def _header(total: int) -> np.ndarray:
    """The header of a chunked stream of ``total`` bytes."""
    head = np.zeros(HEADER, np.uint8)
    head[:16] = np.frombuffer(MAGIC, np.uint8)
    head[16:].view("<u8")[:] = (total, _tunables.CHUNK)
    return head


def _read_header(head: np.ndarray) -> tuple[int, int] | None:
    """``(total, chunk)`` of a chunked stream's header; None for any other message."""
    if head.nbytes != HEADER or head[:16].tobytes() != MAGIC:
        return None
    total, chunk = (int(v) for v in head[16:].view("<u8"))
    if not 0 < chunk <= _CHUNK_CEILING:
        raise ValueError(f"a memarray.mpi stream header announces chunks of {chunk} bytes")
    return total, chunk


def _chunked(a: MemArray) -> bool:
    """Whether ``send`` cuts ``a`` into chunks."""
    return bool(a.on_device) and a.nbytes >= _tunables.PIPELINE_FROM and not is_cuda_aware()


def _send_chunks(comm: Any, a: MemArray, dest: int, tag: int) -> None:
    """The header, then chunk k copied off the device into one of two host buffers while
    chunk k - 1's message is in flight from the other."""
    comm.Send([_header(a.nbytes), MPI.BYTE], dest=dest, tag=tag)
    _chunk_loop(
        a,
        lambda buf, off, n: comm.Isend([buf, n, MPI.BYTE], dest=dest, tag=tag),
        before=True,
        after=False,
    )


def _recv_stream(comm: Any, a: MemArray | None, status: Any, total: int, chunk: int) -> None:
    """The chunks of the stream whose header ``status`` describes (MPI matches them in
    posting order), two receives posted at a time, each copied into ``a``'s first
    ``total`` bytes while the other fills; ``a`` None drops them. A chunk of another size
    than the header says is a ValueError after the whole stream has been taken."""
    source, tag = status.Get_source(), status.Get_tag()
    wrong: list[str] = []

    def check(k: int, off: int, n: int, got: Any) -> None:
        if got.Get_count(MPI.BYTE) != n and not wrong:
            wrong.append(
                f"chunk {k} of a {total}-byte stream from rank {source} (tag {tag}) "
                f"was {got.Get_count(MPI.BYTE)} bytes, not {n}"
            )

    _chunk_loop(
        a,
        lambda buf, off, n: comm.Irecv([buf, n, MPI.BYTE], source=source, tag=tag),
        before=False,
        after=a is not None,
        pieces=_pieces(total, chunk),
        check=check,
    )
    if wrong:
        raise ValueError(wrong[0])


def send(comm: Any, a: MemArray, dest: int, tag: int = 0) -> None:
    """Sends ``a``'s data to ``dest`` (blocking): one message, or (a device array of
    ``PIPELINE_FROM`` bytes or more, without a CUDA-aware MPI) a ``HEADER`` message and
    ``CHUNK``-byte messages, which ``recv`` and ``irecv`` take."""
    a = _check(a, "a")
    if _chunked(a):
        _send_chunks(comm, a, dest, tag)
        return
    with _bufs((a, False)) as (b,):
        assert b is not None
        comm.Send(b.spec(), dest=dest, tag=tag)


def _recv_message(msg: Any, a: MemArray, count: int, status: Any) -> None:
    """The matched message ``msg`` (``count`` <= ``a.nbytes`` bytes) into ``a``'s first
    ``count`` bytes: in place for host arrays (and device memory with a CUDA-aware MPI),
    else through a landing buffer; the rest of ``a`` is left as it was, as MPI leaves a
    longer buffer."""
    own = _in_place(a)
    if own is not None:
        msg.Recv([own[:count], MPI.BYTE], status=status)
        return
    if a.nbytes and a.on_device and is_cuda_aware():
        with _bufs((a, True)) as (b,):
            assert b is not None
            msg.Recv(b.spec(count), status=status)
        return
    landing = np.empty(count, np.uint8)
    msg.Recv([landing, MPI.BYTE], status=status)
    if count:
        a._write_range(0, landing)


def recv(comm: Any, a: MemArray, source: int = MPI.ANY_SOURCE, tag: int = MPI.ANY_TAG) -> Any:
    """Receives into ``a`` and returns the MPI.Status (its count is the bytes received).
    Takes one message (a plain MPI peer's, a host or small array's ``send``) or a chunked
    ``send``'s stream, as long as ``a``'s bytes or shorter (the rest of ``a`` is left as
    it was); a longer one is taken off the queue whole and raises ``TruncateError``. A
    locked array refuses before anything is received."""
    a = _check(a, "a")
    a._write_range(0, np.empty(0, np.uint8))  # a locked array refuses before any message
    status = MPI.Status()
    msg = comm.Mprobe(source=source, tag=tag, status=status)
    count = status.Get_count(MPI.BYTE)
    stream = None
    if count == HEADER:
        head = np.empty(HEADER, np.uint8)
        msg.Recv([head, MPI.BYTE], status=status)
        stream = _read_header(head)
        if stream is None:  # a plain 32-byte message
            if count > a.nbytes:
                raise TruncateError(count, a.nbytes, status.Get_source(), status.Get_tag())
            if count:
                a._write_range(0, head)
            return status
    if stream is not None:
        total, chunk = stream
        if total > a.nbytes:
            _recv_stream(comm, None, status, total, chunk)
            raise TruncateError(total, a.nbytes, status.Get_source(), status.Get_tag())
        _recv_stream(comm, a, status, total, chunk)
        status.Set_elements(MPI.BYTE, total)
        return status
    if count > a.nbytes:
        msg.Recv([np.empty(count, np.uint8), MPI.BYTE], status=status)
        raise TruncateError(count, a.nbytes, status.Get_source(), status.Get_tag())
    _recv_message(msg, a, count, status)
    return status


class Request:
    """A pending ``isend`` / ``irecv``: ``wait()`` (a received array holds its data after
    it), ``test()``. Holds the array's memory (or the staged host copy) until done. A
    receive that meets a chunked ``send``'s header takes the rest of the stream when it
    completes (``wait``, or the ``test`` that finds it done, blocks for the chunks); a
    message longer than the array raises ``TruncateError`` there."""

    def __init__(self, request: Any, buf: _Buf, comm: Any = None) -> None:
        self._request = request
        self._buf: _Buf | None = buf
        self._comm = comm  # set for receives

    def _finish(self, status: Any) -> None:
        buf, self._buf = self._buf, None
        if buf is None:
            return
        if self._comm is None:
            buf.done()
            return
        count = status.Get_count(MPI.BYTE)
        head = None
        if count == HEADER:
            if buf.landing is not None:
                head = _read_header(buf.landing[:HEADER].copy())
            elif buf.scope is None:
                head = _read_header(np.array(buf.mem[:HEADER]))
            else:  # device memory (CUDA-aware): read the 32 bytes back
                buf.done()
                raw = np.empty(HEADER, np.uint8)
                buf.a._read_range(0, raw)
                head = _read_header(raw)
        if head is None:
            buf.done(count)
            return
        buf.landing = None  # the header is not data
        buf.done()
        total, chunk = head
        if total > buf.a.nbytes:
            _recv_stream(self._comm, None, status, total, chunk)
            raise TruncateError(total, buf.a.nbytes, status.Get_source(), status.Get_tag())
        _recv_stream(self._comm, buf.a, status, total, chunk)
        status.Set_elements(MPI.BYTE, total)

    def _truncated(self, e: Exception, status: Any) -> Exception:
        buf, self._buf = self._buf, None
        if buf is not None:
            buf.landing = None
            buf.done()
        if self._comm is not None and isinstance(e, MPI.Exception):
            if e.Get_error_class() == MPI.ERR_TRUNCATE:
                assert buf is not None
                return TruncateError(None, buf.a.nbytes, status.Get_source(), status.Get_tag())
        return e

    def wait(self) -> Any:
        status = MPI.Status()
        try:
            self._request.Wait(status)
        except Exception as e:
            raise self._truncated(e, status) from e
        self._finish(status)
        return status

    def test(self) -> bool:
        status = MPI.Status()
        try:
            done = bool(self._request.Test(status))
        except Exception as e:
            raise self._truncated(e, status) from e
        if done:
            self._finish(status)
        return done


def isend(comm: Any, a: MemArray, dest: int, tag: int = 0) -> Request:
    """Starts sending ``a`` as one message (``send``'s chunks are for blocking sends);
    staged data is a snapshot taken now."""
    b = _Buf(_check(a, "a"), False)
    try:
        return Request(comm.Isend(b.spec(), dest=dest, tag=tag), b)
    except BaseException:
        b.done()
        raise


def irecv(comm: Any, a: MemArray, source: int = MPI.ANY_SOURCE, tag: int = MPI.ANY_TAG) -> Request:
    """Starts receiving into ``a``; ``a`` holds the data once the request is waited on.
    Takes what ``recv`` takes (see ``Request``); a shorter message fills ``a``'s first
    bytes and leaves the rest as it was."""
    b = _Buf(_check(a, "a"), True)
    try:
        return Request(comm.Irecv(b.spec(), source=source, tag=tag), b, comm)
    except BaseException:
        b.landing = None
        b.done()
        raise


def waitall(requests: Sequence[Request]) -> None:
    """Waits for every request."""
    for r in requests:
        r.wait()
