"""CUDA graphs: memarray's own captures (`Stream.capture()`), memarray work inside torch's and
CuPy's captures, refusals that leave a capture valid, and CuPy's allocator through memarray
when streams go before their arrays. Each captured result is checked bit for bit after two
launches. Crash-prone cases run in subprocesses."""

from __future__ import annotations

import gc
import os
import sys

import numpy as np
import pytest
from children import assert_clean, run_child

import memarray

SHAPE = (64, 33)
MODES = ["thread_local", "global", "relaxed"]  # CUDA's capture modes


def one_step() -> np.ndarray:
    """What one `add_index_tuple` adds to a zeroed array (the host kernel's answer)."""
    h = memarray.zeros(SHAPE, "float32")
    h.add_index_tuple()
    return h.to_numpy()


def warm_zeros() -> memarray.MemArray:
    """A zeroed device array, warmed (see `warm`)."""
    a = memarray.zeros(SHAPE, "float32", device="cuda")
    warm(a)
    return a


def warm(a: memarray.MemArray) -> None:
    """One eager kernel and an undo: the module is loaded before any capture (loading a
    module cannot be captured), and `a` is zero again."""
    a.add_index_tuple()
    a.read_numpy_array(np.zeros(SHAPE, np.float32))
    a.synchronize()


@pytest.mark.gpu
def test_a_capture_mode_other_than_cudas_three_is_a_value_error_and_captures_nothing():
    s = memarray.cuda.Stream()
    with pytest.raises(ValueError, match="thread_local"):
        s.capture("sometimes")
    assert not s.is_capturing()


class _Capturing:
    """A stand-in for torch or CuPy whose current stream is (or is not) being captured."""

    def __init__(self, capturing: bool, initialized: bool = True) -> None:
        self.capturing, self.initialized = capturing, initialized
        self.cuda = self

    # torch's names
    def is_initialized(self) -> bool:
        return self.initialized

    def is_current_stream_capturing(self) -> bool:
        if not self.initialized:
            raise RuntimeError("asked before CUDA was initialised")
        return self.capturing

    # CuPy's names
    def get_current_stream(self) -> _Capturing:
        return self

    def is_capturing(self) -> bool:
        if not self.initialized:
            raise RuntimeError("no CUDA device")
        return self.capturing


@pytest.mark.parametrize("peer", ["torch", "cupy"])
def test_a_capture_by_torch_or_cupy_on_this_thread_is_seen_and_refused_typed(monkeypatch, peer):
    from memarray import _capture

    for name in ("torch", "cupy"):
        monkeypatch.setitem(sys.modules, name, _Capturing(False))
    assert _capture.capturing_peer() is None
    _capture.refuse_if_capturing("a host wait")  # nothing captured: no refusal
    monkeypatch.setitem(sys.modules, peer, _Capturing(True))
    assert _capture.capturing_peer() == peer
    with pytest.raises(memarray.CaptureError, match=f"{peer}'s current stream.*still valid"):
        _capture.refuse_if_capturing("a host wait")
    # A library that cannot answer (no CUDA, not initialised) is taken as not capturing.
    monkeypatch.setitem(sys.modules, peer, _Capturing(True, initialized=False))
    assert _capture.capturing_peer() is None


@pytest.mark.gpu
def test_ray_and_dask_serializers_refuse_device_arrays_inside_a_cupy_capture(monkeypatch):
    from memarray._pickle import Snapshot

    monkeypatch.setitem(sys.modules, "cupy", _Capturing(True))
    with pytest.raises(memarray.CaptureError, match="serializing a device MemArray"):
        Snapshot.of(memarray.zeros((4,), "float32", device="cuda"))
    assert Snapshot.of(memarray.zeros((4,), "float32")).device is None  # host arrays go


