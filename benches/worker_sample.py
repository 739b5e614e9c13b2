"""What ``memarray.dask.setup(client, dashboard=True)`` costs a worker: one sample of
memarray's figures (the metric each heartbeat carries: per device the monitor's frame,
the budgets, the pressure counters), median of ``--rounds`` samples of 1,000. Host memory
where there is no CUDA device, every device otherwise.

    python3 benches/worker_sample.py [--rounds 9] [--json out.json]

Target: at most 25 us a sample; a miss prints MISS and exits 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from memarray import resources as mr
from memarray.cluster.dask._dashboard import worker_sample


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--json")
    args = ap.parse_args()
    held = [mr.Host().allocate(1 << 20, source=s) for s in ("memarray", "torch", "cupy")]
    sample = worker_sample()
    runs = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        for _ in range(1000):
            worker_sample()
        runs.append((time.perf_counter() - t0) / 1000)
    us = statistics.median(runs) * 1e6
    where = ", ".join(f["label"] for f in sample["frames"])
    print(f"a Dask worker's memarray sample ({where}): {us:.1f} us (median of {args.rounds})")
    ok = us <= 25
    print(("ok" if ok else "MISS") + ": a worker sample within 25 us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sample_us": us, "frames": where}, f)
    del held
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
