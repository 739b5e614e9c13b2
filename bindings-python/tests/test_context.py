"""The locked get_dlpack context: every way out of a block releases
the lock, and no path leaves an array locked with no live holder."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import memarray
from memarray import dlpack


def test_normal_exit_releases():
    a = memarray.MemArray([3], np.int32)
    with a.get_dlpack(dlpack.kDLCPU) as d:
        assert a.locked and a.lock_id == d.lock_id
        np.from_dlpack(d)[...] = 4
    assert not a.locked and a.lock_id is None
    assert (a.to_numpy() == 4).all()


@pytest.mark.parametrize("exc", [ValueError, KeyboardInterrupt, SystemExit])
def test_exception_exit_releases(exc):
    a = memarray.MemArray([3], np.int32)
    with pytest.raises(exc):
        with a.get_dlpack():
            raise exc()
    assert not a.locked
    a[0] = 1  # usable again


def test_entered_context_collected_without_exit_releases():
    a = memarray.MemArray([3], np.int32)
    ctx = a.get_dlpack()
    ctx.__enter__()
    assert a.locked
    del ctx
    gc.collect()
    assert not a.locked, "dropping the context must release its token"


def test_abandoned_generator_releases():
    a = memarray.MemArray([3], np.int32)

    def gen():
        with a.get_dlpack() as d:
            yield d

    g = gen()
    next(g)
    assert a.locked
    del g
    gc.collect()
    assert not a.locked


def test_context_in_a_cycle_releases_when_collected():
    a = memarray.MemArray([3], np.int32)

    class Holder:
        pass

    h = Holder()
    h.self = h
    h.ctx = a.get_dlpack()
    h.ctx.__enter__()
    del h
    gc.collect()
    assert not a.locked


def test_double_enter_and_double_exit():
    a = memarray.MemArray([3], np.int32)
    ctx = a.get_dlpack()
    with ctx:
        with pytest.raises(memarray.LockError, match="already entered"):
            ctx.__enter__()
        assert a.locked
    assert not a.locked
    assert ctx.__exit__(None, None, None) is False  # a second exit is a no-op
    with ctx:  # re-entering after exit takes a fresh token
        assert a.locked
    assert not a.locked


def test_contending_block_is_refused_naming_both_ids():
    a = memarray.MemArray([3], np.int32)
    with a.get_dlpack() as d:
        with pytest.raises(memarray.LockError) as e:
            with a.get_dlpack():
                pass
        assert str(d.lock_id) in str(e.value)
        assert a.lock_id == d.lock_id, "the refused attempt must not disturb the holder"
    assert not a.locked


def test_failing_thread_at_the_same_moment_leaves_no_lock():
    """Threads that raise inside their blocks while others contend: never locked after."""
    a = memarray.MemArray([8], np.int64)
    barrier = threading.Barrier(8)
    seen: list[BaseException] = []

    def body(k):
        barrier.wait()
        for i in range(100):
            try:
                with a.get_dlpack() as d:
                    np.from_dlpack(d)[...] += 1
                    if (i + k) % 3 == 0:
                        raise RuntimeError("user code failed")
            except (memarray.LockError, RuntimeError):
                pass
            except BaseException as e:  # noqa: BLE001
                seen.append(e)

    ts = [threading.Thread(target=body, args=(k,)) for k in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not seen, seen[:3]
    assert not a.locked


@pytest.mark.gpu
def test_enter_moves_back_after_another_thread_moved_gpu():
    a = memarray.MemArray([3], np.int32)
    ctx = a.get_dlpack(dlpack.kDLCPU)
    a.move_memory(dlpack.kDLCUDA)  # someone else moves it between get and enter
    with ctx as d:
        assert d.__dlpack_device__() == (dlpack.kDLCPU, 0)
        np.from_dlpack(d)[...] = 5
    assert (a.to_numpy() == 5).all()


def test_a_lock_error_inside_a_block_says_how_to_get_on():
    a = memarray.MemArray([3])
    with a.get_dlpack() as t:
        with pytest.raises(memarray.LockError, match="use the view that block gave"):
            a.to_numpy()
        assert t is not None
    assert a.to_numpy().tolist() == [0.0, 0.0, 0.0]
