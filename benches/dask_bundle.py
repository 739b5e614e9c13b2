"""Many small arrays worker to worker through Dask: a list of MemArrays against one
``memarray.Bundle`` of them, in the same cluster, taking turns.

    python3 benches/dask_bundle.py [--count 1000] [--kib 4] [--device cpu|cuda]
                                   [--reps 9] [--json out.json]

Two worker processes over TCP; the arrays are made on one (a list, or a Bundle of the
same arrays) and used on the other, which sums every array (NumPy on the host; on a
device CuPy zero-copy through the CUDA Array Interface, or memarray's own sum without
CuPy). Rows: the median seconds from the consumer's submission to its result, and the
receiver's own record of the fetch (the read and the deserialisation). A list travels as
one frame per array; a Bundle as its pack's one frame and its table. The first round is
not counted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any


def make(kind: str, count: int, n: int, device: str) -> Any:
    import numpy as np

    import memarray

    arrays = [memarray.asarray(np.full(n, 1.5, np.float32), device=device) for _ in range(count)]
    return memarray.Bundle(arrays) if kind == "bundle" else arrays


def consume(arrays: Any) -> float:
    """The receiver's work, the same for both kinds: each array's sum where it lives."""
    import numpy as np

    total = 0.0
    for a in arrays:
        if a.on_device:
            try:
                import cupy

                total += float(cupy.asarray(a).sum())
            except ImportError:
                total += float(np.asarray(a.to_numpy()).sum())
        else:
            total += float(np.asarray(a).sum())
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--kib", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--json")
    args = ap.parse_args()
    try:
        from distributed import Client, LocalCluster, wait
    except ImportError as e:
        print(f"SKIPPED: Dask's distributed is not installed ({e})")
        return 0
    import memarray

    if args.device != "cpu" and not memarray.cuda.is_available():
        print(f"SKIPPED: no CUDA device ({memarray.cuda.unavailable_reason()})")
        return 0
    n = args.kib << 8  # float32 elements
    want = 1.5 * n * args.count
    kinds = ["list", "bundle"]
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        a, b = list(client.scheduler_info()["workers"])
        runs: dict[str, list[float]] = {k: [] for k in kinds}
        order: list[str] = []
        for i in range(args.reps + 1):
            for kind in kinds if i % 2 else kinds[::-1]:
                f = client.submit(make, kind, args.count, n, args.device, workers=[a], pure=False)
                wait(f)
                t0 = time.perf_counter()
                total = client.submit(consume, f, workers=[b], pure=False).result()
                if abs(total - want) > 1e-4 * want:
                    raise AssertionError(f"{kind}: the receiver summed {total}, not {want}")
                order.append(kind)
                if i:
                    runs[kind].append(time.perf_counter() - t0)
                del f
        log = client.run(
            lambda dask_worker: [t["duration"] for t in dask_worker.transfer_incoming_log],
            workers=[b],
        )[b]
    fetch = {k: [d for d, w in zip(log, order, strict=False) if w == k][1:] for k in kinds}
    if len(log) != len(order):
        fetch = {k: [] for k in kinds}
    rows = {
        k: {
            "end_to_end_ms": statistics.median(runs[k]) * 1e3,
            "fetch_ms": statistics.median(fetch[k]) * 1e3 if fetch[k] else float("nan"),
        }
        for k in kinds
    }
    print(
        f"{args.count} x {args.kib} KiB on {args.device}, worker to worker over TCP, "
        f"medians of {args.reps}:"
    )
    for k in kinds:
        r = rows[k]
        print(f"  {k:7} {r['end_to_end_ms']:8.2f} ms end to end, fetch {r['fetch_ms']:7.2f} ms")
    ratio = rows["bundle"]["end_to_end_ms"] / rows["list"]["end_to_end_ms"]
    print(f"  a Bundle takes {ratio:.2f}x the list's time")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"count": args.count, "kib": args.kib, "device": args.device, **rows}, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
