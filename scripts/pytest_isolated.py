#!/usr/bin/env python3
"""Runs every test of a pytest file in a process of its own, so a test that kills its
process (a segfault inside a CUDA graph capture, say) is counted as crashed instead of
ending the run, and prints one summary line:

    N passed, M failed, K skipped, C crashed, T timed out

then the ids of the tests that did not pass or skip, one per line, with their outcome.

    python3 scripts/pytest_isolated.py FILE [--timeout S] [--jobs N] [-- PYTEST_ARGS...]

--jobs runs that many tests at once (each still in its own process; the start of a
process, CuPy's import and a CUDA context, is most of a test's time). PYTEST_ARGS
(`-p some_plugin`, say) go to the collection and to every run. Exits 0 when the file ran
(whatever its outcome), 2 when nothing could be collected.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

OUTCOMES = ("passed", "failed", "skipped", "crashed", "timed out")


def collect(path: str, extra: list[str]) -> list[str]:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            *extra,
            path,
        ],
        capture_output=True,
        text=True,
    )
    # Ids are relative to pytest's root directory: name the file as given instead.
    return [
        f"{path}::{line.strip().split('::', 1)[1]}"
        for line in r.stdout.splitlines()
        if "::" in line and not line.startswith(" ")
    ]


def outcome(test_id: str, extra: list[str], timeout: float) -> str:
    try:
        r = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra, test_id],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return "timed out"
    if r.returncode < 0:
        return "crashed"  # killed by a signal: SIGSEGV, SIGABRT
    tail = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    if r.returncode == 0:
        return "skipped" if " skipped" in tail and " passed" not in tail else "passed"
    if r.returncode == 1:
        return "failed"
    return "crashed" if r.returncode >= 128 else "failed"


def main() -> int:
    argv = sys.argv[1:]
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--jobs", type=int, default=1)
    args = ap.parse_args(argv)
    ids = collect(args.file, extra)
    if not ids:
        print(f"nothing collected from {args.file}")
        return 2
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        outcomes = pool.map(lambda test_id: outcome(test_id, extra, args.timeout), ids)
        results = dict(zip(ids, outcomes, strict=True))
    counts = {o: sum(1 for v in results.values() if v == o) for o in OUTCOMES}
    print(", ".join(f"{counts[o]} {o}" for o in OUTCOMES))
    for test_id, o in results.items():
        if o not in ("passed", "skipped"):
            print(f"{o}: {test_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
