"""A C++ extension built on memarray's C ABI returns arrays to Python through DLPack:
examples/cpp/memarray_ext.cpp is compiled here with the system's C++
compiler against libmemarray.so (MEMARRAY_C_LIB_DIR; `./dev.sh test` and the device run
set it) and imported in a child process, so a crash fails the test."""

from __future__ import annotations

import os
import pathlib
import shutil
import sysconfig

import pytest
from children import child_stdout, run_command

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _lib_dir() -> pathlib.Path:
    d = os.environ.get("MEMARRAY_C_LIB_DIR")
    if d and (pathlib.Path(d) / "libmemarray.so").exists():
        return pathlib.Path(d)
    if d:
        pytest.fail(f"MEMARRAY_C_LIB_DIR={d} has no libmemarray.so")
    for p in ("target/release", "target/debug"):
        if (ROOT / p / "libmemarray.so").exists():
            return ROOT / p
    pytest.skip("no libmemarray.so: run cargo build -p memarray-c (./dev.sh test does)")


@pytest.fixture(scope="module")
def ext_dir(tmp_path_factory) -> pathlib.Path:
    lib = _lib_dir()
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    out = tmp_path_factory.mktemp("ext")
    target = out / f"memarray_ext{sysconfig.get_config_var('EXT_SUFFIX')}"
    cmd = [
        cxx,
        "-std=c++17",
        "-O1",
        "-shared",
        "-fPIC",
        "-Wall",
        "-Werror",
        f"-I{sysconfig.get_paths()['include']}",
        f"-I{ROOT / 'crates/memarray-c/include'}",
        f"-I{ROOT / 'kernels-cuda/include'}",
        str(ROOT / "examples/cpp/memarray_ext.cpp"),
        f"-L{lib}",
        "-lmemarray",
        f"-Wl,-rpath,{lib}",
        "-o",
        str(target),
    ]
    r = run_command(cmd, timeout=300)
    assert r.returncode == 0, r.stderr
    return out


def test_an_extension_returns_a_host_array_numpy_reads(ext_dir):
    out = child_stdout(
        f"""
        import sys; sys.path.insert(0, {str(ext_dir)!r})
        import numpy as np, memarray, memarray_ext
        cap = memarray_ext.ramp(7)
        a = memarray.from_dlpack(cap)
        assert a.shape == (7,) and a.dtype == np.float32, (a.shape, a.dtype)
        n = np.from_dlpack(a)
        np.testing.assert_array_equal(n, np.arange(7, dtype=np.float32) * 0.5)
        # Zero-copy: the NumPy view and the MemArray share the extension's memory.
        n[0] = 9.0
        assert a[0] == 9.0
        del cap, a, n
        # A capsule nobody consumed is freed by its destructor, and errors are Python's.
        memarray_ext.ramp(3)
        try:
            memarray_ext.ramp(-1)
        except ValueError as e:
            print("refused:", e)
        print("ok")
        """
    )
    assert "refused: n must be >= 0" in out and out.rstrip().endswith("ok")


@pytest.mark.gpu
def test_an_extension_returns_a_device_array_torch_reads(ext_dir):
    from test_interop import _peer

    _peer("torch")
    out = child_stdout(
        f"""
        import sys; sys.path.insert(0, {str(ext_dir)!r})
        import numpy as np, torch, memarray, memarray_ext
        a = memarray.from_dlpack(memarray_ext.ramp(1 << 20, 0))
        assert a.device == "cuda:0", a.device
        t = torch.from_dlpack(a)
        assert t.is_cuda and t.shape == (1 << 20,)
        want = torch.arange(1 << 20, dtype=torch.float32, device="cuda") * 0.5
        assert torch.equal(t, want)
        tail = np.float32([1048573, 1048574, 1048575]) * 0.5
        np.testing.assert_array_equal(a.to_numpy()[-3:], tail)
        print("ok")
        """
    )
    assert out.rstrip().endswith("ok")
