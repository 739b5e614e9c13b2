"""Bundles in any import order and from forged tables, the monitor's interval, arguments
checked before early returns, the device words of get_dlpack, NumPy's save naming,
reprs that never raise, empty allocations, and the hints a newcomer meets. Crashes and
import orders run in subprocesses."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
from children import assert_clean, run_child, run_command

import memarray

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# ---- Bundles ----


def test_a_bundle_unpickled_before_ray_is_imported_leaves_rays_registration_working():
    pytest.importorskip("ray")
    r = run_child(
        """
        import pickle, sys, warnings
        warnings.simplefilter("error", RuntimeWarning)
        import memarray
        data = pickle.dumps(memarray.Bundle([memarray.full((3,), 2.0, "float32")]))
        for m in [m for m in sys.modules if m.startswith(("memarray.cluster.ray", "memarray._b"))]:
            del sys.modules[m]
        b = pickle.loads(data)
        assert "ray" not in sys.modules, "unpickling a Bundle imported Ray"
        import ray
        assert "ray" in memarray._hooks._done
        import memarray.ray
        print(float(b[0][1]), memarray.ray.statistics()["sent_objects"])
        """
    )
    assert_clean(r)
    assert "RuntimeWarning" not in r.stderr, r.stderr
    assert r.stdout.split() == ["2.0", "0"], r.stdout


FORGED = [
    [("float32", [-1], 0)],
    [("float32", [-1, 4], 0)],
    [("float32", [2**64], 0)],
    [("float32", [2], -8)],
    [("float32", [2.0], 0)],
    [("float32", [True], 0)],
    [("float32", [1 << 40], 0)],
    [("float32", [2], 1 << 62)],
    [("complex512", [2], 0)],
    [("float32", [2])],
    [None],
    "not a list",
    [("float32", [1] * 33, 0)],
    [("float32", [0, 2**64], 0)],  # zero bytes, but a dimension no array can have
]


@pytest.mark.parametrize("table", FORGED, ids=range(len(FORGED)))
def test_a_forged_bundle_table_is_a_value_error(table):
    from memarray import Bundle

    pack = memarray.zeros((64,), "uint8")
    with pytest.raises(ValueError):
        Bundle._of(pack, table)
    if memarray.cuda.is_available():
        with pytest.raises(ValueError):
            Bundle._of(memarray.zeros((64,), "uint8", device="cuda"), table)


@pytest.mark.parametrize(
    ("dtype", "shape", "itemsize"),
    [("bfloat16", [4, 8], 2), ("float64", [], 8), ("int8", [64], 1), ("complex64", [2, 2, 2], 8)],
)
def test_a_bundle_entry_may_end_at_its_packs_end_and_not_a_byte_past(dtype, shape, itemsize):
    from memarray import Bundle

    nbytes = itemsize * int(np.prod(shape))
    pack = memarray.zeros((64,), "uint8")
    ok = Bundle._of(pack, [(dtype, shape, 64 - nbytes)])
    assert ok[0]._dtype_name == dtype and list(ok[0].shape) == shape
    with pytest.raises(ValueError, match="outside"):
        Bundle._of(pack, [(dtype, shape, 64 - nbytes + 1)])


def test_a_bundle_table_in_tuples_is_read_as_lists():
    from memarray import Bundle

    b = Bundle._of(memarray.zeros((64,), "uint8"), (("float32", (2, 2), 16), ("int8", [], 0)))
    assert [(a._dtype_name, list(a.shape)) for a in b] == [("float32", [2, 2]), ("int8", [])]
    assert b._entries == [("float32", [2, 2], 16), ("int8", [], 0)]


def test_a_good_bundle_table_round_trips_through_pickle():
    from memarray import Bundle

    b = Bundle([memarray.full((2, 3), 1.5, "float64"), memarray.zeros((0,), "int8")])
    c = pickle.loads(pickle.dumps(b))
    assert [tuple(a.shape) for a in c] == [(2, 3), (0,)]
    np.testing.assert_array_equal(c[0].to_numpy(), np.full((2, 3), 1.5))
    with pytest.raises(ValueError, match="pack"):
        Bundle._of(memarray.zeros((8,), "float32"), [])


def test_a_host_bundle_is_packed_by_the_one_layout_and_its_arrays_are_views():
    # Host packs come from the same RawArray::pack as device ones.
    from memarray import Bundle

    parts = [memarray.asarray(np.arange(n, dtype=np.int16)) for n in (3, 200, 0, 7)]
    b = Bundle(parts)
    offsets, total = memarray._memarray._pack_layout([p.nbytes for p in parts])
    assert b.pack.nbytes == total and [e[2] for e in b._entries] == offsets
    raw = np.asarray(b.pack)
    for p, off in zip(parts, offsets, strict=True):
        np.testing.assert_array_equal(raw[off : off + p.nbytes].view(np.int16), p.to_numpy())
    np.asarray(b[1])[0] = 99  # a view of the pack: writing it writes the pack
    assert raw[offsets[1] : offsets[1] + 2].view(np.int16)[0] == 99
    assert parts[1].to_numpy()[0] == 0, "the caller's arrays were copied in, not shared"
    with pytest.raises(TypeError, match="item 1"):
        Bundle([parts[0], np.zeros(2)])


# ---- the monitor ----


@pytest.mark.parametrize("interval", [float("nan"), float("inf"), -1.0, 0, 1e300])
def test_the_monitor_refuses_an_interval_it_cannot_wait(interval):
    from memarray import notebook

    with pytest.raises(ValueError, match="interval"):
        notebook.monitor(interval=interval)


@pytest.mark.parametrize("interval", ["1", True, None])
def test_the_monitor_refuses_an_interval_that_is_not_a_number(interval):
    from memarray import notebook

    with pytest.raises(TypeError, match="interval"):
        notebook.monitor(interval=interval)


# ---- arguments ----


def test_to_device_checks_its_stream_when_the_data_is_already_there():
    a = memarray.zeros((4,), "float32")
    for junk in ("junk", object(), -5):
        with pytest.raises((TypeError, ValueError)):
            a.to_device("cpu", stream=junk)
        with pytest.raises((TypeError, ValueError)):
            a.move_memory("cpu", stream=junk)
    assert a.to_device("cpu") is a


@pytest.mark.parametrize("device", ["cpu", memarray.dlpack.kDLCPU, (1, 0)])
def test_get_dlpack_takes_the_device_words_move_memory_takes(device):
    a = memarray.full((3,), 2.0, "float32")
    with a.get_dlpack(device) as t:
        assert np.from_dlpack(t).sum() == 6.0
    with pytest.raises(ValueError):
        a.get_dlpack("tpu")


def test_save_appends_npy_as_numpy_does(tmp_path):
    a = memarray.full((3,), 4.0, "float32")
    a.save(str(tmp_path / "x"))
    a.save(tmp_path / "y.npy")
    a.save(tmp_path / "z.txt")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["x.npy", "y.npy", "z.txt.npy"], names
    np.testing.assert_array_equal(np.load(tmp_path / "x.npy"), np.full(3, 4.0, np.float32))
    np.testing.assert_array_equal(memarray.load(tmp_path / "x.npy").to_numpy(), np.full(3, 4.0))


# ---- reprs ----


def test_a_bfloat16_array_shows_itself_in_a_notebook_without_ml_dtypes():
    r = run_child(
        """
        import sys
        sys.modules["ml_dtypes"] = None  # as if not installed
        import memarray
        a = memarray.zeros((3,), "bfloat16")
        html = a._repr_html_()
        assert "bfloat16" in html and "MemArray" in html, html
        print(repr(a))
        """
    )
    assert_clean(r)
    assert "bfloat16" in r.stdout


# ---- empty allocations ----


def test_the_allocator_bridges_give_size_zero_the_null_pointer():
    # RMM's callbacks (the bridge RMM allocates through) over a host resource; CuPy's,
    # torch's and Numba's run on the GPU machine (test_numba_cupy.py, test_torch_route.py).
    from memarray import resources as mr

    cb = memarray._memarray._interop.resource_callbacks(mr.Host()._handle, "rmm")
    assert cb.allocate(0, 0) == 0
    cb.deallocate(0, 0, 0)  # ignored, as a pointer it never gave
    assert cb.live_blocks() == 0
    p = cb.allocate(64, 0)
    assert p != 0 and cb.live_blocks() == 1
    cb.deallocate(p, 64, 0)
    assert cb.live_blocks() == 0


# ---- a newcomer's second hour ----


def test_a_memarray_has_no_comparisons_and_says_where_to_compute():
    a = memarray.zeros((3,), "float32")
    for op in (lambda: a > 0, lambda: a < 0, lambda: a >= 0, lambda: 0 <= a):
        with pytest.raises(TypeError, match="comparisons"):
            op()
    assert (a == a) is True and (a != memarray.zeros((3,), "float32")) is True
    assert {a: 1}[a] == 1  # still hashable


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: memarray.MemArray((2, 3), "float32", device="cuda"), "memarray.zeros"),
        (lambda: memarray.MemArray([1.5, 2.5]), "memarray.asarray"),
        (lambda: memarray.ones((3,)), "memarray.full"),
        (lambda: memarray.arange(3), "np.arange"),
        (lambda: memarray.array([1, 2]), "memarray.asarray"),
        (lambda: memarray.zeros_like(None), "memarray.zeros(a.shape"),
        (lambda: memarray.save("x", None), "a.save(path)"),
        (lambda: memarray.zeros((3,)).fill(1.0), "memarray.full"),
    ],
)
def test_familiar_calls_name_memarrays_way(call, words):
    with pytest.raises((TypeError, AttributeError)) as e:
        call()
    assert words in str(e.value), e.value


def test_asarray_takes_a_dtype_and_casts_host_data():
    a = memarray.asarray([1, 2, 3], dtype="float32")
    assert str(a.dtype) == "float32"
    np.testing.assert_array_equal(a.to_numpy(), [1.0, 2.0, 3.0])
    x = np.arange(4, dtype=np.float64)
    same = memarray.asarray(x, dtype="float64", copy=False)
    same[0] = 9.0
    assert x[0] == 9.0, "the same dtype is shared"
    with pytest.raises(ValueError, match="copy=False"):
        memarray.asarray(x, dtype="float32", copy=False)
    b = memarray.asarray(memarray.full((2,), 1.5, "float64"), dtype="int32")
    assert str(b.dtype) == "int32"


def test_torch_style_dtypes_are_taken_by_name():
    # A stand-in with torch.dtype's module and name (torch itself on the GPU machine).
    fake = type("dtype", (), {"__module__": "torch", "__str__": lambda s: "torch.bfloat16"})
    a = memarray.zeros((2,), fake())
    assert a._dtype_name == "bfloat16"
    odd = type("dtype", (), {"__module__": "torch", "__str__": lambda s: "torch.qint8"})
    with pytest.raises(TypeError, match="qint8"):
        memarray.zeros((2,), odd())


def test_help_shows_clean_signatures_and_no_stray_markers():
    r = run_child("import memarray, pydoc; print(pydoc.render_doc(memarray))")
    assert r.returncode == 0, r.stderr
    lines = [line.strip() for line in r.stdout.splitlines()]
    assert "--" not in lines, [i for i, x in enumerate(lines) if x == "--"]
    import inspect

    assert "_progress" not in str(inspect.signature(memarray.move_many))
    assert "_progress" not in str(inspect.signature(memarray.MemArray.save))


def test_dev_sh_help_lists_every_command():
    r = run_command(["bash", os.path.join(ROOT, "dev.sh"), "help"], timeout=60)
    for cmd in ("demo", "test", "lint", "doc", "wheel", "bench", "venv"):
        assert f"./dev.sh {cmd}" in r.stdout, r.stdout


def test_mpi_tuning_constants_reach_every_part_of_the_module():
    pytest.importorskip("mpi4py")
    import memarray.mpi as mm
    from memarray.cluster.mpi import _buffers as _mpi_buffers
    from memarray.cluster.mpi import _p2p as _mpi_p2p

    before = mm.PIPELINE_FROM, mm.CHUNK
    try:
        mm.PIPELINE_FROM, mm.CHUNK = 1 << 62, 1 << 20
        assert (_mpi_buffers.PIPELINE_FROM, _mpi_buffers.CHUNK) == (1 << 62, 1 << 20)
        assert _mpi_buffers._pieces(3 << 20) == [
            (0, 1 << 20),
            (1 << 20, 1 << 20),
            (2 << 20, 1 << 20),
        ]
        head = _mpi_p2p._header(5 << 20)
        assert _mpi_p2p._read_header(head) == (5 << 20, 1 << 20)
    finally:
        mm.PIPELINE_FROM, mm.CHUNK = before
    assert mm.TruncateError.__module__ == "memarray.mpi" and issubclass(
        mm.TruncateError, ValueError
    )
