"""scripts/pytest_isolated.py, which runs CuPy's CUDA-graph test files one test per
process on the GPU machine (remote.sh `cupy-tests`): a test that kills its process is
counted as crashed and the run goes on; passes, failures and skips are told apart."""

from __future__ import annotations

import pathlib
import sys

import pytest
from children import run_command

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "pytest_isolated.py"

SAMPLE = """
import os, signal, pytest
def test_ok(): pass
def test_bad(): assert False
@pytest.mark.skip(reason="not here")
def test_skip(): pass
@pytest.mark.parametrize("k", [1, 2])
def test_crash(k):
    if k == 2:
        os.kill(os.getpid(), signal.SIGSEGV)
def test_slow():
    import time
    time.sleep(30)
"""


@pytest.mark.parametrize("jobs", [1, 3])
def test_each_test_runs_alone_and_a_crash_is_counted(tmp_path, jobs):
    f = tmp_path / "test_sample.py"
    f.write_text(SAMPLE)
    r = run_command(
        [sys.executable, str(SCRIPT), str(f), "--timeout", "8", "--jobs", str(jobs)],
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "2 passed, 1 failed, 1 skipped, 1 crashed, 1 timed out", r.stdout
    assert f"failed: {f}::test_bad" in lines
    assert f"crashed: {f}::test_crash[2]" in lines
    assert f"timed out: {f}::test_slow" in lines


def test_a_file_with_no_tests_is_exit_2(tmp_path):
    f = tmp_path / "test_empty.py"
    f.write_text("x = 1\n")
    r = run_command([sys.executable, str(SCRIPT), str(f)], timeout=120)
    assert r.returncode == 2 and "nothing collected" in r.stdout
