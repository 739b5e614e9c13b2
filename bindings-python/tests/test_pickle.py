"""Pickling: every dtype and ndim, protocol-5 out-of-band buffers
without a copy, deepcopy, multiprocessing, locked arrays refused."""

from __future__ import annotations

import copy
import multiprocessing as mp
import pickle

import numpy as np
import pytest

import memarray
from conftest import DTYPES, SHAPES, init_array
from memarray import dlpack


def same(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
    x, y = a.to_numpy(), b.to_numpy()
    assert x.tobytes() == y.tobytes()


def filled(shape, dtype):
    a = memarray.MemArray(shape, dtype)
    a.read_numpy_array(init_array(shape, dtype))
    return a


@pytest.mark.parametrize("protocol", range(2, pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_round_trip_every_dtype_ndim_protocol(shape, dtype, protocol):
    a = filled(shape, dtype)
    same(a, pickle.loads(pickle.dumps(a, protocol=protocol)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_protocol5_out_of_band_is_a_snapshot(dtype):
    a = filled((64, 1024), dtype)  # >= 64 KiB of data
    buffers = []
    stream = pickle.dumps(a, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == 1
    assert len(stream) < 1024, "the data must not be in the pickle stream"
    raw = buffers[0].raw()
    assert raw.nbytes == a.nbytes and raw.readonly
    # A snapshot, not a view: writes to the array after dumps do not reach the payload.
    if dtype != "bfloat16":
        assert np.frombuffer(raw, np.uint8).ctypes.data != np.asarray(a).ctypes.data
    before = bytes(raw)
    a[(0, 0)] = 1 if dtype != "bool" else True
    a[(63, 1023)] = 1 if dtype != "bool" else True
    assert bytes(raw) == before, "out-of-band buffers must not alias the live array"
    a = filled((64, 1024), dtype)
    b = pickle.loads(stream, buffers=buffers)
    same(a, b)
    b[(0, 0)] = 1 if dtype != "bool" else False
    assert a.to_numpy().tobytes() == filled((64, 1024), dtype).to_numpy().tobytes(), (
        "the copy must own its data"
    )


def test_in_band_protocol5_carries_the_data():
    a = filled((1000,), "float64")
    s = pickle.dumps(a, protocol=5)
    assert len(s) > a.nbytes
    same(a, pickle.loads(s))


def test_deepcopy_and_copy():
    a = filled((3, 4), "int32")
    for b in (copy.deepcopy(a), copy.copy(a)):
        same(a, b)
        b[0, 0] = 99
        assert a[0, 0] != 99


def test_locked_array_refuses_to_pickle():
    a = filled((3,), "int32")
    with a.get_dlpack() as d:
        with pytest.raises(memarray.LockError) as e:
            pickle.dumps(a)
        assert str(d.lock_id) in str(e.value)
    pickle.dumps(a)


def test_bad_payloads_are_clean_errors():
    from memarray._pickle import rebuild

    with pytest.raises(ValueError):
        rebuild(b"\x00" * 7, "float64", (1,), None, 0, "pageable")  # too short
    with pytest.raises(TypeError):
        rebuild(b"\x00" * 8, "float128", (1,), None, 0, "pageable")
    with pytest.raises(ValueError):
        rebuild(b"\x00" * 8, "float64", (1,), None, 0, "bogus")
    with pytest.raises((ValueError, OverflowError)):
        rebuild(b"", "float64", (-1,), None, 0, "pageable")


def _child(q_in, q_out):
    a = q_in.get()
    a[0] = a[0] + 1
    q_out.put(a)


def test_multiprocessing_queue_round_trip():
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_child, args=(q_in, q_out))
    p.start()
    a = filled((5,), "int64")
    q_in.put(a)
    b = q_out.get(timeout=60)
    p.join(60)
    assert p.exitcode == 0
    assert b[0] == a[0] + 1 and b.to_numpy()[1:].tolist() == a.to_numpy()[1:].tolist()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_device_array_pickles_a_host_copy_and_comes_back_on_device(dtype):
    a = filled((4, 5), dtype)
    a.move_memory(dlpack.kDLCUDA)
    buffers = []
    s = pickle.dumps(a, protocol=5, buffer_callback=buffers.append)
    assert a.device == "cuda:0", "pickling must not move the array"
    b = pickle.loads(s, buffers=buffers)
    assert b.device == "cuda:0"
    same(a, b)


def test_the_snapshot_contract_is_named_and_matches_rebuild_and_reduce():
    import inspect

    from memarray._pickle import Snapshot, rebuild

    # rebuild's parameters are the snapshot's fields, in order: a field added on one side
    # only fails here.
    assert Snapshot._fields == tuple(inspect.signature(rebuild).parameters)
    a = memarray.asarray(np.arange(6, dtype=np.int16).reshape(2, 3), copy=True)
    snap = Snapshot.of(a)
    assert (snap.dtype, tuple(snap.shape), snap.device) == ("int16", (2, 3), None)
    assert snap.host_memory in ("pageable", "pinned", "managed")
    back = rebuild(*snap)
    np.testing.assert_array_equal(back.to_numpy(), a.to_numpy())
