"""memarray as the process's one memory manager: sources, shared pressure,
tracking with stacks and plots on the CPU; torch, CuPy, Numba and RMM through memarray on
the GPU. Process-wide switches (torch's allocator, RMM's resource, Numba's manager) are
made in subprocesses, so each test starts from a clean process and a crash fails the
test instead of ending the run."""

from __future__ import annotations

import importlib
import json
import os

import numpy as np
import pytest
from children import child_stdout

from memarray import resources as mr

PNG = b"\x89PNG\r\n\x1a\n"


def _peer(name: str, required_by: str = "MEMARRAY_REQUIRE_GPU"):
    """The peer library `name`, or a visible skip; a failure instead where `required_by`
    is 1 (the GPU machine has torch, CuPy and Numba; RMM travels as carried wheels)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        if os.environ.get(required_by) == "1":
            raise
        pytest.skip(f"SKIPPED: {name} is not installed")


# ---------------------------------------------------------------- CPU: sources, pressure


def test_allocations_are_counted_per_source():
    stats = mr.Statistics(mr.Pool(mr.Host()))
    held = [stats.allocate(1000 * (i + 1), source=s) for i, s in enumerate(mr.SOURCES)]
    assert [a.source for a in held] == list(mr.SOURCES)
    by = stats.statistics()["by_source"]
    for i, s in enumerate(mr.SOURCES):
        assert by[s] == {
            "current_bytes": 1000 * (i + 1),
            "current_count": 1,
            "total_bytes": 1000 * (i + 1),
            "total_count": 1,
        }
    plain = stats.allocate(10)  # no source named: memarray's own
    assert plain.source is None
    for a in held:
        a.free()
    plain.free()
    by = stats.statistics()["by_source"]
    assert all(row["current_bytes"] == 0 and row["current_count"] == 0 for row in by.values())
    assert by["memarray"]["total_bytes"] == 1000 + 10


def test_an_unknown_source_is_a_value_error_and_leaks_nothing():
    stats = mr.Statistics(mr.Host())
    for bad in ("pytorch", "Torch", "", 3):
        with pytest.raises((ValueError, TypeError)):
            stats.allocate(100, source=bad)
    assert stats.statistics()["total_count"] == 0


def test_tracking_keeps_python_stacks_per_allocation_site():
    t = mr.Tracking(mr.Host(), stacks=True)

    def make_block():
        return t.allocate(4096, source="cupy")

    a = make_block()
    b = t.allocate(64)
    live = t.snapshot()["live"]
    assert [x["source"] for x in live] == ["cupy", "memarray"]
    innermost = live[0]["stack"].splitlines()[-1]
    assert __file__ in innermost and "make_block" in innermost, live[0]["stack"]
    assert "test_tracking_keeps_python_stacks" in live[1]["stack"].splitlines()[-1]
    json.dumps(t.snapshot())
    a.free()
    b.free()
    off = mr.Tracking(mr.Host())
    c = off.allocate(8)
    assert off.snapshot()["live"][0]["stack"] is None
    c.free()


def test_an_out_of_memory_runs_the_relief_steps_and_counts_them():
    before = mr.pressure_statistics()
    limit = mr.Limiting(mr.Host(), 1000)
    with pytest.raises(MemoryError):
        limit.allocate(5000)
    after = mr.pressure_statistics()
    assert after["events"] == before["events"] + 1
    assert after["failed"] == before["failed"] + 1
    assert after["recovered"] == before["recovered"]
    # Host memory (no device): no library is asked, loaded or not (a library that is not
    # loaded, or memory it cannot hold, is not a call).
    for lib in ("torch", "cupy", "rmm"):
        assert after["libraries"][lib]["calls"] == before["libraries"][lib]["calls"]
    with pytest.raises(MemoryError):
        limit.allocate(5000, source="cupy")
    again = mr.pressure_statistics()
    assert again["events"] == after["events"] + 1
    assert again["libraries"]["cupy"]["calls"] == after["libraries"]["cupy"]["calls"]


def test_relievers_release_loaded_libraries_and_never_import_them():
    out = child_stdout(
        """
        import sys, types, json
        import memarray._pressure as p

        # Not loaded: not asked (None), nothing imported.
        assert p.relieve("torch", 0) is None and p.relieve("cupy", 0) is None
        assert "torch" not in sys.modules and "cupy" not in sys.modules
        assert p.relieve("numba", 0) is None and p.relieve("nothing", 0) is None

        calls = []
        class Pool:
            held = 5000
            def total_bytes(self): return self.held
            def free_all_blocks(self): calls.append("cupy"); self.held = 1000
        class Dev:
            def __init__(self, d): calls.append(("device", d))
            def __enter__(self): return self
            def __exit__(self, *a): return False
        pool = Pool()
        cupy = types.SimpleNamespace(
            get_default_memory_pool=lambda: pool, cuda=types.SimpleNamespace(Device=Dev))
        reserved = [8000]
        def empty_cache(): calls.append("torch"); reserved[0] = 3000
        torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
            is_initialized=lambda: True, empty_cache=empty_cache,
            memory_reserved=lambda d: reserved[0]))
        sys.modules["cupy"], sys.modules["torch"] = cupy, torch
        got = {"cupy": p.relieve("cupy", 1), "torch": p.relieve("torch", 0),
               "host": p.relieve("cupy", None)}
        print(json.dumps({"got": got, "calls": [str(c) for c in calls]}))
        """
    )
    r = json.loads(out)
    assert r["got"] == {"cupy": 4000, "torch": 5000, "host": None}
    assert r["calls"] == ["('device', 1)", "cupy", "torch"]


# ---------------------------------------------------------------- CPU: plots, missing peers


def test_plot_draws_a_snapshot_and_a_log(tmp_path):
    _peer("matplotlib", "MEMARRAY_REQUIRE_PLOT")
    t = mr.Tracking(mr.Pool(mr.Host()), stacks=True)
    blocks = [t.allocate(1 << 16, source=s) for s in ("torch", "cupy", "memarray")]
    blocks[0].free()
    out = mr.plot(t.snapshot(), tmp_path / "snap.png")
    assert out == str(tmp_path / "snap.png")
    assert (tmp_path / "snap.png").read_bytes()[:8] == PNG
    log_path = tmp_path / "log.csv"
    log = mr.Logging(mr.Host(), log_path)
    kept = [log.allocate(1000), log.allocate(3000)]
    kept[0].free()
    log.flush()
    mr.plot(str(log_path), tmp_path / "log.png", top=3)
    assert (tmp_path / "log.png").read_bytes()[:8] == PNG
    with pytest.raises(TypeError, match="snapshot"):
        mr.plot(42, tmp_path / "x.png")
    with pytest.raises(ValueError, match="snapshot"):
        mr.plot({"live": []}, tmp_path / "x.png")
    with pytest.raises(ValueError, match="top"):
        mr.plot(t.snapshot(), tmp_path / "x.png", top=0)
    assert not (tmp_path / "x.png").exists()
    for b in blocks[1:] + kept[1:]:
        b.free()


def test_plot_sites_are_the_innermost_frame_outside_packages():
    from memarray._plot import _site

    stack = "\n".join(
        [
            "/home/me/train.py:10 in <module>",
            "/home/me/train.py:7 in step",
            "/usr/lib/python3.12/site-packages/torch/nn/modules/linear.py:134 in forward",
        ]
    )
    assert _site(stack) == "train.py:7 in step"
    assert _site("/x/site-packages/a.py:1 in f") == "a.py:1 in f"
    assert _site(None) == "(no stack)"


def test_missing_peers_are_import_errors_naming_the_package():
    out = child_stdout(
        """
        import sys
        sys.modules["matplotlib"] = None
        sys.modules["torch"] = None
        sys.modules["rmm"] = None
        sys.modules["cupy"] = None
        import memarray, memarray.resources as mr, memarray.torch, memarray.rmm, memarray.cupy
        t = mr.Tracking(mr.Host())
        for call, needle in [
            (lambda: mr.plot(t.snapshot(), "/nonexistent/x.png"), "matplotlib"),
            (memarray.torch.allocator, "torch"),
            (memarray.torch.install, "torch"),
            (memarray.rmm.resource, "rmm-cu13"),
            (lambda: mr.Rmm(0), "rmm-cu13"),
            (lambda: memarray.cupy.allocator, "cupy-cuda13x"),
            (lambda: memarray.cupy_allocator(16), "cupy-cuda13x"),
        ]:
            try:
                call()
            except ImportError as e:
                assert needle in str(e), e
            else:
                raise AssertionError(f"{call} did not raise")
        print("ok")
        """
    )
    assert out.strip() == "ok"


def test_glue_entry_points_refuse_bad_integers_with_documented_errors():
    # The exception walk on the GPU found these raising OverflowError (a bare usize).
    from memarray import _memarray

    interop = _memarray._interop
    hook = interop.cupy_allocator(lambda: 0, lambda: None, None, None)
    callbacks = interop.resource_callbacks(mr.Host()._handle, "rmm")
    for bad in (-1, 2**64, 2**70, np.int64(-1)):
        with pytest.raises(ValueError):
            hook(bad)
        with pytest.raises(ValueError):
            callbacks.allocate(bad, 0)
        with pytest.raises(ValueError):
            callbacks.deallocate(bad, 1, 0)
        with pytest.raises(ValueError):
            interop.pin(b"x", bad, 1, 0)
    with pytest.raises(TypeError):
        hook("1")
    # Host memory through the callbacks (RMM's side would pass its stream object).
    p = callbacks.allocate(4096, 0)
    assert p % 256 == 0 and callbacks.live_blocks() == 1
    with pytest.raises(ValueError, match="4096"):
        callbacks.deallocate(p, 4000, 0)
    assert callbacks.live_blocks() == 1
    callbacks.deallocate(p, 4096, 0)
    callbacks.deallocate(p, 4096, 0)  # a second free of the same block is ignored
    assert callbacks.live_blocks() == 0


def test_allocation_free_takes_a_stream():
    a = mr.Host().allocate(100)
    with pytest.raises(TypeError):
        a.free(stream="fast")
    assert not a.freed
    a.free(stream=0)
    assert a.freed
    a.free()  # once only


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_torch_allocates_through_memarray():
    _peer("torch")
    out = child_stdout(
        """
        import json, torch, memarray.torch as mt, memarray.resources as mr
        mr.set_default_resource(mr.Statistics(mr.Pool(mr.Device(0))), 0)
        mt.install()
        mt.install()  # a second call does nothing
        torch.ones(8, 8, device="cuda") @ torch.ones(8, 8, device="cuda")
        torch.cuda.synchronize()
        # What torch keeps for good (cuBLAS workspaces) is the baseline.
        base = mr.statistics(0)["by_source"]["torch"]["current_bytes"]
        base_blocks = mt.live_blocks()
        a = torch.randn(512, 512, device="cuda")
        b = torch.randn(512, 512, device="cuda")
        c = a @ b
        ref = a.cpu() @ b.cpu()
        close = torch.allclose(c.cpu(), ref, rtol=1e-3, atol=1e-3)
        held = mr.statistics(0)["by_source"]["torch"]["current_bytes"] - base
        blocks = mt.live_blocks() - base_blocks
        del a, b, c
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        after = mr.statistics(0)["by_source"]["torch"]
        before_oom = mr.pressure_statistics()["events"]
        try:
            torch.empty(1 << 46, dtype=torch.uint8, device="cuda")
            oom = ""
        except RuntimeError as e:
            oom = str(e)
        print(json.dumps({"close": close, "held": held, "blocks": blocks,
                          "after": after["current_bytes"] - base,
                          "live": mt.live_blocks() - base_blocks,
                          "oom": oom, "events": mr.pressure_statistics()["events"] - before_oom}))
        """
    )
    r = json.loads(out)
    assert r["close"]
    # torch's caching allocator sits on top: its segments (2 MiB for blocks of 1 MiB) are
    # memarray's, and empty_cache gives them back.
    assert r["held"] > 0 and r["blocks"] >= 1
    # empty_cache gives every cached segment back (torch's earlier ones too: <= 0).
    assert r["after"] <= 0 and r["live"] <= 0
    assert "out of memory" in r["oom"].lower()
    assert r["events"] >= 1


@pytest.mark.gpu
def test_torch_record_stream_orders_the_free():
    _peer("torch")
    out = child_stdout(
        """
        import json, torch, memarray.torch as mt
        mt.install()
        n = 1 << 22
        x = torch.ones(n, device="cuda")
        x_ptr = x.data_ptr()
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)      # ~0.1 s of work queued before the read
            y = x * 2
        x.record_stream(side)
        del x                                   # freed on the default stream
        z = torch.empty(n, device="cuda")       # same size, same stream: the same block
        z.fill_(7)
        torch.cuda.synchronize()
        print(json.dumps({"reused": z.data_ptr() == x_ptr, "ok": bool((y == 2).all())}))
        """
    )
    r = json.loads(out)
    # torch's caching allocator (on top of memarray) keeps the block from reuse until the
    # recorded stream's work is done: reused or not, the read is never overwritten.
    assert r["ok"], "the block was overwritten before the recorded stream read it"


@pytest.mark.gpu
def test_torch_mem_pool_and_installing_after_torchs_first_cuda_use():
    _peer("torch")
    out = child_stdout(
        """
        import json, torch, memarray.torch as mt, memarray.resources as mr
        mr.set_default_resource(mr.Statistics(mr.Pool(mr.Device(0))), 0)
        early = torch.ones(1000, device="cuda")  # torch's own allocator is in use
        pool = mt.pool()
        with torch.cuda.use_mem_pool(pool):
            t = torch.full((1000,), 5.0, device="cuda")
        in_block = mr.statistics(0)["by_source"].get("torch", {}).get("current_bytes", 0)
        mt.install()                              # after torch's first CUDA use: fine
        late = torch.ones(1 << 20, device="cuda")
        by = mr.statistics(0)["by_source"]
        print(json.dumps({"sum": float(t.sum() + early.sum()), "in_block": in_block,
                          "torch": by["torch"]["current_bytes"], "installed": mt.installed(),
                          "late": float(late.sum())}))
        """
    )
    r = json.loads(out)
    assert r["installed"] and r["sum"] == 6000.0 and r["late"] == float(1 << 20)
    assert r["in_block"] > 0  # the pool's segment came from memarray
    assert r["torch"] >= r["in_block"] + (4 << 20)  # so did the installed route's


@pytest.mark.gpu
def test_pressure_frees_torch_and_cupy_caches():
    _peer("torch")
    _peer("cupy")
    out = child_stdout(
        """
        import json, torch, cupy, memarray, memarray.resources as mr
        free, total = mr.Device(0).memory_info()
        chunk = int(free * 0.42) // (1 << 21) * (1 << 21)
        t = torch.empty(chunk, dtype=torch.uint8, device="cuda"); del t     # torch's cache
        c = cupy.empty(chunk, dtype=cupy.uint8); del c                      # CuPy's pool
        reserved = torch.cuda.memory_reserved(0)
        pooled = cupy.get_default_memory_pool().total_bytes()
        before = mr.pressure_statistics()
        want = int(free * 0.5)
        a = memarray.empty([want], "uint8", device="cuda")                 # must relieve
        after = mr.pressure_statistics()
        print(json.dumps({
            "chunk": chunk, "reserved": reserved, "pooled": pooled, "size": a.nbytes,
            "events": after["events"] - before["events"],
            "recovered": after["recovered"] - before["recovered"],
            "torch": after["libraries"]["torch"]["released_bytes"],
            "cupy": after["libraries"]["cupy"]["released_bytes"],
            "torch_now": torch.cuda.memory_reserved(0),
            "cupy_now": cupy.get_default_memory_pool().total_bytes()}))
        """
    )
    r = json.loads(out)
    assert r["reserved"] >= r["chunk"] and r["pooled"] >= r["chunk"]
    assert r["events"] == 1 and r["recovered"] == 1
    assert r["torch"] >= r["chunk"] and r["cupy"] >= r["chunk"]
    assert r["torch_now"] == 0 and r["cupy_now"] == 0


@pytest.mark.gpu
def test_cupy_allocates_through_memarray_on_its_stream():
    cupy = _peer("cupy")
    import memarray.cupy

    stats = mr.Statistics(mr.Pool(mr.Device(0)))
    previous = cupy.cuda.get_allocator()
    with mr.using(stats, 0):
        cupy.cuda.set_allocator(memarray.cupy.allocator)
        try:
            s = cupy.cuda.Stream(non_blocking=True)
            with s:
                x = cupy.arange(1 << 20, dtype=cupy.float32)
                total = float(x.sum())
            assert stats.statistics()["by_source"]["cupy"]["current_bytes"] >= x.nbytes
            del x
            s.synchronize()
            assert stats.statistics()["by_source"]["cupy"]["current_bytes"] == 0
        finally:
            cupy.cuda.set_allocator(previous)
    assert total == float(np.arange(1 << 20, dtype=np.float32).sum())


@pytest.mark.gpu
def test_numba_host_memory_comes_from_memarray():
    _peer("numba")
    out = child_stdout(
        """
        import json, numpy as np
        np.row_stack = np.vstack
        from numba import cuda
        import memarray.numba as mn
        cuda.set_memory_manager(mn.MemarrayNumbaManager)
        p = cuda.pinned_array(1 << 18, dtype=np.float32); p[:] = 1
        m = cuda.mapped_array(1 << 18, dtype=np.float32); m[:] = 2
        w = cuda.pinned_array(1 << 10, dtype=np.float32)   # not wc: the pool again
        stats = mn.host_resource(0).statistics()["by_source"]["numba"]
        d = cuda.to_device(p)
        @cuda.jit
        def double(a):
            i = cuda.grid(1)
            if i < a.size:
                a[i] *= 2
        double[(m.size + 255) // 256, 256](m)              # mapped: written in place
        cuda.synchronize()
        a = np.ones(1 << 16, np.float32)
        with cuda.pinned(a):
            back = cuda.to_device(a).copy_to_host()
        with cuda.pinned(a):                                # unregistered in between
            pass
        del p, m, w
        import gc; gc.collect()
        print(json.dumps({
            "held": stats["current_bytes"], "count": stats["current_count"],
            "d": float(d.copy_to_host().sum()), "back": float(back.sum()),
            "after": mn.host_resource(0).statistics()["by_source"]["numba"]["current_bytes"]}))
        """
    )
    r = json.loads(out)
    assert r["held"] >= 2 * (1 << 18) * 4 and r["count"] == 3
    assert r["d"] == float(1 << 18) and r["back"] == float(1 << 16)
    assert r["after"] == 0


@pytest.mark.gpu
def test_rmm_both_ways():
    _peer("rmm", "MEMARRAY_REQUIRE_RMM")
    out = child_stdout(
        """
        import json, numpy as np, rmm, rmm.mr, memarray, memarray.rmm, memarray.resources as mr
        stats = mr.Statistics(mr.Pool(mr.Device(0)))
        mr.set_default_resource(stats, 0)
        memarray.rmm.set_current(0)
        host = np.arange(1 << 18, dtype=np.float32)
        buf = rmm.DeviceBuffer.to_device(host.view(np.uint8))
        held = stats.statistics()["by_source"]["rmm"]["current_bytes"]
        back = buf.copy_to_host().view(np.float32)
        del buf
        freed = stats.statistics()["by_source"]["rmm"]["current_bytes"]
        # memarray allocating through RMM's resource (a pool on RMM's side).
        rmm.mr.set_per_device_resource(0, rmm.mr.PoolMemoryResource(
            rmm.mr.CudaMemoryResource(), initial_pool_size=1 << 26))
        through = mr.Statistics(mr.Rmm(0))
        with mr.using(through, 0):
            a = memarray.asarray(host, device="cuda")
            via = through.statistics()["current_bytes"]
            same = bool((a.to_numpy() == host).all())
        errors = []
        for bad in (99, -1):
            try:
                mr.Rmm(bad)
            except ValueError as e:
                errors.append(str(e))
        try:
            mr.Rmm("0")
        except TypeError as e:
            errors.append(str(e))
        print(json.dumps({"held": held, "freed": freed, "ok": bool((back == host).all()),
                          "via": via, "same": same, "errors": errors}))
        """
    )
    r = json.loads(out)
    assert r["held"] >= (1 << 20) and r["freed"] == 0 and r["ok"]
    assert r["via"] >= (1 << 20) and r["same"]
    assert len(r["errors"]) == 3 and "no CUDA device 99" in r["errors"][0]