@pytest.mark.gpu
def test_mpi_refuses_device_arrays_inside_a_torch_capture_and_host_arrays_pass(monkeypatch):
    pytest.importorskip("mpi4py")
    from memarray.cluster.mpi import _buffers

    monkeypatch.setitem(sys.modules, "torch", _Capturing(True))
    with pytest.raises(memarray.CaptureError, match="memarray.mpi with a device array"):
        _buffers._check(memarray.zeros((4,), "float32", device="cuda"), "a")
    host = memarray.zeros((4,), "float32")
    assert _buffers._check(host, "a") is host


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
def test_a_memarray_capture_records_kernels_and_replays_them_bit_for_bit(mode):
    step = one_step()
    s = memarray.cuda.Stream()
    a = warm_zeros()
    with s.capture(mode) as cap:
        assert s.is_capturing()
        a.add_index_tuple(stream=s)
        a.add_index_tuple(stream=s)
    assert not s.is_capturing()
    g = cap.graph
    assert g.node_count >= 2, g
    np.testing.assert_array_equal(a.to_numpy(), np.zeros(SHAPE, np.float32))  # nothing ran
    g.upload()
    g.launch()
    s.synchronize()
    np.testing.assert_array_equal(a.to_numpy(), 2 * step)
    g.replay(2)
    s.synchronize()
    np.testing.assert_array_equal(a.to_numpy(), 6 * step)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
def test_a_graph_holds_its_arrays_and_a_read_after_a_launch_waits_for_it(mode):
    step = one_step()
    s = memarray.cuda.Stream()
    a, b = warm_zeros(), warm_zeros()
    with s.capture(mode) as cap:
        a.add_index_tuple(stream=s)
        b.add_index_tuple(stream=s)
        # Host waits for captured work could never end: refused, the capture goes on.
        with pytest.raises(memarray.CaptureError, match="still valid"):
            s.synchronize()
        with pytest.raises(memarray.CaptureError, match="still valid"):
            a.synchronize()
        a.add_index_tuple(stream=s)
    g = cap.graph
    assert g.array_count == 2, g
    # The graph's arrays stay on the device: the spiller passes them over.
    with pytest.raises(ValueError, match="graph"):
        memarray.spill.evict(a)
    g.launch()
    g.launch()  # no stream wait: a host read waits for the launches, the arrays' work
    np.testing.assert_array_equal(a.to_numpy(), 4 * step)
    np.testing.assert_array_equal(b.to_numpy(), 2 * step)
    g.replay(2)
    np.testing.assert_array_equal(b.to_numpy(), 4 * step)
    # Deleted by its owner, an array lives on in the graph: launches stay valid.
    del a
    gc.collect()
    g.launch()
    np.testing.assert_array_equal(b.to_numpy(), 5 * step)


@pytest.mark.gpu
def test_a_launch_after_an_array_took_other_memory_raises_and_launches_nothing():
    step = one_step()
    s = memarray.cuda.Stream()
    a, b, c = warm_zeros(), warm_zeros(), warm_zeros()
    with s.capture() as cap:
        a.add_index_tuple(stream=s)
        b.add_index_tuple(stream=s)
    g = cap.graph
    # To the host and back keeps the device memory (the mirror): the launch runs.
    a.move_memory(memarray.dlpack.kDLCPU)
    g.launch()
    np.testing.assert_array_equal(a.to_numpy(), step)
    a.swap(c)  # a now has c's device memory
    with pytest.raises(memarray.CaptureError, match="moved since the capture"):
        g.launch()
    np.testing.assert_array_equal(a.to_numpy(), np.zeros(SHAPE, np.float32))
    np.testing.assert_array_equal(b.to_numpy(), step)  # nothing launched
    a.swap(c)
    g.launch()
    np.testing.assert_array_equal(a.to_numpy(), 2 * step)
    np.testing.assert_array_equal(b.to_numpy(), 2 * step)


