"""Shared fixtures. Tests marked ``gpu`` skip without a CUDA device, with the reason,
and fail instead when MEMARRAY_REQUIRE_GPU=1."""

from __future__ import annotations

import os

import numpy as np
import pytest

import memarray

REQUIRE_GPU = os.environ.get("MEMARRAY_REQUIRE_GPU") == "1"
REQUIRE_PEER = os.environ.get("MEMARRAY_REQUIRE_PEER") == "1"


def two_gpus(why: str = "needs 2 CUDA devices") -> None:
    """Skips a test on fewer than two GPUs, with the reason; fails it instead under
    MEMARRAY_REQUIRE_PEER=1 (the two-GPU stage)."""
    n = memarray.cuda.device_count()
    if n < 2:
        if REQUIRE_PEER:
            pytest.fail(f"MEMARRAY_REQUIRE_PEER=1 but this machine has {n} CUDA device(s)")
        pytest.skip(f"SKIPPED: {why}, this machine has {n}")


# Every dtype memarray supports, as NumPy dtypes (bfloat16 via ml_dtypes when present).
DTYPES = [d for d in memarray.SUPPORTED_DTYPES if d != "bfloat16"]
try:
    import ml_dtypes  # noqa: F401

    DTYPES.append("bfloat16")
except ImportError:
    pass

SHAPES = [(), (0,), (1,), (7,), (2, 4, 7), (3, 0, 2), (2, 3, 4, 5), (1,) * 9]


def pytest_report_header(config):
    if memarray.cuda.is_available():
        return f"memarray: {memarray.cuda.device_count()} CUDA device(s)"
    return f"memarray: no CUDA device: {memarray.cuda.unavailable_reason()}"


def pytest_collection_modifyitems(config, items):
    if memarray.cuda.is_available():
        return
    reason = f"SKIPPED: no CUDA device ({memarray.cuda.unavailable_reason()})"
    for item in items:
        if "gpu" in item.keywords:
            if REQUIRE_GPU:
                detail = memarray.cuda.unavailable_reason()
                raise pytest.UsageError(f"MEMARRAY_REQUIRE_GPU=1 but no CUDA device: {detail}")
            item.add_marker(pytest.mark.skip(reason=reason))


def init_array(shape, dtype):
    """Deterministic test data of `shape` and `dtype` (the seed's get_init_array)."""
    n = int(np.prod(shape, dtype=np.int64))
    base = (np.arange(n) % 13).reshape(shape)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return (base % 2).astype(dt)
    if dt.kind == "c":
        return (base + 1j * (base % 3)).astype(dt)
    return base.astype(dt)


def ref_add_index(arr):
    """NumPy reference for add_index_tuple: each element plus the sum of its indices,
    with the kernel's arithmetic (integers wrap, floats round once, bool is logical or)."""
    arr = np.array(arr)
    if arr.size == 0:
        return arr.copy()
    sums = np.indices(arr.shape).sum(axis=0) if arr.ndim else np.array(0)
    dt = arr.dtype
    if dt.kind == "b":
        return arr | (sums != 0)
    if dt.kind in "iu":
        return (arr.astype(np.int64) + sums).astype(dt)  # wraps like the kernel's cast
    if dt.kind == "c":
        real = np.float32 if dt == np.complex64 else np.float64
        out = arr.copy()
        out.real = (arr.real.astype(real) + sums.astype(real)).astype(real)
        return out
    if dt.itemsize == 2:  # float16 / bfloat16: computed in float32, rounded once
        return (arr.astype(np.float32) + sums.astype(np.float32)).astype(dt)
    return (arr + sums.astype(dt)).astype(dt)


def pytest_terminal_summary(terminalreporter):
    """Skips grouped by reason, each reason once (``-rs`` would list every location)."""
    import collections

    reasons = collections.Counter()
    for rep in terminalreporter.stats.get("skipped", []):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    if reasons:
        terminalreporter.section("skips by reason")
        for reason, n in reasons.most_common():
            terminalreporter.write_line(f"{n:5d}  {reason}")
