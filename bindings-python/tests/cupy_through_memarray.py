"""A pytest plugin (`-p cupy_through_memarray`) that makes memarray CuPy's allocator before
any test runs: CuPy's own test files run through memarray this way, beside a run of the
same files on CuPy's own pool (scripts/gpu-remote.sh, stage `cupy-tests`)."""

from __future__ import annotations


def pytest_configure(config):  # noqa: ARG001 - pytest's hook signature
    import cupy

    import memarray

    cupy.cuda.set_allocator(memarray.cupy_allocator)
    assert cupy.cuda.get_allocator() is memarray.cupy_allocator
