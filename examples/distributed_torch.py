"""memarray arrays in NCCL collectives, one process per GPU: through torch.distributed
(zero-copy via DLPack) and through memarray.distributed (NCCL loaded by memarray's Rust
layer, for code without torch). Integer data, so every sum is checked exactly.

    torchrun --nproc-per-node 2 examples/distributed_torch.py
"""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np

import memarray

if __name__ == "__main__":
    # One clear line, not a traceback, where the example cannot run.
    # Exit 77: the examples' status for "this machine lacks what I need".
    if importlib.util.find_spec("torch") is None:
        print("distributed_torch needs torch (pip install torch)", file=sys.stderr)
        sys.exit(77)
    if not memarray.cuda.is_available():
        why = memarray.cuda.unavailable_reason()
        print(f"distributed_torch needs a CUDA device: {why}", file=sys.stderr)
        sys.exit(77)
    if "RANK" not in os.environ:
        sys.exit(
            "distributed_torch runs one process per GPU: "
            "torchrun --nproc-per-node 2 examples/distributed_torch.py"
        )

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import memarray.distributed as md  # noqa: E402


def check(name: str, got: np.ndarray, want: np.ndarray, rank: int) -> None:
    if not np.array_equal(got, want):
        bad = np.flatnonzero(got.ravel() != want.ravel())[:5]
        raise AssertionError(f"rank {rank} {name}: first differences at {bad.tolist()}")


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    dev = f"cuda:{local}"
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    n = (1 << 20) + 3
    base = np.arange(n, dtype=np.int32)
    weights = sum(r + 1 for r in range(world))

    # 1. torch.distributed on a MemArray: the tensor shares its memory; leaving the block
    #    makes the array's later work wait for torch's collective (no host block).
    a = memarray.asarray(base * (rank + 1), device=dev)
    ptr = a.__cuda_array_interface__["data"][0]
    with md.as_torch(a) as t:
        assert t.data_ptr() == ptr, "torch got a copy"
        dist.all_reduce(t)
    a.add_index_tuple()  # memarray work after torch's collective, on another stream
    check("torch all_reduce", a.to_numpy(), base * weights + base, rank)

    # 2. memarray.distributed: the same collectives without torch in the loop.
    comm = md.init()
    assert (comm.rank, comm.size, comm.device_id) == (rank, world, local)
    b = memarray.asarray(base * (rank + 1), device=dev)
    comm.all_reduce(b)
    check("all_reduce", b.to_numpy(), base * weights, rank)
    m = memarray.asarray(base + rank, device=dev)
    comm.all_reduce(m, op="max")
    check("all_reduce max", m.to_numpy(), base + world - 1, rank)
    g = memarray.empty((world, 4), "int32", device=dev)
    comm.all_gather(memarray.asarray(np.full(4, rank, np.int32), device=dev), g)
    check(
        "all_gather",
        g.to_numpy(),
        np.repeat(np.arange(world, dtype=np.int32), 4).reshape(world, 4),
        rank,
    )
    full = memarray.asarray(np.arange(world * 3, dtype=np.int32) * (rank + 1), device=dev)
    block = memarray.empty((3,), "int32", device=dev)
    comm.reduce_scatter(full, block)
    check(
        "reduce_scatter",
        block.to_numpy(),
        np.arange(rank * 3, rank * 3 + 3, dtype=np.int32) * weights,
        rank,
    )
    c = memarray.asarray(np.full(5, rank * 10, np.int32), device=dev)
    comm.broadcast(c, root=world - 1)
    check("broadcast", c.to_numpy(), np.full(5, (world - 1) * 10, np.int32), rank)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    out = memarray.empty((7,), "int32", device=dev)
    with md.group():  # a ring: every rank sends and receives at once
        comm.send(memarray.asarray(np.full(7, rank, np.int32), device=dev), nxt)
        comm.recv(out, prv)
    check("send/recv", out.to_numpy(), np.full(7, prv, np.int32), rank)

    dist.barrier()
    if rank == 0:
        print(f"{world} ranks: torch.distributed and memarray.distributed collectives exact")
        print("ok")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
