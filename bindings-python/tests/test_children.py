"""children.run_command: a command that leaves processes of its own behind (MPI's ranks, Ray's
and Dask's daemons) neither holds the test past its end nor past its timeout, and what it
leaves is killed."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from children import run_command

# Prints, starts a grandchild that sleeps holding the same stdout and stderr, prints its
# pid, then sleeps for `wait` seconds itself.
PARENT = """
import subprocess, sys, time
print("started", flush=True)
g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(g.pid, flush=True)
time.sleep(float(sys.argv[1]))
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A killed child of an exited parent is a zombie until init reaps it: dead all the same.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def test_a_command_that_leaves_a_process_holding_its_output_returns_when_it_ends():
    t = time.monotonic()
    r = run_command([sys.executable, "-c", PARENT, "0"], timeout=120)
    took = time.monotonic() - t
    assert r.returncode == 0, r.stderr
    assert took < 60, f"waited {took:.1f} s for the grandchild"
    lines = r.stdout.split()
    assert lines[0] == "started"
    assert _gone(int(lines[1])), "the grandchild outlived the command"


def test_a_timeout_kills_the_command_and_what_it_started_and_keeps_its_output():
    t = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as e:
        run_command([sys.executable, "-c", PARENT, "600"], timeout=3)
    took = time.monotonic() - t
    assert took < 60, f"the timeout of 3 s took {took:.1f} s"
    lines = e.value.output.split()
    assert lines[0] == "started"
    assert _gone(int(lines[1])), "the grandchild outlived the timeout"
