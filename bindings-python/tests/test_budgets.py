"""Budgets per library (memarray.resources.set_budget) and what each library holds through
memarray (library_usage), over host memory: a budget stops the library it names and no
other, its OutOfMemoryError names the budget, frees make room, and the counts stay exact
with threads allocating while they are read."""

from __future__ import annotations

import json
import threading

import pytest
from children import child_stdout

import memarray
from memarray import resources as mr


@pytest.fixture
def clean_budgets():
    yield
    for source in mr.SOURCES:
        mr.set_budget(source, None, device="host")
        mr.set_budget(source, None)


def held(source: str, device="host") -> int:
    return sum(
        r["live_bytes"]
        for r in mr.library_usage()
        if r["source"] == source and r["device"] == device
    )


def test_a_budget_stops_the_library_it_names_and_no_other(clean_budgets):
    host = mr.Host()
    before_numba, before_rmm = held("numba"), held("rmm")
    mr.set_budget("numba", "1KiB", device="host")
    first = host.allocate(600, source="numba")
    with pytest.raises(memarray.OutOfMemoryError) as info:
        host.allocate(600, source="numba")
    e = info.value
    assert "numba's budget on host memory" in str(e) and "of its 1024 bytes" in str(e), e
    report = e.report
    text = str(report)
    assert "numba" in text and "budget" in text, text
    assert 'set_budget("numba"' in report["advice"], report["advice"]
    rows = [r for r in report["libraries"] if r["source"] == "numba"]
    assert rows and rows[0]["budget"] == 1024, report["libraries"]
    # Another library on the same memory is not limited; the refused bytes never counted.
    other = host.allocate(1 << 20, source="rmm")
    assert held("numba") - before_numba == 600
    assert held("rmm") - before_rmm == 1 << 20
    row = next(r for r in mr.budgets() if r["source"] == "numba")
    assert (row["device"], row["budget"], row["refused"]) == ("host", 1024, 1), row
    # A free makes room; exactly the budget fits, one byte more does not.
    first.free()
    whole = host.allocate(1024, source="numba")
    with pytest.raises(memarray.OutOfMemoryError):
        host.allocate(1, source="numba")
    whole.free()
    other.free()
    # Removed: no limit, and no budget row.
    mr.set_budget("numba", None, device="host")
    big = host.allocate(1 << 16, source="numba")
    big.free()
    assert held("numba") == before_numba and held("rmm") == before_rmm
    assert not [r for r in mr.budgets() if r["source"] == "numba"]


def test_every_device_budget_leaves_host_memory_alone_and_a_device_budget_reads_back(
    clean_budgets,
):
    mr.set_budget("cupy", 4096)
    mr.set_budget("cupy", "1MiB", device="cuda:3")
    got = {(r["source"], r["device"]): r["budget"] for r in mr.budgets()}
    assert got[("cupy", 0)] == 4096 and got[("cupy", 3)] == 1 << 20, got
    assert ("cupy", "host") not in got
    a = mr.Host().allocate(1 << 20, source="cupy")  # host memory: not limited
    a.free()


@pytest.mark.parametrize(
    "args, kwargs, error",
    [
        (("nobody", 1), {}, ValueError),
        ((3, 1), {}, TypeError),
        (("torch", "4 parsecs"), {}, ValueError),
        (("torch", -1), {}, (ValueError, OverflowError)),
        (("torch", 1.5), {}, TypeError),
        (("torch", 1), {"device": "tpu"}, ValueError),
        (("torch", 1), {"device": True}, TypeError),
        (("torch", 1), {"device": -1}, (ValueError, OverflowError)),
        (("torch", 1), {"device": 64}, ValueError),
    ],
)
def test_bad_arguments_are_typed_errors_and_set_nothing(args, kwargs, error, clean_budgets):
    with pytest.raises(error):
        mr.set_budget(*args, **kwargs)
    assert not [r for r in mr.budgets() if r["source"] == "torch"]


def test_threads_allocating_under_a_budget_while_the_usage_is_read(clean_budgets):
    host = mr.Host()
    base = held("cuda_core")
    mr.set_budget("cuda_core", 64 * 1000, device="host")
    refused = []
    stop = threading.Event()
    seen = []

    def reader():
        while not stop.is_set():
            seen.append(held("cuda_core") - base)

    def worker():
        mine = []
        for i in range(2000):
            try:
                mine.append(host.allocate(1000, source="cuda_core"))
            except memarray.OutOfMemoryError:
                refused.append(1)
            if i % 3 == 0 and mine:
                mine.pop().free()
        for a in mine:
            a.free()

    r = threading.Thread(target=reader)
    r.start()
    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    r.join()
    assert refused, "the budget was reached"
    assert seen and max(seen) <= 64 * 1000 + 4 * 1000, max(seen)
    assert held("cuda_core") == base