@pytest.mark.gpu
def test_work_a_graph_cannot_replay_is_refused_typed_and_the_capture_still_succeeds():
    step = one_step()
    s = memarray.cuda.Stream()
    a = warm_zeros()
    with s.capture() as cap:
        a.add_index_tuple(stream=s)
        # The next upload runs on a's last stream, s: pageable memory cannot be replayed.
        with pytest.raises(memarray.CaptureError, match="still valid"):
            a.read_numpy_array(np.ones(SHAPE, np.float32))
        assert s.is_capturing()
        # move_many packs on host threads and waits: refused before any work.
        small = [memarray.zeros((8,), "float32", host_memory="pinned") for _ in range(3)]
        with pytest.raises(memarray.CaptureError, match="move_many"):
            memarray.move_many(small, "cuda", stream=s)
        assert all(x.device == "cpu" for x in small)
        a.add_index_tuple(stream=s)
    cap.graph.launch()
    s.synchronize()
    np.testing.assert_array_equal(a.to_numpy(), 2 * step)
    # A block left by an exception ends the capture and throws the graph away.
    with pytest.raises(KeyError):
        with s.capture() as dropped:
            a.add_index_tuple(stream=s)
            raise KeyError("leaving")
    assert not s.is_capturing()
    with pytest.raises(RuntimeError, match="no graph"):
        _ = dropped.graph
    np.testing.assert_array_equal(a.to_numpy(), 2 * step)  # the dropped work never ran


@pytest.mark.gpu
def test_memarray_kernels_inside_torchs_graph_replay_and_leave_the_capture_valid():
    torch = pytest.importorskip("torch")
    step = one_step()
    a = warm_zeros()
    # Eager work still pending on the array when the capture begins (no synchronize): the
    # graph waits for it as an external event instead of breaking the capture.
    a.read_numpy_array(np.zeros(SHAPE, np.float32))
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.graph(g, stream=s):
        a.add_index_tuple(stream=torch.cuda.current_stream())
        t = torch.from_dlpack(a) * 2  # torch reads memarray's array inside the graph
    g.replay()
    torch.cuda.synchronize()
    np.testing.assert_array_equal(a.to_numpy(), step)
    np.testing.assert_array_equal(t.cpu().numpy(), 2 * step)
    g.replay()
    torch.cuda.synchronize()
    np.testing.assert_array_equal(a.to_numpy(), 2 * step)
    np.testing.assert_array_equal(t.cpu().numpy(), 4 * step)


@pytest.mark.gpu
def test_memarray_allocates_inside_torchs_capture_without_breaking_it():
    torch = pytest.importorskip("torch")
    step = one_step()
    a = warm_zeros()
    # a's block goes back to the pool for the legacy stream: taking it inside the capture
    # would query its event, which torch's (global) capture forbids; the pool grows
    # instead, by a cuMemAlloc that a global capture forbids unless the thread's capture
    # mode is relaxed for it (as memarray does).
    del a
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=torch.cuda.Stream()):
        cur = torch.cuda.current_stream()
        b = memarray.zeros(SHAPE, "float32", device="cuda", stream=cur)
        b.add_index_tuple(stream=cur)
    for _ in range(2):
        g.replay()  # the memset and the kernel, again
        torch.cuda.synchronize()
        np.testing.assert_array_equal(b.to_numpy(), step)


@pytest.mark.gpu
def test_memarray_kernels_inside_a_cupy_capture_replay_and_free_cleanly():
    pytest.importorskip("cupy")
    # In a fresh process, so that no error parked by another test counts: the export CuPy
    # drops inside the capture records no use an eager free would then wait on (the
    # driver refuses that wait: it was parked as a failed free before).
    r = run_child(
        """
        import gc
        import numpy as np
        import cupy, memarray
        from test_graphs import SHAPE, one_step, warm
        step = one_step()
        a = memarray.zeros(SHAPE, "float32", device="cuda")
        warm(a)
        s = cupy.cuda.Stream(non_blocking=True)
        with s:
            s.begin_capture()
            a.add_index_tuple(stream=s)
            c = cupy.from_dlpack(a) + 1
            g = s.end_capture()
        g.launch(s)
        s.synchronize()
        g.launch(s)
        s.synchronize()
        np.testing.assert_array_equal(a.to_numpy(), 2 * step)
        np.testing.assert_array_equal(cupy.asnumpy(c), 2 * step + 1)
        del g, c, a
        gc.collect()
        cupy.cuda.Device().synchronize()
        memarray.cuda.check_errors()
        print("ok")
        """,
        timeout=300,
    )
    assert_clean(r)
    assert "ok" in r.stdout and "RuntimeWarning" not in r.stderr, r.stderr[-2000:]


