"""The crash-proof suite: adversarial cases run in subprocesses
(``crash_cases.py``), so a signal or a Rust panic fails a test instead of ending the
run. Each group reports its case count; the total goes to ``target/crashproof.txt``,
which ``./dev.sh test`` prints after pytest's summary."""

from __future__ import annotations

import os
import pathlib
import sys

import pytest
from children import run_command

HERE = pathlib.Path(__file__).parent
SUMMARY = HERE.parents[1] / "target" / "crashproof.txt"
COUNTS: dict[str, int] = {}


@pytest.mark.parametrize("group", ["dlpack", "subclasses", "files", "pickles"])
def test_adversarial_group_never_crashes(group):
    env = dict(os.environ, PYTHONPATH=str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = run_command(
        [sys.executable, str(HERE / "crash_cases.py"), group],
        timeout=600,
        env=env,
    )
    last = r.stderr.strip().splitlines()[-3:]
    assert r.returncode == 0, (
        f"group {group} ended with {r.returncode} (negative: killed by signal "
        f"{-r.returncode}); last cases: {last}; stdout: {r.stdout[-2000:]}"
    )
    assert "PanicException" not in r.stdout + r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("CASES ")]
    assert lines, r.stdout[-2000:]
    COUNTS[group] = int(lines[-1].split()[1])
    assert COUNTS[group] > 0
    SUMMARY.parent.mkdir(exist_ok=True)
    SUMMARY.write_text(
        "crash-proof suite: "
        + ", ".join(f"{g} {n}" for g, n in sorted(COUNTS.items()))
        + f"; {sum(COUNTS.values())} cases in {len(COUNTS)} subprocesses, no crash\n"
    )