@pytest.fixture
def no_host_watermark():
    yield
    mr.set_watermark(None, device="host")


def test_a_watermark_calls_once_per_rise_off_the_allocating_thread(no_host_watermark):
    import queue

    host = mr.Host()
    base = sum(r["live_bytes"] for r in mr.library_usage() if r["device"] == "host")
    got: queue.Queue = queue.Queue()
    mr.set_watermark(
        base + (1 << 20),
        lambda device, held, level: got.put((device, held, level, threading.get_ident())),
        device="host",
    )
    a = host.allocate(768 << 10, source="torch")
    with pytest.raises(queue.Empty):
        got.get(timeout=0.2)
    b = host.allocate(512 << 10)  # every library's bytes count
    device, held, level, thread = got.get(timeout=5)
    assert (device, held, level) == ("host", base + (1280 << 10), base + (1 << 20))
    assert thread != threading.get_ident(), "called off the allocating thread"
    c = host.allocate(1 << 10)
    with pytest.raises(queue.Empty):
        got.get(timeout=0.2)  # still above: no second call
    b.free()
    c.free()  # below again: re-armed
    d = host.allocate(512 << 10, source="cupy")
    assert got.get(timeout=5)[:2] == ("host", base + (1280 << 10))
    row = next(r for r in mr.watermarks() if r["device"] == "host")
    assert (row["crossings"], row["failures"]) == (2, 0), row
    mr.set_watermark(None, device="host")
    assert all(r["device"] != "host" for r in mr.watermarks())
    a.free()
    d.free()


def test_a_watermark_callback_that_raises_is_reported_and_counted(monkeypatch, no_host_watermark):
    import queue

    reported: queue.Queue = queue.Queue()
    monkeypatch.setattr("sys.unraisablehook", lambda u: reported.put(u.exc_value))
    host = mr.Host()

    def boom(device, held, level):
        raise RuntimeError("the callback failed")

    mr.set_watermark(1, boom, device="host")
    a = host.allocate(4096)
    assert "the callback failed" in str(reported.get(timeout=5))
    for _ in range(100):  # the count follows the report
        row = next(r for r in mr.watermarks() if r["device"] == "host")
        if row["failures"]:
            break
        threading.Event().wait(0.02)
    assert row["failures"] == 1, row
    a.free()


@pytest.mark.parametrize(
    "args, kwargs, error",
    [
        ((1,), {"device": "host"}, TypeError),  # no callback
        ((1, 5), {"device": "host"}, TypeError),  # not callable
        ((1, print), {"device": True}, TypeError),
        ((1, print), {"device": "tpu"}, ValueError),
        ((1, print), {"device": 64}, ValueError),
        (("1 parsec", print), {"device": "host"}, ValueError),
        ((-1, print), {"device": "host"}, (ValueError, OverflowError)),
    ],
)
def test_bad_watermark_arguments_are_typed_errors(args, kwargs, error, no_host_watermark):
    with pytest.raises(error):
        mr.set_watermark(*args, **kwargs)
    assert all(r["device"] not in ("host", 64) for r in mr.watermarks())


@pytest.mark.gpu
def test_on_a_device_a_budget_stops_torch_and_no_other_and_torch_says_who_holds_what():
    # A fresh process: torch and CuPy through memarray, torch's budget 64 MiB on cuda:0.
    out = child_stdout(
        """
        import json
        import cupy, torch, memarray, memarray.torch
        from memarray import resources as mr, notebook

        memarray.torch.install()
        cupy.cuda.set_allocator(memarray.cupy_allocator)
        mr.set_budget("torch", "64MiB", device=0)
        t = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")  # within it
        try:
            torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
            text = None
        except Exception as e:  # torch's out-of-memory error
            text = str(e)
        # The others keep allocating on the same device, past torch's budget.
        c = cupy.zeros(128 << 20, dtype=cupy.uint8)
        m = memarray.zeros((128 << 20,), "uint8", device="cuda")
        rows = {r["source"]: r for r in mr.library_usage() if r["device"] == 0}
        bands = {name: n for name, n, _ in notebook.device_usage(0)["bands"]}
        print(json.dumps({"text": text, "rows": rows, "bands": bands}))
        """
    )
    got = json.loads(out.strip().splitlines()[-1])
    text = got["text"]
    assert text and "torch's budget on cuda:0" in text, text
    assert "held through memarray on cuda:0" in text and "relief so far" in text, text
    rows = got["rows"]
    assert rows["torch"]["budget"] == 64 << 20 and rows["torch"]["refused"] >= 1, rows
    assert 32 << 20 <= rows["torch"]["live_bytes"] <= 64 << 20, rows
    assert rows["cupy"]["live_bytes"] >= 128 << 20, rows
    assert rows["memarray"]["live_bytes"] >= 128 << 20, rows
    # The monitor's bands with no setup: one per library, from the ledger.
    for lib in ("torch", "cupy", "memarray"):
        assert got["bands"].get(lib, 0) == rows[lib]["live_bytes"], (lib, got["bands"], rows)


