"""New NumPy arrays from to_numpy() of 1 MiB and more come from a pool of faulted-in host
memory: the same values and flags users rely on, the block back in the
pool when the array is collected, reuse on the next call, and MEMARRAY_NUMPY_POOL to size
or turn off the pool."""

from __future__ import annotations

import gc
import os
import threading

import numpy as np
import pytest
from children import child_stdout, run_child

import memarray

pool = memarray.resources


def test_large_to_numpy_is_an_ordinary_writable_copy():
    x = np.arange(1 << 19, dtype=np.float64).reshape(512, 1024)  # 4 MiB
    a = memarray.asarray(x)
    y = a.to_numpy()
    assert y.shape == x.shape and y.dtype == x.dtype
    assert y.flags.c_contiguous and y.flags.writeable and y.flags.aligned
    np.testing.assert_array_equal(y, x)
    y[0, 0] = -1.0  # a copy: the MemArray does not change
    assert a[0, 0] == 0.0
    z = a.to_numpy()
    assert not np.shares_memory(y, z)


def test_the_block_returns_to_the_pool_and_is_reused():
    pool.release_numpy_pool()
    a = memarray.zeros((2 << 20,), "uint8")
    before = pool.numpy_pool_statistics()
    assert before is not None
    y = a.to_numpy()
    during = pool.numpy_pool_statistics()
    assert during["used_bytes"] >= 2 << 20
    del y
    gc.collect()
    after = pool.numpy_pool_statistics()
    assert after["used_bytes"] == before["used_bytes"]
    assert after["cached_bytes"] >= 2 << 20
    y = a.to_numpy()
    assert pool.numpy_pool_statistics()["hits"] == after["hits"] + 1
    del y
    assert pool.release_numpy_pool() >= 2 << 20
    assert pool.numpy_pool_statistics()["cached_bytes"] == 0


def test_small_arrays_keep_numpy_allocations():
    y = memarray.zeros((1000,), "float32").to_numpy()
    assert y.flags.owndata  # np.empty below 1 MiB


def test_threads_copy_out_into_pool_blocks():
    xs = [np.full(1 << 18, i, dtype=np.float32) for i in range(8)]  # 1 MiB each
    arrays = [memarray.asarray(x) for x in xs]
    bad = []

    def work(i):
        for _ in range(20):
            y = arrays[i].to_numpy()
            if not (y == i).all():
                bad.append(i)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not bad


def test_the_pool_can_be_turned_off_and_bad_sizes_are_refused():
    out = child_stdout(
        """
        import memarray
        y = memarray.zeros((1 << 20,), "float32").to_numpy()
        print(y.flags.owndata, memarray.resources.numpy_pool_statistics())
        """,
        env={"MEMARRAY_NUMPY_POOL": "0"},
    )
    assert out.split() == ["True", "None"]
    r = run_child("import memarray", env=dict(os.environ, MEMARRAY_NUMPY_POOL="lots"))
    assert r.returncode != 0 and "MEMARRAY_NUMPY_POOL" in r.stderr, r.stderr[-500:]
    assert "PanicException" not in r.stderr


@pytest.mark.gpu
def test_device_arrays_copy_out_into_pool_blocks():
    x = np.random.default_rng(0).random((1024, 1024))
    a = memarray.asarray(x, device="cuda")
    for _ in range(3):
        np.testing.assert_array_equal(a.to_numpy(), x)
