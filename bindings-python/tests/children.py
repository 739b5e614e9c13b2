"""Running test code in a fresh interpreter, so a crash fails the test instead of ending
the run (shared by the test modules that need it)."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import textwrap

HERE = pathlib.Path(__file__).parent


def run_command(
    args, *, timeout: float, env=None, cwd=None, text=True
) -> subprocess.CompletedProcess:
    """`subprocess.run(args, capture_output=True, timeout=timeout)` for a command that may
    start processes of its own (MPI's ranks, Ray's and Dask's daemons, a browser).

    The command runs in a session of its own with its output going to files, and when it
    ends, or its time is up, every process left in that session is killed. subprocess.run
    kills only the child: what the child started runs on, taking the cores the rest of the
    run needs, and while it holds the pipes open a command that ended is waited for until
    its timeout and reported as timed out. A timeout raises subprocess.TimeoutExpired
    carrying what the command printed."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(args, stdout=out, stderr=err, env=env, cwd=cwd, start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # the session ended with the command
            p.wait()

        def read(f):
            f.seek(0)
            data = f.read()
            return data.decode(errors="replace") if text else data

        stdout, stderr = read(out), read(err)
    if rc is None:
        raise subprocess.TimeoutExpired(args, timeout, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(args, rc, stdout, stderr)


def run_child(code: str, env=None, timeout=120) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (with the tests directory importable); the
    caller asserts on the result. A signal shows as a negative return code."""
    e = dict(os.environ if env is None else env)
    e["PYTHONPATH"] = str(HERE) + os.pathsep + e.get("PYTHONPATH", "")
    return run_command([sys.executable, "-c", textwrap.dedent(code)], timeout=timeout, env=e)


def assert_clean(r: subprocess.CompletedProcess):
    assert r.returncode == 0, f"rc {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr[-3000:]}"
    assert "PanicException" not in r.stderr + r.stdout


def child_stdout(code: str, timeout: int = 300, env: dict | None = None) -> str:
    """Runs `code` in a fresh interpreter with `env` added to the environment; its stdout,
    or the test fails showing both streams."""
    r = run_child(code, env=dict(os.environ, **(env or {})), timeout=timeout)
    assert_clean(r)
    return r.stdout
