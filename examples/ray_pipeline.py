"""Particle chunks made on one Ray actor's GPU and binned on another's, handed over by the
``"memarray"`` tensor transport (CUDA IPC: no object store), checked against NumPy.

    python3 examples/ray_pipeline.py [--chunks 8] [--particles 2000000] [--grid 128] [--nccl]

With two GPUs or more, the producer and the consumer each have one (and, Ray's default, see
only theirs): the consumer maps the producer's memory on its own GPU and a chunk crosses as
a peer copy. With one GPU they share it (half each). Without a GPU the chunks are host
MemArrays and the transport fetches them through the object store. With ``--nccl`` and
two GPUs or more the chunks go over NCCL instead (the ``"memarray_nccl"`` transport, as
between nodes; ``memarray.ray.create_nccl_group`` joins the two actors). Prints
how the consumer received its chunks and exits 1 if the density field differs from NumPy's
or, with a GPU, if a chunk came through the object store.
"""

# Ray's type hints know neither actor classes' `.remote` nor `enable_tensor_transport`.
# mypy: disable-error-code="attr-defined,untyped-decorator"
from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np
import ray
from dask_pipeline import add, counts_np, deposit, particles_np

import memarray
import memarray.ray


@ray.remote(enable_tensor_transport=True)
class Producer:
    @ray.method(tensor_transport="memarray")
    def chunk(self, seed: int, n: int) -> memarray.MemArray:
        """Chunk `seed`'s particles on this actor's GPU (the host without one)."""
        device = "cuda" if memarray.cuda.is_available() else None
        return memarray.asarray(particles_np(seed, n), device=device)


@ray.remote(enable_tensor_transport=True)
class Consumer:
    def bin(self, chunk: memarray.MemArray, grid: int) -> tuple[str, np.ndarray]:
        """Where the chunk arrived, and its counts grid (a CUDA kernel on the device)."""
        return chunk.device, deposit(chunk, grid).to_numpy()

    def received(self) -> dict[str, float]:
        return memarray.ray.statistics()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--particles", type=int, default=2_000_000)
    ap.add_argument("--grid", type=int, default=128)
    ap.add_argument("--nccl", action="store_true", help="NCCL between the actors' GPUs")
    args = ap.parse_args()
    gpus = memarray.cuda.device_count() if memarray.cuda.is_available() else 0
    ray.init(num_gpus=gpus, include_dashboard=False, log_to_driver=False)
    nccl = args.nccl and gpus >= 2
    if args.nccl and not nccl:
        print(f"--nccl needs two GPUs, this machine has {gpus}: CUDA IPC or the store instead")
    options: dict[str, Any] = {}
    if gpus >= 2:
        options = {"num_gpus": 1}
    elif gpus == 1:
        options = {"num_gpus": 0.5}
    producer = Producer.options(**options).remote()
    consumer = Consumer.options(**options).remote()
    chunk = producer.chunk
    if nccl:
        memarray.ray.create_nccl_group([producer, consumer])
        chunk = producer.chunk.options(tensor_transport=memarray.ray.NCCL_TRANSPORT)
    results = ray.get(
        [
            consumer.bin.remote(chunk.remote(seed, args.particles), args.grid)
            for seed in range(args.chunks)
        ]
    )
    field = add(*[grid for _, grid in results])
    expect = add(
        *[counts_np(particles_np(s, args.particles), args.grid) for s in range(args.chunks)]
    )
    where = sorted({device for device, _ in results})
    received = ray.get(consumer.received.remote())
    print(f"{gpus} GPU(s); chunks arrived on {', '.join(where)}; by transport: {received}")
    ok = bool(np.array_equal(field, expect)) and int(field.sum()) == args.chunks * args.particles
    if gpus and received["store_objects"]:
        print("device chunks came through the object store, not by IPC or NCCL")
        ok = False
    print(
        f"density field {field.shape}, {int(field.sum())} particles: "
        f"{'matches' if ok else 'DIFFERS from'} NumPy"
    )
    ray.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
