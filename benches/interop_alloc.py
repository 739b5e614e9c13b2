"""The targets: torch, RMM, CuPy and Numba allocating through memarray against
their own allocators, a torch training loop on either, and the tracking adaptor's cost.

    python3 benches/interop_alloc.py [--json out.json]

Each peer runs in a subprocess of its own (torch's allocator, RMM's resource and Numba's
manager are process-wide); all in one invocation, so every ratio compares figures from the
same run on the same machine. Per-call times are medians of 7 repeats of N calls; peers
that can share a process are measured interleaved, the others in alternating processes
(3 each, median). A missed
target prints MISS and the script exits 1 (a benchmark: the figures are the product).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap

TIMER = textwrap.dedent(
    """
    import statistics, time
    def per_call(f, n=2000, repeats=7, warmup=200):
        for _ in range(warmup):
            f()
        runs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            runs.append((time.perf_counter() - t0) / n * 1e6)
        return statistics.median(runs)
    """
)

MIB = 1 << 20


def child(code: str) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    r = subprocess.run(
        [sys.executable, "-c", TIMER + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    if r.returncode != 0:
        raise SystemExit(f"child failed:\n{r.stdout}\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


TORCH = """
import json, sys, torch
if MODE == "memarray":
    import memarray.torch
    memarray.torch.install()
x = torch.empty(1, device="cuda")
empty = per_call(lambda: torch.empty(1 << 18, dtype=torch.float32, device="cuda"))
torch.manual_seed(0)
width, batch = 4096, 256
model = torch.nn.Sequential(
    torch.nn.Linear(width, width), torch.nn.ReLU(),
    torch.nn.Linear(width, width), torch.nn.ReLU(),
    torch.nn.Linear(width, width), torch.nn.ReLU(),
    torch.nn.Linear(width, width)).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
g = torch.Generator(device="cuda").manual_seed(1)
data = torch.randn(batch, width, device="cuda", generator=g)
target = torch.randn(batch, width, device="cuda", generator=g)
losses, steps = [], []
for i in range(110):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(data), target)
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    if i >= 10:
        steps.append((time.perf_counter() - t0) * 1e3)
        losses.append(loss.item())
print(json.dumps({"empty_us": empty, "step_ms": statistics.median(steps), "losses": losses}))
"""

RMM = """
import json, rmm, rmm.mr, memarray, memarray.rmm, memarray.resources as mr
pool = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=1 << 30)
ours = memarray.rmm.resource(device=0)
rmm.mr.set_per_device_resource(0, pool)
through_rmm = mr.Rmm(0)                       # over RMM's pool
default = mr.get_default_resource(0)
own, via, through = [], [], []
for _ in range(7):      # interleaved: every figure sees the same machine state
    rmm.mr.set_per_device_resource(0, pool)
    own.append(per_call(lambda: rmm.DeviceBuffer(size=1 << 20), repeats=1))
    rmm.mr.set_per_device_resource(0, ours)
    via.append(per_call(lambda: rmm.DeviceBuffer(size=1 << 20), repeats=1))
    with mr.using(through_rmm, 0):
        through.append(per_call(
            lambda: memarray.empty([1 << 20], "uint8", device="cuda"), repeats=1))
mine = per_call(lambda: memarray.empty([1 << 20], "uint8", device="cuda"))
print(json.dumps({"rmm_pool_us": statistics.median(own),
                  "rmm_via_memarray_us": statistics.median(via),
                  "memarray_empty_us": mine,
                  "memarray_via_rmm_us": statistics.median(through)}))
"""

CUPY = """
import json, cupy, memarray.cupy
pool, ours = cupy.get_default_memory_pool().malloc, memarray.cupy.allocator
own, via = [], []
for _ in range(7):      # interleaved: both see the same machine state
    cupy.cuda.set_allocator(pool)
    own.append(per_call(lambda: cupy.empty(1 << 20, dtype=cupy.uint8), repeats=1))
    cupy.cuda.set_allocator(ours)
    via.append(per_call(lambda: cupy.empty(1 << 20, dtype=cupy.uint8), repeats=1))
print(json.dumps({"cupy_pool_us": statistics.median(own),
                  "cupy_via_memarray_us": statistics.median(via)}))
"""

NUMBA = """
import json, numpy as np
np.row_stack = np.vstack
from numba import cuda
if MODE == "memarray":
    import memarray.numba
    cuda.set_memory_manager(memarray.numba.MemarrayNumbaManager)
cuda.device_array(1)
n = 1 << 18
dev = per_call(lambda: cuda.device_array(n, dtype=np.float32), n=500, warmup=50)
pinned = per_call(lambda: cuda.pinned_array(n, dtype=np.float32), n=200, warmup=20)
mapped = per_call(lambda: cuda.mapped_array(n, dtype=np.float32), n=200, warmup=20)
print(json.dumps({"device_array_us": dev, "pinned_array_us": pinned,
                  "mapped_array_us": mapped}))
