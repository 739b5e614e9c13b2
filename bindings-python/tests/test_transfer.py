"""Transfers: to_numpy(out=), read_numpy_array into device arrays, asarray(device=),
move_many, and the staged pageable pipeline at every size and setting."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import memarray
from conftest import DTYPES, init_array

kDLCPU, kDLCUDA = memarray.dlpack.kDLCPU, memarray.dlpack.kDLCUDA


@pytest.mark.parametrize("dtype", DTYPES)
def test_to_numpy_into_an_existing_array(dtype):
    src = init_array((3, 5, 2), dtype)
    a = memarray.MemArray(src.shape, dtype)
    a.read_numpy_array(src)
    out = np.zeros_like(src)
    got = a.to_numpy(out=out)
    assert got is out
    np.testing.assert_array_equal(out, src)


def test_to_numpy_out_is_checked():
    a = memarray.asarray(np.arange(12, dtype=np.float32).reshape(3, 4), copy=True)
    with pytest.raises(ValueError, match="dtype"):
        a.to_numpy(out=np.zeros((3, 4), np.float64))
    with pytest.raises(ValueError, match="shape"):
        a.to_numpy(out=np.zeros((4, 3), np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        a.to_numpy(out=np.zeros((4, 3), np.float32).T)
    ro = np.zeros((3, 4), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        a.to_numpy(out=ro)
    with pytest.raises(TypeError, match="numpy.ndarray"):
        a.to_numpy(out=[0] * 12)
    # A view of the array's own memory would be written through two aliases.
    with pytest.raises(ValueError, match="shares memory"):
        a.to_numpy(out=np.asarray(a))
    np.testing.assert_array_equal(a.to_numpy(), np.arange(12).reshape(3, 4))


def test_read_numpy_array_of_its_own_view_keeps_the_data():
    src = np.arange(1 << 20, dtype=np.float32).reshape(1024, 1024)  # 4 MiB: above the split
    a = memarray.asarray(src, copy=True)
    a.read_numpy_array(np.asarray(a))
    np.testing.assert_array_equal(a.to_numpy(), src)
    a.read_numpy_array(np.asarray(a)[::-1])  # a reversed view: NumPy makes a copy first
    np.testing.assert_array_equal(a.to_numpy(), src[::-1])


def test_asarray_device_cpu_and_copy_rules():
    src = np.arange(10, dtype=np.int16)
    a = memarray.asarray(src, device="cpu")
    assert a.device == "cpu"
    np.testing.assert_array_equal(a.to_numpy(), src)
    b = memarray.asarray(a, device="cpu")
    assert b is a
    c = memarray.asarray(a, device="cpu", copy=True)
    assert c is not a
    np.testing.assert_array_equal(c.to_numpy(), src)


def test_move_many_on_the_host_and_bad_input():
    arrays = [memarray.asarray(np.full(5, i, np.int32), copy=True) for i in range(4)]
    memarray.move_many(arrays + arrays[:1], "cpu")  # already there; duplicates allowed
    for i, a in enumerate(arrays):
        assert a.device == "cpu"
        np.testing.assert_array_equal(a.to_numpy(), np.full(5, i))
    with pytest.raises(TypeError, match="MemArray"):
        memarray.move_many([arrays[0], [1, 2, 3]], "cpu")
    with pytest.raises(ValueError, match="unknown device"):
        memarray.move_many(arrays, "tpu")
    memarray.move_many([], "cpu")


def _with_bar(capsys, call):
    """``call()`` with progress bars on at once; returns its result and what went to
    stderr."""
    pytest.importorskip("tqdm")
    import memarray._progress as progress

    saved = progress.AFTER
    progress.AFTER = 0.0
    memarray.set_progress(True)
    try:
        capsys.readouterr()
        got = call()
        return got, capsys.readouterr().err
    finally:
        progress.AFTER = saved
        memarray.set_progress(None)


def test_large_move_many_batches_count_their_bytes_and_small_ones_ask_nothing(monkeypatch):
    import memarray._progress as progress

    seen = []
    real_run = progress.run

    def run(work, total, desc, **kw):
        def counted(counter):
            got = work(counter)
            seen.append((desc, total, counter.done))
            return got

        return real_run(counted, total, desc, **kw)

    monkeypatch.setattr(progress, "run", run)
    monkeypatch.setattr(progress, "wanted", lambda *a: True)
    big = [memarray.zeros((1 << 22,), "float64") for _ in range(3)]  # 3 x 32 MiB
    got = memarray.move_many(big, "cpu")
    assert [g is b for g, b in zip(got, big, strict=True)] == [True] * 3
    # The bar's counter reached every byte (arrays already on the host count as done).
    assert seen == [("move 3 arrays", 3 << 25, 3 << 25)], seen

    asked = []
    monkeypatch.setattr(progress, "wanted", lambda *a: asked.append(a) or True)
    memarray.move_many([memarray.zeros((1 << 20,), "float64")] * 7, "cpu")  # 56 MiB
    assert asked == []  # below 64 MiB memarray never calls into Python


@pytest.mark.gpu
def test_a_large_upload_batch_shows_its_bar_and_arrives_whole(capsys):
    src = [np.arange(1 << 23, dtype=np.float32) + i for i in range(3)]  # 3 x 32 MiB
    got, err = _with_bar(capsys, lambda: memarray.move_many(src, "cuda"))
    assert "move 3 arrays" in err and "100%" in err, err
    for i, a in enumerate(got):
        assert a.device.startswith("cuda")
        np.testing.assert_array_equal(a.to_numpy(), src[i])


def _restore_staging(before):
    for direction, c in before.items():
        memarray.cuda.set_staging_config(direction, **c)


def test_staging_settings_round_trip_and_bad_values():
    before = memarray.cuda.staging_config()
    assert set(before) == {"to_device", "to_host"}
    assert set(before["to_host"]) == {
        "threads",
        "fill_threads",
        "chunk_bytes",
        "direct_below",
        "lane_min",
        "short_below",
    }
    try:
        memarray.cuda.set_staging_config("to_host", threads=3)
        now = memarray.cuda.staging_config()
        assert now["to_host"]["threads"] == 3
        assert now["to_device"] == before["to_device"]
        memarray.cuda.set_staging_config(chunk_bytes=1 << 20)
        now = memarray.cuda.staging_config()
        assert now["to_host"]["chunk_bytes"] == now["to_device"]["chunk_bytes"] == 1 << 20
        memarray.cuda.set_staging_config("to_device", lane_min=0)
        now = memarray.cuda.staging_config()
        assert now["to_device"]["lane_min"] == 0
        assert now["to_host"]["lane_min"] == before["to_host"]["lane_min"]
        memarray.cuda.set_staging_config("to_device", fill_threads=5)
        now = memarray.cuda.staging_config()
        assert now["to_device"]["fill_threads"] == 5
        assert now["to_device"]["threads"] == before["to_device"]["threads"]
        for bad in (
            {"threads": 0},
            {"threads": 65},
            {"fill_threads": 0},
            {"fill_threads": 65},
            {"chunk_bytes": 1024},
            {"lane_min": (1 << 30) + 1},
            {"short_below": (1 << 30) + 1},
        ):
            with pytest.raises(ValueError, match="staging"):
                memarray.cuda.set_staging_config(**bad)
        with pytest.raises(ValueError, match="direction"):
            memarray.cuda.set_staging_config("sideways", threads=2)
        assert memarray.cuda.staging_config() == now
    finally:
        _restore_staging(before)
    assert memarray.cuda.staging_config() == before


# ---- GPU ----

SIZES = [0, 1, 4095, 256 << 10, (1 << 20) + 3, (16 << 20) + 5, (100 << 20) + 7]


def _bytes(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


@pytest.mark.gpu
@pytest.mark.parametrize("n", SIZES)
def test_pageable_round_trip_through_every_entry_point(n):
    src = _bytes(n + 1, n)[1:]  # an unaligned NumPy view
    # asarray(device=): straight to a device-resident array.
    a = memarray.asarray(src, device="cuda")
    assert a.device == "cuda:0"
    np.testing.assert_array_equal(a.to_numpy(), src)
    # read_numpy_array into a device-resident array keeps it there.
    flipped = ~src
    a.read_numpy_array(flipped)
    assert a.device == "cuda:0"
    out = np.empty_like(src)
    assert a.to_numpy(out=out) is out
    np.testing.assert_array_equal(out, flipped)
    # move_memory of a pageable array, and back.
    b = memarray.MemArray((n,), "u1", host_memory="pageable")
    b.read_numpy_array(src)
    b.move_memory(kDLCUDA, 0)
    b.read_numpy_array(flipped)
    b.move_memory(kDLCPU)
    np.testing.assert_array_equal(np.asarray(b), flipped)
    # A zero-copy import of NumPy memory moved to the device.
    c = memarray.from_dlpack(src)
    c.move_memory(kDLCUDA, 0)
    np.testing.assert_array_equal(c.to_numpy(), src)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 4096, 60 << 10])
def test_small_uploads_let_the_caller_reuse_its_array_at_once(n):
    # Below direct_below the upload returns once the driver has staged the bytes, before
    # the DMA: the NumPy array is overwritten at once, and every reader sees the old bytes.
    for seed in range(20):
        src = _bytes(n, seed)
        want = src.copy()
        a = memarray.asarray(src, device="cuda")
        src[:] = 0xA5
        b = memarray.asarray(src, device="cuda")
        np.testing.assert_array_equal(a.to_numpy(), want)
        assert (b.to_numpy() == 0xA5).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_staged_paths_keep_every_dtype(dtype):
    src = init_array((513, 1031), dtype)  # > 256 KiB for 1-byte types too
    a = memarray.asarray(src, device="cuda")
    np.testing.assert_array_equal(a.to_numpy(), src)


@pytest.mark.gpu
def test_staged_copies_under_every_setting():
    before = memarray.cuda.staging_config()
    src = _bytes((24 << 20) + 13, 5)
    try:
        for cfg in (
            {"threads": 1},
            {"threads": 3, "chunk_bytes": 64 << 10, "direct_below": 0},
            {"threads": 16, "chunk_bytes": 8 << 20},
        ):
            memarray.cuda.set_staging_config(**cfg)
            a = memarray.asarray(src, device="cuda")
            np.testing.assert_array_equal(a.to_numpy(), src, err_msg=str(cfg))
    finally:
        _restore_staging(before)


@pytest.mark.gpu
def test_staged_copies_from_many_threads():
    errors = []

    def work(t):
        try:
            for i in range(5):
                src = _bytes((3 << 20) + t * 7 + i, t * 10 + i)
                a = memarray.asarray(src, device="cuda")
                np.testing.assert_array_equal(a.to_numpy(), src)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not errors, errors


@pytest.mark.gpu
def test_over_4_gib_round_trip():
    n = (4 << 30) + 4099
    src = np.empty(n, np.uint8)
    src[: 1 << 20] = _bytes(1 << 20, 1)
    src[(1 << 20) :] = np.resize(src[: 1 << 20], n - (1 << 20))
    src[-5:] = [1, 2, 3, 4, 5]
    a = memarray.asarray(src, device="cuda")
    back = a.to_numpy()
    assert np.array_equal(back, src)
    del a, back, src


@pytest.mark.gpu
def test_move_many_both_ways_with_mixed_arrays():
    rng = np.random.default_rng(3)
    arrays, expect = [], []
    for i in range(1000):
        dt = ["f4", "i2", "u1", "f8"][i % 4]
        x = rng.integers(0, 100, 1024 + i % 7).astype(dt)
        hm = "pinned" if i % 3 == 0 else "pageable"
        a = memarray.MemArray(x.shape, dt, host_memory=hm)
        a.read_numpy_array(x)
        arrays.append(a)
        expect.append(x)
    arrays[5].move_memory(kDLCUDA, 0)
    s = memarray.cuda.Stream()
    memarray.move_many(arrays + [arrays[0]], "cuda", stream=s)
    for a, x in zip(arrays, expect, strict=True):
        assert a.device == "cuda:0"
        np.testing.assert_array_equal(a.to_numpy(), x)
    memarray.move_many(arrays, "cpu")
    for a, x in zip(arrays, expect, strict=True):
        assert a.device == "cpu"
        np.testing.assert_array_equal(np.asarray(a), x)


@pytest.mark.gpu
def test_move_many_down_of_arrays_made_one_by_one():
    # Arrays made one by one sit in many pool blocks, some adjacent in the address space:
    # no copy may span two of them (the driver refuses it).
    rng = np.random.default_rng(5)
    for kib, count in ((4, 3000), (64, 300), (300, 40)):
        xs = [rng.integers(0, 255, kib << 10, dtype=np.uint8) for _ in range(count)]
        arrays = [memarray.asarray(x, device="cuda") for x in xs]
        memarray.move_many(arrays, "cpu")
        for a, x in zip(arrays, xs, strict=True):
            assert a.device == "cpu"
            np.testing.assert_array_equal(np.asarray(a), x)


@pytest.mark.gpu
def test_move_many_refuses_when_one_is_locked():
    a = memarray.asarray(np.ones(8, np.float32), copy=True)
    b = memarray.asarray(np.ones(8, np.float32), copy=True)
    with b.get_dlpack(kDLCPU):
        with pytest.raises(memarray.LockError):
            memarray.move_many([a, b], "cuda")
    assert a.device == "cpu" and b.device == "cpu"


@pytest.mark.gpu
def test_asarray_device_from_torch_and_copy_false():
    torch = pytest.importorskip("torch")
    t = torch.arange(300000, dtype=torch.float32)
    a = memarray.asarray(t, device="cuda")
    assert a.device == "cuda:0"
    np.testing.assert_array_equal(a.to_numpy(), t.numpy())
    with pytest.raises(ValueError, match="copy=False"):
        memarray.asarray(t, device="cuda", copy=False)
    g = t.cuda()
    b = memarray.asarray(g, device="cuda")
    np.testing.assert_array_equal(b.to_numpy(), t.numpy())
    c = memarray.asarray(g, device="cpu")
    assert c.device == "cpu"
    np.testing.assert_array_equal(np.asarray(c), t.numpy())


@pytest.mark.parametrize(
    ("var", "value"), [("MEMARRAY_STAGING_THREADS", "many"), ("MEMARRAY_STAGING_CHUNK", "0")]
)
def test_bad_staging_environment_fails_the_import_naming_it(var, value):
    import os

    from children import run_child

    env = dict(os.environ, **{var: value})
    r = run_child("import memarray", env=env)
    err = r.stderr
    assert r.returncode == 1 and "ValueError" in err, err[-2000:]
    assert var in err or "chunk_bytes" in err, err[-2000:]


def test_the_staging_threads_variable_sets_the_lanes_of_copies_and_of_file_loads():
    import json

    from children import child_stdout

    code = "import json, memarray; print(json.dumps(memarray.cuda.staging_config()))"
    out = child_stdout(code, timeout=120, env={"MEMARRAY_STAGING_THREADS": "3"})
    got = json.loads(out.strip().splitlines()[-1])
    for direction in ("to_device", "to_host"):
        assert (got[direction]["threads"], got[direction]["fill_threads"]) == (3, 3), got


def test_move_many_takes_numpy_arrays_and_returns_memarrays():
    xs = [np.full((3, 4), i, dtype=np.float32) for i in range(5)]
    m = memarray.asarray(np.arange(6, dtype=np.int64))
    out = memarray.move_many([xs[0], m, xs[1], xs[2], m], "cpu")
    assert len(out) == 5 and out[1] is m and out[4] is m
    assert all(isinstance(a, memarray.MemArray) for a in out)
    # On the host an imported NumPy array is shared, as asarray shares it.
    out[0][0, 0] = 42.0
    assert xs[0][0, 0] == 42.0
    with pytest.raises(TypeError, match="move_many takes MemArrays, NumPy arrays"):
        memarray.move_many([xs[0], "not an array"], "cpu")
    with m.get_dlpack(memarray.dlpack.kDLCPU):
        with pytest.raises(memarray.LockError):
            memarray.move_many([xs[3], m], "cpu")


@pytest.mark.gpu
def test_move_many_of_numpy_arrays_gives_independent_device_arrays():
    xs = [np.random.default_rng(i).random((i + 1, 7)) for i in range(200)]
    big = np.arange(1 << 20, dtype=np.float32)  # 4 MiB: the staged path, not the batch
    out = memarray.move_many([*xs, big], "cuda")
    assert all(a.device == "cuda:0" for a in out)
    for x, a in zip(xs, out[:-1], strict=True):
        np.testing.assert_array_equal(a.to_numpy(), x)
    np.testing.assert_array_equal(out[-1].to_numpy(), big)
    # The device arrays no longer use the NumPy memory: changing it changes nothing.
    xs[0][...] = -1.0
    big[...] = -1.0
    assert (out[0].to_numpy() != -1.0).all() and (out[-1].to_numpy() != -1.0).all()
    # And back to the host they get buffers of their own.
    memarray.move_many(out[:3], "cpu")
    assert not np.shares_memory(np.asarray(out[1]), xs[1])


def test_pinned_fallbacks_count_nothing_until_pinning_fails():
    got = memarray.cuda.pinned_fallbacks()
    assert set(got) == {"count", "bytes"} and got["count"] >= 0 and got["bytes"] >= 0
    if not memarray.cuda.is_available():
        # Nothing can be pinned here, and nothing asked to be.
        assert got == {"count": 0, "bytes": 0}


@pytest.mark.gpu
def test_when_pinning_is_refused_staging_goes_pageable_counted_and_correct():
    # A 1 MiB cap on the pinned pool: staged copies of 64 MiB need more (slots of 1-4
    # MiB, several at once), so they fall back; an explicit pinned array is refused.
    from children import child_stdout

    out = child_stdout(
        """
        import numpy as np, memarray
        before = memarray.cuda.pinned_fallbacks()
        assert before == {"count": 0, "bytes": 0}, before
        x = np.random.default_rng(1).random(8 << 20)  # 64 MiB
        a = memarray.asarray(x, device="cuda")
        np.testing.assert_array_equal(a.to_numpy(), x)
        y = np.empty_like(x)
        a.to_numpy(out=y)
        np.testing.assert_array_equal(y, x)
        small = [np.full(4096, i % 251, np.uint8) for i in range(600)]  # 2.4 MiB packed
        moved = memarray.move_many(small, device="cuda")
        for i, m in enumerate(moved):
            assert (m.to_numpy() == i % 251).all()
        after = memarray.cuda.pinned_fallbacks()
        assert after["count"] >= 3 and after["bytes"] >= 2 << 20, after
        try:
            memarray.empty(4 << 20, "uint8", device="cpu", host_memory="pinned")
        except MemoryError:
            print("explicit pinned refused")
        print("fallbacks", after["count"])
        """,
        env={"MEMARRAY_PINNED_LIMIT": "1MiB"},
    )
    assert "explicit pinned refused" in out and "fallbacks" in out, out
