"""Where a file load onto the device spends its time: one 2 GiB payload written as a
`.npy` file and as a safetensors file (32 tensors of 64 MiB), both in the page cache, then
in one process, medians of ``--rounds``:

- the host side alone: each file read into new host arrays, page-locked and pageable (the
  staging threads' positional reads, no device; the time includes making the arrays:
  pinning or faulting in their pages);
- the device arrays alone: allocating and freeing the 32 arrays;
- each load onto the device, alone and (safetensors) with torch's loader between rounds,
  as benches/safetensors_load.py runs it;
- the same loads over staging settings (a load's lanes, `fill_threads`; slot bytes);
- the pinned host-to-device copy of the same bytes (torch), the peer figure.

Run on the GPU machine: python3 benches/load_phases.py [--gib 2] [--rounds 5] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
from npy_load import timed  # benches/ is the script's folder

import memarray


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not memarray.cuda.is_available():
        print(f"SKIPPED: no CUDA device ({memarray.cuda.unavailable_reason()})")
        return 0
    import torch
    from safetensors.torch import load_file, save_file

    per = 64 << 20
    n = max(1, int(args.gib * (1 << 30)) // per)
    total = n * per
    d = tempfile.mkdtemp()
    st_path, npy_path = os.path.join(d, "m.safetensors"), os.path.join(d, "m.npy")
    rng = np.random.default_rng(0)
    payload = rng.integers(0, 255, total, dtype=np.uint8)
    save_file(
        {
            f"t.{i}": torch.from_numpy(payload[i * per : (i + 1) * per].view(np.float16))
            for i in range(n)
        },
        st_path,
    )
    np.save(npy_path, payload)
    del payload
    os.sync()  # written back: no writeback competes with the reads below
    for p in (st_path, npy_path):
        with open(p, "rb") as f:
            while f.read(64 << 20):
                pass
    pinned = torch.empty(total, dtype=torch.uint8).pin_memory()
    torch.empty(1, device="cuda")
    gb = total / 1e9
    rows: dict[str, float] = {}

    def row(name, f):
        f()  # warm
        s = timed(f, args.rounds)
        rows[name] = s
        print(f"  {name:<58} {s * 1e3:8.1f} ms  {gb / s:6.2f} GB/s", flush=True)

    sync = memarray.cuda.synchronize

    print(
        f"{n} tensors of 64 MiB, {total / (1 << 30):.2f} GiB, files in the page cache, "
        f"median of {args.rounds}"
    )
    print("staging:", memarray.cuda.staging_config()["to_device"])
    row(
        "pinned H2D of the same bytes (torch)",
        lambda: (pinned.to("cuda", non_blocking=True), torch.cuda.synchronize()),
    )
    row(
        "new pinned host array <- .npy (pinning included)",
        lambda: memarray.load(npy_path, host_memory="pinned"),
    )
    row(
        "fill: safetensors -> pinned host arrays",
        lambda: memarray.load_safetensors(st_path, host_memory="pinned"),
    )
    row("new pageable host array <- .npy (faults included)", lambda: memarray.load(npy_path))

    def alloc():
        a = [memarray.empty((per,), dtype="uint8", device="cuda") for _ in range(n)]
        sync()
        del a

    row("device arrays alone (allocate and free)", alloc)
    row(".npy -> device", lambda: (memarray.load(npy_path, device="cuda"), sync()))
    row(
        "safetensors -> device",
        lambda: (memarray.load_safetensors(st_path, device="cuda"), sync()),
    )

    s = []
    for _ in range(args.rounds):
        load_file(st_path, device="cuda")
        torch.cuda.synchronize()
        t = time.perf_counter()
        memarray.load_safetensors(st_path, device="cuda")
        sync()
        s.append(time.perf_counter() - t)
    key = "safetensors -> device, torch's loader between rounds"
    rows[key] = statistics.median(s)
    print(f"  {key:<58} {rows[key] * 1e3:8.1f} ms  {gb / rows[key]:6.2f} GB/s")

    # A load's lanes are `fill_threads` (`threads` is for copies of memory).
    base = memarray.cuda.staging_config()["to_device"]
    for threads in (4, 8, 12, 16):
        for chunk in (4 << 20, 8 << 20, 16 << 20):
            memarray.cuda.set_staging_config("to_device", fill_threads=threads, chunk_bytes=chunk)
            row(
                f"safetensors -> device, {threads} lanes, {chunk >> 20} MiB slots",
                lambda: (memarray.load_safetensors(st_path, device="cuda"), sync()),
            )
    memarray.cuda.set_staging_config(
        "to_device", fill_threads=base["fill_threads"], chunk_bytes=base["chunk_bytes"]
    )
    best = min(v for k, v in rows.items() if k.startswith("safetensors -> device"))
    pinned_s = rows["pinned H2D of the same bytes (torch)"]
    print(
        f"best safetensors load / pinned copy: {pinned_s / best:.2f}x; default: "
        f"{pinned_s / rows['safetensors -> device']:.2f}x; "
        f".npy: {pinned_s / rows['.npy -> device']:.2f}x"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bytes": total, "seconds": rows}, f, indent=1)
    os.unlink(st_path)
    os.unlink(npy_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
