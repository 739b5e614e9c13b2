"""memarray.mpi send/recv, bcast and allreduce of a device array between two ranks
against host NumPy ``Send``/``Recv``, ``Bcast`` and ``Allreduce`` of the same bytes, in one
run (an MPI that is not CUDA-aware stages
device data through the host): the chunked pipeline, the one-message staging it replaced
(``PIPELINE_FROM`` raised past the array), and NumPy. Medians of the repetitions, timed on
the receiver from a barrier to the last byte on the device (or in the NumPy array).

    mpirun -np 2 python3 benches/mpi_transfer.py [--mib 256] [--reps 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

import memarray
import memarray.mpi as mm

comm = MPI.COMM_WORLD
rank = comm.rank


def timed(step) -> float:  # type: ignore[no-untyped-def]
    comm.Barrier()
    t = time.perf_counter()
    step()
    dt = time.perf_counter() - t
    return comm.bcast(dt if rank == 1 else None, root=1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--chunk-mib", type=int, default=None, help="memarray.mpi.CHUNK to try")
    args = p.parse_args()
    if args.chunk_mib:
        mm.CHUNK = args.chunk_mib << 20
        mm.PIPELINE_FROM = 2 * mm.CHUNK
    n = (args.mib << 20) // 8
    device = "cuda" if memarray.cuda.is_available() else "cpu"
    gpus = 0
    if device == "cuda":  # one GPU per rank where there are several
        gpus = min(comm.size, memarray.cuda.device_count())
        memarray.cuda.set_default_device(rank % memarray.cuda.device_count())
    src = memarray.asarray(np.arange(n, dtype=np.float64), device=device)
    dst = memarray.zeros((n,), "float64", device=device)
    host_src = np.arange(n, dtype=np.float64)
    host_dst = np.zeros(n)

    def memarray_step() -> None:
        if rank == 0:
            mm.send(comm, src, dest=1)
        else:
            mm.recv(comm, dst, source=0)
            dst.synchronize()

    def numpy_step() -> None:
        if rank == 0:
            comm.Send(host_src, dest=1)
        else:
            comm.Recv(host_dst, source=0)

    def bcast_step() -> None:
        mm.bcast(comm, src if rank == 0 else dst, root=0)
        (src if rank == 0 else dst).synchronize()

    def numpy_bcast() -> None:
        comm.Bcast(host_src if rank == 0 else host_dst, root=0)

    def allreduce_step() -> None:
        mm.allreduce(comm, dst)
        dst.synchronize()

    def numpy_allreduce() -> None:
        comm.Allreduce(MPI.IN_PLACE, host_dst)

    def reduce_step() -> None:
        r = mm.reduce(comm, dst, root=1)
        if r is not None:
            r.synchronize()

    def numpy_reduce() -> None:
        comm.Reduce(host_dst, host_src if rank == 1 else None, root=1)

    chunked = PIPELINE = mm.PIPELINE_FROM
    steps = {
        "chunked": memarray_step,
        "one message": memarray_step,
        "numpy": numpy_step,
        "bcast chunked": bcast_step,
        "bcast whole": bcast_step,
        "numpy Bcast": numpy_bcast,
        "allreduce chunked": allreduce_step,
        "allreduce whole": allreduce_step,
        "numpy Allreduce": numpy_allreduce,
        "reduce chunked": reduce_step,
        "reduce whole": reduce_step,
        "numpy Reduce": numpy_reduce,
    }
    rows: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.reps):  # rotating order: drift shows in every row alike
        for name, step in steps.items():
            # "one message" / "whole": the staging this replaced (one download, one message)
            whole = name == "one message" or name.endswith("whole")
            mm.PIPELINE_FROM = 1 << 62 if whole else chunked
            rows[name].append(timed(step))
        mm.PIPELINE_FROM = PIPELINE
    dst.read_numpy_array(np.zeros(n))
    timed(memarray_step)  # the last checked transfer
    if rank == 1:
        ok = bool((dst.to_numpy() == np.arange(n, dtype=np.float64)).all())
        print(
            f"{args.mib} MiB float64, {device} arrays on {gpus} GPU(s), "
            f"MPI CUDA-aware: {mm.is_cuda_aware(comm)}, "
            f"{MPI.Get_library_version().splitlines()[0].rstrip(chr(0))}, "
            f"chunks of {mm.CHUNK >> 20} MiB; data intact: {ok}"
        )
        nb = n * 8
        peer = {"chunked": "numpy", "one message": "numpy", "numpy": "numpy"}
        for name in rows:
            peer.setdefault(name, f"numpy {name.split()[0].capitalize()}")
        peer["bcast chunked"] = peer["bcast whole"] = peer["numpy Bcast"] = "numpy Bcast"
        peer["allreduce chunked"] = peer["allreduce whole"] = "numpy Allreduce"
        peer["numpy Allreduce"] = "numpy Allreduce"
        peer["reduce chunked"] = peer["reduce whole"] = peer["numpy Reduce"] = "numpy Reduce"
        for name, ts in rows.items():
            m = statistics.median(ts)
            base = statistics.median(rows[peer[name]])
            print(
                f"  {name:18} {m * 1e3:8.1f} ms {nb / m / 1e9:6.2f} GB/s"
                f"  {base / m:5.2f}x {peer[name]}"
            )


if __name__ == "__main__":
    main()
