"""Device arrays across processes: a.ipc_handle() in one process,
memarray.from_ipc_handle(h) in another, handles pickled through multiprocessing; memory
that cannot be shared and handles of dead processes are clear errors."""

from __future__ import annotations

import multiprocessing as mp
import pickle

import numpy as np
import pytest

import memarray
from memarray import dlpack


def test_host_data_cannot_be_shared():
    a = memarray.MemArray([4], np.float32)
    with pytest.raises(RuntimeError, match="move it to a device"):
        a.ipc_handle()


def test_garbage_handles_are_refused():
    from memarray._pickle import ipc_handle

    with pytest.raises(RuntimeError, match="not a memarray IPC handle"):
        ipc_handle(b"garbage", "float32", (4,))
    with pytest.raises(TypeError):
        ipc_handle(b"MAH2" + bytes(153), "float128", (4,))


def _consumer(q_in, q_out):
    h = q_in.get()
    try:
        b = memarray.from_ipc_handle(h)
        v = b.to_numpy()
        b.add_index_tuple()  # writes through to the producer's memory
        b.synchronize()
        q_out.put(("ok", float(v.sum()), b.shape, str(b.dtype)))
    except Exception as e:  # noqa: BLE001 - reported to the parent
        q_out.put(("error", repr(e)))


@pytest.mark.gpu
def test_two_processes_share_a_device_array_through_a_queue():
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_consumer, args=(q_in, q_out))
    p.start()
    a = memarray.full((1000,), 2.0, np.float32, device="cuda")
    h = a.ipc_handle()
    assert (h.shape, h.dtype, h.nbytes) == ((1000,), "float32", 4000)
    assert pickle.loads(pickle.dumps(h)).pid == h.pid
    q_in.put(h)
    result = q_out.get(timeout=120)
    p.join(60)
    assert result[0] == "ok", result
    assert result[1:] == (2000.0, (1000,), "float32")
    # The consumer's kernel wrote into the shared memory.
    expected = 2.0 + np.arange(1000, dtype=np.float32)
    np.testing.assert_array_equal(a.to_numpy(), expected)


def _producer_that_exits(q):
    a = memarray.full((256,), 1.0, np.float32, device="cuda")
    q.put(a.ipc_handle())


@pytest.mark.gpu
def test_handles_of_a_dead_process_and_own_handles_are_clear_errors():
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_producer_that_exits, args=(q,))
    p.start()
    h = q.get(timeout=120)
    p.join(60)
    with pytest.raises(RuntimeError, match="CUDA IPC"):
        memarray.from_ipc_handle(h)
    a = memarray.zeros((4,), device="cuda")
    with pytest.raises(RuntimeError, match="made by this process"):
        memarray.from_ipc_handle(a.ipc_handle())


@pytest.mark.gpu
def test_memory_that_cannot_be_shared_is_a_clear_error():
    from memarray import resources as mr

    with mr.using(mr.Managed(0)):
        a = memarray.zeros((4,), device="cuda")
    with pytest.raises(RuntimeError, match="cannot be shared"):
        a.ipc_handle()
    b = memarray.zeros((4,), device="cuda")
    b.move_memory(dlpack.kDLCPU)
    with pytest.raises(RuntimeError, match="move it to a device"):
        b.ipc_handle()
