"""Three overheads measured again, each in one run against its baseline.

    python3 benches/overheads.py [--json out.json]

- ``Tracking`` with stacks off over the bare pool: ``memarray.empty`` of 1 MiB on the
  device (and ``Resource.allocate`` + free), target <= 1.10x;
- spilling enabled without pressure: ``memarray.empty`` of 1 MiB + free, on / off
  interleaved, target <= 1.02x;
- ``memarray.from_dlpack(torch tensor)`` (through torch's C exchange table), target
  <= 1.2 us, with ``memarray.from_dlpack(memarray array)`` beside it.

Each figure is a median of 7 rounds, the pairs interleaved round by round in one process.
A missed target prints MISS and the script exits 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from python_interop import per_call_us  # benches/ is the script's folder


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
    runs: dict[str, list[float]] = {}
    for _ in range(7):
        for name, r in (("bare", bare), ("tracking", tracked)):
            runs.setdefault(f"{name} allocate+free", []).append(
                per_call_us(lambda r=r: r.allocate(mib).free(), 5000, 1, 500)
            )
            with mr.using(r, 0):
                runs.setdefault(f"{name} empty", []).append(per_call_us(empty, 5000, 1, 500))
        runs.setdefault("spill off empty", []).append(per_call_us(empty, 5000, 1, 500))
        spill.enable(0)
        runs.setdefault("spill on empty", []).append(per_call_us(empty, 5000, 1, 500))
        spill.disable(0)
    try:
        import torch
    except ImportError:
        torch = None
        print("torch is not installed: the from_dlpack(torch) row is missing")
    if torch is not None:
        tt = torch.zeros(1024, device="cuda")
        ma = memarray.zeros((1024,), "float32", device="cuda")
        for _ in range(7):
            runs.setdefault("from_dlpack(torch)", []).append(
                per_call_us(lambda: memarray.from_dlpack(tt), 5000, 1, 500)
            )
            runs.setdefault("from_dlpack(memarray)", []).append(
                per_call_us(lambda: memarray.from_dlpack(ma), 5000, 1, 500)
            )
    med = {k: statistics.median(v) for k, v in runs.items()}
    for k, v in med.items():
        print(f"{k:28s} {v:7.3f} us")
    ok = True

    def check(name: str, value: float, limit: float, unit: str = "x") -> None:
        nonlocal ok
        good = value <= limit
        ok &= good
        print(
            f"{'PASS' if good else 'MISS'}  {name}: {value:.3f}{unit} (target <= {limit:g}{unit})"
        )

    check(
        "Tracking / bare pool, memarray.empty 1 MiB",
        med["tracking empty"] / med["bare empty"],
        1.10,
    )
    check(
        "Tracking / bare pool, allocate + free 1 MiB",
        med["tracking allocate+free"] / med["bare allocate+free"],
        1.10,
    )
    check(
        "spilling on / off, memarray.empty 1 MiB",
        med["spill on empty"] / med["spill off empty"],
        1.02,
    )
    if "from_dlpack(torch)" in med:
        check("memarray.from_dlpack(torch tensor)", med["from_dlpack(torch)"], 1.2, " us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(med, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
