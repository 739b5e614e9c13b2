"""memarray.mpi under ``mpirun -np 2`` (test_mpi.py runs this file on every rank; pytest
runs the same tests in the same order everywhere, so the collectives meet). Host arrays
everywhere; device arrays too where CUDA is (through whatever path ``is_cuda_aware``
picks: staging on the GPU machine's Open MPI)."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import memarray
import memarray.mpi as mm
from memarray.cluster.mpi import _p2p as wire

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
assert size == 2, "run with mpirun -np 2"

PLACES = ["cpu"] + (["cuda"] if memarray.cuda.is_available() else [])


def make(values: np.ndarray, dtype: str, place: str) -> memarray.MemArray:
    a = memarray.zeros(values.shape, dtype, device=None if place == "cpu" else "cuda")
    a.read_numpy_array(values.astype(np.float32) if dtype == "bfloat16" else values.astype(dtype))
    return a


def host(a: memarray.MemArray) -> np.ndarray:
    x = a.to_numpy()
    return x.astype(np.float32) if str(a.dtype) == "bfloat16" else x


def pattern(shape: tuple[int, ...], r: int) -> np.ndarray:
    n = int(np.prod(shape, dtype=np.int64))
    return ((np.arange(n) * 3 + 7 * r) % 50).reshape(shape)


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("dtype", memarray.SUPPORTED_DTYPES)
def test_send_recv_every_dtype(dtype, place):
    shape = (5, 3)
    if rank == 0:
        mm.send(comm, make(pattern(shape, 1), dtype, place), dest=1, tag=7)
    else:
        a = make(np.zeros(shape), dtype, place)
        status = mm.recv(comm, a, source=0, tag=7)
        assert status.Get_source() == 0 and status.Get_tag() == 7
        np.testing.assert_array_equal(host(a), host(make(pattern(shape, 1), dtype, place)))
        assert a.device == ("cpu" if place == "cpu" else "cuda:0")


@pytest.mark.parametrize("place", PLACES)
def test_isend_irecv_requests_both_ways(place):
    mine = make(pattern((1000,), rank), "float64", place)
    theirs = make(np.zeros(1000), "float64", place)
    reqs = [mm.irecv(comm, theirs, source=1 - rank), mm.isend(comm, mine, dest=1 - rank)]
    mm.waitall(reqs)
    np.testing.assert_array_equal(theirs.to_numpy(), pattern((1000,), 1 - rank))


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("shape", [(), (0,), (4, 6), (1,) * 31 + (2,)])
def test_bcast_shapes(shape, place):
    a = make(pattern(shape, rank), "int32", place)
    mm.bcast(comm, a, root=1)
    np.testing.assert_array_equal(a.to_numpy(), pattern(shape, 1))


@pytest.mark.parametrize("place", PLACES)
def test_reductions(place):
    a = make(pattern((64,), rank), "float32", place)
    mm.allreduce(comm, a)
    np.testing.assert_array_equal(a.to_numpy(), pattern((64,), 0) + pattern((64,), 1))
    b = make(pattern((8, 8), rank), "int64", place)
    out = mm.reduce(comm, b, op=MPI.MAX, root=0)
    if rank == 0:
        np.testing.assert_array_equal(
            out.to_numpy(), np.maximum(pattern((8, 8), 0), pattern((8, 8), 1))
        )
        assert out.device == b.device
    else:
        assert out is None
    flags = make(np.array([True, rank == 0, False]), "bool", place)
    mm.allreduce(comm, flags, op=MPI.LOR)
    assert flags.to_numpy().tolist() == [True, True, False]
    c = make(pattern((5,), rank) + 1j, "complex128", place)
    mm.allreduce(comm, c, op=MPI.SUM)
    np.testing.assert_array_equal(c.to_numpy(), pattern((5,), 0) + pattern((5,), 1) + 2j)


def test_reductions_mpi_cannot_do_are_errors_on_every_rank_before_sending():
    for dtype, op in (
        ("float16", MPI.SUM),
        ("bfloat16", MPI.SUM),
        ("complex64", MPI.MIN),
        ("float32", MPI.BAND),
        ("bool", MPI.SUM),
    ):
        with pytest.raises(ValueError, match="MPI"):
            mm.allreduce(comm, memarray.zeros((4,), dtype), op=op)
        with pytest.raises(ValueError, match="MPI"):
            mm.reduce(comm, memarray.zeros((4,), dtype), op=op)
    with pytest.raises(TypeError, match="MPI.Op"):
        mm.allreduce(comm, memarray.zeros((4,), "float32"), op="sum")
    with pytest.raises(TypeError, match="memarray.MemArray"):
        mm.send(comm, np.zeros(3), dest=1 - rank)
    comm.Barrier()  # nothing was sent: both ranks are still in step


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("dtype", ["uint8", "float16", "bfloat16", "complex64"])
def test_gather_allgather_scatter_alltoall(dtype, place):
    a = make(pattern((3, 2), rank), dtype, place)
    g = mm.gather(comm, a, root=0)
    if rank == 0:
        assert tuple(g.shape) == (2, 3, 2) and g.device == a.device
        np.testing.assert_array_equal(host(g), np.stack([pattern((3, 2), r) for r in (0, 1)]))
    else:
        assert g is None
    ag = mm.allgather(comm, a)
    np.testing.assert_array_equal(host(ag), np.stack([pattern((3, 2), r) for r in (0, 1)]))
    whole = make(pattern((2, 3, 2), 5), dtype, place) if rank == 1 else None
    part = make(np.zeros((3, 2)), dtype, place)
    mm.scatter(comm, whole, part, root=1)
    np.testing.assert_array_equal(host(part), pattern((2, 3, 2), 5)[rank])
    t = make(pattern((2, 4), rank), dtype, place)
    u = mm.alltoall(comm, t)
    expect = np.stack([pattern((2, 4), r)[rank] for r in (0, 1)])
    np.testing.assert_array_equal(host(u), expect)


def test_cuda_awareness_is_asked_and_can_be_overridden(monkeypatch):
    answer = mm.is_cuda_aware(comm)
    assert isinstance(answer, bool)
    for off in ("0", "off", "False", "no"):
        monkeypatch.setenv("MEMARRAY_MPI_CUDA_AWARE", off)
        assert mm.is_cuda_aware() is False, off
    monkeypatch.setenv("MEMARRAY_MPI_CUDA_AWARE", "maybe")
    with pytest.raises(ValueError, match="MEMARRAY_MPI_CUDA_AWARE"):
        mm.is_cuda_aware()


def stream_by_hand(raw: np.ndarray, dest: int, tag: int) -> None:
    """What a chunked device ``send`` puts on the wire (made by hand, so the host-only CI
    runs it too): the header, then CHUNK-byte messages."""
    comm.Send([wire._header(raw.nbytes), MPI.BYTE], dest=dest, tag=tag)
    for off in range(0, raw.nbytes, mm.CHUNK):
        comm.Send([raw[off : off + mm.CHUNK], MPI.BYTE], dest=dest, tag=tag)


def test_recv_takes_a_chunked_send_or_one_message_whatever_the_sizes_agree_on():
    # 3.5 chunks: the chunked form and one plain message both arrive bit for bit, with
    # the whole array's byte count in the status.
    n = (7 * mm.CHUNK // 2) // 8
    want = np.arange(n, dtype=np.float64) * 1.5
    if rank == 0:
        stream_by_hand(want.view(np.uint8), 1, 3)
        comm.Send([want, MPI.DOUBLE], dest=1, tag=4)  # a plain MPI peer's one message
    else:
        for tag in (3, 4):
            a = memarray.zeros((n,), "float64")
            status = mm.recv(comm, a, source=MPI.ANY_SOURCE, tag=tag)
            assert (status.Get_source(), status.Get_tag()) == (0, tag)
            assert status.Get_count(MPI.BYTE) == want.nbytes
            np.testing.assert_array_equal(a.to_numpy(), want)


@pytest.mark.parametrize("place", PLACES)
def test_a_shorter_message_fills_the_front_and_returns_with_its_count(place):
    # One CHUNK-sized message (a memarray send of 8 MiB, a plain mpi4py Send) into 16 and
    # 24 MiB arrays, and a two-chunk stream into 20 MiB: each returns with its count, the
    # rest of the array kept as it was. A receive that guessed a stream's length from its
    # own array hung here.
    m = mm.CHUNK // 8
    first = memarray.full((m,), 1.5, "float64")
    plain = np.full(m, 2.5)
    two = np.arange(2 * m, dtype=np.float64)
    if rank == 0:
        mm.send(comm, first, dest=1, tag=20)
        comm.Send([plain, MPI.DOUBLE], dest=1, tag=21)
        stream_by_hand(two.view(np.uint8), 1, 22)
        mm.send(comm, first, dest=1, tag=23)
    else:
        for tag, size, sent in ((20, 2 * m, np.full(m, 1.5)), (21, 3 * m, plain)):
            a = make(np.full(size, -1.0), "float64", place)
            source, anytag = (MPI.ANY_SOURCE, MPI.ANY_TAG) if tag == 21 else (0, tag)
            status = mm.recv(comm, a, source=source, tag=anytag)
            assert (status.Get_tag(), status.Get_count(MPI.BYTE)) == (tag, sent.nbytes)
            got = a.to_numpy()
            np.testing.assert_array_equal(got[:m], sent)
            assert (got[m:] == -1.0).all()
        a = make(np.full(5 * m // 2, -1.0), "float64", place)
        status = mm.recv(comm, a, source=0, tag=22)
        assert status.Get_count(MPI.BYTE) == two.nbytes
        np.testing.assert_array_equal(a.to_numpy()[: 2 * m], two)
        assert (a.to_numpy()[2 * m :] == -1.0).all()
        # irecv takes the same shorter message.
        b = make(np.full(2 * m, -1.0), "float64", place)
        st = mm.irecv(comm, b, source=0, tag=23).wait()
        assert st.Get_count(MPI.BYTE) == mm.CHUNK
        assert (b.to_numpy()[:m] == 1.5).all() and (b.to_numpy()[m:] == -1.0).all()


@pytest.mark.parametrize("place", PLACES)
def test_a_longer_message_is_a_truncate_error_and_leaves_nothing_for_the_next_receive(place):
    # A 3 x 8 MiB stream (a chunked send of a 24 MiB device array) and a plain 24 MiB
    # message into 16 MiB: TruncateError, the whole message taken off the queue, and the
    # next receive from the same source and tag gets the next message, not the rest.
    m = mm.CHUNK // 8
    big = np.arange(3 * m, dtype=np.float64)
    after = np.full(2 * m, 7.0)
    if rank == 0:
        stream_by_hand(big.view(np.uint8), 1, 30)
        comm.Send([after, MPI.DOUBLE], dest=1, tag=30)
        comm.Send([big, MPI.DOUBLE], dest=1, tag=31)
        comm.Send([after, MPI.DOUBLE], dest=1, tag=31)
        stream_by_hand(big.view(np.uint8), 1, 32)
        comm.Send([after, MPI.DOUBLE], dest=1, tag=32)
    else:
        for tag in (30, 31):
            a = make(np.full(2 * m, -1.0), "float64", place)
            with pytest.raises(mm.TruncateError) as e:
                mm.recv(comm, a, source=0, tag=tag)
            assert isinstance(e.value, ValueError)
            assert (e.value.message_bytes, e.value.buffer_bytes) == (big.nbytes, a.nbytes)
            assert (a.to_numpy() == -1.0).all(), "the array is unchanged"
            status = mm.recv(comm, a, source=0, tag=tag)
            assert status.Get_count(MPI.BYTE) == after.nbytes
            np.testing.assert_array_equal(a.to_numpy(), after)
        # irecv meets the stream's header: the stream is taken whole, then TruncateError.
        a = make(np.full(2 * m, -1.0), "float64", place)
        with pytest.raises(mm.TruncateError):
            mm.irecv(comm, a, source=0, tag=32).wait()
        mm.recv(comm, a, source=0, tag=32)
        np.testing.assert_array_equal(a.to_numpy(), after)


def test_a_forged_header_is_refused_before_any_chunk_is_taken():
    head = wire._header(mm.CHUNK * 2)
    head[24:].view("<u8")[:] = 0  # chunks of 0 bytes
    if rank == 0:
        comm.Send([head, MPI.BYTE], dest=1, tag=40)
    else:
        a = memarray.zeros((mm.CHUNK // 4,), "float64")
        with pytest.raises(ValueError, match="announces chunks of 0 bytes"):
            mm.recv(comm, a, source=0, tag=40)


@pytest.mark.parametrize("place", PLACES)
def test_irecv_takes_a_chunked_send_whole(place):
    n = (5 * mm.CHUNK // 2) // 4
    want = (np.arange(n) % 977).astype(np.float32)
    if rank == 0:
        mm.send(comm, make(want, "float32", PLACES[-1]), dest=1, tag=41)
    else:
        a = make(np.zeros(n), "float32", place)
        status = mm.irecv(comm, a, source=0, tag=41).wait()
        assert status.Get_count(MPI.BYTE) == want.nbytes
        np.testing.assert_array_equal(a.to_numpy(), want)


@pytest.mark.skipif(not memarray.cuda.is_available(), reason="spilling needs a GPU")
def test_recv_into_a_spilled_array_writes_its_host_copy_and_it_restores():
    n = (5 * mm.CHUNK // 2) // 4
    want = (np.arange(n) % 991).astype(np.float32)
    if rank == 0:
        mm.send(comm, make(want, "float32", "cuda"), dest=1, tag=42)
        comm.Send([want[:1000], MPI.FLOAT], dest=1, tag=43)
    else:
        dev = memarray.cuda.current_device()
        memarray.spill.enable(dev)
        try:
            a = make(np.zeros(n), "float32", "cuda")
            a.synchronize()  # an array with work queued on it does not spill
            memarray.spill.evict(a)
            assert a.spilled
            mm.recv(comm, a, source=0, tag=42)
            np.testing.assert_array_equal(a.to_numpy(), want)
            a.prefetch()
            a.synchronize()
            memarray.spill.evict(a)
            assert a.spilled
            mm.recv(comm, a, source=0, tag=43)
            a.prefetch()
            np.testing.assert_array_equal(a.to_numpy()[:1000], want[:1000])
        finally:
            memarray.spill.disable(dev)


@pytest.mark.parametrize("place_to", PLACES)
@pytest.mark.parametrize("place_from", PLACES)
def test_large_arrays_arrive_whole_between_host_and_device(place_from, place_to):
    n = (5 * mm.CHUNK // 2 + 12) // 4  # not a whole number of chunks
    want = (np.arange(n) % 1000).astype(np.float32)
    if rank == 0:
        mm.send(comm, make(want, "float32", place_from), dest=1, tag=9)
    else:
        a = make(np.zeros(n), "float32", place_to)
        status = mm.recv(comm, a, source=0, tag=9)
        assert status.Get_count(MPI.BYTE) == want.nbytes
        np.testing.assert_array_equal(a.to_numpy(), want)


@pytest.mark.parametrize("mix", ["same", "crossed"])
def test_large_bcast_and_allreduce_go_in_chunks_whatever_each_ranks_placement(mix):
    # 2.5 chunks of float64: every rank cuts the same chunks from the size, so a device
    # array on one rank meets a host array on the other (where CUDA is).
    n = (5 * mm.CHUNK // 2) // 8
    place = PLACES[-1] if (mix == "same" or rank == 0) else "cpu"
    a = make(pattern((n,), rank).astype(np.float64) if rank == 0 else np.zeros(n), "float64", place)
    mm.bcast(comm, a, root=0)
    np.testing.assert_array_equal(host(a), pattern((n,), 0))
    b = make(np.full(n, rank + 1.0), "float64", place)
    mm.allreduce(comm, b)
    np.testing.assert_array_equal(host(b), np.full(n, 3.0))
    # Each rank's values differ along the array, so a chunk reduced into the wrong place
    # shows.
    c = make(pattern((n,), rank).astype(np.float64), "float64", place)
    r = mm.reduce(comm, c, op=MPI.MAX, root=1)
    np.testing.assert_array_equal(host(c), pattern((n,), rank))  # the input is kept
    if rank == 1:
        assert r is not None and r.device == c.device
        np.testing.assert_array_equal(host(r), np.maximum(pattern((n,), 0), pattern((n,), 1)))
    else:
        assert r is None
    locked = make(np.zeros(n), "float64", place)
    with locked.get_dlpack() if rank == 1 else _nothing():
        with pytest.raises(memarray.LockError if rank == 1 else Exception) as e:
            mm.bcast(comm, locked, root=0)
    if rank == 0:
        assert "rank 1 refused" in str(e.value), e.value


@pytest.mark.parametrize("place", PLACES)
def test_many_small_chunks_through_the_bounce_buffers_land_in_order(monkeypatch, place):
    # Host arrays take the bounce buffers and the copy thread too here (as device arrays
    # do without a CUDA-aware MPI), in 37.5 chunks of 4 KiB: a buffer handed to MPI before
    # the helper finished with it, or a chunk copied to the wrong place, shows in the data.
    from memarray.cluster.mpi import _buffers

    monkeypatch.setattr(mm, "CHUNK", 4096)
    monkeypatch.setattr(mm, "PIPELINE_FROM", 4096)
    monkeypatch.setattr(_buffers, "_in_place", lambda a: None)
    monkeypatch.setattr(wire, "_chunked", lambda a: a.nbytes >= mm.PIPELINE_FROM)
    n = (75 * 4096 // 2) // 8
    want = pattern((n,), 0).astype(np.float64) + np.arange(n)
    if rank == 0:
        mm.send(comm, make(want, "float64", place), dest=1, tag=44)
        mm.send(comm, make(want[::-1].copy(), "float64", place), dest=1, tag=45)
    else:
        a = make(np.zeros(n), "float64", place)
        assert mm.recv(comm, a, source=0, tag=44).Get_count(MPI.BYTE) == want.nbytes
        np.testing.assert_array_equal(a.to_numpy(), want)
        mm.irecv(comm, a, source=0, tag=45).wait()
        np.testing.assert_array_equal(a.to_numpy(), want[::-1])
    b = make(want if rank == 0 else np.zeros(n), "float64", place)
    mm.bcast(comm, b, root=0)
    np.testing.assert_array_equal(host(b), want)
    c = make(pattern((n,), rank) + np.arange(n) * (rank + 1.0), "float64", place)
    mm.allreduce(comm, c)
    both = [pattern((n,), r) + np.arange(n) * (r + 1.0) for r in (0, 1)]
    np.testing.assert_array_equal(host(c), both[0] + both[1])
    d = make(both[rank], "float64", place)
    r = mm.reduce(comm, d, op=MPI.MAX, root=0)
    np.testing.assert_array_equal(host(d), both[rank])
    if rank == 0:
        np.testing.assert_array_equal(host(r), np.maximum(both[0], both[1]))


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
