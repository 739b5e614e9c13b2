"""A captured simulation loop against eager ones: the seed's kind of loop (several small
kernels a step over device arrays, a host snapshot every N steps), eager and captured,
in memarray, CuPy and torch, same run.

    python3 benches/graph_loop.py [--arrays 4] [--side 128] [--steps 400] [--every 20]
                                  [--rounds 7] [--json out.json]

Each step adds each array's index tuple to it (`add_index_tuple`, one kernel per array;
CuPy and torch add a precomputed array of the same values, one kernel per array too; the
"memarray add" rows do what the peers do, with an add kernel compiled by NVRTC: eager
without snapshots, and as a graph alone).
Every ``--every`` steps the host takes a snapshot of the first array (a copy into one
reused pageable NumPy buffer, the same for every library, waited for). Captured rows
record ``--every`` steps once (a graph of arrays x every kernels) and launch it once per
block, the snapshot taken between launches as in the eager rows; "graph alone" rows
launch the same graphs back to back with no snapshot (the graphs' own time). Times are
per step, the whole loop waited for, medians of ``--rounds`` rounds in which every loop
runs once, in turn (after a warm-up round); every library's final arrays are checked
against the expected values.
Prints SKIPPED without a GPU.
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
    ap.add_argument("--side", type=int, default=128)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not memarray.cuda.is_available():
        print(f"SKIPPED: no CUDA device ({memarray.cuda.unavailable_reason()})")
        return 0
    shape = (args.side, args.side)
    k, steps, every = args.arrays, args.steps, args.every
    blocks = steps // every
    steps = blocks * every
    h = memarray.zeros(shape, "float32")
    h.add_index_tuple()
    inc = h.to_numpy()  # what one step adds to each array
    snap = np.empty(shape, np.float32)
    rows: dict[str, float] = {}
    loops: list[tuple[dict[str, float], str, Callable[[], None]]] = []
    # Each library's last array and how many loops of all steps ran on it.
    finals: dict[str, tuple[Callable[[], np.ndarray], int]] = {}
    replays: dict[str, float] = {}  # the captured loops without snapshots: the graphs alone

    # memarray, eager and captured, on one stream of its own.
    s = memarray.cuda.Stream()
    ma = [memarray.zeros(shape, "float32", device="cuda") for _ in range(k)]
    for a in ma:
        a.add_index_tuple(stream=s)  # loads the module, sets each array's stream
    s.synchronize()

    def ma_eager() -> None:
        for _ in range(blocks):
            for _ in range(every):
                for a in ma:
                    a.add_index_tuple(stream=s)
            ma[0].to_numpy(out=snap)
        s.synchronize()

    with s.capture() as cap:
        for _ in range(every):
            for a in ma:
                a.add_index_tuple(stream=s)
    graph = cap.graph
    graph.upload()

    def ma_graph() -> None:
        for _ in range(blocks):
            graph.launch()
            # A launch is not an array's pending work: the host waits for the stream.
            s.synchronize()
            ma[0].to_numpy(out=snap)
        s.synchronize()

    def ma_replays() -> None:
        graph.replay(blocks)
        s.synchronize()

    for a in ma:
        a.read_numpy_array(np.zeros(shape, np.float32))
    loops.append((rows, "memarray eager", ma_eager))
    loops.append((rows, "memarray captured", ma_graph))
    loops.append((replays, "memarray", ma_replays))
    finals["memarray"] = (lambda: ma[-1].to_numpy(), 3)

    # The peers' own work in memarray: an add kernel of its own (NVRTC), a precomputed
    # array added per step, eager and as a graph, so the graphs compare kernel for kernel.
    add = None
    try:
        add = memarray.cuda.Module.from_source(ADD_SOURCE, "add.cu").function("add")
    except memarray.CudaUnavailableError as e:  # no NVRTC here: the rows are left out
        print(f"SKIPPED: memarray's add kernel rows (NVRTC: {e})")
    if add is not None:
        n = args.side * args.side
        grid, block = add.config_for(n)
        madd = [memarray.zeros((n,), "float32", device="cuda") for _ in range(k)]
        minc = memarray.asarray(inc.reshape(-1), device="cuda")
        In = memarray.cuda.In

        def add_step() -> None:
            for a in madd:
                add.launch(a, In(minc), grid=grid, block=block, stream=s)

        add_step()  # loads nothing more, sets each array's stream
        s.synchronize()
        with s.capture() as add_cap:
            for _ in range(every):
                add_step()
        add_graph = add_cap.graph
        add_graph.upload()
        for a in madd:
            a.read_numpy_array(np.zeros(n, np.float32))

        def add_eager() -> None:
            for _ in range(steps):
                add_step()
            s.synchronize()

        def add_replays() -> None:
            add_graph.replay(blocks)
            s.synchronize()

        loops.append((rows, "memarray add, no snapshots", add_eager))
        loops.append((replays, "memarray add", add_replays))
        finals["memarray add"] = (lambda: madd[-1].to_numpy().reshape(shape), 2)

    try:
        import cupy
    except ImportError:
        cupy = None
    if cupy is not None:
        cs = cupy.cuda.Stream(non_blocking=True)
        with cs:
            ca = [cupy.zeros(shape, cupy.float32) for _ in range(k)]
            cinc = cupy.asarray(inc)
        cs.synchronize()

        def cp_eager() -> None:
            with cs:
                for _ in range(blocks):
                    for _ in range(every):
                        for a in ca:
                            a += cinc
                    ca[0].get(out=snap, stream=cs)
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
                ca[0].get(out=snap, stream=cs)
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
        ta = [torch.zeros(shape, device="cuda") for _ in range(k)]
        tinc = torch.from_numpy(inc).cuda()
        tsnap = torch.from_numpy(snap)  # the same pageable host buffer as the others
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

    eager = min(v for n, v in rows.items() if n.endswith("eager"))
    peers = [v for n, v in rows.items() if n.endswith("captured") and not n.startswith("memarray")]
    print(
        f"{k} arrays of {args.side} x {args.side} float32, {steps} steps, a host snapshot "
        f"every {every} (per step, median of {args.rounds})"
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
