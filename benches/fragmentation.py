"""Fragmentation: a generated trace of allocations and frees of varying sizes replayed
through each allocator, peak memory held against peak live bytes (1.00 is no waste).

Two traces, seeded: ``llm`` (weights once, then requests whose activations vary in size
and a key/value cache that grows by reallocation, so freed holes are rarely the size
asked next) and ``churn`` (Dask-like: random sizes from 1 MiB to 64 MiB, random lifetimes).
Replayed through memarray's caching pool with separate segments and growing in place
(``Pool(..., grow_in_place=...)``), over host memory here; on a GPU machine also over
device memory, and through torch's allocator (native, ``expandable_segments:True``, and
through memarray with ``memarray.torch.install()``, with torch's cache on top and
without it), each torch row in a process of its own (the setting is read at torch's CUDA
start).

    python3 benches/fragmentation.py [--trace llm|churn|both] [--scale 1.0] [--json out]

Targets (GPU): memarray growing in place at or below torch's expandable segments and
within 1.05x of peak live; torch through memarray at least as good as expandable alone.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys

MIB = 1 << 20


def trace(kind: str, scale: float, seed: int = 7) -> list[tuple[str, int, int]]:
    """("alloc", id, bytes) / ("free", id, 0) events."""
    rng = random.Random(seed)
    ev: list[tuple[str, int, int]] = []
    nid = 0

    def alloc(n: int) -> int:
        nonlocal nid
        nid += 1
        ev.append(("alloc", nid, max(MIB, int(n * scale))))
        return nid

    def free(i: int) -> None:
        ev.append(("free", i, 0))

    if kind == "llm":
        for _ in range(24):
            alloc(rng.choice([32, 48, 64]) * MIB)  # weights: held to the end
        kv = alloc(8 * MIB)
        kv_size = 8 * MIB
        for _step in range(400):
            acts = [alloc(rng.randint(1, 24) * MIB + rng.randint(0, 255) * 4096) for _ in range(6)]
            if rng.random() < 0.3:  # the cache grows: a larger copy, then the old one goes
                kv_size += rng.randint(1, 6) * MIB
                new = alloc(kv_size)
                free(kv)
                kv = new
            if rng.random() < 0.05:  # a request ends: the cache starts small again
                free(kv)
                kv_size = 8 * MIB
                kv = alloc(kv_size)
            for a in acts:
                free(a)
    else:
        live: list[int] = []
        for _ in range(3000):
            if live and (rng.random() < 0.5 or len(live) > 40):
                free(live.pop(rng.randrange(len(live))))
            else:
                live.append(alloc(rng.randint(1, 64) * MIB))
    return ev


def peak_live(ev: list[tuple[str, int, int]]) -> int:
    sizes, live, peak = {}, 0, 0
    for op, i, n in ev:
        if op == "alloc":
            sizes[i] = n
            live += n
            peak = max(peak, live)
        else:
            live -= sizes.pop(i)
    return peak


def replay_pool(pool, ev) -> int:
    """Peak bytes the pool held from its upstream."""
    held, peak = {}, 0
    for op, i, n in ev:
        if op == "alloc":
            held[i] = pool.allocate(n)
            peak = max(peak, pool.statistics()["upstream_bytes"])
        else:
            held.pop(i).free()
    return peak


TORCH_CHILD = r"""
import json, sys
import torch
pool = None
if sys.argv[1] in ("memarray", "memarray-direct"):
    # torch's segments (or, without torch's cache, its tensors) from a memarray pool
    # growing in place; what the device holds is that pool's peak.
    import memarray.torch
    from memarray import resources as mr
    pool = mr.Pool(mr.Device(0), grow_in_place=64 << 30)
    mr.set_default_resource(pool, 0)
    memarray.torch.install(cache=sys.argv[1] == "memarray")
ev = json.loads(sys.stdin.read())
held, peak = {}, 0
for op, i, n in ev:
    if op == "alloc":
        held[i] = torch.empty(n, dtype=torch.uint8, device="cuda")
        if pool is not None:
            peak = max(peak, pool.statistics()["upstream_bytes"])
    else:
        del held[i]
torch.cuda.synchronize()
print(json.dumps({"peak": peak if pool is not None else torch.cuda.max_memory_reserved()}))
"""


def torch_row(way: str, ev) -> int | None:
    env = dict(os.environ)
    if way == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    r = subprocess.run(
        [sys.executable, "-c", TORCH_CHILD, way],
        input=json.dumps(ev),
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if r.returncode != 0:
        print(f"  torch {way}: failed: {r.stderr.strip().splitlines()[-1:]}")
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])["peak"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trace", default="both", choices=["llm", "churn", "both"])
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    import memarray
    from memarray import resources as mr

    kinds = ["llm", "churn"] if args.trace == "both" else [args.trace]
    out: dict[str, dict[str, float]] = {}
    gpu = memarray.cuda.is_available()
    for kind in kinds:
        ev = trace(kind, args.scale)
        live = peak_live(ev)
        rows: dict[str, int | None] = {
            "memarray pool, host, segments": replay_pool(mr.Pool(mr.Host()), ev),
            "memarray pool, host, growing in place": replay_pool(
                mr.Pool(mr.Host(), grow_in_place=64 << 30), ev
            ),
        }
        if gpu:
            rows["memarray pool, device, segments"] = replay_pool(mr.Pool(mr.Device(0)), ev)
            rows["memarray pool, device, growing in place"] = replay_pool(
                mr.Pool(mr.Device(0), grow_in_place=64 << 30), ev
            )
            try:
                import torch  # noqa: F401

                names = {
                    "native": "native",
                    "expandable": "expandable",
                    "memarray": "through memarray growing in place",
                    "memarray-direct": "through memarray, no cache of torch's",
                }
                for way, name in names.items():
                    rows[f"torch, {name}"] = torch_row(way, ev)
            except ImportError:
                print("torch is not installed: its rows are missing")
        n = sum(1 for e in ev if e[0] == "alloc")
        print(f"{kind}: {n} allocations, peak live {live / MIB:,.0f} MiB")
        out[kind] = {"peak_live": live}
        for name, peak in rows.items():
            if peak is None:
                continue
            print(f"  {name:<42} peak held {peak / MIB:9,.0f} MiB  {peak / live:5.3f}x live")
            out[kind][name] = peak
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
