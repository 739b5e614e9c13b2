"""Three overheads measured again, each in one run against its baseline.

    python3 benches/overheads.py [--json out.json]

- ``Tracking`` with stacks off over the bare pool: ``memarray.empty`` of 1 MiB on the
  device (and ``Resource.allocate`` + free), target <= 1.10x;
- spilling enabled without pressure: ``memarray.empty`` of 1 MiB + free, on / off
  interleaved, target <= 1.02x;
- ``memarray.from_dlpack(torch tensor)`` (through torch's C exchange table), target
  <= 1.0 us, with ``memarray.from_dlpack(memarray array)`` beside it and, as peers on the
  same draw, ``torch.from_dlpack`` and ``cupy.from_dlpack`` of the same tensor.

A host's speed drifts within one run (a bare ``memarray.empty`` took 2.0-4.4 us in four
runs of one device call): each pair is timed in ROUNDS short rounds of CALLS calls a side,
its order flipping each round, and judged by the median of the rounds' ratios (quartiles
beside); ``from_dlpack`` rows are medians of 7. A missed target prints MISS and the script
exits 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from python_interop import per_call_us  # benches/ is the script's folder

ROUNDS = 21
CALLS = 2000
WARMUP = 200


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    import memarray
    import memarray.resources as mr
    import memarray.spill as spill

    if not memarray.cuda.is_available():
        print(f"SKIPPED: no CUDA device ({memarray.cuda.unavailable_reason()})")
        return 0
    mib = 1 << 20

    def empty():
        memarray.empty([mib], "uint8", device="cuda")

    bare = mr.Pool(mr.Device(0))
    tracked = mr.Tracking(bare)

    def block(fn) -> float:
        return per_call_us(fn, CALLS, 1, WARMUP)

    def allocate_free(r) -> float:
        return block(lambda: r.allocate(mib).free())

    def empty_from(r) -> float:
        with mr.using(r, 0):
            return block(empty)

    def empty_spilling(on: bool) -> float:
        if on:
            spill.enable(0)
        try:
            return block(empty)
        finally:
            if on:
                spill.disable(0)

    # Each case: (the baseline's block, the candidate's block, the target ratio).
    cases = {
        "Tracking / bare pool, memarray.empty 1 MiB": (
            lambda: empty_from(bare),
            lambda: empty_from(tracked),
            1.10,
        ),
        "Tracking / bare pool, allocate + free 1 MiB": (
            lambda: allocate_free(bare),
            lambda: allocate_free(tracked),
            1.10,
        ),
        "spilling on / off, memarray.empty 1 MiB": (
            lambda: empty_spilling(False),
            lambda: empty_spilling(True),
            1.02,
        ),
    }
    pairs: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    for i in range(ROUNDS):
        for name, (base, cand, _) in cases.items():
            # ABBA: the pair's order flips each round, so a drift of the host's speed
            # within a round weighs on both sides alike.
            if i % 2 == 0:
                b, c = base(), cand()
            else:
                c, b = cand(), base()
            pairs[name].append((b, c))
    dl: dict[str, list[float]] = {}
    try:
        import torch
    except ImportError:
        torch = None
        print("torch is not installed: the from_dlpack(torch) row is missing")
    try:
        import cupy
    except ImportError:
        cupy = None
    if torch is not None:
        tt = torch.zeros(1024, device="cuda")
        ma = memarray.zeros((1024,), "float32", device="cuda")
        for _ in range(7):
            dl.setdefault("from_dlpack(torch)", []).append(
                per_call_us(lambda: memarray.from_dlpack(tt), 5000, 1, 500)
            )
            dl.setdefault("from_dlpack(memarray)", []).append(
                per_call_us(lambda: memarray.from_dlpack(ma), 5000, 1, 500)
            )
            # Peers on the same draw: the target is absolute, the draw's speed is not.
            dl.setdefault("peer torch.from_dlpack(torch)", []).append(
                per_call_us(lambda: torch.from_dlpack(tt), 5000, 1, 500)
            )
            if cupy is not None:
                dl.setdefault("peer cupy.from_dlpack(torch)", []).append(
                    per_call_us(lambda: cupy.from_dlpack(tt), 5000, 1, 500)
                )
    ok = True

    def check(name: str, value: float, limit: float, unit: str = "x") -> None:
        nonlocal ok
        good = value <= limit
        ok &= good
        print(
            f"{'PASS' if good else 'MISS'}  {name}: {value:.3f}{unit} (target <= {limit:g}{unit})"
        )

    out: dict[str, float] = {}
    print(f"{ROUNDS} rounds of {CALLS} calls a side, the pair's order flipping each round (us):")
    for name, (_, _, limit) in cases.items():
        b = statistics.median(p[0] for p in pairs[name])
        c = statistics.median(p[1] for p in pairs[name])
        lo, mid, hi = statistics.quantiles([y / x for x, y in pairs[name]], n=4)
        print(
            f"  {name}: {b:.3f} -> {c:.3f} us; ratio of medians {c / b:.3f}x, "
            f"median of the rounds' ratios {mid:.3f}x (quartiles {lo:.3f}-{hi:.3f})"
        )
        out[f"{name} baseline_us"], out[f"{name} candidate_us"], out[f"{name} ratio"] = b, c, mid
        check(name, mid, limit)
    for k, v in dl.items():
        out[k] = statistics.median(v)
        print(f"  {k:28s} {out[k]:7.3f} us")
    if "from_dlpack(torch)" in out:
        check("memarray.from_dlpack(torch tensor)", out["from_dlpack(torch)"], 1.0, " us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
