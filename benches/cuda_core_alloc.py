"""The targets: a cuda.core Buffer through memarray costs at most what it
costs from cuda.core's own DeviceMemoryResource.

    python3 benches/cuda_core_alloc.py [--json out.json]

Per call: ``allocate(1 MiB, stream=s)`` + ``Buffer.close(s)``, and the same through
``Device.allocate`` with each resource as the device's memory resource. Interleaved (7
rounds of 5,000 calls, median), one process, so both see the same machine. A missed
target prints MISS and the script exits 1.
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
    try:
        import cuda.core as cc
    except ImportError:
        print("SKIPPED: cuda.core is not installed (pip install cuda-core)")
        return 0
    import memarray

    if not memarray.cuda.is_available():
        print(f"SKIPPED: no CUDA device ({memarray.cuda.unavailable_reason()})")
        return 0
    import memarray.cuda_core as mcc

    dev = cc.Device(0)
    dev.set_current()
    s = dev.create_stream()
    own, ours = cc.DeviceMemoryResource(0), mcc.MemoryResource(device=0)
    size = 1 << 20
    runs: dict[str, list[float]] = {}
    for _ in range(7):
        for name, r in (("cuda.core", own), ("memarray", ours)):
            runs.setdefault(f"{name} allocate+close", []).append(
                per_call_us(lambda r=r: r.allocate(size, stream=s).close(s), 5000, 1, 500)
            )
            dev.memory_resource = r
            runs.setdefault(f"{name} Device.allocate+close", []).append(
                per_call_us(lambda: dev.allocate(size, stream=s).close(s), 5000, 1, 500)
            )
    dev.memory_resource = own
    med = {k: statistics.median(v) for k, v in runs.items()}
    for k, v in med.items():
        print(f"{k:40s} {v:7.3f} us")
    ok = True
    for what in ("allocate+close", "Device.allocate+close"):
        ratio = med[f"memarray {what}"] / med[f"cuda.core {what}"]
        good = ratio <= 1.0
        ok &= good
        print(
            f"{'PASS' if good else 'MISS'}  1 MiB {what}: memarray / cuda.core's "
            f"DeviceMemoryResource = {ratio:.2f} (target <= 1.0)"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cuda_core": cc.__version__, "us": med}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
