"""Ray figures: arrays actor to actor, memarray against torch (and NumPy on the host) in the
same run.

    python3 benches/ray_transfer.py [--mib 256] [--small 1000] [--reps 5] [--json out.json]

Each row is the median of ``--reps`` hand-offs after one warm-up: the driver asks the
sending actor for its array (made once and kept, so no row times an allocation) and passes
the reference to the receiving actor, which waits for the data and returns its size; the
driver times ``ray.get`` of that. Rows:

- host: one ``--mib`` array and ``--small`` arrays of 4 KiB in one object, as Ray objects
  (MemArray, NumPy) and through the ``"memarray"`` transport (its object-store way);
- device, one GPU (two actors with half a GPU each): the ``"memarray"`` transport (CUDA
  IPC), a MemArray as a Ray object, torch through Ray's ``cuda_ipc`` transport and as a Ray
  object; ``--small`` device arrays of 4 KiB in one object by both transports;
- device, two GPUs (one actor on each): the ``"memarray"`` transport (actors see every GPU
  and pick theirs) against torch through Ray's ``nccl`` transport.

A row whose library or devices are missing prints SKIPPED with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np
import ray

import memarray
import memarray.ray as mray

NOSET = {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}


def torch_or_none() -> Any:
    try:
        import torch

        return torch if torch.cuda.is_available() else None
    except ImportError:
        return None


@ray.remote(enable_tensor_transport=True)
class Sender:
    """Holds the arrays it hands out: `make` once, then each method returns the same."""

    def __init__(self, pick_gpu: bool = False) -> None:
        if pick_gpu:
            mray.use_assigned_gpu()
        self.held: dict[str, Any] = {}

    def make(self, kind: str, nbytes: int, count: int, device: bool) -> int:
        n = nbytes // 8
        if kind == "memarray":
            where = "cuda" if device else "cpu"
            arrays = [
                memarray.asarray(np.full(n, i, np.float64), device=where) for i in range(count)
            ]
            for a in arrays:
                a.synchronize()
        elif kind == "numpy":
            arrays = [np.full(n, i, np.float64) for i in range(count)]
        else:
            import torch

            dev = "cuda" if device else "cpu"
            arrays = [
                torch.full((n,), float(i), dtype=torch.float64, device=dev) for i in range(count)
            ]
            if device:
                torch.cuda.synchronize()
        self.held[kind] = arrays[0] if count == 1 else arrays
        return count

    def give(self, kind: str) -> Any:
        """The held arrays (called with ``.options(tensor_transport=...)`` or plain)."""
        return self.held[kind]


@ray.remote(enable_tensor_transport=True)
class Receiver:
    def __init__(self, pick_gpu: bool = False) -> None:
        if pick_gpu:
            mray.use_assigned_gpu()

    def consume(self, x: Any) -> int:
        arrays = x if isinstance(x, list) else [x]
        total = 0
        for a in arrays:
            if isinstance(a, memarray.MemArray):
                a.synchronize()
                total += a.nbytes
            elif isinstance(a, np.ndarray):
                total += a.nbytes
            else:
                import torch

                if a.is_cuda:
                    torch.cuda.synchronize(a.device)
                total += a.numel() * a.element_size()
        return total

    def where(self, x: Any) -> list[str]:
        arrays = x if isinstance(x, list) else [x]
        return sorted({str(a.device) for a in arrays})

    def stats(self) -> dict[str, int]:
        return mray.statistics()


def hand_off(sender: Any, receiver: Any, kind: str, transport: str | None, reps: int) -> float:
    """Median milliseconds of `reps` hand-offs (after one warm-up); `transport` None: as a
    Ray object."""
    give = sender.give if transport is None else sender.give.options(tensor_transport=transport)

    def once() -> int:
        return ray.get(receiver.consume.remote(give.remote(kind)))

    expected = once()
    runs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        got = once()
        runs.append(time.perf_counter() - t0)
        assert got == expected
    return statistics.median(runs) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--small", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    big, small = args.mib << 20, 4096
    gpus = memarray.cuda.device_count() if memarray.cuda.is_available() else 0
    torch = torch_or_none()
    ray.init(num_gpus=gpus, include_dashboard=False, log_to_driver=False)
    rows: list[dict[str, Any]] = []

    def row(what: str, ms: float, nbytes: int, peer: str = "") -> None:
        r = {"what": what, "ms": round(ms, 3), "GB/s": round(nbytes / ms / 1e6, 2), "peer": peer}
        rows.append(r)
        print(f"{what:<58} {ms:9.2f} ms {r['GB/s']:8.2f} GB/s", flush=True)

    # Host.
    s, r = Sender.remote(), Receiver.remote()
    for count, nbytes in ((1, big), (args.small, small)):
        label = f"{args.mib} MiB" if count == 1 else f"{count} x 4 KiB"
        ray.get([s.make.remote(k, nbytes, count, False) for k in ("memarray", "numpy")])
        total = count * nbytes
        row(
            f"host {label}: memarray transport",
            hand_off(s, r, "memarray", "memarray", args.reps),
            total,
        )
        row(f"host {label}: MemArray object", hand_off(s, r, "memarray", None, args.reps), total)
        row(f"host {label}: NumPy object", hand_off(s, r, "numpy", None, args.reps), total, "peer")
    ray.kill(s)
    ray.kill(r)

    if gpus < 1:
        print("SKIPPED device rows: no CUDA device")
    else:
        s = Sender.options(num_gpus=0.5).remote()
        r = Receiver.options(num_gpus=0.5).remote()
        for count, nbytes in ((1, big), (args.small, small)):
            label = f"{args.mib} MiB" if count == 1 else f"{count} x 4 KiB"
            total = count * nbytes
            ray.get(s.make.remote("memarray", nbytes, count, True))
            row(
                f"1 GPU {label}: memarray transport (IPC)",
                hand_off(s, r, "memarray", "memarray", args.reps),
                total,
            )
            row(
                f"1 GPU {label}: MemArray object",
                hand_off(s, r, "memarray", None, args.reps),
                total,
            )
            if torch is None:
                print("SKIPPED torch rows: torch with CUDA is not importable")
                continue
            ray.get(s.make.remote("torch", nbytes, count, True))
            row(
                f"1 GPU {label}: torch, Ray's cuda_ipc transport",
                hand_off(s, r, "torch", "cuda_ipc", args.reps),
                total,
                "peer",
            )
            row(
                f"1 GPU {label}: torch object",
                hand_off(s, r, "torch", None, args.reps),
                total,
                "peer",
            )
        st = ray.get(r.stats.remote())
        ipc = max(st["ipc_objects"], 1)
        print(
            f"receiver: {st['ipc_objects']:.0f} objects by IPC (per object: open "
            f"{st['ipc_open_s'] / ipc * 1e3:.3f} ms, copy and wait "
            f"{st['ipc_copy_s'] / ipc * 1e3:.3f} ms), "
            f"{st['store_objects']:.0f} through the store"
        )
        ray.kill(s)
        ray.kill(r)

    if gpus < 2:
        print(f"SKIPPED two-GPU rows: {gpus} CUDA device(s)")
    else:
        env = {"runtime_env": {"env_vars": NOSET}}
        s = Sender.options(num_gpus=1, **env).remote(True)
        r = Receiver.options(num_gpus=1, **env).remote(True)
        ray.get(s.make.remote("memarray", big, 1, True))
        print(
            "memarray arrays land on",
            ray.get(r.where.remote(s.give.options(tensor_transport="memarray").remote("memarray"))),
        )
        row(
            f"2 GPUs {args.mib} MiB: memarray transport (IPC, peer copy)",
            hand_off(s, r, "memarray", "memarray", args.reps),
            big,
        )
        ray.kill(s)  # their GPUs, for torch's pair
        ray.kill(r)
        if torch is not None:
            from ray.experimental.collective import create_collective_group

            ts, tr = Sender.options(num_gpus=1).remote(), Receiver.options(num_gpus=1).remote()
            create_collective_group([ts, tr], backend="nccl")
            ray.get(ts.make.remote("torch", big, 1, True))
            row(
                f"2 GPUs {args.mib} MiB: torch, Ray's nccl transport",
                hand_off(ts, tr, "torch", "nccl", args.reps),
                big,
                "peer",
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "host": os.uname().nodename, "gpus": gpus}, f, indent=1)
    ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
