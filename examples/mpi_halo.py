"""Heat diffusion on a 2-d grid decomposed over MPI ranks, halo rows exchanged as
MemArrays (on the GPU where there is one), checked bit for bit against one NumPy process.

    mpirun -np 2 python3 examples/mpi_halo.py [--rows 512] [--cols 512] [--steps 200]

Each rank holds a band of rows plus one ghost row above and below. A step: each rank
packs its first and last rows into small arrays, trades them with its neighbours
(``memarray.mpi.isend`` / ``irecv``: device pointers with a CUDA-aware MPI, staged through
host memory otherwise), unpacks what arrived into its ghost rows, and updates the interior
with the 5-point stencil. Device work is CUDA kernels compiled without fused multiply-adds,
in NumPy's order of operations, so the result equals NumPy's to the last bit. Rank 0
collects the bands (``memarray.mpi.send`` / ``recv``) and compares; exits 1 on any
difference.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np
from mpi4py import MPI

import memarray
import memarray.mpi as mm

KERNELS = r"""
struct G { double* data; unsigned long long rows, cols; };        // Indexer<2>, float64
struct R { double* data; unsigned long long cols; };              // Indexer<1>
extern "C" __global__ void step(G u, G out, double k) {
    unsigned long long n = (u.rows - 2) * (u.cols - 2);
    for (unsigned long long t = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         t < n; t += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned long long i = 1 + t / (u.cols - 2), j = 1 + t % (u.cols - 2), c = u.cols;
        double centre = u.data[i * c + j];
        // NumPy's order: ((up + down) + (left + right)) - 4 * centre, times k, plus centre.
        double lap = ((u.data[(i - 1) * c + j] + u.data[(i + 1) * c + j])
                      + (u.data[i * c + j - 1] + u.data[i * c + j + 1])) - 4.0 * centre;
        out.data[i * c + j] = centre + k * lap;
    }
}
extern "C" __global__ void copy_row(G u, R row, unsigned long long i, int into_u) {
    for (unsigned long long j = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         j < u.cols; j += (unsigned long long)gridDim.x * blockDim.x) {
        if (into_u) u.data[i * u.cols + j] = row.data[j];
        else row.data[j] = u.data[i * u.cols + j];
    }
}
"""

K = 0.1


def numpy_step(u: np.ndarray) -> np.ndarray:
    """One step on a grid with fixed edges, in the kernel's order of operations."""
    out = u.copy()
    c = u[1:-1, 1:-1]
    lap = ((u[:-2, 1:-1] + u[2:, 1:-1]) + (u[1:-1, :-2] + u[1:-1, 2:])) - 4.0 * c
    out[1:-1, 1:-1] = c + K * lap
    return out


def initial(rows: int, cols: int) -> np.ndarray:
    u = np.random.default_rng(1).random((rows, cols))
    u[0, :], u[-1, :], u[:, 0], u[:, -1] = 1.0, 0.0, 0.5, 0.25
    return u


class Band:
    """This rank's rows with a ghost row on each side, on the GPU or the host."""

    def __init__(self, whole: np.ndarray, rank: int, size: int) -> None:
        rows = whole.shape[0] - 2  # the global edges are fixed rows
        lo = 1 + rank * rows // size
        hi = 1 + (rank + 1) * rows // size
        self.lo, self.hi = lo, hi
        self.cols = whole.shape[1]
        self.device = "cuda" if memarray.cuda.is_available() else None
        self.u = memarray.asarray(whole[lo - 1 : hi + 1].copy(), device=self.device)
        self.next = memarray.asarray(whole[lo - 1 : hi + 1].copy(), device=self.device)
        self.fns: dict[str, Any] = {}
        if self.device:
            from memarray.cuda import Module

            mod = Module.from_source(KERNELS, "halo.cu", options=["--fmad=false"])
            self.fns = {name: mod.function(name) for name in ("step", "copy_row")}

    def row(self, i: int) -> memarray.MemArray:
        """Row ``i`` of the band (0 and -1 are the ghosts) as a new 1-d array."""
        i = i % self.u.shape[0]
        if self.device:
            from memarray.cuda import In

            r = memarray.empty((self.cols,), "float64", device=self.device)
            self.fns["copy_row"].launch(In(self.u), r, np.uint64(i), np.int32(0))
            return r
        return memarray.asarray(np.asarray(self.u)[i].copy())

    def set_row(self, i: int, r: memarray.MemArray) -> None:
        i = i % self.u.shape[0]
        if self.device:
            from memarray.cuda import In

            self.fns["copy_row"].launch(self.u, In(r), np.uint64(i), np.int32(1))
        else:
            np.asarray(self.u)[i] = np.asarray(r)

    def step(self) -> None:
        if self.device:
            from memarray.cuda import In

            self.fns["step"].launch(In(self.u), self.next, np.float64(K))
        else:
            np.asarray(self.next)[:] = numpy_step(np.asarray(self.u))
        self.u, self.next = self.next, self.u


def exchange(comm: Any, band: Band) -> None:
    """Trades edge rows with the neighbours above and below (none past the grid's edge)."""
    rank, size = comm.rank, comm.size
    reqs, inbound = [], []
    if rank > 0:
        reqs.append(mm.isend(comm, band.row(1), dest=rank - 1, tag=1))
        top = memarray.empty((band.cols,), "float64", device=band.device)
        reqs.append(mm.irecv(comm, top, source=rank - 1, tag=2))
        inbound.append((0, top))
    if rank < size - 1:
        reqs.append(mm.isend(comm, band.row(-2), dest=rank + 1, tag=2))
        bottom = memarray.empty((band.cols,), "float64", device=band.device)
        reqs.append(mm.irecv(comm, bottom, source=rank + 1, tag=1))
        inbound.append((-1, bottom))
    mm.waitall(reqs)
    for i, r in inbound:
        band.set_row(i, r)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--cols", type=int, default=512)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    whole = initial(args.rows, args.cols)
    band = Band(whole, comm.rank, comm.size)
    for _ in range(args.steps):
        exchange(comm, band)
        band.step()
    # Gather the interiors (bands may differ in size: send each to rank 0 in turn).
    mine = memarray.asarray(band.u.to_numpy()[1:-1])
    if comm.rank == 0:
        parts = [mine.to_numpy()]
        for r in range(1, comm.size):
            interior = args.rows - 2
            rows = (r + 1) * interior // comm.size - r * interior // comm.size
            got = memarray.zeros((rows, args.cols), "float64")
            mm.recv(comm, got, source=r, tag=9)
            parts.append(got.to_numpy())
        result = whole.copy()
        result[1:-1] = np.concatenate(parts)
        expect = whole
        for _ in range(args.steps):
            expect = numpy_step(expect)
        same = np.array_equal(result.view(np.uint64), expect.view(np.uint64))
        where = "GPU" if band.device else "host"
        print(
            f"{comm.size} ranks, {args.rows}x{args.cols}, {args.steps} steps on the {where}, "
            f"MPI {'CUDA-aware' if mm.is_cuda_aware(comm) else 'staged through host memory'}: "
            + ("equal to one NumPy process bit for bit" if same else "DIFFERS from NumPy")
        )
        return 0 if same else 1
    mm.send(comm, mine, dest=0, tag=9)
    return 0


if __name__ == "__main__":
    sys.exit(main())