@pytest.mark.gpu
def test_cupy_blocks_through_memarray_keep_their_stream_until_freed():
    pytest.importorskip("cupy")
    # CuPy's own graph tests drop a Stream before the arrays allocated on it; each free is
    # ordered on the allocation's stream, so memarray keeps that Stream alive until then.
    r = run_child(
        """
        import gc, sys
        import cupy, memarray
        cupy.cuda.set_allocator(memarray.cupy_allocator)
        s = cupy.cuda.Stream(non_blocking=True)
        with s:
            pass
        before = sys.getrefcount(s)
        with s:
            a = cupy.arange(1000)
        assert sys.getrefcount(s) == before + 1, (sys.getrefcount(s), before)
        del a
        gc.collect()
        assert sys.getrefcount(s) == before, (sys.getrefcount(s), before)
        x = cupy.random.random((100,))
        cupy.cuda.get_current_stream().synchronize()
        for i in range(300):
            s = cupy.cuda.Stream(non_blocking=True)
            with s:
                s.begin_capture()
                y = (x + 3) * 7.6
                g = s.end_capture()
                g.launch()
            s.synchronize()
            del s, g  # the stream goes first; y's block is freed after it
            assert float(abs(y - (x + 3) * 7.6).max()) == 0.0
            del y
        cupy.cuda.Device().synchronize()
        print("ok")
        """,
        timeout=300,
    )
    assert_clean(r)
    assert "ok" in r.stdout


@pytest.mark.gpu
def test_torch_compile_reduce_overhead_reads_memarray_tensors_and_its_outputs_import():
    pytest.importorskip("torch")
    # In a fresh process (torch.compile's caches and cudagraph trees stay per process).
    r = run_child(
        """
        import numpy as np, torch, memarray
        from torch._dynamo.utils import counters

        @torch.compile(mode="reduce-overhead")
        def f(x, y):
            return torch.sin(x * 2 + y)

        n = 4096
        a = memarray.asarray(np.linspace(0, 1, n, dtype=np.float32), device="cuda")
        b = memarray.zeros((n,), "float32", device="cuda")
        x, y = torch.from_dlpack(a), torch.from_dlpack(b)  # zero-copy views of memarray's
        for i in range(6):  # warm-up, recording, then replays
            torch.compiler.cudagraph_mark_step_begin()
            # memarray writes its array; the compiled graph reads the new values
            b.read_numpy_array(np.full(n, i, np.float32))
            out = f(x, y)
            m = memarray.from_dlpack(out)  # the graph's output as a memarray array
            want = np.sin(np.linspace(0, 1, n, dtype=np.float32) * 2 + i)
            np.testing.assert_allclose(m.to_numpy(), want, rtol=1e-5, atol=1e-6)
            del m, out
        assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
        assert sum(counters["inductor"].values()) > 0, "inductor never compiled f"
        memarray.cuda.check_errors()
        print("ok")
        """,
        timeout=400,
    )
    assert_clean(r)
    assert "ok" in r.stdout, r.stderr[-3000:]


@pytest.mark.gpu
def test_an_allocation_over_the_budget_inside_a_capture_spills_nothing():
    # A fresh process: spilling on with a budget two arrays fill.
    r = run_child(
        """
        import numpy as np, memarray
        memarray.spill.enable(0, device_budget="64MiB")
        n = 8 << 20  # 32 MiB of float32
        s = memarray.cuda.Stream()
        a, b = (memarray.zeros((n,), "float32", device="cuda") for _ in range(2))
        for x in (a, b):
            x.add_index_tuple(stream=s)
        s.synchronize()
        before = memarray.spill.statistics(0)["spilled_arrays"]
        with s.capture() as cap:
            # Past the budget: outside a capture a or b would spill (a copy and a host
            # wait); inside one nothing spills and the capture goes on.
            c = memarray.zeros((n,), "float32", device="cuda", stream=s)
            c.add_index_tuple(stream=s)
        assert memarray.spill.statistics(0)["spilled_arrays"] == before
        assert not a.spilled and not b.spilled
        cap.graph.launch()
        cap.graph.launch()
        # Each launch zeroes c (its birth was captured) and adds i once.
        np.testing.assert_array_equal(c.to_numpy(), np.arange(n, dtype=np.float32))
        memarray.cuda.check_errors()
        print("ok")
        """,
        timeout=300,
    )
    assert_clean(r)
    assert "ok" in r.stdout, r.stderr[-3000:]


