"""IPC hand-off latency of a device array between two processes: memarray (IpcHandle with
its event, pickled through a multiprocessing pipe) vs torch (a CUDA tensor sent through the
same transport with torch.multiprocessing's reducers, which also share an event), through
a multiprocessing pipe and through a pair of multiprocessing queues.

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
import pickle
import statistics
import time


def _producer(lib: str, conn, frames: int, n: int) -> None:
    if lib == "memarray":
        import memarray

        ring = [memarray.zeros((n,), "float32", device="cuda:0") for _ in range(2)]
        # Export cost alone, in a loop: with queued work (an event recorded each call) and
        # without (after a synchronize).
        ring[0].add_index_tuple()
        t = time.perf_counter()
        for _ in range(200):
            ring[0].ipc_handle()
        busy_us = (time.perf_counter() - t) / 200 * 1e6
        ring[0].synchronize()
        t = time.perf_counter()
        for _ in range(200):
            h = ring[0].ipc_handle()
        idle_us = (time.perf_counter() - t) / 200 * 1e6
        t = time.perf_counter()
        for _ in range(200):
            pickle.loads(pickle.dumps(h))
        pickle_us = (time.perf_counter() - t) / 200 * 1e6
        conn.send(("export", busy_us, idle_us, pickle_us))
        for f in range(frames):
            s = f % 2
            if f >= 2:
                conn.recv()
            ring[s].add_index_tuple()
            t0 = time.perf_counter()
            h = ring[s].ipc_handle()
            conn.send((s, h, t0, time.perf_counter()))
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
            conn.send((s, ring[s], t0, t0))
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
    cached, first, parts = [], [], []
    micro: dict[str, float] = {}
    while (msg := conn.recv()) is not None:
        if msg[0] == "export":
            micro = dict(
                zip(("export_busy_us", "export_idle_us", "pickle_us"), msg[1:], strict=True)
            )
            continue
        s, h, t0, t_exp = msg
        t_recv = time.perf_counter()
        x = open_(h)
        t1 = time.perf_counter()
        if s in keep:
            cached.append((t1 - t0) * 1e6)
            parts.append(((t_exp - t0) * 1e6, (t_recv - t_exp) * 1e6, (t1 - t_recv) * 1e6))
        else:
            first.append((t1 - t0) * 1e6)
        keep[s] = x
        conn.send(s)
    if lib == "memarray" and keep:
        # Import cost alone: reopening a cached handle in a loop.
        t = time.perf_counter()
        for _ in range(200):
            y = open_(h)
        micro["import_cached_us"] = (time.perf_counter() - t) / 200 * 1e6
        del y
    med = [statistics.median(p[i] for p in parts) for i in range(3)] if parts else []
    results.put((cached, first, med, micro))


class QueueEnd:
    """One end of a pair of multiprocessing queues, with a pipe end's send / recv."""

    def __init__(self, out_q, in_q):
        self.out_q, self.in_q = out_q, in_q

    def send(self, obj) -> None:
        self.out_q.put(obj)

    def recv(self):
        return self.in_q.get()


def handoff(lib: str, frames: int, n: int, transport: str):
    ctx = mp.get_context("spawn")
    if transport == "pipe":
        a, b = ctx.Pipe()
    else:
        q1, q2 = ctx.Queue(), ctx.Queue()
        a, b = QueueEnd(q1, q2), QueueEnd(q2, q1)
    results = ctx.Queue()
    c = ctx.Process(target=_consumer, args=(lib, b, results))
    p = ctx.Process(target=_producer, args=(lib, a, frames, n))
    c.start()
    p.start()
    cached, first, parts, micro = results.get(timeout=600)
    p.join(60)
    c.join(60)
    return statistics.median(cached), first, parts, micro


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument("--json")
    args = ap.parse_args()
    n = args.mib * (1 << 20) // 4
    out = {}
    for transport in ("pipe", "queue"):
        for lib in ("memarray", "torch"):
            try:
                med, first, parts, micro = handoff(lib, args.frames, n, transport)
            except Exception as e:  # noqa: BLE001 - a missing peer is reported, not fatal
                print(f"{lib}: not measured ({e!r})")
                continue
            out[f"{lib} {transport}"] = {
                "median_us": med,
                "first_us": first,
                "parts_us": parts,
                **micro,
            }
            print(
                f"{lib:9s} {transport:5s} hand-off of {args.mib} MiB after the first open: "
                f"median {med:7.1f} us (first opens: {', '.join(f'{x:.0f}' for x in first)} us)"
            )
            if parts:
                print(
                    f"                export {parts[0]:.1f} us, {transport} (with pickling) "
                    f"{parts[1]:.1f} us, open {parts[2]:.1f} us; "
                    + ", ".join(f"{k} {v:.1f}" for k, v in micro.items())
                )
    for transport in ("pipe", "queue"):
        m = out.get(f"memarray {transport}", {}).get("median_us")
        t = out.get(f"torch {transport}", {}).get("median_us")
        if m is not None:
            print(
                f"{'met ' if m < 100 else 'MISS'} memarray hand-off < 100 us "
                f"({transport}): {m:.1f} us"
            )
        if m and t:
            print(f"torch / memarray ({transport}): {t / m:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
