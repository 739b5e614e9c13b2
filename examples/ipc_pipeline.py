"""A two-process pipeline over CUDA IPC: a producer fills device arrays on its own stream
and hands them to a consumer process without copying and without waiting for its GPU work.

Each hand-off is an IpcHandle pickled through a multiprocessing queue. The handle carries
an interprocess event recorded after the producer's queued kernels, so the consumer's reads
wait for them on the GPU; the producer never blocks. Buffers come from a ring the producer
reuses only after the consumer acknowledges a frame; the consumer keeps the last array of
each ring slot alive, so later frames of a slot reuse the opened mapping (a microsecond).

    python examples/ipc_pipeline.py [--frames 40] [--mib 256] [--slots 2] [--kernels 8]

Checks every frame's values (the sum of each element's indices times the kernels run on
that slot so far, so a read before the producer's work finishes fails) and prints the cost
of the hand-off: export (producer) and import (consumer), medians over the frames after each
slot's first open. benches/ipc_handoff.py measures the latency end to end against torch.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from multiprocessing.queues import Queue
from typing import Any

#: The exit status of every example that this machine lacks what it needs for (a GPU).
NEEDS = 77


def producer(
    frames_q: Queue[Any],
    acks_q: Queue[Any],
    frames: int,
    shape: tuple[int, int],
    slots: int,
    kernels: int,
    device: int,
) -> None:
    import memarray

    stream = memarray.cuda.Stream(device)
    ring = [memarray.zeros(shape, "float32", device=f"cuda:{device}") for _ in range(slots)]
    counts = [0] * slots
    free = list(range(slots))
    for frame in range(frames):
        if not free:
            free.append(acks_q.get())  # the consumer is done with this slot
        s = free.pop(0)
        a = ring[s]
        for _ in range(kernels):  # queued on `stream`; nothing waits for them here
            a.add_index_tuple(stream=stream)
        counts[s] += kernels
        t0 = time.perf_counter()
        h = a.ipc_handle()  # records the handle's event after the kernels
        t1 = time.perf_counter()
        frames_q.put((s, frame, counts[s], h, t0, t1))
    for _ in range(len(free), slots):
        acks_q.get()
    frames_q.put(None)
    memarray.cuda.synchronize(device)


def consumer(
    frames_q: Queue[Any],
    acks_q: Queue[Any],
    shape: tuple[int, int],
    slots: int,
    results: Queue[Any],
) -> None:
    import memarray

    keep: dict[int, object] = {}
    rows, cols = shape
    probes = [(0, 1), (rows // 2, cols // 3), (rows - 1, cols - 1)]
    export_us: list[float] = []
    transit_us: list[float] = []
    import_us: list[float] = []
    first: list[float] = []
    ptrs: dict[int, int] = {}
    while (msg := frames_q.get()) is not None:
        s, frame, count, h, t0, t1 = msg
        t2 = time.perf_counter()
        b = memarray.from_ipc_handle(h)
        t3 = time.perf_counter()
        # Element reads wait for the producer's event: the values are the finished ones.
        for i, j in probes:
            got, want = b[i, j], float(count * (i + j))
            if got != want:
                results.put(f"frame {frame} slot {s}: b[{i}, {j}] = {got}, want {want}")
                return
        ptr = b.__cuda_array_interface__["data"][0]
        if s in ptrs and ptrs[s] != ptr:
            results.put(f"slot {s} moved: {ptrs[s]:#x} -> {ptr:#x} (a copy?)")
            return
        ptrs[s] = ptr
        (first if s not in keep else import_us).append((t3 - t2) * 1e6)
        if s in keep:
            export_us.append((t1 - t0) * 1e6)
            transit_us.append((t2 - t1) * 1e6)
        keep[s] = b  # keeps the mapping open for the slot's next frame
        acks_q.put(s)
    results.put(("ok", export_us, transit_us, import_us, first))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=40)
    ap.add_argument("--mib", type=int, default=256, help="size of each array")
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--kernels", type=int, default=8, help="kernels per frame")
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args(argv)
    import memarray

    if not memarray.cuda.is_available():
        print(f"ipc_pipeline needs a CUDA device: {memarray.cuda.unavailable_reason()}")
        return NEEDS
    cols = 4096
    rows = max(1, args.mib * (1 << 20) // (4 * cols))
    shape = (rows, cols)
    ctx = mp.get_context("spawn")
    frames_q, acks_q, results = ctx.Queue(), ctx.Queue(), ctx.Queue()
    cons = ctx.Process(target=consumer, args=(frames_q, acks_q, shape, args.slots, results))
    prod = ctx.Process(
        target=producer,
        args=(frames_q, acks_q, args.frames, shape, args.slots, args.kernels, args.device),
    )
    cons.start()
    prod.start()
    out = results.get(timeout=600)
    prod.join(120)
    cons.join(120)
    if not isinstance(out, tuple):
        print("FAILED:", out)
        return 1
    _, export_us, transit_us, import_us, first = out
    med = statistics.median
    print(
        f"{args.frames} frames of {rows}x{cols} float32 ({rows * cols * 4 / 2**20:.0f} MiB), "
        f"{args.slots} slots, {args.kernels} kernels per frame: every value checked"
    )
    print(f"first open of a slot's handle: {', '.join(f'{x:.0f}' for x in first)} us")
    if import_us:
        print(
            f"after the first open (median of {len(import_us)} frames): export (ipc_handle) "
            f"{med(export_us):.1f} us, import (from_ipc_handle) {med(import_us):.1f} us; the "
            f"queue wait, {med(transit_us):.0f} us, is the consumer finishing the frame before"
        )
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
