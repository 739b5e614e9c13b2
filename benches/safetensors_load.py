"""A multi-GiB safetensors file onto the device: memarray.load_safetensors against
safetensors' own loaders and against the pinned host-to-device copy of the same bytes, one
process, the file (written here) in the page cache, each loader in turn within each round,
medians of ``--rounds``. Each time ends with the tensors on the device and the device
synchronised. Target: memarray at least 0.8x the pinned copy; its tensors bit-exact against
``safetensors.torch.load_file``. Run on the GPU machine:

    python3 benches/safetensors_load.py [--gib 4] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import memarray


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not memarray.cuda.is_available():
        print(f"SKIPPED: no CUDA device ({memarray.cuda.unavailable_reason()})")
        return 0
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    per = 64 << 20  # 64 MiB tensors, as a model's layers
    n = max(1, int(args.gib * (1 << 30)) // per)
    total = n * per
    tensors = {
        f"layer.{i}.weight": torch.randn(per // 2, dtype=torch.float16).reshape(-1, 4096)
        for i in range(n)
    }
    path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
    save_file(tensors, path)
    del tensors
    pinned = torch.empty(total, dtype=torch.uint8).pin_memory()

    def ours():
        got = memarray.load_safetensors(path, device="cuda")
        memarray.cuda.synchronize()
        return got

    def theirs():
        got = load_file(path, device="cuda")
        torch.cuda.synchronize()
        return got

    def opened():
        with safe_open(path, framework="pt", device="cuda") as f:
            got = {k: f.get_tensor(k) for k in f.keys()}
        torch.cuda.synchronize()
        return got

    def pinned_copy():
        pinned.to("cuda", non_blocking=True)
        torch.cuda.synchronize()

    cases = {
        "memarray.load_safetensors": ours,
        "safetensors.torch.load_file": theirs,
        "safe_open(device='cuda')": opened,
        "pinned H2D of the same bytes": pinned_copy,
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.rounds):
        for name, f in cases.items():
            t = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    a, b = ours(), theirs()
    exact = all(torch.from_dlpack(a[k]).view(torch.uint8).equal(b[k].view(torch.uint8)) for k in b)
    print(
        f"{n} tensors, {total / (1 << 30):.2f} GiB of float16, file in the page cache, "
        f"median of {args.rounds}"
    )
    for k, s in med.items():
        print(f"  {k:<32} {s * 1e3:8.1f} ms  {total / s / 1e9:6.2f} GB/s")
    ratio = med["pinned H2D of the same bytes"] / med["memarray.load_safetensors"]
    vs_file = med["safetensors.torch.load_file"] / med["memarray.load_safetensors"]
    print(
        f"memarray / pinned copy: {ratio:.2f}x (target 0.8); "
        f"vs load_file {vs_file:.2f}x; "
        f"bit-exact: {exact}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seconds": med, "bytes": total, "ratio_to_pinned": ratio, "exact": exact}, f)
    os.unlink(path)
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