"""

TRACKING = """
import json, memarray, memarray.resources as mr
bare = mr.Pool(mr.Device(0))
tracked = mr.Tracking(bare)
stacked = mr.Tracking(bare, stacks=True)
runs = {}
for _ in range(7):      # interleaved: every figure sees the same machine state
    for name, r in (("bare", bare), ("tracking", tracked), ("stacks", stacked)):
        runs.setdefault(name + "_allocate_us", []).append(
            per_call(lambda: r.allocate(1 << 20).free(), repeats=1))
        with mr.using(r, 0):
            runs.setdefault(name + "_empty_us", []).append(per_call(
                lambda: memarray.empty([1 << 20], "uint8", device="cuda"), repeats=1))
print(json.dumps({k: statistics.median(v) for k, v in runs.items()}))
"""


def alternate(code: str, rounds: int = 3) -> tuple[dict, dict]:
    """Runs `code` natively and through memarray in alternating processes, `rounds` times
    each; every number is the median over the rounds (lists: the first round's)."""
    runs: dict[str, list[dict]] = {"native": [], "memarray": []}
    for _ in range(rounds):
        for mode in ("native", "memarray"):
            runs[mode].append(child(f"MODE = {mode!r}\n" + code))

    def med(rs: list[dict]) -> dict:
        return {
            k: (statistics.median(r[k] for r in rs) if isinstance(v, float) else v)
            for k, v in rs[0].items()
        }

    return med(runs["native"]), med(runs["memarray"])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", help="write every figure here")
    args = ap.parse_args()
    res: dict = {}
    res["torch_native"], res["torch_memarray"] = alternate(TORCH)
    try:
        import rmm  # noqa: F401

        res["rmm"] = child(RMM)
    except ImportError:
        print("RMM not installed: its rows are missing (pip install rmm-cu13)")
    res["cupy"] = child(CUPY)
    res["numba_native"], res["numba_memarray"] = alternate(NUMBA)
    res["tracking"] = child(TRACKING)

    rows = []

    def check(name: str, ours: float, peer: float, limit: float, unit: str = "us") -> None:
        ratio = ours / peer
        ok = ratio <= limit
        rows.append((name, ours, peer, ratio, limit, ok))
        print(
            f"{'PASS' if ok else 'MISS'}  {name:58s} {ours:9.2f} {unit} vs {peer:9.2f} {unit}"
            f"  ratio {ratio:5.2f} (target <= {limit:g})"
        )

    tn, tm = res["torch_native"], res["torch_memarray"]
    check(
        "torch.empty 1 MiB: memarray / torch's caching allocator",
        tm["empty_us"],
        tn["empty_us"],
        1.5,
    )
    check(
        "MLP 4x4096, batch 256, Adam: step time memarray / native",
        tm["step_ms"],
        tn["step_ms"],
        1.05,
        "ms",
    )
    worst = max(
        abs(a - b) / max(abs(b), 1e-12) for a, b in zip(tm["losses"], tn["losses"], strict=True)
    )
    print(
        f"{'PASS' if worst <= 1e-3 else 'MISS'}  loss curves agree: worst relative "
        f"difference {worst:.2e} over {len(tn['losses'])} steps (target <= 1e-3)"
    )
    res["loss_max_rel_diff"] = worst
    if "rmm" in res:
        r = res["rmm"]
        check(
            "rmm.DeviceBuffer 1 MiB: through memarray / RMM's pool",
            r["rmm_via_memarray_us"],
            r["rmm_pool_us"],
            1.0,
        )
        check(
            "memarray.empty 1 MiB through Rmm() / rmm.DeviceBuffer on RMM's pool",
            r["memarray_via_rmm_us"],
            r["rmm_pool_us"],
            1.5,
        )
    c = res["cupy"]
    check(
        "cupy.empty 1 MiB: memarray hook / CuPy's pool",
        c["cupy_via_memarray_us"],
        c["cupy_pool_us"],
        1.2,
    )
    nn, nm = res["numba_native"], res["numba_memarray"]
    check(
        "numba device_array 1 MiB: plugin / Numba's manager",
        nm["device_array_us"],
        nn["device_array_us"],
        1 / 3,
    )
    check(
        "numba pinned_array 1 MiB: plugin / Numba's manager",
        nm["pinned_array_us"],
        nn["pinned_array_us"],
        1.0,
    )
    check(
        "numba mapped_array 1 MiB: plugin / Numba's manager",
        nm["mapped_array_us"],
        nn["mapped_array_us"],
        1.0,
    )
    t = res["tracking"]
    check(
        "memarray.empty 1 MiB: Tracking (stacks off) / bare pool",
        t["tracking_empty_us"],
        t["bare_empty_us"],
        1.10,
    )
    tr, bare = t["tracking_allocate_us"], t["bare_allocate_us"]
    print(
        f"info  Resource.allocate+free 1 MiB: tracking {tr:.2f} us vs bare {bare:.2f} us "
        f"({tr / bare:.2f}x); stacks on: empty {t['stacks_empty_us']:.2f} us, "
        f"allocate {t['stacks_allocate_us']:.2f} us"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    missed = [r[0] for r in rows if not r[5]] + ([] if worst <= 1e-3 else ["loss curves"])
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
