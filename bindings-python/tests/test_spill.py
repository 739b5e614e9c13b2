"""Spilling: the Python surface on the CPU, and on the GPU workloads past a
device budget, exports that pin, restores on every path, CuPy and torch pressure. GPU
scenarios run in child processes: spill settings are per process."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from children import child_stdout, run_child
from test_interop import _peer

import memarray
import memarray.spill as spill

# ---------------------------------------------------------------- CPU


def test_off_by_default_and_host_arrays_have_nothing_to_spill():
    assert spill.statistics(0) is None and spill.settings(0) is None
    a = memarray.asarray(np.arange(10, dtype=np.float32))
    assert a.spilled is False
    a.prefetch()  # nothing to bring back
    with pytest.raises(ValueError, match="not on a device|spilling is off"):
        spill.evict(a)
    with pytest.raises(ValueError, match="device_view needs"):
        with a.device_view():
            pass
    assert spill.allow(a) == 0


def test_bad_settings_are_value_errors_naming_the_setting():
    with pytest.raises(ValueError, match="device_budget"):
        spill.enable(0, device_budget="4 parsecs")
    with pytest.raises(ValueError, match="host_budget"):
        spill.enable(0, host_budget="lots")
    with pytest.raises((TypeError, ValueError), match="device"):
        spill.enable(-1)
    with pytest.raises(TypeError):
        spill.evict(np.zeros(3))


@pytest.mark.parametrize(
    "env, message",
    [
        ({"MEMARRAY_SPILL": "1", "MEMARRAY_DEVICE_BUDGET": "4 parsecs"}, "MEMARRAY_DEVICE_BUDGET"),
        ({"MEMARRAY_SPILL": "gpu7"}, "MEMARRAY_SPILL"),
        ({"MEMARRAY_SPILL": "all", "MEMARRAY_HOST_BUDGET": "-3"}, "MEMARRAY_HOST_BUDGET"),
    ],
)
def test_bad_environment_fails_the_import_with_the_variable_named(env, message):
    r = run_child("import memarray", env=dict(os.environ, **env))
    assert r.returncode == 1, r.stderr
    assert "ValueError" in r.stderr and message in r.stderr, r.stderr


def test_environment_off_values_leave_spilling_off():
    for v in ["", "0", "off"]:
        out = child_stdout(
            "import memarray.spill as s; print(s.statistics(0))", env={"MEMARRAY_SPILL": v}
        )
        assert out.strip() == "None"


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_workloads_at_2x_and_4x_the_budget_keep_every_value():
    out = child_stdout(
        """
        import json, numpy as np, memarray, memarray.spill as spill
        MiB = 1 << 20
        spill.enable(0, device_budget=32 * MiB)
        res = {}
        for factor in (2, 4):
            n = factor * 8  # 4 MiB arrays; 8 fit the budget
            base = [np.arange(MiB, dtype=np.uint32) * 3 + k for k in range(n)]
            arrays = [memarray.asarray(b, device="cuda") for b in base]
            worst = 0
            for p in range(3):
                for a in arrays:
                    a.add_index_tuple()
                    worst = max(worst, spill.statistics(0)["resident_bytes"])
            ok = all(
                np.array_equal(a.to_numpy(), b + 3 * np.arange(MiB, dtype=np.uint32))
                for a, b in zip(arrays, base)
            )
            places = {a.device for a in arrays}
            res[factor] = [ok, worst <= 32 * MiB, sorted(places)]
            del arrays, a
        s = spill.statistics(0)
        res["stats"] = s
        print(json.dumps(res))
        """
    )
    r = json.loads(out.strip().splitlines()[-1])
    for f in ("2", "4"):
        assert r[f] == [True, True, ["cuda:0"]], r
    s = r["stats"]
    assert s["spilled_arrays"] > 0 and s["restored_arrays"] > 0
    assert s["spill_seconds"] > 0 and s["restore_seconds"] > 0
    assert s["resident_bytes"] == 0 and s["current_spilled_bytes"] == 0


@pytest.mark.gpu
def test_spilled_arrays_read_from_the_host_and_come_back_on_every_path():
    out = child_stdout(
        """
        import json, numpy as np, memarray, memarray.spill as spill
        spill.enable(0)
        x = np.arange(1 << 16, dtype=np.float32)
        a = memarray.asarray(x, device="cuda")
        r = {}
        spill.evict(a)
        r["spilled"] = [a.spilled, a.device]
        r["host_read"] = [bool(np.array_equal(a.to_numpy(), x)), a.spilled, float(a[5])]
        # The CUDA Array Interface restores and pins until allowed.
        cai = a.__cuda_array_interface__
        r["after_cai"] = a.spilled
        try:
            spill.evict(a); r["pinned"] = False
        except ValueError as e:
            r["pinned"] = "exported" in str(e)
        r["allowed"] = spill.allow(a)
        memarray.cuda.synchronize()  # evict refuses an array with queued work (a restore)
        spill.evict(a)
        # DLPack (a capsule) restores too.
        cap = a.__dlpack__()
        r["after_dlpack"] = a.spilled
        del cap
        # prefetch, then a device view pins while open.
        memarray.cuda.synchronize()
        spill.evict(a)
        s = memarray.cuda.Stream()
        a.prefetch(stream=s)
        r["after_prefetch"] = a.spilled
        with a.device_view(s) as v:
            r["view"] = [v.ptr != 0, v.shape, v.dtype, v.nbytes]
            try:
                spill.evict(a); r["view_pins"] = False
            except ValueError:
                r["view_pins"] = True
        memarray.cuda.synchronize()
        spill.evict(a)
        r["after_view"] = a.spilled
        a.move_memory(memarray.dlpack.kDLCPU)
        r["to_host"] = [a.spilled, a.device, bool(np.array_equal(a.to_numpy(), x))]
        print(json.dumps(r))
        """
    )
    r = json.loads(out.strip().splitlines()[-1])
    assert r["spilled"] == [True, "cuda:0"]
    assert r["host_read"] == [True, True, 5.0]
    assert r["after_cai"] is False and r["pinned"] is True and r["allowed"] == 1
    assert r["after_dlpack"] is False and r["after_prefetch"] is False
    assert r["view"] == [True, [1 << 16], "float32", 4 << 16] and r["view_pins"] is True
    assert r["after_view"] is True
    assert r["to_host"] == [False, "cpu", True]


@pytest.mark.gpu
def test_a_torch_tensor_keeps_its_pointer_while_others_spill():
    _peer("torch")
    out = child_stdout(
        """
        import gc, json, numpy as np, torch, memarray, memarray.spill as spill
        MiB = 1 << 20
        spill.enable(0, device_budget=16 * MiB)
        a = memarray.asarray(np.ones(MiB, dtype=np.float32), device="cuda")
        t = torch.from_dlpack(a)
        ptr = t.data_ptr()
        others = [memarray.asarray(np.full(MiB, k, np.float32), device="cuda") for k in range(12)]
        for o in others:
            o.add_index_tuple()
        t += 1
        r = {"same": t.data_ptr() == ptr, "spilled": a.spilled,
             "sum": float(t.sum()), "others_spilled": sum(o.spilled for o in others)}
        del t; gc.collect(); torch.cuda.synchronize()
        spill.evict(a)
        r["after_release"] = a.spilled
        r["values"] = float(a.to_numpy().sum())
        print(json.dumps(r))
        """
    )
    r = json.loads(out.strip().splitlines()[-1])
    assert r["same"] and r["spilled"] is False and r["others_spilled"] > 0, r
    assert r["sum"] == 2.0 * (1 << 20) and r["after_release"] is True
    assert r["values"] == 2.0 * (1 << 20)


@pytest.mark.gpu
@pytest.mark.parametrize("library", ["cupy", "torch"])
def test_other_libraries_pressure_spills_memarrays_arrays(library):
    _peer(library)
    out = child_stdout(
        f"""
        import json, numpy as np, memarray, memarray.spill as spill
        import memarray.resources as mr
        MiB = 1 << 20
        mr.set_default_resource(mr.Limiting(mr.Device(0), 64 * MiB), 0)
        spill.enable(0)  # no budget: the out-of-memory path spills
        arrays = [memarray.asarray(np.full(2 * MiB, k, np.float32), device="cuda")
                  for k in range(6)]  # 48 MiB
        library = "{library}"
        if library == "cupy":
            import cupy, memarray.cupy
            cupy.cuda.set_allocator(memarray.cupy.allocator)
            x = cupy.ones(8 * MiB, dtype=cupy.float32)  # 32 MiB
            total = float(x.sum())
        else:
            import torch, memarray.torch as mt
            with torch.cuda.use_mem_pool(mt.pool()):
                x = torch.ones(8 * MiB, device="cuda")
            total = float(x.sum())
        ok = all(float(a.to_numpy().sum()) == k * 2.0 * MiB for k, a in enumerate(arrays))
        s = spill.statistics(0)
        print(json.dumps({{"total": total, "ok": ok, "spilled": s["spilled_arrays"],
                          "pressure": mr.pressure_statistics()["spills"]}}))
        """
    )
    r = json.loads(out.strip().splitlines()[-1])
    assert r["total"] == 8.0 * (1 << 20) and r["ok"], r
    assert r["spilled"] > 0 and r["pressure"] > 0, r


@pytest.mark.gpu
def test_spilling_from_sixteen_threads():
    out = child_stdout(
        """
        import json, threading, numpy as np, memarray, memarray.spill as spill
        MiB = 1 << 20
        spill.enable(0, device_budget=16 * MiB)
        shared = [memarray.asarray(np.zeros(MiB // 4, np.uint32), device="cuda") for _ in range(8)]
        errors = []
        def work(t):
            try:
                mine = [memarray.asarray(np.full(MiB // 4, t, np.uint32), device="cuda")
                        for _ in range(4)]
                for r in range(6):
                    for a in mine:
                        a.add_index_tuple()
                        if r % 2:
                            try:
                                spill.evict(a)
                            except ValueError:
                                pass
                    shared[(t + r) % 8].add_index_tuple()
                idx = np.arange(MiB // 4, dtype=np.uint32)
                for a in mine:
                    if not np.array_equal(a.to_numpy(), t + 6 * idx):
                        errors.append(f"thread {t}: wrong values")
            except Exception as e:
                errors.append(repr(e))
        ts = [threading.Thread(target=work, args=(t,)) for t in range(16)]
        [t.start() for t in ts]; [t.join() for t in ts]
        runs = [0] * 8
        for t in range(16):
            for r in range(6):
                runs[(t + r) % 8] += 1
        idx = np.arange(MiB // 4, dtype=np.uint32)
        ok = all(np.array_equal(a.to_numpy(), runs[k] * idx) for k, a in enumerate(shared))
        print(json.dumps({"errors": errors, "ok": ok,
                          "spilled": spill.statistics(0)["spilled_arrays"]}))
        """
    )
    r = json.loads(out.strip().splitlines()[-1])
    assert r["errors"] == [] and r["ok"] and r["spilled"] > 0, r


@pytest.mark.gpu
def test_spills_show_in_the_tracking_snapshot_the_log_and_the_plot(tmp_path):
    _peer("matplotlib", "MEMARRAY_REQUIRE_PLOT")
    log = tmp_path / "alloc.csv"
    png = tmp_path / "spill.png"
    out = child_stdout(
        f"""
        import csv, json, numpy as np, memarray, memarray.spill as spill
        import memarray.resources as mr
        MiB = 1 << 20
        logging = mr.Logging(mr.Async(0), {str(log)!r})
        tracking = mr.Tracking(logging)
        mr.set_default_resource(tracking, 0)
        spill.enable(0, device_budget=8 * MiB)
        arrays = [memarray.asarray(np.full(MiB, k, np.float32), device="cuda") for k in range(6)]
        for a in arrays:
            a.add_index_tuple()
        snap = tracking.snapshot()
        kinds = sorted({{e[1] for e in snap["events"]}})
        mr.plot(snap, {str(png)!r})
        del arrays, a
        mr.set_default_resource(mr.Async(0), 0)
        logging.flush()
        rows = [r["event"] for r in csv.DictReader(open({str(log)!r}))]
        print(json.dumps({{"kinds": kinds, "n": len(snap["events"]),
                          "log": sorted(set(rows) & {{"spill", "restore"}})}}))
        """
    )
    r = json.loads(out.strip().splitlines()[-1])
    assert r["kinds"] == ["restore", "spill"] and r["n"] >= 4, r
    assert r["log"] == ["restore", "spill"], r
    assert png.stat().st_size > 10_000


@pytest.mark.gpu
def test_a_prefetch_loop_that_runs_ahead_of_the_device_keeps_the_budget():
    _peer("cupy")
    out = child_stdout(
        """
        import json, cupy, memarray, memarray.spill as spill
        MiB = 1 << 20
        budget = 128 * MiB
        spill.enable(0, device_budget=budget)
        arrays = [memarray.zeros((4 * MiB,), dtype="float32", device="cuda") for _ in range(16)]
        for a in arrays:
            spill.evict(a)  # all on the host: the next pass restores every one
        pf = memarray.cuda.Stream()
        worst = 0
        for p in range(2):
            for i, a in enumerate(arrays):
                arrays[(i + 1) % 16].prefetch(stream=pf)
                x = cupy.from_dlpack(a)
                x += 1
                del x
                worst = max(worst, spill.statistics(0)["resident_bytes"])
        cupy.cuda.Device().synchronize()
        ok = all(float(a.to_numpy().min()) == 2.0 == float(a.to_numpy().max()) for a in arrays)
        print(json.dumps({"worst": worst, "budget": budget, "ok": ok}))
        """
    )
    r = json.loads(out.strip().splitlines()[-1])
    assert r["ok"] and r["worst"] <= r["budget"], r
