"""The figures a restructuring must leave unchanged, for two builds of memarray
on one GPU, alternating: each round runs this script once per build in a fresh process.

    python3 benches/house_figures.py --builds OLD_SITE NEW_SITE [--rounds 3] [--json out.json]
    python3 benches/house_figures.py --one            # this process's memarray, JSON on stdout

Figures (medians, each call waited for; torch's pinned and pageable copies of the same
bytes in the same process, as a gauge of the machine's noise):
pinned 1 GiB to and from the device, pageable 16 MiB and 1 GiB to and from an existing
device array, ``move_many`` of 1,000 x 4 KiB host arrays to the device, a device pack of
1,000 x 4 KiB (``_memarray._pack``), the seed kernel (``add_index_tuple``) on 64 MiB of
float32, and a 1 MiB device allocation from the default pool. Prints SKIPPED without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def median_ms(fn: Any, reps: int, setup: Any = None) -> float:
    """Median milliseconds of ``fn()`` (after ``setup()`` each time, untimed)."""
    import memarray

    samples = []
    for i in range(reps + 1):
        if setup is not None:
            setup()
        memarray.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        memarray.cuda.synchronize()
        if i:  # the first is a warm-up
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def one() -> dict[str, float]:
    import numpy as np
    import torch

    import memarray
    from memarray import _memarray

    kcuda, kcpu = memarray.dlpack.kDLCUDA, memarray.dlpack.kDLCPU
    rng = np.random.default_rng(0)
    out: dict[str, float] = {}

    def pinned() -> None:  # its gigabytes go when it returns
        p = memarray.MemArray((GiB,), "u1", host_memory="pinned")
        out["pinned 1 GiB up"] = median_ms(
            lambda: p.move_memory(kcuda, 0), 5, setup=lambda: p.move_memory(kcpu)
        )
        out["pinned 1 GiB down"] = median_ms(
            lambda: p.move_memory(kcpu), 5, setup=lambda: p.move_memory(kcuda, 0)
        )

    def torch_pinned() -> None:
        tp = torch.empty(GiB, dtype=torch.uint8).pin_memory()
        td = torch.empty(GiB, dtype=torch.uint8, device="cuda")
        out["torch pinned 1 GiB up"] = median_ms(lambda: td.copy_(tp, non_blocking=True), 5)

    pinned()
    torch_pinned()

    for n, name, reps in ((16 * MiB, "16 MiB", 21), (GiB, "1 GiB", 5)):
        x = rng.integers(0, 255, n, dtype=np.uint8)
        y = np.empty_like(x)
        a = memarray.asarray(x, device="cuda")
        out[f"pageable {name} up"] = median_ms(lambda a=a, x=x: a.read_numpy_array(x), reps)
        out[f"pageable {name} down"] = median_ms(lambda a=a, y=y: a.to_numpy(out=y), reps)
        t = torch.from_numpy(x).cuda()
        ty = torch.from_numpy(y)
        out[f"torch pageable {name} down"] = median_ms(lambda t=t, ty=ty: ty.copy_(t), reps)
        del a, t

    xs = [rng.integers(0, 255, 4 * KiB, dtype=np.uint8) for _ in range(1000)]
    arrs: list[Any] = []

    def fresh() -> None:
        arrs[:] = [memarray.asarray(v, copy=True) for v in xs]

    out["move_many 1000 x 4 KiB"] = median_ms(lambda: memarray.move_many(arrs, "cuda"), 15, fresh)
    dev = [memarray.asarray(v, device="cuda") for v in xs]
    out["device pack 1000 x 4 KiB"] = median_ms(lambda: _memarray._pack(dev), 21)

    k = memarray.zeros((16 * MiB,), "float32", device="cuda")
    out["seed kernel 64 MiB f32"] = median_ms(k.add_index_tuple, 21)

    def alloc() -> None:
        for _ in range(1000):
            memarray.empty((MiB,), "u1", device="cuda")

    out["pool allocation 1 MiB (us)"] = median_ms(alloc, 7)  # ms per 1,000 = us per call
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--one", action="store_true")
    ap.add_argument("--builds", nargs=2, metavar=("OLD_SITE", "NEW_SITE"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.one:
        import memarray

        if not memarray.cuda.is_available():
            print(json.dumps({"skipped": memarray.cuda.unavailable_reason()}))
            return 0
        print(json.dumps(one()))
        return 0
    if not args.builds:
        ap.error("--builds OLD_SITE NEW_SITE or --one")
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for r in range(args.rounds):
        for label, site in zip(("old", "new"), args.builds, strict=True):
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join([site, env.get("PYTHONPATH", "")])
            p = subprocess.run(
                [sys.executable, __file__, "--one"], env=env, capture_output=True, text=True
            )
            if p.returncode != 0:
                print(p.stderr[-3000:], file=sys.stderr)
                return 1
            got = json.loads(p.stdout.strip().splitlines()[-1])
            if "skipped" in got:
                print(f"SKIPPED: {got['skipped']}")
                return 0
            runs[label].append(got)
            print(f"round {r + 1} {label} done", flush=True)
    print(
        f"{'figure':34} {'old ms':>10} {'new ms':>10} {'new/old':>8}   (medians of {args.rounds})"
    )
    table = {}
    for key in runs["old"][0]:
        old = statistics.median(run[key] for run in runs["old"])
        new = statistics.median(run[key] for run in runs["new"])
        table[key] = {"old": old, "new": new, "ratio": new / old}
        print(f"{key:34} {old:10.3f} {new:10.3f} {new / old:8.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, "table": table}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
