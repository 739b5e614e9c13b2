"""`.npy` save and load: readable by numpy.load, every dtype NumPy has, bad
files refused with typed errors."""

from __future__ import annotations

import errno

import numpy as np
import pytest

import memarray
from conftest import DTYPES, SHAPES, init_array
from memarray import dlpack

NP_DTYPES = [d for d in DTYPES if d != "bfloat16"]


@pytest.mark.parametrize("dtype", NP_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_save_is_numpy_readable_and_load_round_trips(tmp_path, shape, dtype):
    a = memarray.MemArray(shape, dtype)
    a.read_numpy_array(init_array(shape, dtype))
    path = tmp_path / "a.npy"
    a.save(path)
    np.testing.assert_array_equal(np.load(path), init_array(shape, dtype))
    b = memarray.load(path)
    assert b.shape == shape and b.dtype == np.dtype(dtype) and b.device == "cpu"
    np.testing.assert_array_equal(b.to_numpy(), init_array(shape, dtype))


@pytest.mark.parametrize("dtype", NP_DTYPES)
def test_load_numpy_written_files(tmp_path, dtype):
    x = init_array((3, 5, 2), dtype)
    np.save(tmp_path / "x.npy", x)
    np.testing.assert_array_equal(memarray.load(str(tmp_path / "x.npy")).to_numpy(), x)


def test_bad_files_are_typed_errors(tmp_path):
    # As `open` raises: FileNotFoundError with its errno and path.
    with pytest.raises(FileNotFoundError) as e:
        memarray.load(tmp_path / "missing.npy")
    assert e.value.errno == errno.ENOENT and e.value.filename == str(tmp_path / "missing.npy")
    (tmp_path / "junk.npy").write_bytes(b"not an npy file at all")
    with pytest.raises(ValueError, match="npy"):
        memarray.load(tmp_path / "junk.npy")
    np.save(tmp_path / "short.npy", np.arange(1000.0))
    data = (tmp_path / "short.npy").read_bytes()
    (tmp_path / "short.npy").write_bytes(data[:-8])
    with pytest.raises(ValueError, match="8000 bytes of data"):
        memarray.load(tmp_path / "short.npy")
    np.save(tmp_path / "long.npy", np.ones(3, dtype=np.longdouble))
    with pytest.raises(ValueError, match='dtype "<f16" is not one memarray holds'):
        memarray.load(tmp_path / "long.npy")
    np.save(tmp_path / "obj.npy", np.array([1, "x"], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError):
        memarray.load(tmp_path / "obj.npy")
    with pytest.raises(OSError):
        memarray.MemArray([2]).save(tmp_path / "no-such-dir" / "a.npy")
    with pytest.raises(ValueError):
        memarray.load(tmp_path / "junk.npy", device="tpu")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_fortran_order_and_big_endian_files_load_as_numpy_loads(tmp_path, device):
    rng = np.random.default_rng(26)
    cases = [
        np.asfortranarray(np.arange(6.0).reshape(2, 3)),
        np.asfortranarray(rng.integers(-99, 99, (3, 4, 5), dtype=np.int16)),
        np.arange(4, dtype=">f8"),
        np.asfortranarray(np.arange(24, dtype=">i4").reshape(2, 3, 4)),
        np.asfortranarray((rng.random((5, 3)) + 1j * rng.random((5, 3))).astype(">c8")),
        np.asfortranarray(rng.random((7, 1, 3)) > 0.5),
        np.asfortranarray(np.zeros((0, 3), ">u2")),
    ]
    for i, x in enumerate(cases):
        p = tmp_path / f"c{i}.npy"
        np.save(p, x)
        want = np.load(p)
        got = memarray.load(p, device=device)
        assert got.shape == want.shape and got.dtype == want.dtype.newbyteorder("=")
        np.testing.assert_array_equal(got.to_numpy(), want)


def test_locked_array_refuses_to_save(tmp_path):
    a = memarray.MemArray([2])
    with a.get_dlpack():
        with pytest.raises(memarray.LockError):
            a.save(tmp_path / "a.npy")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", NP_DTYPES)
def test_load_onto_the_device_and_save_from_it(tmp_path, dtype):
    x = init_array((1000, 3), dtype)
    np.save(tmp_path / "x.npy", x)
    a = memarray.load(tmp_path / "x.npy", device="cuda")
    assert a.device == "cuda:0" and not a.has_host_copy
    np.testing.assert_array_equal(a.to_numpy(), x)
    a.save(tmp_path / "y.npy")
    assert a.device == "cuda:0"
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), x)
    a.move_memory(dlpack.kDLCPU)
    np.testing.assert_array_equal(a.to_numpy(), x)


@pytest.mark.gpu
def test_large_load_onto_the_device_reads_through_the_staged_pipeline(tmp_path):
    # Past the direct threshold and not a multiple of any chunk: every lane, a short tail.
    x = (np.arange((40 << 20) // 8 + 12345) * 3).astype(np.float64)
    np.save(tmp_path / "x.npy", x)
    a = memarray.load(tmp_path / "x.npy", device="cuda")
    assert a.device == "cuda:0" and not a.has_host_copy
    np.testing.assert_array_equal(a.to_numpy(), x)
    # A file shorter than its header says is refused before anything is read.
    with open(tmp_path / "x.npy", "r+b") as f:
        f.truncate(1 << 20)
    with pytest.raises(ValueError, match="holds"):
        memarray.load(tmp_path / "x.npy", device="cuda")


def test_long_loads_and_saves_show_a_bar_only_when_asked_or_interactive(tmp_path, capsys):
    pytest.importorskip("tqdm")
    import memarray._progress as progress

    path = tmp_path / "big.npy"
    np.save(path, np.arange(1 << 24, dtype=np.float32))  # 64 MiB: large enough for a bar
    saved = progress.AFTER
    progress.AFTER = 0.0  # show at once: the test need not take a second
    try:
        memarray.set_progress(True)
        a = memarray.load(path)
        a.save(tmp_path / "again.npy")
        err = capsys.readouterr().err
        assert "load big.npy" in err and "save again.npy" in err and "100%" in err, err
        memarray.set_progress(None)  # pytest's output is not interactive: no bar
        b = memarray.load(path)
        b.save(tmp_path / "quiet.npy")
        assert capsys.readouterr().err == ""
        memarray.set_progress(False)
        assert not progress.wanted(1 << 40)
    finally:
        progress.AFTER = saved
        memarray.set_progress(None)
    assert np.array_equal(np.load(tmp_path / "again.npy"), np.load(path))
    assert b.to_numpy()[-1] == (1 << 24) - 1
    with pytest.raises(TypeError):
        memarray.set_progress("yes")
    with pytest.raises(FileNotFoundError):
        memarray.load(tmp_path / "missing.npy")