@pytest.mark.gpu
def test_a_budget_on_the_second_device_stops_the_library_there_and_not_on_the_first():
    from conftest import two_gpus

    two_gpus()
    out = child_stdout(
        """
        import json
        import cupy, torch, memarray, memarray.torch
        from memarray import resources as mr

        memarray.torch.install()
        cupy.cuda.set_allocator(memarray.cupy_allocator)
        mr.set_budget("torch", "32MiB", device=1)
        got = {}
        for d in (1, 0):
            try:
                t = torch.empty(64 << 20, dtype=torch.uint8, device=f"cuda:{d}")
                got[d] = "ok"
                del t
            except Exception as e:
                got[d] = str(e)
        with cupy.cuda.Device(1):
            c = cupy.zeros(64 << 20, dtype=cupy.uint8)  # CuPy on cuda:1: no budget of its own
        got["cupy"] = int(c.sum())
        rows = [r for r in mr.library_usage() if r["source"] == "torch" and r["device"] == 1]
        got["refused"] = rows[0]["refused"] if rows else None
        print(json.dumps(got))
        """
    )
    got = json.loads(out.strip().splitlines()[-1])
    assert "torch's budget on cuda:1" in got["1"], got
    assert got["0"] == "ok" and got["cupy"] == 0, got
    assert got["refused"] and got["refused"] >= 1, got


@pytest.mark.gpu
def test_each_librarys_budget_stops_it_through_its_own_path_and_no_other():
    # CuPy, RMM, Numba's EMM plugin, cuda.core and memarray's arrays each allocate through
    # memarray on cuda:0 under a 16 MiB budget of their own: 8 MiB fits, 32 MiB more is
    # refused naming that library's budget, and the next library is not limited.
    out = child_stdout(
        """
        import json
        import numpy as np
        if not hasattr(np, "row_stack"):
            np.row_stack = np.vstack  # Numba 0.68's tables name it; NumPy 2.5 removed it
        import cupy, rmm, memarray, memarray.rmm
        from numba import cuda as ncuda
        from cuda.core import Device as CcDevice
        import memarray.cuda_core as mcc
        from memarray import resources as mr

        cupy.cuda.set_allocator(memarray.cupy_allocator)
        memarray.rmm.set_current(device=0)
        cc = CcDevice(0)
        cc.set_current()
        cc.memory_resource = mcc.MemoryResource()
        cc_stream = cc.create_stream()
        MiB = 1 << 20
        ways = {
            "cupy": lambda n: cupy.empty(n, dtype=cupy.uint8),
            "rmm": lambda n: rmm.DeviceBuffer(size=n),
            "numba": lambda n: ncuda.device_array(n, dtype=np.uint8),
            "cuda_core": lambda n: cc.allocate(n, stream=cc_stream),
            "memarray": lambda n: memarray.empty((n,), "uint8", device="cuda"),
        }
        for source in ways:
            mr.set_budget(source, "16MiB", device=0)
        got, held = {}, []
        for source, alloc in ways.items():
            held.append(alloc(8 * MiB))
            try:
                held.append(alloc(32 * MiB))
                got[source] = "not refused"
            except Exception as e:
                got[source] = type(e).__name__ + ": " + str(e)
        rows = {r["source"]: r for r in mr.library_usage() if r["device"] == 0}
        got["live"] = {s: rows[s]["live_bytes"] for s in ways if s in rows}
        got["refused"] = {s: rows[s]["refused"] for s in ways if s in rows}
        print(json.dumps(got))
        """,
        env={"NUMBA_CUDA_MEMORY_MANAGER": "memarray.numba"},
    )
    got = json.loads(out.strip().splitlines()[-1])
    for source in ("cupy", "rmm", "numba", "cuda_core", "memarray"):
        assert got[source] != "not refused", (source, got)
        assert got["refused"][source] >= 1, (source, got["refused"])
        assert 8 << 20 <= got["live"][source] <= 16 << 20, (source, got["live"])
    # RMM's callback resource reports a failure its own way; the others carry memarray's text.
    for source in ("cupy", "numba", "cuda_core", "memarray"):
        assert f"{source}'s budget on cuda:0" in got[source], (source, got[source])
