"""Users' kernels on MemArrays: memarray.cuda.Module / Function / In / Out.
GPU tests launch on streams other than the arrays' and read the results from torch on a
third stream with no manual event; bad input is refused with messages naming it."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest
from children import assert_clean, run_child
from test_interop import _peer

import memarray
import memarray.cuda as mc

ROOT = pathlib.Path(__file__).resolve().parents[2]
PTX = (ROOT / "crates/memarray-seed/src/ptx/add_index_f32.ptx").read_bytes()
INCLUDE = str(ROOT / "kernels-cuda/include")

# y = a * x + y over 1-d float32 arrays, with the Indexer of memarray/indexer.cuh.
AXPY = r"""
#include <memarray/indexer.cuh>
extern "C" __global__ void axpy(memarray::Indexer<1> y, memarray::Indexer<1> x, float a) {
    float* yd = static_cast<float*>(y.data);
    const float* xd = static_cast<const float*>(x.data);
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < y.len();
         i += (uint64_t)gridDim.x * blockDim.x)
        yd[i] = a * xd[i] + yd[i];
}
"""


def test_in_and_out_take_memarrays_only():
    a = memarray.asarray(np.zeros(3, np.float32))
    assert mc.In(a).array is a and mc.Out(a).array is a
    for bad in (3, np.zeros(3), "a"):
        with pytest.raises(TypeError, match="In takes MemArrays"):
            mc.In(bad)
        with pytest.raises(TypeError, match="Out takes MemArrays"):
            mc.Out(bad)


def test_modules_need_a_device():
    if mc.is_available():
        pytest.skip("checks the error without a CUDA device")
    with pytest.raises(memarray.CudaUnavailableError):
        mc.Module(PTX)
    with pytest.raises(TypeError, match="PTX text"):
        mc.Module(3)


def _axpy():
    try:
        module = mc.Module.from_source(AXPY, "axpy.cu", [f"-I{INCLUDE}"])
    except memarray.CudaUnavailableError as e:
        if os.environ.get("MEMARRAY_REQUIRE_NVRTC") == "1":
            raise
        pytest.skip(f"no NVRTC: {e}")
    return module.function("axpy")


@pytest.mark.gpu
def test_a_kernel_from_ptx_runs_on_a_memarray():
    f = mc.Module(PTX).function("add_index_f32_n2")
    assert f.name == "add_index_f32_n2" and f.param_sizes == [24]
    grid, block = f.config_for(1000)
    assert block[0] >= 32 and grid[0] >= 1 and grid[1:] == (1, 1) and block[1:] == (1, 1)
    x = np.arange(35, dtype=np.float32).reshape(5, 7)
    a = memarray.asarray(x)
    f.launch(a)  # a host array: moved to the device by the launch
    assert a.device == "cuda:0"
    want = x + np.indices(x.shape).sum(axis=0)
    np.testing.assert_array_equal(a.to_numpy(), want)
    # An explicit grid of one block of 32 threads loops over every element.
    f.launch(a, grid=1, block=(32, 1, 1))
    np.testing.assert_array_equal(a.to_numpy(), want + np.indices(x.shape).sum(axis=0))


@pytest.mark.gpu
def test_launches_on_other_streams_are_read_by_torch_on_a_third_without_events():
    _peer("torch")
    import torch

    f = _axpy()
    n = 1 << 22
    x = memarray.asarray(np.arange(n, dtype=np.float32), device="cuda")
    y = memarray.zeros(n, "float32", device="cuda")
    s1, s2 = mc.Stream(), mc.Stream()
    for k in range(3):
        # s1 and s2 alternate; each launch waits on the previous one's write of y.
        f.launch(y, mc.In(x), np.float32(k + 1), stream=s1 if k % 2 == 0 else s2)
    s3 = torch.cuda.Stream()
    with torch.cuda.stream(s3):
        t = torch.from_dlpack(y)  # __dlpack__(stream=s3): s3 waits on y's launches
        got = (t * 1).cpu().numpy()
    np.testing.assert_array_equal(got, np.arange(n, dtype=np.float32) * 6)
    # x was only read: it stays where it was, and a later write to it waits for the reads.
    assert x.device == "cuda:0"


@pytest.mark.gpu
def test_one_array_in_two_parameters_is_locked_once():
    f = _axpy()
    y = memarray.asarray(np.arange(1000, dtype=np.float32))
    f.launch(y, mc.In(y), np.float32(2))  # y = 2y + y
    np.testing.assert_array_equal(y.to_numpy(), np.arange(1000, dtype=np.float32) * 3)


@pytest.mark.gpu
def test_bad_launches_are_refused_and_nothing_moves():
    f = _axpy()
    y = memarray.asarray(np.zeros(10, np.float32))
    x2 = memarray.asarray(np.zeros((2, 5), np.float32))
    cases = [
        ((y, mc.In(y)), {}, ValueError, "takes 3 parameters, 2 given"),
        ((y, mc.In(x2), np.float32(1)), {}, ValueError, "parameter 1 is 16 bytes"),
        ((y, mc.In(y), np.float64(1)), {}, ValueError, "parameter 2 is 4 bytes"),
        ((y, mc.In(y), 1.0), {}, TypeError, "Python ints and floats have no C type"),
        ((y, mc.In(y), np.float32(1)), {"grid": 0, "block": 32}, ValueError, "at least 1"),
        ((y, mc.In(y), np.float32(1)), {"grid": 4}, ValueError, "grid and block"),
        ((y, mc.In(y), np.float32(1)), {"grid": (1, 1, 1, 1), "block": 1}, ValueError, "1 to 3"),
    ]
    for args, kw, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            f.launch(*args, **kw)
        assert y.device == "cpu", (args, kw)
    with y.get_dlpack(memarray.dlpack.kDLCPU):  # locked while the export is held
        with pytest.raises(memarray.LockError):
            f.launch(y, mc.In(y), np.float32(1))
    with pytest.raises(ValueError, match="no_such"):
        mc.Module(PTX).function("no_such")
    with pytest.raises(ValueError, match="bad.cu does not compile"):
        mc.Module.from_source("this is not C++", "bad.cu")
    for image in (b"", b"x", "not ptx"):
        with pytest.raises(ValueError, match="kernel module"):
            mc.Module(image)


@pytest.mark.gpu
def test_a_missing_nvrtc_is_a_clear_error():
    r = run_child(
        """
        import memarray, memarray.cuda as mc
        try:
            mc.Module.from_source('extern "C" __global__ void k() {}')
        except memarray.CudaUnavailableError as e:
            print("refused:", e)
        """,
        env=dict(os.environ, MEMARRAY_NVRTC_LIBRARY="/nonexistent/libnvrtc.so"),
    )
    assert_clean(r)
    assert "refused:" in r.stdout and "/nonexistent/libnvrtc.so" in r.stdout, r.stdout


# One thread per element, no loop: what a newcomer writes first.
EACH = r"""
#include <memarray/indexer.cuh>
extern "C" __global__ void mark(memarray::Indexer<1> o) {
    uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
    if (i < o.len()) static_cast<unsigned char*>(o.data)[i] = 1;
}
"""


@pytest.mark.gpu
def test_the_default_launch_covers_every_element():
    try:
        f = mc.Module.from_source(EACH, "mark.cu", [f"-I{INCLUDE}"]).function("mark")
    except memarray.CudaUnavailableError as e:
        if os.environ.get("MEMARRAY_REQUIRE_NVRTC") == "1":
            raise
        pytest.skip(f"no NVRTC: {e}")
    n = 2_100_000
    grid, block = f.config_for(n)
    assert grid[0] * block[0] >= n
    sgrid, sblock = f.config_grid_stride(n)
    assert sgrid[0] <= grid[0] and sblock == block
    a = memarray.zeros((n,), "uint8", device="cuda")
    f.launch(a)  # no grid: one thread per element of the largest array
    touched = int(a.to_numpy().sum())
    assert touched == n, f"{touched} of {n} elements touched"