@pytest.mark.gpu
def test_rmm_through_memarray_allocates_inside_a_cupy_capture_as_on_its_own():
    pytest.importorskip("cupy")
    pytest.importorskip("rmm")
    # CuPy allocating through RMM, RMM's resource memarray's (memarray.rmm.set_current):
    # the capture's temporaries come from memarray's pool, held for the graph, and every
    # replay reads and writes the right memory; the same on RMM's own resource beside it.
    code = """
        import numpy as np
        import cupy, rmm, memarray, memarray.rmm
        from rmm.allocators.cupy import rmm_cupy_allocator
        if THROUGH:
            memarray.rmm.set_current()
        cupy.cuda.set_allocator(rmm_cupy_allocator)
        x = cupy.arange(1 << 16, dtype=cupy.float32)
        out = cupy.zeros_like(x)
        s = cupy.cuda.Stream(non_blocking=True)
        (x * 2 + 1).sum()  # kernels loaded before the capture
        with s:
            s.begin_capture()
            t = x * 2            # a temporary allocated inside the capture
            out += t + 1
            g = s.end_capture()
        del t
        for _ in range(2):
            g.launch(s)
        s.synchronize()
        want = 2 * (2 * np.arange(1 << 16, dtype=np.float32) + 1)
        np.testing.assert_array_equal(cupy.asnumpy(out), want)
        del g
        cupy.cuda.Device().synchronize()
        memarray.cuda.check_errors()
        print("ok")
        """
    for through in (False, True):
        r = run_child(code.replace("THROUGH", str(through)), timeout=300)
        assert_clean(r)
        assert "ok" in r.stdout, (through, r.stderr[-2000:])


@pytest.mark.gpu
def test_numba_through_memarray_allocates_and_launches_inside_a_cupy_capture():
    pytest.importorskip("cupy")
    pytest.importorskip("numba")
    # Numba's memory manager memarray's; Numba has no capture of its own, so its kernel
    # and a device array it allocates join a CuPy capture through an external stream.
    r = run_child(
        """
        import numpy as np
        if not hasattr(np, "row_stack"):
            np.row_stack = np.vstack  # Numba 0.68's tables name it; NumPy 2.5 removed it
        import cupy
        from numba import cuda

        @cuda.jit
        def add_index(a):
            i = cuda.grid(1)
            if i < a.size:
                a[i] += i

        n = 1 << 14
        kept = cuda.device_array(n, dtype=np.float32)
        add_index[64, 256](kept)  # compiled and loaded before the capture
        cuda.synchronize()
        s = cupy.cuda.Stream(non_blocking=True)
        ns = cuda.external_stream(s.ptr)
        with s:
            s.begin_capture()
            d = cuda.device_array(n, dtype=np.float32, stream=ns)  # through memarray
            add_index[64, 256, ns](d)
            add_index[64, 256, ns](kept)
            g = s.end_capture()
        kept.copy_to_device(np.zeros(n, np.float32))
        for _ in range(2):
            g.launch(s)
        s.synchronize()
        np.testing.assert_array_equal(kept.copy_to_host(), 2 * np.arange(n, dtype=np.float32))
        del g, d
        import memarray
        memarray.cuda.check_errors()
        print("ok")
        """,
        env=dict(os.environ, NUMBA_CUDA_MEMORY_MANAGER="memarray.numba"),
        timeout=300,
    )
    assert_clean(r)
    assert "ok" in r.stdout, r.stderr[-2000:]
