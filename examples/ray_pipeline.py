"""Particle chunks made on one Ray actor's GPU and binned on another's, handed over by the
``"memarray"`` tensor transport (CUDA IPC: no object store), checked against NumPy.

    python3 examples/ray_pipeline.py [--chunks 8] [--particles 2000000] [--grid 128]

With two GPUs or more, the producer and the consumer each have one (they see every GPU,
``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1``, and pick theirs with
``memarray.ray.use_assigned_gpu()``): a chunk crosses between GPUs as a peer copy. With one
GPU they share it (half each). Without a GPU the chunks are host MemArrays and the
transport fetches them through the object store. Prints how the consumer received its
chunks and exits 1 if the density field differs from NumPy's.
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
    def __init__(self, pick_gpu: bool) -> None:
        self.gpu = memarray.ray.use_assigned_gpu() if pick_gpu else None

    @ray.method(tensor_transport="memarray")
    def chunk(self, seed: int, n: int) -> memarray.MemArray:
        """Chunk `seed`'s particles on this actor's GPU (the host without one)."""
        device = "cuda" if memarray.cuda.is_available() else None
        return memarray.asarray(particles_np(seed, n), device=device)


@ray.remote(enable_tensor_transport=True)
class Consumer:
    def __init__(self, pick_gpu: bool) -> None:
        if pick_gpu:
            memarray.ray.use_assigned_gpu()

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
    args = ap.parse_args()
    gpus = memarray.cuda.device_count() if memarray.cuda.is_available() else 0
    ray.init(num_gpus=gpus, include_dashboard=False, log_to_driver=False)
    options: dict[str, Any] = {}
    if gpus >= 2:
        env = {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}
        options = {"num_gpus": 1, "runtime_env": {"env_vars": env}}
    elif gpus == 1:
        options = {"num_gpus": 0.5}
    producer = Producer.options(**options).remote(gpus >= 2)
    consumer = Consumer.options(**options).remote(gpus >= 2)
    results = ray.get(
        [
            consumer.bin.remote(producer.chunk.remote(seed, args.particles), args.grid)
            for seed in range(args.chunks)
        ]
    )
    field = add(*[grid for _, grid in results])
    expect = add(
        *[counts_np(particles_np(s, args.particles), args.grid) for s in range(args.chunks)]
    )
    where = sorted({device for device, _ in results})
    print(
        f"{gpus} GPU(s); chunks arrived on {', '.join(where)}; by transport: "
        f"{ray.get(consumer.received.remote())}"
    )
    ok = bool(np.array_equal(field, expect)) and int(field.sum()) == args.chunks * args.particles
    print(
        f"density field {field.shape}, {int(field.sum())} particles: "
        f"{'matches' if ok else 'DIFFERS from'} NumPy"
    )
    ray.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
