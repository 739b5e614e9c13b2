"""A captured simulation loop against eager ones: the seed's kind of loop (several small
kernels a step over device arrays, a host snapshot every N steps through pinned memory),
eager and captured, in memarray, CuPy and torch, same run.

    python3 benches/graph_loop.py [--arrays 4] [--n 16384] [--steps 400] [--every 20]
                                  [--rounds 7] [--json out.json]

Every library does the same work: each step adds a precomputed increment array to each of
``--arrays`` float32 arrays of ``--n`` elements, one kernel per array (memarray launches an
add kernel compiled by NVRTC on its arrays; CuPy and torch run ``a += inc``). Every
``--every`` steps the host takes a snapshot of the first array into pinned host memory of
the library's own (a memarray pinned array, ``cupyx.empty_pinned``, a pinned torch tensor),
waited for. Captured rows record ``--every`` steps once (a graph of arrays x every kernels)
and launch it once per block, the snapshot taken between launches as in the eager rows
(memarray's snapshot waits for the launch as the array's pending work; CuPy's and torch's
wait for their stream); "graph alone" rows launch the same graphs back to back with no
snapshot. Times are per step, the whole loop waited for, medians of ``--rounds`` rounds in
which every loop runs once, in turn (after a warm-up round); every library's final arrays
are checked against the expected values.
Prints SKIPPED without a GPU or without NVRTC.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import numpy as np

import memarray

#: The peers' step in memarray: y += x over flat float32 arrays (memarray passes each
#: array as its Indexer: the data pointer, then the extent).
ADD_SOURCE = r"""
struct Ix1 { float* data; unsigned long long n; };
extern "C" __global__ void add(Ix1 y, Ix1 x) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < y.n) y.data[i] += x.data[i];
}
"""


def alternate(
    loops: list[tuple[dict[str, float], str, Callable[[], None]]], rounds: int, steps: int
) -> None:
    """Runs every loop once per round, the loops in turn within each round (a warm-up round
    first, not counted), and stores each one's median in microseconds per step under its
    name in its table."""
    times: dict[str, list[float]] = {name: [] for _, name, _ in loops}
    for r in range(1 + rounds):
        for _, name, run in loops:
            t0 = time.perf_counter()
            run()
            if r:
                times[name].append(time.perf_counter() - t0)
    for table, name, _ in loops:
        table[name] = statistics.median(times[name]) / steps * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--arrays", type=int, default=4)
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not memarray.cuda.is_available():
        print(f"SKIPPED: no CUDA device ({memarray.cuda.unavailable_reason()})")
        return 0
    try:
        add = memarray.cuda.Module.from_source(ADD_SOURCE, "add.cu").function("add")
    except memarray.CudaUnavailableError as e:
        print(f"SKIPPED: memarray's add kernel needs NVRTC ({e})")
        return 0
    k, n, steps, every = args.arrays, args.n, args.steps, args.every
    blocks = steps // every
    steps = blocks * every
    inc = (np.arange(n, dtype=np.float32) % 7) + 1  # what one step adds to each array
    rows: dict[str, float] = {}
    loops: list[tuple[dict[str, float], str, Callable[[], None]]] = []
    # Each library's last array and how many loops of all steps ran on it.
    finals: dict[str, tuple[Callable[[], np.ndarray], int]] = {}
    replays: dict[str, float] = {}  # the captured loops without snapshots: the graphs alone

    # memarray, eager and captured, on one stream of its own.
    s = memarray.cuda.Stream()
    grid, block = add.config_for(n)
    ma = [memarray.zeros((n,), "float32", device="cuda") for _ in range(k)]
    minc = memarray.asarray(inc, device="cuda")
    psnap = np.asarray(memarray.empty((n,), "float32", device="cpu", host_memory="pinned"))
    In = memarray.cuda.In

    def ma_step() -> None:
        for a in ma:
            add.launch(a, In(minc), grid=grid, block=block, stream=s)

    ma_step()  # loads nothing more, sets each array's stream
    s.synchronize()

    def ma_eager() -> None:
        for _ in range(blocks):
            for _ in range(every):
                ma_step()
            ma[0].to_numpy(out=psnap)
        s.synchronize()

    with s.capture() as cap:
        for _ in range(every):
            ma_step()
    graph = cap.graph
    graph.upload()

    def ma_graph() -> None:
        for _ in range(blocks):
            graph.launch()
            ma[0].to_numpy(out=psnap)  # waits for the launch: the array's pending work
        s.synchronize()

    def ma_replays() -> None:
        graph.replay(blocks)
        s.synchronize()

    for a in ma:
        a.read_numpy_array(np.zeros(n, np.float32))
    loops.append((rows, "memarray eager", ma_eager))
    loops.append((rows, "memarray captured", ma_graph))
    loops.append((replays, "memarray", ma_replays))
    finals["memarray"] = (lambda: ma[-1].to_numpy(), 3)

    try:
        import cupy
    except ImportError:
        cupy = None
    if cupy is not None:
        import cupyx

        cs = cupy.cuda.Stream(non_blocking=True)
        with cs:
            ca = [cupy.zeros((n,), cupy.float32) for _ in range(k)]
            cinc = cupy.asarray(inc)
        csnap = cupyx.empty_pinned((n,), np.float32)
        cs.synchronize()

        def cp_eager() -> None:
            with cs:
                for _ in range(blocks):
                    for _ in range(every):
                        for a in ca:
                            a += cinc
                    ca[0].get(out=csnap, stream=cs)
            cs.synchronize()

        with cs:
            cs.begin_capture()
            for _ in range(every):
                for a in ca:
                    a += cinc
            cgraph = cs.end_capture()
        cgraph.upload(cs)

        def cp_graph() -> None:
            for _ in range(blocks):
                cgraph.launch(cs)
                ca[0].get(out=csnap, stream=cs)
            cs.synchronize()

        def cp_replays() -> None:
            for _ in range(blocks):
                cgraph.launch(cs)
            cs.synchronize()

        loops.append((rows, "cupy eager", cp_eager))
        loops.append((rows, "cupy captured", cp_graph))
        loops.append((replays, "cupy", cp_replays))
        finals["cupy"] = (lambda: cupy.asnumpy(ca[-1]), 3)

    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        ts = torch.cuda.Stream()
        ta = [torch.zeros((n,), device="cuda") for _ in range(k)]
        tinc = torch.from_numpy(inc).cuda()
        tsnap = torch.empty((n,), pin_memory=True)
        torch.cuda.synchronize()

        def t_eager() -> None:
            with torch.cuda.stream(ts):
                for _ in range(blocks):
                    for _ in range(every):
                        for a in ta:
                            a.add_(tinc)
                    tsnap.copy_(ta[0])
            ts.synchronize()

        tgraph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(tgraph, stream=ts):
            for _ in range(every):
                for a in ta:
                    a.add_(tinc)

        def t_graph() -> None:
            with torch.cuda.stream(ts):
                for _ in range(blocks):
                    tgraph.replay()
                    tsnap.copy_(ta[0])
            ts.synchronize()

        for a in ta:
            a.zero_()
        torch.cuda.synchronize()  # zeroed on the default stream; the loops run on ts

        def t_replays() -> None:
            with torch.cuda.stream(ts):
                for _ in range(blocks):
                    tgraph.replay()
            ts.synchronize()

        loops.append((rows, "torch eager", t_eager))
        loops.append((rows, "torch captured", t_graph))
        loops.append((replays, "torch", t_replays))
        finals["torch"] = (lambda: ta[-1].cpu().numpy(), 3)

    alternate(loops, args.rounds, steps)
    # Every loop ran once a round and in the warm-up round, all its steps each time.
    for name, (final, n_loops) in finals.items():
        want = inc * (n_loops * (1 + args.rounds) * steps)
        np.testing.assert_allclose(final(), want, rtol=1e-6, err_msg=name)

    eager = min(v for name, v in rows.items() if name.endswith("eager"))
    peers = [
        v
        for name, v in rows.items()
        if name.endswith("captured") and not name.startswith("memarray")
    ]
    print(
        f"{k} arrays of {n} float32, {steps} steps, a pinned host snapshot every {every} "
        f"(per step, median of {args.rounds})"
    )
    for name, us in rows.items():
        print(f"  {name:<20} {us:8.2f} us/step")
    for name, us in replays.items():
        print(f"  {name + ' graph alone':<20} {us:8.2f} us/step (no snapshots)")
    ours = rows["memarray captured"]
    print(f"  memarray captured: {eager / ours:.2f}x the best eager loop", end="")
    if peers:
        print(f", {min(peers) / ours:.2f}x the best captured peer")
    else:
        print()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"rows_us_per_step": rows, "replays_us_per_step": replays, "args": vars(args)},
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
