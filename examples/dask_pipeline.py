"""A particle density field over Dask worker processes, memarray managing each worker's
GPU memory (spilling past a device budget), checked against one NumPy process.

    python3 examples/dask_pipeline.py [--chunks 24] [--particles 4000000] [--grid 256]
                                      [--workers 2] [--device-budget 128MiB]

Each chunk of particles (x, y in [0, 1), float32; 32 MB by default) is made on a worker as
a MemArray on the GPU and kept (persisted); a worker's chunks together are larger than its
device budget, so memarray spills the oldest to pinned host memory. A second pass
deposits each chunk into a counts grid (a CUDA kernel with integer atomics: exact),
moving chunks between workers as Dask schedules them (memarray's serializers) and
bringing spilled ones back. The grids are summed in a tree and gathered as NumPy.
Without a GPU everything runs on the host (the same code: MemArrays on the host, the
deposit in NumPy). Prints the spill counters and exits 1 if the field differs from the
single-process NumPy result, or if nothing spilled on a GPU.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

import memarray

DEPOSIT = r"""
struct P2 { const float* data; unsigned long long n, two; };   // Indexer<2> of (n, 2)
struct G2 { unsigned int* data; unsigned long long rows, cols; };
extern "C" __global__ void deposit(P2 p, G2 g) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < p.n; i += (unsigned long long)gridDim.x * blockDim.x) {
        float x = p.data[2 * i], y = p.data[2 * i + 1];
        unsigned long long r = (unsigned long long)(y * (float)g.rows);
        unsigned long long c = (unsigned long long)(x * (float)g.cols);
        if (r < g.rows && c < g.cols) atomicAdd(&g.data[r * g.cols + c], 1u);
    }
}
"""


def particles_np(seed: int, n: int) -> np.ndarray:
    """Chunk `seed`'s particles: the same numbers on every machine."""
    return np.random.default_rng(seed).random((n, 2), dtype=np.float32)


def make_chunk(seed: int, n: int) -> memarray.MemArray:
    """A chunk as a MemArray on this worker's GPU (on the host without one)."""
    device = "cuda" if memarray.cuda.is_available() else None
    return memarray.asarray(particles_np(seed, n), device=device)


_kernel: Any = None


def deposit(chunk: memarray.MemArray, grid: int) -> memarray.MemArray:
    """Counts of `chunk`'s particles per cell of a grid x grid field (uint32)."""
    global _kernel
    if chunk.on_device:
        from memarray.cuda import In, Module

        if _kernel is None:
            _kernel = Module.from_source(DEPOSIT, "deposit.cu").function("deposit")
        counts = memarray.zeros((grid, grid), "uint32", device=chunk.device)
        _kernel.launch(In(chunk), counts)
        return counts
    return memarray.asarray(counts_np(np.asarray(chunk), grid))


def counts_np(p: np.ndarray, grid: int) -> np.ndarray:
    rows = (p[:, 1] * np.float32(grid)).astype(np.int64)
    cols = (p[:, 0] * np.float32(grid)).astype(np.int64)
    flat = np.bincount(rows * grid + cols, minlength=grid * grid)
    return flat.astype(np.uint32).reshape(grid, grid)


def add(*grids: Any) -> np.ndarray:
    """The sum of some counts grids (MemArrays or NumPy), as NumPy uint64."""
    parts = [g.to_numpy() if isinstance(g, memarray.MemArray) else np.asarray(g) for g in grids]
    total = np.zeros(parts[0].shape, np.uint64)
    for p in parts:
        total += p.astype(np.uint64)
    return total


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=24)
    ap.add_argument("--particles", type=int, default=4_000_000)
    ap.add_argument("--grid", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--device-budget", default="128MiB")
    args = ap.parse_args()
    from distributed import Client, LocalCluster, wait

    import memarray.dask

    with (
        LocalCluster(
            n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        done = memarray.dask.setup(client, device_budget=args.device_budget)
        on_gpu = all(d["devices"] > 0 for d in done.values())
        print(f"{len(done)} workers, {'GPU' if on_gpu else 'host only'}")
        chunks = [
            client.submit(make_chunk, seed, args.particles, pure=False)
            for seed in range(args.chunks)
        ]
        wait(chunks)  # all kept: past the device budget, memarray spills
        grids = [client.submit(deposit, c, args.grid, pure=False) for c in chunks]
        while len(grids) > 1:  # a tree of sums
            grids = [
                client.submit(add, *grids[i : i + 4], pure=False) for i in range(0, len(grids), 4)
            ]
        field = np.asarray(grids[0].result())
        stats = memarray.dask.statistics(client)
        spilled = sum(
            (dev["spill"] or {}).get("spilled_arrays", 0)
            for w in stats.values()
            for dev in w["devices"].values()
        )
        print(f"arrays spilled on the workers: {spilled}")
    expect = sum(
        counts_np(particles_np(s, args.particles), args.grid).astype(np.uint64)
        for s in range(args.chunks)
    )
    ok = bool(np.array_equal(field, expect)) and int(field.sum()) == args.chunks * args.particles
    verdict = "matches" if ok else "DIFFERS from"
    print(f"density field {field.shape}, {int(field.sum())} particles: {verdict} NumPy")
    if on_gpu and spilled == 0:
        print("nothing spilled: the data fits the device budget (more --chunks or --particles)")
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
