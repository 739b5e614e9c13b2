"""Host <-> device throughput: memarray, torch and CuPy side by side in one process.

    python3 benches/transfer.py [--json PATH] [--max-gib 4] [--sweep]

Rows (GB/s, medians; "ratio" is memarray over the best peer of the same row):
- H2D pageable, new device array: memarray.asarray(x, device="cuda") /
  torch.from_numpy(x).to("cuda") / cupy.asarray(x)
- H2D pageable, existing device array: a.read_numpy_array(x) / t.copy_(from_numpy(x)) /
  c.set(x)
- D2H pageable, new NumPy array: a.to_numpy() / t.cpu().numpy() / c.get()
- D2H pageable, existing NumPy array: a.to_numpy(out=y) / from_numpy(y).copy_(t) /
  c.get(out=y)
- H2D / D2H pinned: move_memory of a host_memory="pinned" array / torch pinned tensors
  with non_blocking copies / CuPy from cupyx pinned arrays
plus the 1 MiB default round trip, 1,000 arrays of 4 KiB to the device (MemArrays, and
NumPy arrays end to end), small-call costs, DLPack exchange latencies and the cold first
to_numpy() of 1 GiB. The targets are checked and reported, not asserted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time

import numpy as np
from python_interop import per_call_us  # benches/ is the script's folder

import memarray

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def median_s(fn, sync, reps) -> float:
    fn()
    sync()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def reps_for(n: int) -> int:
    return int(max(5 if n <= GiB else 3, min(40, (2 * GiB) // max(n, 1))))


def one_size(n, rng, row, sync, torch, cupy, cupyx) -> None:
    """The six rows of one size (locals freed on return)."""
    kCUDA, kCPU = memarray.dlpack.kDLCUDA, memarray.dlpack.kDLCPU
    reps = reps_for(n)
    x = rng.integers(0, 255, n, dtype=np.uint8)
    y = np.empty_like(x)
    a = memarray.asarray(x, device="cuda")
    t = torch.from_numpy(x).cuda()
    c = cupy.asarray(x)
    row(
        "H2D pageable new",
        n,
        {
            "memarray": median_s(lambda: memarray.asarray(x, device="cuda"), sync, reps),
            "torch": median_s(lambda: torch.from_numpy(x).to("cuda"), sync, reps),
            "cupy": median_s(lambda: cupy.asarray(x), sync, reps),
        },
    )
    tx = torch.from_numpy(x)
    row(
        "H2D pageable existing",
        n,
        {
            "memarray": median_s(lambda: a.read_numpy_array(x), sync, reps),
            "torch": median_s(lambda: t.copy_(tx), sync, reps),
            "cupy": median_s(lambda: c.set(x), sync, reps),
        },
    )
    row(
        "D2H pageable new",
        n,
        {
            "memarray": median_s(lambda: a.to_numpy(), sync, reps),
            "torch": median_s(lambda: t.cpu().numpy(), sync, reps),
            "cupy": median_s(lambda: c.get(), sync, reps),
        },
    )
    ty = torch.from_numpy(y)
    row(
        "D2H pageable existing",
        n,
        {
            "memarray": median_s(lambda: a.to_numpy(out=y), sync, reps),
            "torch": median_s(lambda: ty.copy_(t), sync, reps),
            "cupy": median_s(lambda: c.get(out=y), sync, reps),
        },
    )
    p = memarray.MemArray((n,), "u1", host_memory="pinned")
    p.read_numpy_array(x)
    tp = torch.from_numpy(x).pin_memory()
    cp_host = cupyx.empty_pinned((n,), np.uint8)
    cp_host[...] = x

    def mem_up():
        p.move_memory(kCUDA, 0)

    def mem_down():
        p.move_memory(kCUDA, 0)
        p.synchronize()
        t0 = time.perf_counter()
        p.move_memory(kCPU)
        return time.perf_counter() - t0

    def timed_down(reps=reps):
        samples = []
        for _ in range(reps + 1):
            samples.append(mem_down())
        return statistics.median(samples[1:])

    def host_again():
        p.move_memory(kCPU)

    def mem_up_timed(reps=reps):
        samples = []
        for _ in range(reps + 1):
            host_again()
            p.synchronize()
            t0 = time.perf_counter()
            mem_up()
            p.synchronize()
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples[1:])

    row(
        "H2D pinned",
        n,
        {
            "memarray": mem_up_timed(),
            "torch": median_s(lambda: t.copy_(tp, non_blocking=True), sync, reps),
            "cupy": median_s(lambda: c.set(cp_host), sync, reps),
        },
    )
    row(
        "D2H pinned",
        n,
        {
            "memarray": timed_down(),
            "torch": median_s(lambda: tp.copy_(t, non_blocking=True), sync, reps),
            "cupy": median_s(lambda: c.get(out=cp_host), sync, reps),
        },
    )


def torch_table_costs(torch, tt) -> dict:
    """torch's own part of a C-exchange import, through ctypes: its from_py_object call
    plus the deleter, against a ctypes call of its current_work_stream (the ctypes cost)."""
    import ctypes

    cap = type(tt).__dlpack_c_exchange_api__
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api = ctypes.cast(get(cap, b"dlpack_exchange_api"), ctypes.POINTER(ctypes.c_void_p * 7))
    from_py = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(ctypes.c_void_p))(
        api.contents[3]
    )
    stream = ctypes.CFUNCTYPE(
        ctypes.c_int, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p)
    )(api.contents[6])
    deleter_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    out = ctypes.c_void_p()

    def take_and_delete():
        from_py(tt, ctypes.byref(out))
        # DLManagedTensorVersioned: version (8 bytes), manager_ctx, deleter.
        deleter_t(ctypes.c_void_p.from_address(out.value + 16).value)(out)

    s = ctypes.c_void_p()
    return {
        "  torch table from_py + deleter (ctypes)": per_call_us(take_and_delete, n=5000),
        "  torch table current_work_stream (ctypes)": per_call_us(
            lambda: stream(2, 0, ctypes.byref(s)), n=5000
        ),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--max-gib", type=float, default=4)
    ap.add_argument("--sweep", action="store_true", help="staging threads x chunk at 1 GiB")
    args = ap.parse_args()
    if not memarray.cuda.is_available():
        print(f"SKIPPED: no CUDA device ({memarray.cuda.unavailable_reason()})")
        return 0
    try:
        import cupy
        import cupyx
        import torch
    except ImportError as e:
        print(f"SKIPPED: the side-by-side bench needs torch and CuPy ({e})")
        return 0

    dev_name = torch.cuda.get_device_name(0)
    sync = torch.cuda.synchronize
    kCUDA, kCPU = memarray.dlpack.kDLCUDA, memarray.dlpack.kDLCPU
    result = {
        "device": dev_name,
        "date": datetime.date.today().isoformat(),
        "staging": memarray.cuda.staging_config(),
        "rows": [],
        "extra": {},
    }

    def row(kind, n, secs):
        gbs = {k: (n / s / 1e9 if s else 0.0) for k, s in secs.items()}
        result["rows"].append({"kind": kind, "bytes": n, "gbps": gbs})
        peers = [v for k, v in gbs.items() if k != "memarray"]
        ratio = gbs["memarray"] / max(peers) if peers and max(peers) else float("nan")
        cells = "  ".join(f"{k} {v:7.2f}" for k, v in gbs.items())
        print(f"{kind:24s} {n / MiB:10.3f} MiB  {cells}  ratio {ratio:5.2f}", flush=True)

    if args.sweep:
        x = np.random.default_rng(0).integers(0, 255, GiB, dtype=np.uint8)
        y = np.empty_like(x)
        a = memarray.empty((GiB,), "u1", device="cuda")
        pin = memarray.MemArray((GiB,), "u1", host_memory="pinned")
        pin.read_numpy_array(x)
        up = median_s(lambda: pin.move_memory(kCUDA, 0), sync, 5)
        print(f"pinned reference H2D {GiB / up / 1e9:.2f} GB/s")
        before = memarray.cuda.staging_config()
        sweep = []
        for threads in (1, 2, 4, 6, 8, 12, 16):
            for chunk in (1 * MiB, 4 * MiB, 16 * MiB):
                memarray.cuda.set_staging_config(threads=threads, chunk_bytes=chunk)
                h2d = median_s(lambda: a.read_numpy_array(x), sync, 5)
                d2h = median_s(lambda: a.to_numpy(out=y), sync, 5)
                sweep.append((threads, chunk, GiB / h2d / 1e9, GiB / d2h / 1e9))
                print(
                    f"sweep threads {threads:2d} chunk {chunk // MiB:2d} MiB: "
                    f"H2D {sweep[-1][2]:6.2f}  D2H(out) {sweep[-1][3]:6.2f} GB/s",
                    flush=True,
                )
        for direction, c in before.items():
            memarray.cuda.set_staging_config(direction, **c)
        result["sweep"] = sweep
        del x, y, a, pin

    sizes = [4 * KiB * 4**k for k in range(12)]
    sizes = [n for n in sizes if n <= args.max_gib * GiB]
    rng = np.random.default_rng(1)
    for n in sizes:
        one_size(n, rng, row, sync, torch, cupy, cupyx)
        torch.cuda.empty_cache()
        cupy.get_default_memory_pool().free_all_blocks()

    # 1 MiB round trip with memarray's default host memory, against torch pinned.
    n = MiB
    x = rng.integers(0, 255, n, dtype=np.uint8)
    a = memarray.MemArray((n,), "u1")
    a.read_numpy_array(x)
    tp = torch.from_numpy(x).pin_memory()
    td = tp.cuda()

    def mem_rt():
        a.move_memory(kCUDA, 0)
        a.move_memory(kCPU)

    def torch_rt():
        td.copy_(tp, non_blocking=True)
        tp.copy_(td, non_blocking=True)

    rt_m = median_s(mem_rt, sync, 200)
    rt_t = median_s(torch_rt, sync, 200)
    result["extra"]["round_trip_1MiB"] = {
        "memarray_default_gbps": 2 * n / rt_m / 1e9,
        "memarray_host_memory": a.host_memory,
        "torch_pinned_gbps": 2 * n / rt_t / 1e9,
    }
    print(
        f"1 MiB round trip: memarray (default host memory: {a.host_memory}) "
        f"{2 * n / rt_m / 1e9:.2f} GB/s, torch pinned {2 * n / rt_t / 1e9:.2f} GB/s "
        f"(ratio {rt_t / rt_m:.2f})"
    )

    # Small calls: per-call costs against torch's, in the same process.
    x4 = rng.integers(0, 255, 4 * KiB, dtype=np.uint8)
    small = {
        "memarray.asarray(4 KiB, device='cuda')": per_call_us(
            lambda: memarray.asarray(x4, device="cuda"), n=5000
        ),
        "torch.from_numpy(4 KiB).to('cuda', non_blocking=True)": per_call_us(
            lambda: torch.from_numpy(x4).to("cuda", non_blocking=True), n=5000
        ),
        "memarray.from_dlpack(NumPy 4 KiB)": per_call_us(lambda: memarray.from_dlpack(x4), n=20000),
        "np.from_dlpack(NumPy 4 KiB)": per_call_us(lambda: np.from_dlpack(x4), n=20000),
        "memarray.empty(1 MiB, pinned)": per_call_us(
            lambda: memarray.empty((MiB,), "u1", host_memory="pinned"), n=5000
        ),
        "torch.empty(1 MiB, pin_memory=True)": per_call_us(
            lambda: torch.empty(MiB, dtype=torch.uint8, pin_memory=True), n=5000
        ),
    }
    sync()
    result["extra"]["small_calls_us"] = small
    for k, v in small.items():
        print(f"{k:56s} {v:7.3f} us")
    # to_numpy() of 1 GiB with the NumPy block pool emptied first (its first use faults
    # pages in, as np.empty's do; later calls reuse faulted blocks).
    if GiB in sizes:
        a1 = memarray.empty((GiB,), "u1", device="cuda")
        memarray.resources.release_numpy_pool()
        t0 = time.perf_counter()
        a1.to_numpy()
        cold = time.perf_counter() - t0
        result["extra"]["to_numpy_1GiB_cold_gbps"] = GiB / cold / 1e9
        print(f"to_numpy() 1 GiB, NumPy block pool cold: {GiB / cold / 1e9:.2f} GB/s")
        del a1

    # 1,000 arrays of 4 KiB to the device.
    xs = [rng.integers(0, 255, 4 * KiB, dtype=np.uint8) for _ in range(1000)]
    ts = [torch.from_numpy(v) for v in xs]
    end_to_end = []
    for _ in range(15):
        sync()
        t0 = time.perf_counter()
        memarray.move_many(xs, "cuda")
        end_to_end.append(time.perf_counter() - t0)
    t_torch_e2e = median_s(lambda: [torch.from_numpy(v).to("cuda") for v in xs], sync, 15)
    batch_m = []
    for _ in range(15):
        arrs = [memarray.asarray(v, copy=True) for v in xs]
        sync()
        t0 = time.perf_counter()
        memarray.move_many(arrs, "cuda")
        batch_m.append(time.perf_counter() - t0)
    loop_m = []
    for _ in range(15):
        arrs = [memarray.asarray(v, copy=True) for v in xs]
        t0 = time.perf_counter()
        for v in arrs:
            v.move_memory(kCUDA, 0)
        memarray.cuda.synchronize()
        loop_m.append(time.perf_counter() - t0)
    from memarray import _memarray

    profile = _memarray._last_batch_profile()
    print(f"  last move_many batch: {profile}")
    result["extra"]["batch_profile"] = profile
    t_loop = median_s(lambda: [v.to("cuda") for v in ts], sync, 15)
    bm, lm = statistics.median(batch_m[1:]), statistics.median(loop_m[1:])
    e2e = statistics.median(end_to_end[1:])
    result["extra"]["batch_1000x4KiB_ms"] = {
        "memarray_move_many": bm * 1e3,
        "memarray_loop": lm * 1e3,
        "torch_loop": t_loop * 1e3,
        "memarray_move_many_numpy_end_to_end": e2e * 1e3,
        "torch_loop_end_to_end": t_torch_e2e * 1e3,
    }
    print(
        f"1000 NumPy arrays of 4 KiB to the device end to end: move_many(numpy list) "
        f"{e2e * 1e3:.2f} ms, torch from_numpy(...).to('cuda') loop {t_torch_e2e * 1e3:.2f} ms "
        f"({t_torch_e2e / e2e:.1f}x)"
    )
    print(
        f"1000 x 4 KiB to the device: move_many {bm * 1e3:.2f} ms, memarray loop "
        f"{lm * 1e3:.2f} ms, torch .to('cuda') loop {t_loop * 1e3:.2f} ms "
        f"({t_loop / bm:.1f}x)"
    )

    # DLPack exchange.
    tt = torch.zeros(1024, device="cuda")
    cc = cupy.zeros(1024, cupy.float32)
    ma = memarray.zeros((1024,), "f4", device="cuda")
    lat = {
        "memarray.from_dlpack(torch)": per_call_us(lambda: memarray.from_dlpack(tt), n=5000),
        "memarray.from_dlpack(cupy)": per_call_us(lambda: memarray.from_dlpack(cc), n=5000),
        "torch.from_dlpack(cupy)": per_call_us(lambda: torch.from_dlpack(cc), n=5000),
        "torch.from_dlpack(memarray)": per_call_us(lambda: torch.from_dlpack(ma), n=5000),
        "cupy.from_dlpack(torch)": per_call_us(lambda: cupy.from_dlpack(tt), n=5000),
        "memarray a.__dlpack__()": per_call_us(lambda: ma.__dlpack__()),
        "torch t.__dlpack__()": per_call_us(lambda: tt.__dlpack__()),
    }
    kept = []
    lat["  memarray.from_dlpack(torch), result kept"] = per_call_us(
        lambda: kept.append(memarray.from_dlpack(tt)), n=5000, rounds=3
    )
    kept.clear()
    lat["  memarray.from_dlpack(memarray)"] = per_call_us(lambda: memarray.from_dlpack(ma), n=5000)
    lat.update(torch_table_costs(torch, tt))
    lat["(torch has __dlpack_c_exchange_api__)"] = float(
        hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
    )
    result["extra"]["dlpack_us"] = lat
    for k, v in lat.items():
        print(f"{k:32s} {v:7.3f} us")

    # Targets.
    def gb(kind, n, who):
        for r in result["rows"]:
            if r["kind"] == kind and r["bytes"] == n:
                return r["gbps"][who]
        return float("nan")

    big = GiB if GiB in sizes else sizes[-1]
    checks = []
    pairs = (
        ("H2D pageable new", "H2D pinned"),
        ("H2D pageable existing", "H2D pinned"),
        ("D2H pageable existing", "D2H pinned"),
        ("D2H pageable new", "D2H pinned"),
    )
    # 1 and 4 MiB at least 2x torch and CuPy; 64 MiB and 1 GiB at least 0.85x
    # the pinned copy of the same size.
    for kind, pinned in pairs:
        for n in (MiB, 4 * MiB):
            if n in sizes:
                m = gb(kind, n, "memarray")
                peer = max(gb(kind, n, "torch"), gb(kind, n, "cupy"))
                checks.append((f"{kind} {n // MiB} MiB >= 2x torch and CuPy", m / peer, 2.0))
        for n in (64 * MiB, big):
            if n in sizes:
                checks.append(
                    (
                        f"{kind} {n // MiB} MiB >= 0.85x pinned",
                        gb(kind, n, "memarray") / gb(pinned, n, "memarray"),
                        0.85,
                    )
                )
    sc = result["extra"]["small_calls_us"]
    checks.append(
        (
            "asarray 4 KiB to cuda <= torch from_numpy().to(non_blocking)",
            sc["torch.from_numpy(4 KiB).to('cuda', non_blocking=True)"]
            / sc["memarray.asarray(4 KiB, device='cuda')"],
            1.0,
        )
    )
    checks.append(
        ("from_dlpack(NumPy 4 KiB) <= 1 us", 1.0 / sc["memarray.from_dlpack(NumPy 4 KiB)"], 1.0)
    )
    checks.append(
        (
            "empty 1 MiB pinned <= torch.empty(pin_memory=True)",
            sc["torch.empty(1 MiB, pin_memory=True)"] / sc["memarray.empty(1 MiB, pinned)"],
            1.0,
        )
    )
    b = result["extra"]["batch_1000x4KiB_ms"]
    checks.append(
        (
            "1000 NumPy x 4 KiB end to end >= 5x torch loop",
            b["torch_loop_end_to_end"] / b["memarray_move_many_numpy_end_to_end"],
            5.0,
        )
    )
    print(f"\n== targets ({dev_name}, {result['date']})")
    for name, ratio, need in checks:
        print(f"{'met ' if ratio >= need else 'MISS'} {name}: {ratio:.2f} (need {need})")
    result["targets"] = [{"name": n, "value": r, "need": k} for n, r, k in checks]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
