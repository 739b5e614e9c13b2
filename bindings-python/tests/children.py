"""Running test code in a fresh interpreter, so a crash fails the test instead of ending
the run (shared by the test modules that need it)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

HERE = pathlib.Path(__file__).parent


def run_child(code: str, env=None, timeout=120) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (with the tests directory importable); the
    caller asserts on the result. A signal shows as a negative return code."""
    e = dict(os.environ if env is None else env)
    e["PYTHONPATH"] = str(HERE) + os.pathsep + e.get("PYTHONPATH", "")
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=e,
    )
    return r


def assert_clean(r: subprocess.CompletedProcess):
    assert r.returncode == 0, f"rc {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr[-3000:]}"
    assert "PanicException" not in r.stderr + r.stdout


def child_stdout(code: str, timeout: int = 300, env: dict | None = None) -> str:
    """Runs `code` in a fresh interpreter with `env` added to the environment; its stdout,
    or the test fails showing both streams."""
    r = run_child(code, env=dict(os.environ, **(env or {})), timeout=timeout)
    assert_clean(r)
    return r.stdout
