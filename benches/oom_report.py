"""What an out-of-memory error costs the caller: the time from the failing call to the
``memarray.OutOfMemoryError`` with its ``report`` built (who holds what, from counters: no
device work, no sync). Host memory over a ``Limiting`` resource, so no GPU is needed; on a
GPU machine ``--device 0`` makes the
failing call a device allocation past a budget, whose report includes the monitor's frame
of the device (the driver's figures, the libraries' own allocators).

    python3 benches/oom_report.py [--rounds 201] [--device N] [--json out.json]

Median of ``--rounds`` raises. Target: the report built within 1 ms; a miss prints MISS and
exits 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import memarray
from memarray import resources as mr


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=201)
    ap.add_argument("--device", type=int, default=None)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.device is None:
        small = mr.Limiting(mr.Host(), 1 << 20)
        kept = small.allocate(768 << 10, source="torch")

        def fail() -> None:
            small.allocate(1 << 20)

        where = "host memory (Limiting 1 MiB)"
    else:
        mr.set_budget("memarray", "1MiB", device=args.device)
        kept = memarray.zeros((1 << 18,), "float32", device=f"cuda:{args.device}")

        def fail() -> None:
            memarray.zeros((1 << 20,), "float32", device=f"cuda:{args.device}")

        where = f"cuda:{args.device} (memarray's budget 1 MiB)"
    raises: list[float] = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        try:
            fail()
        except memarray.OutOfMemoryError as e:
            report = e.report
        raises.append(time.perf_counter() - t0)
    assert report["advice"], report.to_dict()
    us = statistics.median(raises) * 1e6
    print(f"an out-of-memory error with its report, {where}: median {us:.1f} us of {args.rounds}")
    print(str(report).splitlines()[0])
    ok = us <= 1000
    print(("ok" if ok else "MISS") + ": the report built within 1 ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"report_us": us, "where": where}, f)
    del kept
    if args.device is not None:
        mr.set_budget("memarray", None, device=args.device)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
