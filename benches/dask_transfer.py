"""Dask figures: a 256 MiB device array through Dask, memarray against CuPy in the same run.

    python3 benches/dask_transfer.py [--mib 256] [--protocol tcp|ucxx] [--gpus N] [--json out.json]

In one process: ``dask.sizeof``, ``dask.base.tokenize`` (warm: after a first call), the
``"dask"`` and ``"cuda"`` serializer families (serialise + deserialise, one call each as
Dask makes them), generic pickle (protocol 5 with out-of-band buffers). Then a cluster of
two worker processes over ``--protocol`` (``ucxx``: distributed-ucxx): the array made on one
worker and summed on the other's GPU by CuPy, zero-copy, for both libraries (median of
``--reps``, memarray and CuPy taking turns in one cluster; beside it the receiver's own
record of each fetch). With ``--gpus 2`` (the default where two GPUs
are visible) each worker has a GPU of its own (``CUDA_VISIBLE_DEVICES`` rotated, as
dask-cuda does), ``--gpus 1`` both share GPU 0, ``--gpus 0`` both see every GPU (a plain
LocalCluster's placement: each library picks its own device). Prints SKIPPED without a
GPU, CuPy or Dask.
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import sys
import time
from typing import Any


def timed(f: Any, repeats: int = 5) -> float:
    """Median seconds of `repeats` calls (after one warm-up)."""
    f()
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def make(lib: str, n: int) -> Any:
    import cupy

    import memarray

    if lib == "memarray":
        return memarray.full((n,), 1.5, "float32", device="cuda")
    return cupy.full((n,), 1.5, cupy.float32)


def consume(x: Any) -> float:
    """What the receiving worker does with the array, the same for both libraries: its sum
    on the GPU by CuPy, zero-copy (``cupy.asarray`` takes a MemArray through the CUDA Array
    Interface and a CuPy array as it is); ``float`` waits for the result."""
    import cupy

    return float(cupy.asarray(x).sum())


def worker_to_worker(
    libs: list[str], n: int, protocol: str, gpus: int, reps: int
) -> dict[str, tuple[float, float]]:
    """Per library: median seconds of `reps` hand-offs (the array made on one worker, used
    on the other) and of the receiver's own record of each fetch. The libraries take
    turns round by round in one cluster, after a first round that is not counted."""
    from distributed import Client, Nanny, Scheduler, SpecCluster, wait

    def env(i: int) -> dict[str, str]:
        if gpus == 0:
            return {}
        order = list(range(gpus))
        return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, order[i % gpus :] + order[: i % gpus]))}

    workers = {i: {"cls": Nanny, "options": {"nthreads": 1, "env": env(i)}} for i in range(2)}
    scheduler = {"cls": Scheduler, "options": {"protocol": protocol, "dashboard_address": None}}
    with (
        SpecCluster(workers=workers, scheduler=scheduler) as cluster,
        Client(cluster) as client,
    ):
        a, b = list(client.scheduler_info()["workers"])
        runs: dict[str, list[float]] = {lib: [] for lib in libs}
        order: list[str] = []
        for i in range(reps + 1):
            for lib in libs:
                f = client.submit(make, lib, n, workers=[a], pure=False)
                wait(f)
                t0 = time.perf_counter()
                g = client.submit(consume, f, workers=[b], pure=False)
                total = g.result()
                if abs(total - 1.5 * n) > 1e-4 * 1.5 * n:  # float32 sums round
                    raise AssertionError(f"{lib}: the receiver summed {total}, not {1.5 * n}")
                order.append(lib)
                if i:
                    runs[lib].append(time.perf_counter() - t0)
                del f, g
        # The receiving worker's own record of each fetch (the comm's read and the
        # deserialisation, without the scheduler's round trips), in hand-off order.
        log = client.run(
            lambda dask_worker: [t["duration"] for t in dask_worker.transfer_incoming_log],
            workers=[b],
        )[b]
        if len(log) != len(order):
            print(
                f"the receiver logged {len(log)} fetches for {len(order)} hand-offs: no fetch times"
            )
            log = []
        out = {}
        for lib in libs:
            fetches = [
                d
                for k, (d, who) in enumerate(zip(log, order, strict=False))
                if who == lib and k >= len(libs)
            ]
            out[lib] = (
                statistics.median(runs[lib]),
                statistics.median(fetches) if fetches else float("nan"),
            )
        return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--protocol", default="tcp", choices=["tcp", "ucxx"])
    ap.add_argument("--gpus", type=int, default=None, help="GPUs the two workers use (1 or 2)")
    ap.add_argument("--reps", type=int, default=9, help="hand-offs per library, worker to worker")
    ap.add_argument("--json")
    args = ap.parse_args()
    try:
        import cupy  # noqa: F401
        import dask  # noqa: F401
        import distributed  # noqa: F401
    except ImportError as e:
        print(f"SKIPPED: {e.name} is not installed")
        return 0
    import memarray

    if not memarray.cuda.is_available():
        print(f"SKIPPED: no CUDA device ({memarray.cuda.unavailable_reason()})")
        return 0
    gpus = min(2, memarray.cuda.device_count() if args.gpus is None else args.gpus)
    from dask.base import tokenize
    from dask.sizeof import sizeof
    from distributed.protocol import deserialize, serialize

    n = args.mib * (1 << 20) // 4
    res: dict[str, dict[str, float]] = {}
    for lib in ("memarray", "cupy"):
        x = make(lib, n)
        r = res[lib] = {}
        r["sizeof_bytes"] = float(sizeof(x))
        r["tokenize_ms"] = timed(lambda x=x: tokenize(x)) * 1e3
        for fam in ("dask", "cuda"):
            r[f"{fam}_ms"] = (
                timed(lambda x=x, fam=fam: deserialize(*serialize(x, serializers=[fam]))) * 1e3
            )

        def pickled(x: Any = x) -> Any:
            bufs: list[Any] = []
            data = pickle.dumps(x, protocol=5, buffer_callback=bufs.append)
            return pickle.loads(data, buffers=bufs)

        r["pickle_ms"] = timed(pickled) * 1e3
        del x
    for lib, (total, fetch) in worker_to_worker(
        list(res), n, args.protocol, gpus, args.reps
    ).items():
        res[lib]["worker_to_worker_ms"], res[lib]["fetch_ms"] = total * 1e3, fetch * 1e3
    print(
        f"{args.mib} MiB float32 on the device; medians of 5 in one process, of {args.reps} "
        "worker to worker (the libraries taking turns; ms, sizeof in bytes); "
        f"workers over {args.protocol} on {gpus or 'every'} GPU(s)"
    )
    keys = list(res["memarray"])
    print(f"{'':24s} {'memarray':>12s} {'CuPy':>12s}")
    for k in keys:
        print(f"{k:24s} {res['memarray'][k]:12.2f} {res['cupy'][k]:12.2f}")
    gbs = args.mib * (1 << 20) / 1e9
    for lib in ("memarray", "cupy"):
        print(f"worker to worker {lib}: {gbs / (res[lib]['worker_to_worker_ms'] / 1e3):.2f} GB/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
