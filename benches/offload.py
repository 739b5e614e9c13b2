"""Offload and restore ("sleep") of a device's memory with every address kept, against the
pinned copy of the same bytes: torch tensors of ``--gib`` GiB allocated through memarray
(``memarray.torch.install()``) from a pool growing in place, then ``memarray.offload(0)``
and ``memarray.restore(0)`` in turn, beside torch's own copy of the same bytes to and from
a page-locked tensor, alternating, medians of ``--rounds`` (the first offload, which pins
the host copy the pool keeps for the next, printed apart). Each way's target: at least
0.9x the pinned copy; the freed bytes confirmed by the driver; the tensors bit-exact after.
Beside them, the same copies split by side: torch's pinned tensor to and from the pool's
memory (256 MiB a tensor, as the offload copies them: "pool D2H/H2D"), and memarray's
pinned memory (as the offload's copy is made) to and from torch's ("ours D2H/H2D"); and
the pool's own part of each way: a second pool whose range (as long as the
first pool released) holds cached memory and 2 MiB handed out at its end, offloaded and
restored ("release only", "back only": 2 MiB copied each way).

    python3 benches/offload.py [--gib 8] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import memarray


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not memarray.cuda.is_available():
        print(f"SKIPPED: no CUDA device ({memarray.cuda.unavailable_reason()})")
        return 0
    import torch

    import memarray.torch as memarray_torch
    from memarray import resources as mr

    total = int(args.gib * (1 << 30))
    # The peer's copy on torch's own allocator, made before torch routes through memarray:
    # offload moves only the tensors below.
    host = torch.empty(total, dtype=torch.uint8).pin_memory()
    flat = torch.empty(total, dtype=torch.uint8, device="cuda")
    pool = mr.Pool(mr.Device(0), grow_in_place=4 * total)
    mr.set_default_resource(pool, 0)
    memarray_torch.install()
    per = 256 << 20
    tensors = [
        torch.randint(0, 255, (per,), dtype=torch.uint8, device="cuda") for _ in range(total // per)
    ]
    sums = [int(t.sum()) for t in tensors]
    torch.cuda.synchronize()
    print(f"  the pool before: {pool.statistics()}")
    # Who holds the pool's blocks, per library (memarray's counters), and torch's own view.
    held = {r["source"]: r["live_bytes"] for r in mr.library_usage() if r["device"] == 0}
    print(f"  held through memarray on cuda:0, by library: {held}")
    print(
        f"  torch: allocated {torch.cuda.memory_allocated(0):,}, "
        f"reserved {torch.cuda.memory_reserved(0):,} bytes"
    )
    times: dict[str, list[float]] = {
        k: [] for k in ("offload", "restore", "pinned D2H", "pinned H2D")
    }
    freed = []
    copied = []  # the bytes each restore copied back (the blocks handed out, whole)
    for _ in range(args.rounds):
        free0 = mr.Device(0).memory_info()[0]
        t0 = time.perf_counter()
        memarray.offload(0)
        times["offload"].append(time.perf_counter() - t0)
        freed.append(mr.Device(0).memory_info()[0] - free0)
        t0 = time.perf_counter()
        copied.append(memarray.restore(0))
        times["restore"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        host.copy_(flat, non_blocking=True)
        torch.cuda.synchronize()
        times["pinned D2H"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        flat.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        times["pinned H2D"].append(time.perf_counter() - t0)
    exact = [int(t.sum()) for t in tensors] == sums
    # Which side slows the pool's copies: the same bytes between torch's pinned tensor and
    # the pool's memory (the tensors above, 256 MiB each, as the offload copies them), and
    # between memarray's pinned memory (as the offload's copy is made) and torch's.
    import numpy as np

    ours = memarray.MemArray([total], np.uint8, host_resource=mr.Pinned(0))
    ours_t = torch.from_dlpack(ours)
    assert ours_t.is_pinned(), "memarray's pinned memory, as torch sees it"

    def each(to_host: bool) -> None:
        for i, t in enumerate(tensors):
            part = host[i * per : (i + 1) * per]
            if to_host:
                part.copy_(t, non_blocking=True)
            else:
                t.copy_(part, non_blocking=True)
        torch.cuda.synchronize()

    def across(dst: Any, src: Any) -> None:
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()

    copies = {
        "pool D2H": lambda: each(True),
        "pool H2D": lambda: each(False),
        "ours D2H": lambda: across(ours_t, flat),
        "ours H2D": lambda: across(flat, ours_t),
    }
    for _ in range(args.rounds):
        for name, f in copies.items():
            t0 = time.perf_counter()
            f()
            times.setdefault(name, []).append(time.perf_counter() - t0)
    exact = exact and [int(t.sum()) for t in tensors] == sums
    # What backing the addresses again costs alone: a second pool whose range, as long as
    # the first released, holds a cached block and 2 MiB handed out at its end (a restore
    # backs the range up to its last block handed out; 2 MiB to copy each way).
    backed = int(statistics.median(freed))
    bare = mr.Pool(mr.Device(0), grow_in_place=4 * total)
    cached = bare.allocate(backed - (2 << 20))
    end = bare.allocate(2 << 20)
    cached.free()
    for name in ("release only", "back only"):
        times[name] = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        bare.offload()
        times["release only"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        bare.restore()
        times["back only"].append(time.perf_counter() - t0)
    end.free()
    # The first offload pins its host copy (kept by the pool for the next): apart.
    first = times["offload"][0]
    print(f"  first offload {first * 1e3:8.1f} ms  {total / first / 1e9:6.2f} GB/s (pins its copy)")
    if args.rounds > 1:
        times["offload"] = times["offload"][1:]
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, s in med.items():
        n = backed if k.endswith(" only") else total
        print(f"  {k:<12} {s * 1e3:8.1f} ms  {n / s / 1e9:6.2f} GB/s")
    down = med["pinned D2H"] / med["offload"]
    up = med["pinned H2D"] / med["restore"]
    moved = statistics.median(copied)
    print(
        f"  the pool's blocks: {moved / (1 << 30):.2f} GiB copied each way for "
        f"{total / (1 << 30):.2f} GiB of tensors: offload {moved / med['offload'] / 1e9:.2f} "
        f"GB/s, restore {moved / med['restore'] / 1e9:.2f} GB/s: {down * moved / total:.2f}x / "
        f"{up * moved / total:.2f}x the pinned copy's speed"
    )
    print(
        f"{total / (1 << 30):.1f} GiB: offload {down:.2f}x the pinned copy, restore {up:.2f}x "
        f"(target 0.9); the driver saw {statistics.median(freed) / (1 << 30):.2f} GiB freed; "
        f"bit-exact after {args.rounds} rounds: {exact}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "seconds": med,
                    "first_offload": first,
                    "bytes": total,
                    "backed": backed,
                    "freed": freed,
                    "copied": copied,
                    "exact": exact,
                },
                f,
            )
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
