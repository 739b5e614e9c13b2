"""IPC hand-off latency of a device array between two processes: memarray (IpcHandle with
its event, pickled through a multiprocessing pipe) vs torch (a CUDA tensor sent through the
same pipe with torch.multiprocessing's reducers, which also share an event).

    python3 benches/ipc_handoff.py [--mib 256] [--frames 60] [--json PATH]

Hand-off = from just before the producer exports (memarray: a.ipc_handle(); torch: the
pickling inside send) to the consumer holding an array over the memory (memarray:
from_ipc_handle; torch: the unpickled tensor). Two ring slots, reused after the consumer's
acknowledgement, so every frame after a slot's first is an open of a cached handle. The
producer queues a kernel on each frame first and does not wait for it. Medians.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time


def _producer(lib: str, conn, frames: int, n: int) -> None:
    if lib == "memarray":
        import memarray

        ring = [memarray.zeros((n,), "float32", device="cuda:0") for _ in range(2)]
        for f in range(frames):
            s = f % 2
            if f >= 2:
                conn.recv()
            ring[s].add_index_tuple()
            t0 = time.perf_counter()
            conn.send((s, ring[s].ipc_handle(), t0))
    else:
        import torch
        import torch.multiprocessing  # noqa: F401 - registers the CUDA tensor reducers

        ring = [torch.zeros(n, device="cuda") for _ in range(2)]
        for f in range(frames):
            s = f % 2
            if f >= 2:
                conn.recv()
            ring[s].add_(1.0)
            t0 = time.perf_counter()
            conn.send((s, ring[s], t0))
    conn.recv()
    conn.recv()
    conn.send(None)


def _consumer(lib: str, conn, results) -> None:
    if lib == "memarray":
        import memarray

        open_ = memarray.from_ipc_handle
    else:
        import torch  # noqa: F401
        import torch.multiprocessing  # noqa: F401

        def open_(t):
            return t

    keep: dict[int, object] = {}
    cached, first = [], []
    while (msg := conn.recv()) is not None:
        s, h, t0 = msg
        x = open_(h)
        t1 = time.perf_counter()
        (cached if s in keep else first).append((t1 - t0) * 1e6)
        keep[s] = x
        conn.send(s)
    results.put((cached, first))


def handoff(lib: str, frames: int, n: int) -> tuple[float, list[float]]:
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    results = ctx.Queue()
    c = ctx.Process(target=_consumer, args=(lib, b, results))
    p = ctx.Process(target=_producer, args=(lib, a, frames, n))
    c.start()
    p.start()
    cached, first = results.get(timeout=600)
    p.join(60)
    c.join(60)
    return statistics.median(cached), first


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument("--json")
    args = ap.parse_args()
    n = args.mib * (1 << 20) // 4
    out = {}
    for lib in ("memarray", "torch"):
        try:
            med, first = handoff(lib, args.frames, n)
        except Exception as e:  # noqa: BLE001 - a missing peer is reported, not fatal
            print(f"{lib}: not measured ({e!r})")
            continue
        out[lib] = {"median_us": med, "first_us": first}
        print(
            f"{lib:9s} hand-off of {args.mib} MiB after the first open: median {med:7.1f} us "
            f"(first opens: {', '.join(f'{x:.0f}' for x in first)} us)"
        )
    if "memarray" in out:
        m = out["memarray"]["median_us"]
        print(f"{'met ' if m < 100 else 'MISS'} memarray hand-off < 100 us: {m:.1f} us")
        if "torch" in out:
            print(f"torch / memarray: {out['torch']['median_us'] / m:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
