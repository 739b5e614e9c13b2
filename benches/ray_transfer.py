"""Ray figures: arrays actor to actor, memarray against torch (and NumPy on the host) in the
same run.

    python3 benches/ray_transfer.py [--mib 256] [--small 1000] [--reps 9] [--json out.json]

Each row is the median of ``--reps`` hand-offs after one warm-up (rows of one group taking
turns): the driver asks the
sending actor for its array (made once and kept, so no row times an allocation) and passes
the reference to the receiving actor, which sums the data where it landed (on its GPU by
torch through DLPack, zero-copy, for memarray's arrays and torch's alike) and returns the
sum; the driver times ``ray.get`` of that. Beside each row, the consumer's own part of it
(its conversions and sum, timed in the receiving actor); beside each group, both actors'
per-phase timings (means from ``memarray.ray.statistics``, medians from
``memarray.ray.phases``). Rows:

- host: one ``--mib`` array and ``--small`` arrays of 4 KiB in one object, as Ray objects
  (MemArray, NumPy) and through the ``"memarray"`` transport (its object-store way);
- device, one GPU (two actors with half a GPU each): the ``"memarray"`` transport (CUDA
  IPC), a MemArray as a Ray object, torch through Ray's ``cuda_ipc`` transport and as a Ray
  object; ``--small`` device arrays of 4 KiB in one object by both transports, and
  ``--small`` views of one allocation (a Bundle's items) as a list, as one Bundle of them
  (``copy=False``) and beside them the one array of their bytes;
- device, two GPUs (one actor on each), one ``--mib`` array and ``--small`` arrays of 4 KiB:
  the ``"memarray"`` transport against ``"memarray_nccl"`` with actors that see every GPU
  and pick theirs, then, actors seeing one GPU each (Ray's default), both of memarray's
  transports against torch through Ray's ``nccl`` transport and the list through the object
  store, with the views rows by ``"memarray_nccl"``, each group alternating round by round;
- ``alone``: one ``--mib`` array by torch's ``nccl`` and by ``"memarray_nccl"``, each in a
  pair of actors of its own (only its own communicator), pair after pair, twice.

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
        where = "cuda" if device else "cpu"
        if kind == "whole":  # the one array `count` views would be views of
            self.held[kind] = memarray.asarray(np.zeros(n * count), device=where)
            return 1
        if kind in ("views", "views bundle"):  # `count` views of one allocation
            parts = [
                memarray.asarray(np.full(n, i, np.float64), device=where) for i in range(count)
            ]
            views = list(mray.Bundle(parts))
            self.held[kind] = views if kind == "views" else mray.Bundle(views, copy=False)
            return count
        if kind in ("memarray", "bundle"):
            arrays = [
                memarray.asarray(np.full(n, i, np.float64), device=where) for i in range(count)
            ]
            for a in arrays:
                a.synchronize()
            if kind == "bundle":
                self.held[kind] = mray.Bundle(arrays)
                return count
        elif kind == "numpy":
            arrays = [np.full(n, i, np.float64) for i in range(count)]
        else:
            import torch

            arrays = [
                torch.full((n,), float(i), dtype=torch.float64, device=where) for i in range(count)
            ]
            if device:
                torch.cuda.synchronize()
        self.held[kind] = arrays[0] if count == 1 else arrays
        return count

    def stats(self) -> dict[str, float]:
        return mray.statistics()

    def phases(self, reset: bool) -> dict[str, list[float]]:
        return mray.phases(reset)

    def give(self, kind: str) -> Any:
        """The held arrays (called with ``.options(tensor_transport=...)`` or plain)."""
        return self.held[kind]


@ray.remote(enable_tensor_transport=True)
class Receiver:
    def __init__(self, pick_gpu: bool = False) -> None:
        if pick_gpu:
            mray.use_assigned_gpu()

    def consume(self, x: Any) -> tuple[int, float, float]:
        """The bytes received and their sum, computed where they are: device arrays (torch's
        and memarray's alike) summed on their GPU by torch, zero-copy through DLPack (a
        list in one torch.cat and one sum), host arrays by NumPy, zero-copy through the
        buffer protocol; and the seconds this work took here (the consumer's own part of
        a hand-off)."""
        t0 = time.perf_counter()
        nbytes, total = self._sum(x)
        return nbytes, total, time.perf_counter() - t0

    def _sum(self, x: Any) -> tuple[int, float]:
        arrays = x if isinstance(x, (list, mray.Bundle)) else [x]
        nbytes = sum(int(a.nbytes) for a in arrays)
        if not arrays:
            return 0, 0.0
        first = arrays[0]
        on_device = (
            first.on_device
            if isinstance(first, memarray.MemArray)
            else (not isinstance(first, np.ndarray) and first.is_cuda)
        )
        if not on_device:
            host = [np.asarray(a) for a in arrays]  # zero-copy: the buffer protocol
            return nbytes, float(sum(h.sum() for h in host))
        import torch

        tensors = [torch.from_dlpack(a) for a in arrays]
        flat = tensors[0] if len(tensors) == 1 else torch.cat([t.view(-1) for t in tensors])
        return nbytes, float(flat.sum().item())  # .item() waits for the GPU

    def where(self, x: Any) -> list[str]:
        arrays = x if isinstance(x, (list, mray.Bundle)) else [x]
        return sorted({str(a.device) for a in arrays})

    def stats(self) -> dict[str, int]:
        return mray.statistics()

    def phases(self, reset: bool) -> dict[str, list[float]]:
        return mray.phases(reset)


def hand_off(sender: Any, receiver: Any, kind: str, transport: str | None, reps: int) -> float:
    """Median milliseconds of `reps` hand-offs (after one warm-up); `transport` None: as a
    Ray object."""
    return alternate({"x": (sender, receiver, kind, transport)}, reps)["x"]


def costs(s: Any, r: Any) -> tuple[dict[str, float], dict[str, float]]:
    return ray.get(s.stats.remote()), ray.get(r.stats.remote())


def explain(label: str, before: Any, after: Any) -> None:
    """Per object, from memarray.ray.statistics() on both sides between `before` and
    `after`: what the sender's description (packing included) and the receiver's part
    took, by way."""
    ds = {k: after[0][k] - before[0][k] for k in after[0]}
    dr = {k: after[1][k] - before[1][k] for k in after[1]}
    out = []
    if ds["sent_objects"]:
        out.append(f"sender describes {ds['describe_s'] / ds['sent_objects'] * 1e3:.3f} ms")
    if ds["packed_objects"]:
        out.append(f"of which packing {ds['pack_s'] / ds['packed_objects'] * 1e3:.3f} ms")
    if ds.get("nccl_sends"):
        n = ds["nccl_sends"]
        out.append(
            f"sender queues {ds['nccl_send_s'] / n * 1e3:.3f} + waits "
            f"{ds['nccl_send_wait_s'] / n * 1e3:.3f} ms"
        )
    for way, secs in (
        ("ipc", ("ipc_open_s", "ipc_copy_s")),
        ("nccl", ("nccl_alloc_s", "nccl_wait_s")),
        ("store", ("store_s",)),
    ):
        n = dr[f"{way}_objects"]
        if n:
            each = " + ".join(f"{dr[k] / n * 1e3:.3f}" for k in secs)
            out.append(f"receiver by {way} {each} ms")
    received = dr["ipc_objects"] + dr["nccl_objects"]
    if dr["unpack_s"] and received:
        out.append(f"unpacking {dr['unpack_s'] / received * 1e3:.3f} ms")
    print(f"  {label}, per object: {'; '.join(out)}")


def forget_phases(s: Any, r: Any) -> None:
    ray.get([s.phases.remote(True), r.phases.remote(True)])


def phase_medians(label: str, s: Any, r: Any) -> None:
    """Per object, the median of each phase both actors timed since ``forget_phases``
    (``memarray.ray.phases``): unlike the means ``explain`` prints, one slow object (an NCCL
    pair's first transfer) does not move them."""
    sent, got = ray.get([s.phases.remote(True), r.phases.remote(True)])
    out = []
    for side, samples in (("sender", sent), ("receiver", got)):
        for name in sorted(samples):
            if samples[name]:
                ms = statistics.median(samples[name]) * 1e3
                out.append(f"{side} {name[:-2]} {ms:.3f} ({len(samples[name])})")
    print(f"  {label}, medians per object in ms (count): {'; '.join(out)}")


# The consumer's own work (its sum, conversions included) per case: median milliseconds,
# filled by `alternate`, printed by each row beside the whole hand-off.
CONSUMER_MS: dict[str, float] = {}


def alternate(cases: dict[str, tuple[Any, Any, str, str | None]], reps: int) -> dict[str, float]:
    """Median milliseconds per case of `reps` rounds, each round one hand-off of every case
    in turn (so drift in the machine touches every case alike), after one warm-up each.
    A case is (sender, receiver, kind, transport); transport None: as a Ray object. Each
    hand-off's bytes and sum must match the warm-up's. The consumer's own part goes to
    ``CONSUMER_MS``."""

    def once(
        sender: Any, receiver: Any, kind: str, transport: str | None
    ) -> tuple[int, float, float]:
        give = sender.give if transport is None else sender.give.options(tensor_transport=transport)
        return ray.get(receiver.consume.remote(give.remote(kind)))

    expected = {name: once(*case)[:2] for name, case in cases.items()}
    runs: dict[str, list[float]] = {name: [] for name in cases}
    consumer: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(reps):
        for name, case in cases.items():
            t0 = time.perf_counter()
            got = once(*case)
            runs[name].append(time.perf_counter() - t0)
            consumer[name].append(got[2])
            assert got[:2] == expected[name], (name, got, expected[name])
    CONSUMER_MS.update({name: statistics.median(c) * 1e3 for name, c in consumer.items()})
    return {name: statistics.median(r) * 1e3 for name, r in runs.items()}


def views_rows(s: Any, nbytes: int, count: int) -> dict[str, str]:
    """Has the sender make, on its GPU, `count` views of one allocation (as a list and as
    one Bundle of them) and the one array they view; returns each kind with its row text."""
    rows = {
        "views": f"a list of {count} views of one allocation",
        "views bundle": "one Bundle of those views (copy=False)",
        "whole": f"the one array of {count * nbytes >> 10} KiB they view",
    }
    ray.get([s.make.remote(kind, nbytes, count, True) for kind in rows])
    return rows


def two_gpus(args: argparse.Namespace, big: int, small: int, torch: Any, row: Any) -> None:
    """One actor on each GPU. First a pair that sees both GPUs (IPC needs that): memarray's
    IPC and NCCL transports, alternating; then a pair as Ray places them by default (one
    visible GPU each, what torch's ``nccl`` transport expects): memarray's NCCL transport
    and torch's, alternating. memarray_nccl in both runs links the two."""
    env = {"runtime_env": {"env_vars": NOSET}}
    pairs = [
        ("seeing both GPUs", {"num_gpus": 1, **env}, True, ["memarray", "memarray_nccl"]),
        ("one GPU each", {"num_gpus": 1}, False, ["memarray", "memarray_nccl", "nccl"]),
    ]
    for what, options, pick, transports in pairs:
        if torch is None and "nccl" in transports:
            print("SKIPPED torch rows: torch with CUDA is not importable")
            transports = [t for t in transports if t != "nccl"]
        s = Sender.options(**options).remote(pick)
        r = Receiver.options(**options).remote(pick)
        group = f"bench-{pick}"
        print(
            f"actors {what}: memarray's NCCL group on devices",
            mray.create_nccl_group([s, r], group),
        )
        if "nccl" in transports:
            from ray.experimental.collective import create_collective_group

            create_collective_group([s, r], backend="nccl")
        for count, nbytes in ((1, big), (args.small, small)):
            label = f"{args.mib} MiB" if count == 1 else f"{count} x 4 KiB"
            ray.get(s.make.remote("memarray", nbytes, count, True))
            cases = {}
            if count > 1 and "memarray_nccl" in transports:
                ray.get(s.make.remote("bundle", nbytes, count, True))
                cases[f"2 GPUs {label}, {what}: one Bundle by memarray_nccl"] = (
                    s,
                    r,
                    "bundle",
                    "memarray_nccl",
                )
            for t in transports:
                kind = "torch" if t == "nccl" else "memarray"
                name = {
                    "memarray": "memarray transport (IPC, peer copy)",
                    "memarray_nccl": "memarray_nccl transport",
                    "nccl": "torch, Ray's nccl transport",
                }[t]
                cases[f"2 GPUs {label}, {what}: {name}"] = (s, r, kind, t)
            if count > 1 and "memarray_nccl" in transports:
                for kind, text in views_rows(s, nbytes, count).items():
                    cases[f"2 GPUs {label}, {what}: {text} by memarray_nccl"] = (
                        s,
                        r,
                        kind,
                        "memarray_nccl",
                    )
            if count > 1:
                cases[f"2 GPUs {label}, {what}: the list as a Ray object (object store)"] = (
                    s,
                    r,
                    "memarray",
                    None,
                )
            if "nccl" in transports:
                ray.get(s.make.remote("torch", nbytes, count, True))
            if "memarray" in transports:
                print(
                    "memarray arrays land on",
                    ray.get(
                        r.where.remote(
                            s.give.options(tensor_transport="memarray").remote("memarray")
                        )
                    ),
                )
            before = costs(s, r)
            forget_phases(s, r)
            for name, ms in alternate(cases, args.reps).items():
                row(name, ms, count * nbytes, "peer" if "torch" in name else "")
            explain(f"2 GPUs {label}, {what}", before, costs(s, r))
            phase_medians(f"2 GPUs {label}, {what}", s, r)
        st = ray.get(r.stats.remote())
        print(
            f"receiver ({what}): {st['ipc_objects']:.0f} objects by IPC (per object: open "
            f"{st['ipc_open_s'] / max(st['ipc_objects'], 1) * 1e3:.3f} ms, copy and wait "
            f"{st['ipc_copy_s'] / max(st['ipc_objects'], 1) * 1e3:.3f} ms), "
            f"{st['nccl_objects']:.0f} over NCCL "
            f"({st['nccl_s'] / max(st['nccl_objects'], 1) * 1e3:.3f} ms each), "
            f"{st['store_objects']:.0f} through the store"
        )
        mray.destroy_nccl_group(group)
        ray.kill(s)
        ray.kill(r)


def alone(args: argparse.Namespace, big: int, torch: Any, row: Any) -> None:
    """Each library in an actor pair of its own (one GPU each, only its own communicator),
    one ``--mib`` array: torch's ``nccl``, memarray's, torch's, memarray's, one pair after
    the other (blocks, not rounds: the two pairs cannot hold the GPUs at once)."""
    if torch is None:
        print("SKIPPED pairs alone: torch with CUDA is not importable")
        return
    from ray.experimental.collective import create_collective_group

    for turn, transport in enumerate(["nccl", "memarray_nccl"] * 2):
        s = Sender.options(num_gpus=1).remote()
        r = Receiver.options(num_gpus=1).remote()
        if transport == "nccl":
            create_collective_group([s, r], backend="nccl")
            kind, name = "torch", "torch, Ray's nccl transport"
        else:
            mray.create_nccl_group([s, r], f"alone-{turn}")
            kind, name = "memarray", "memarray_nccl transport"
        ray.get(s.make.remote(kind, big, 1, True))
        case = f"2 GPUs {args.mib} MiB, pair alone {turn // 2 + 1}: {name}"
        ms = alternate({case: (s, r, kind, transport)}, args.reps)[case]
        row(case, ms, big, "peer" if kind == "torch" else "")
        if transport == "memarray_nccl":
            mray.destroy_nccl_group(f"alone-{turn}")
        ray.kill(s)
        ray.kill(r)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--small", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--parts", default="host,1gpu,2gpu,alone", help="which groups of rows, comma-separated"
    )
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    big, small = args.mib << 20, 4096
    gpus = memarray.cuda.device_count() if memarray.cuda.is_available() else 0
    torch = torch_or_none()
    ray.init(num_gpus=gpus, include_dashboard=False, log_to_driver=False)
    rows: list[dict[str, Any]] = []

    def row(what: str, ms: float, nbytes: int, peer: str = "") -> None:
        r = {"what": what, "ms": round(ms, 3), "GB/s": round(nbytes / ms / 1e6, 2), "peer": peer}
        own = CONSUMER_MS.get(what)
        if own is not None:
            r["consumer_ms"] = round(own, 3)
        rows.append(r)
        mine = "" if own is None else f"  (consumer's own work {own:.2f} ms)"
        print(f"{what:<58} {ms:9.2f} ms {r['GB/s']:8.2f} GB/s{mine}", flush=True)

    # Host.
    s, r = Sender.remote(), Receiver.remote()
    for count, nbytes in ((1, big), (args.small, small)) if "host" in parts else ():
        label = f"{args.mib} MiB" if count == 1 else f"{count} x 4 KiB"
        kinds = ("memarray", "numpy")
        if count > 1:
            kinds += ("bundle", "views", "views bundle")
        ray.get([s.make.remote(k, nbytes, count, False) for k in kinds])
        total = count * nbytes
        cases = {
            f"host {label}: memarray transport": (s, r, "memarray", "memarray"),
            f"host {label}: MemArray object": (s, r, "memarray", None),
            f"host {label}: NumPy object": (s, r, "numpy", None),
        }
        if count > 1:
            cases[f"host {label}: {count} views of one allocation, as an object"] = (
                s,
                r,
                "views",
                None,
            )
            cases[f"host {label}: one Bundle of those views (copy=False), as an object"] = (
                s,
                r,
                "views bundle",
                None,
            )
            cases[f"host {label}: one Bundle by the memarray transport"] = (
                s,
                r,
                "bundle",
                "memarray",
            )
            cases[f"host {label}: one Bundle as an object"] = (s, r, "bundle", None)
        for name, ms in alternate(cases, args.reps).items():
            row(name, ms, total, "peer" if "NumPy" in name else "")
    ray.kill(s)
    ray.kill(r)

    if gpus < 1:
        print("SKIPPED device rows: no CUDA device")
    elif "1gpu" in parts:
        s = Sender.options(num_gpus=0.5).remote()
        r = Receiver.options(num_gpus=0.5).remote()
        for count, nbytes in ((1, big), (args.small, small)):
            label = f"{args.mib} MiB" if count == 1 else f"{count} x 4 KiB"
            total = count * nbytes
            ray.get(s.make.remote("memarray", nbytes, count, True))
            cases = {
                f"1 GPU {label}: memarray transport (IPC)": (s, r, "memarray", "memarray"),
                f"1 GPU {label}: MemArray object": (s, r, "memarray", None),
            }
            if count > 1:
                ray.get(s.make.remote("bundle", nbytes, count, True))
                cases[f"1 GPU {label}: one Bundle by the memarray transport (IPC)"] = (
                    s,
                    r,
                    "bundle",
                    "memarray",
                )
                for kind, text in views_rows(s, nbytes, count).items():
                    cases[f"1 GPU {label}: {text} by IPC"] = (s, r, kind, "memarray")
            if torch is not None:
                ray.get(s.make.remote("torch", nbytes, count, True))
                cases[f"1 GPU {label}: torch, Ray's cuda_ipc transport"] = (
                    s,
                    r,
                    "torch",
                    "cuda_ipc",
                )
                cases[f"1 GPU {label}: torch object"] = (s, r, "torch", None)
            else:
                print("SKIPPED torch rows: torch with CUDA is not importable")
            before = costs(s, r)
            forget_phases(s, r)
            for name, ms in alternate(cases, args.reps).items():
                row(name, ms, total, "peer" if "torch" in name else "")
            explain(f"1 GPU {label}", before, costs(s, r))
            phase_medians(f"1 GPU {label}", s, r)
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
    elif "2gpu" in parts:
        two_gpus(args, big, small, torch, row)
    if gpus >= 2 and "alone" in parts:
        alone(args, big, torch, row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "host": os.uname().nodename, "gpus": gpus}, f, indent=1)
    ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
