"""The GPU stage's verdict on a compute-sanitizer memcheck run (``memcheck_ok`` in
scripts/gpu-remote.sh): a run passes when the tool returned 0, or, on two GPUs or more,
when every error it counted is a warning about an NVTX memory call (the tool loses the
regions of memory whose device gains peer access) and the tests passed. Anything else
fails: a memory error beside the warnings, a failed test, a crash, one GPU."""

from __future__ import annotations

import os
import pathlib
import textwrap

import pytest
from children import run_command

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-remote.sh"

NVTX = (
    "========= Warning: Call to nvtxMemRegionsUnregister failed: "
    "One or more of the parameters is invalid"
)
OK = (
    "test result: ok. 14 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.34s"
)
FAILED = "test result: FAILED. 13 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out"


def function() -> str:
    """memcheck_ok's text, cut from the script (the script itself runs stages)."""
    lines = SCRIPT.read_text().splitlines()
    start = lines.index("memcheck_ok() {")
    end = lines.index("}", start)
    return "\n".join(lines[start : end + 1])


def verdict(tmp_path: pathlib.Path, log: list[str], rc: int, gpus: int) -> bool:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        textwrap.dedent(
            f"""\
            #!/bin/sh
            i=0
            while [ "$1" = -L ] && [ $i -lt {gpus} ]; do echo "GPU $i: H200"; i=$((i+1)); done
            exit 0
            """
        )
    )
    smi.chmod(0o755)
    path = tmp_path / "memcheck.log"
    path.write_text("\n".join(log) + "\n")
    script = f'{function()}\nmemcheck_ok "{path}" {rc}\n'
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    done = run_command(["bash", "-c", script], env=env, timeout=120)
    return done.returncode == 0


def summary(n: int) -> str:
    return f"========= ERROR SUMMARY: {n} error" + ("" if n == 1 else "s")


@pytest.mark.parametrize("gpus", [1, 2])
def test_a_clean_run_passes(tmp_path, gpus):
    assert verdict(tmp_path, [OK, summary(0)], 0, gpus)


def test_nvtx_warnings_alone_pass_on_two_gpus(tmp_path):
    assert verdict(tmp_path, [NVTX, NVTX, OK, summary(2)], 9, 2)


@pytest.mark.parametrize(
    "log, rc, gpus",
    [
        # One GPU: no peer access, so an NVTX warning is a real misuse.
        ([NVTX, NVTX, OK, summary(2)], 9, 1),
        # A memory error beside the warnings.
        ([NVTX, "========= Invalid __global__ write of size 4 bytes", OK, summary(2)], 9, 2),
        # A failed test.
        ([NVTX, FAILED, summary(1)], 9, 2),
        # The tool ended the process.
        ([NVTX, "========= Error: process didn't terminate successfully", OK, summary(1)], 9, 2),
        # Not the tool's error exit: the test binary's own.
        ([NVTX, OK, summary(1)], 101, 2),
        # No summary at all.
        ([NVTX, OK], 9, 2),
    ],
    ids=["one-gpu", "memory-error", "failed-test", "crash", "test-exit", "no-summary"],
)
def test_anything_else_fails(tmp_path, log, rc, gpus):
    assert not verdict(tmp_path, log, rc, gpus)
