"""torch, CuPy and memarray drawing from one memarray pool, traced and drawn.

    python3 examples/one_pool.py [--png one_pool.png] [--steps 30]

A small pipeline: memarray brings frames to the device, CuPy filters them, a torch
model consumes them, and a few results are kept. Every device allocation of the three
libraries goes through one Tracking(Statistics(Pool(Device(0)))) stack, so one snapshot
shows who holds what; the PNG is the picture in docs/memory-manager.md. Needs a GPU, torch,
CuPy and matplotlib.
"""

from __future__ import annotations

import argparse

import numpy as np

import memarray
import memarray.cupy
import memarray.torch
from memarray import resources as mr


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--png", default="one_pool.png")
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()

    tracking = mr.Tracking(mr.Statistics(mr.Pool(mr.Device(0))), stacks=True)
    mr.set_default_resource(tracking, 0)
    memarray.torch.install()  # before torch's first CUDA use

    import cupy
    import torch

    cupy.cuda.set_allocator(memarray.cupy.allocator)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)
    ).cuda()
    rng = np.random.default_rng(0)
    kept = []
    for step in range(args.steps):
        frames = memarray.asarray(rng.random((512, 1024), dtype=np.float32), device="cuda")
        filtered = cupy.tanh(cupy.from_dlpack(frames)) * 2  # CuPy's memory
        with torch.no_grad():
            out = model(torch.from_dlpack(filtered))  # torch's memory
        if step % 5 == 0:
            kept.append(out)  # results held: torch's share grows
    torch.cuda.synchronize()
    snap = tracking.snapshot()
    by_source = mr.statistics(0)["by_source"]
    for source, row in sorted(by_source.items()):
        print(
            f"{source:8s} holds {row['current_bytes'] / 2**20:8.1f} MiB now, "
            f"{row['total_count']} allocations in all"
        )
    print("wrote", mr.plot(snap, args.png))
    assert len(kept) == (args.steps + 4) // 5


def missing() -> str | None:
    """What this machine lacks for the example, in one line, or None."""
    import importlib.util

    if not memarray.cuda.is_available():
        return f"a CUDA device: {memarray.cuda.unavailable_reason()}"
    absent = [m for m in ("torch", "cupy", "matplotlib") if importlib.util.find_spec(m) is None]
    return f"{', '.join(absent)} (pip install {' '.join(absent)})" if absent else None


if __name__ == "__main__":
    if (why := missing()) is not None:
        print(f"one_pool needs {why}")
        raise SystemExit(77)  # the examples' status for "this machine lacks what I need"
    main()
