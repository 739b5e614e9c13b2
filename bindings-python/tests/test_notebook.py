"""memarray in the notebook: the live monitor's figures and picture (usage, render), the
widget's refresh thread, and the HTML views of arrays and resources."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

import memarray
from memarray import resources as mr


def _tracked():
    t = mr.Tracking(mr.Statistics(mr.Pool(mr.Host())), stacks=True)
    held = [t.allocate(3 << 20, source="cupy"), t.allocate(1 << 20, source="torch")]
    return t, held


def test_usage_splits_a_device_into_libraries_cache_and_outside():
    from memarray import notebook

    t, held = _tracked()
    f = notebook.usage(t, total=64 << 20, free=32 << 20, budget=48 << 20, label="cuda:0")
    bands = {name: n for name, n, _ in f["bands"]}
    assert bands["cupy"] == 3 << 20 and bands["torch"] == 1 << 20, bands
    through = sum(n for name, n in bands.items() if name not in ("outside memarray",))
    assert bands["outside memarray"] == (64 << 20) - (32 << 20) - through, bands
    sites = {name: s for name, _, s in f["bands"]}
    assert sites["cupy"] and "test_notebook.py" in sites["cupy"][0], sites
    assert f["budget"] == 48 << 20 and f["tracking"]
    # Without Tracking: a Statistics stack still tells libraries apart; a bare pool has one
    # band for all.
    s = mr.Statistics(mr.Pool(mr.Host()))
    a = s.allocate(1 << 20, source="numba")
    assert [b[0] for b in notebook.usage(s)["bands"]][:1] == ["numba"]
    p = mr.Pool(mr.Host())
    b = p.allocate(1 << 20)
    frame = notebook.usage(p)
    assert frame["bands"][0][:2] == ("through memarray", 1 << 20)
    assert frame["pool"] == {"cached_bytes": 0, "largest_free_bytes": 0}
    b.free()
    assert notebook.usage(p)["pool"] == {"cached_bytes": 1 << 20, "largest_free_bytes": 1 << 20}
    assert notebook.usage(s)["pool"] is not None and notebook.usage(mr.Host())["pool"] is None
    del a, held


def test_usage_reads_a_trackings_counters_as_allocations_come_and_go():
    import threading

    from memarray import notebook

    t = mr.Tracking(mr.Host(), stacks=True)
    held = [t.allocate(1000, source="torch") for _ in range(50)]
    held += [t.allocate(500) for _ in range(10)]
    assert t.live_bytes()["torch"] == 50_000 and t.live_count() == 60
    bands = {name: (n, sites) for name, n, sites in notebook.usage(t)["bands"]}
    assert bands["torch"][0] == 50_000 and bands["memarray"][0] == 5_000, bands
    assert "test_notebook.py" in bands["torch"][1][0], bands
    for a in held[:25]:
        a.free()
    assert t.live_bytes()["torch"] == 25_000 and t.live_count() == 35
    assert sum(n for src, _, n in t.live_by_stack() if src == "torch") == 25_000
    # Without stacks the bytes are there, their site is "(no stack)".
    plain = mr.Tracking(mr.Host())
    kept = plain.allocate(4096, source="cupy")
    (name, n, sites), *_ = notebook.usage(plain)["bands"]
    assert (name, n) == ("cupy", 4096) and sites == ["0.0 MiB at (no stack)"], sites
    # Threads allocating and freeing while frames are read: every frame is whole, and
    # the last one equals the counters once they stop.
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            x = [t.allocate(256, source="cupy") for _ in range(20)]
            for a in x:
                a.free()

    workers = [threading.Thread(target=churn) for _ in range(2)]
    for w in workers:
        w.start()
    try:
        for _ in range(200):
            frame = notebook.usage(t)
            assert all(n > 0 for _, n, _ in frame["bands"]), frame
    finally:
        stop.set()
        for w in workers:
            w.join()
    final = {name: n for name, n, _ in notebook.usage(t)["bands"]}
    assert final == {k: v for k, v in t.live_bytes().items() if v}, final
    del held, kept


def test_usage_of_a_place_reads_the_ledger_with_no_setup():
    from memarray import notebook

    host = mr.Host()  # no Statistics, no Tracking
    before = {name: n for name, n, _ in notebook.usage(None, device="host")["bands"]}
    a = host.allocate(3 << 20, source="rmm")
    b = host.allocate(1 << 20)
    frame = notebook.usage(host, device="host")
    bands = {name: n for name, n, _ in frame["bands"]}
    assert bands["rmm"] - before.get("rmm", 0) == 3 << 20, bands
    assert bands["memarray"] - before.get("memarray", 0) == 1 << 20, bands
    assert any(r["source"] == "rmm" for r in frame["libraries"]), frame["libraries"]
    a.free()
    b.free()
    after = {name: n for name, n, _ in notebook.usage(None, device="host")["bands"]}
    assert after.get("rmm", 0) == before.get("rmm", 0), (before, after)


class _Fake:
    """A namespace standing in for a library module."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def _fake_libraries(monkeypatch, *, torch_installed=False, cupy_fails=False):
    import contextlib
    import sys

    torch = _Fake(
        cuda=_Fake(is_initialized=lambda: True, memory_reserved=lambda d: (5 << 20) * (d + 1))
    )

    def total_bytes():
        if cupy_fails:
            raise RuntimeError("no CUDA here")
        return 2 << 20

    cupy = _Fake(
        cuda=_Fake(Device=lambda d: contextlib.nullcontext()),
        get_default_memory_pool=lambda: _Fake(total_bytes=total_bytes),
    )
    pool = _Fake(pool_size=lambda: 7 << 20)
    rmm = _Fake(mr=_Fake(get_per_device_resource=lambda d: _Fake(get_upstream=lambda: pool)))
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "rmm", rmm)
    route = _Fake(installed=lambda: torch_installed)
    monkeypatch.setitem(sys.modules, "memarray.interop.torch", route)


def test_libraries_own_allocators_are_asked_and_taken_out_of_outside(monkeypatch):
    from memarray import notebook

    _fake_libraries(monkeypatch)
    total, free = 1 << 30, (1 << 30) - (100 << 20)
    frame = notebook.usage(None, total=total, free=free, device=1)
    bands = {name: n for name, n, _ in frame["bands"]}
    assert bands["torch (own allocator)"] == 10 << 20, bands
    assert bands["cupy (own pool)"] == 2 << 20 and bands["rmm (own pool)"] == 7 << 20, bands
    through = sum(r["live_bytes"] for r in frame["libraries"])
    assert bands["outside memarray"] == (100 << 20) - through - (19 << 20), bands
    assert "torch (own allocator)" in notebook.render([frame])


def test_torch_routed_through_memarray_and_a_failing_library_have_no_own_band(monkeypatch):
    from memarray import notebook

    _fake_libraries(monkeypatch, torch_installed=True, cupy_fails=True)
    frame = notebook.usage(None, total=1 << 30, free=1 << 29, device=0)
    names = [name for name, _, _ in frame["bands"]]
    assert "torch (own allocator)" not in names and "cupy (own pool)" not in names, names
    assert "rmm (own pool)" in names


def test_render_draws_bands_in_proportion_and_escapes():
    from memarray import notebook

    frame = {
        "label": "cuda:0 <b>",
        "bands": [
            ("torch", 1 << 20, ["1.0 MiB at x.py:1 in <module>"]),
            ("outside memarray", 3 << 20, []),
        ],
        "total": 8 << 20,
        "free": 4 << 20,
        "host_bytes": 2 << 20,
        "file_bytes": 0,
        "budget": 6 << 20,
        "tracking": True,
    }
    page = notebook.render([frame])
    assert "width:12.500%" in page and "width:37.500%" in page, page
    assert "cuda:0 &lt;b&gt;" in page and "&lt;module&gt;" in page and "<script" not in page
    assert "spilled: host 2.0 MiB" in page and "budget 6.0 MiB" in page
    assert "4.0 MiB used of 8.0 MiB" in page


def test_the_monitor_refreshes_while_shown_and_stops_when_closed():
    pytest.importorskip("ipywidgets")
    from memarray import notebook

    m = notebook.monitor(interval=0.05)
    assert m._thread is None  # not shown: no thread, no cost
    first = m.view.value
    if not memarray.cuda.is_available():
        assert "no CUDA device here" in first
    bundle = m._repr_mimebundle_()  # what Jupyter calls to show it
    assert bundle and m._thread is not None and m._thread.is_alive()
    m.close()
    m._thread.join(timeout=5)
    assert not m._thread.is_alive()
    with pytest.raises(ValueError, match="interval"):
        notebook.monitor(interval=0)


def test_the_timeline_stacks_each_band_over_the_last_minutes():
    from memarray import notebook

    def frame(torch, cupy):
        bands = [("torch", torch, []), ("cupy<&>", cupy, [])]
        return {"bands": [b for b in bands if b[1]], "total": 1000, "free": 0}

    assert notebook.render_timeline([(0.0, frame(100, 0))]) == "", "one point: no line"
    svg = notebook.render_timeline(
        [(0.0, frame(100, 0)), (60.0, frame(200, 300)), (120.0, frame(0, 500))]
    )
    assert svg.count("<polygon") == 2 and "the last 2.0 min, up to" in svg, svg
    assert "cupy&lt;&amp;&gt;" in svg and "<script" not in svg
    # Scaled to the most held (500 at t=60 and t=120): torch's 100 at t=0 is a fifth of
    # the 60 px height from the bottom.
    torch = svg[svg.index("<polygon") : svg.index("</polygon>")]
    assert "0.0,48.0" in torch and "560.0,60.0" in torch, torch
    # A long history is thinned to TIMELINE_POINTS points a band, its first and newest
    # kept: the window is the whole history, the last point at the right edge.
    long = [(float(t), frame(100 + t, 0)) for t in range(1000)]
    svg = notebook.render_timeline(long)
    points = svg[svg.index("points='") + 8 : svg.index("' fill")].split()
    assert len(points) == 2 * notebook.TIMELINE_POINTS, len(points)
    assert points[0] == "0.0,54.5" and points[notebook.TIMELINE_POINTS - 1] == "560.0,0.0"
    assert "the last 16.6 min, up to" in svg, svg[:200]


def test_the_monitor_keeps_the_last_history_seconds_as_a_timeline(monkeypatch):
    pytest.importorskip("ipywidgets")
    from memarray import notebook

    m = notebook.monitor(interval=0.05, history=10)
    monkeypatch.setattr(
        m,
        "frames",
        lambda: (
            [{**notebook.usage(mr.Host(), total=1 << 30, free=1 << 29), "label": "cuda:0"}],
            "",
        ),
    )
    clock = iter([0.0, 4.0, 8.0, 12.0, 16.0])
    m._clock = lambda: next(clock)
    m._points.clear()  # the first frame's points, on the real clock (a device's, on a GPU)
    for _ in range(3):
        m.refresh()
    assert "<svg" in m.view.value and "the last 8 s" in m.view.value, m.view.value
    m.refresh()
    m.refresh()  # t=16: the points of t=0 and t=4 are past the 10 s of history
    assert [t for t, _ in m._points["cuda:0"]] == [8.0, 12.0, 16.0]
    with pytest.raises(ValueError, match="history"):
        notebook.monitor(history=float("nan"))
    m.widget.close()


def test_the_snapshot_button_answers_in_the_widget_and_never_raises(monkeypatch):
    pytest.importorskip("ipywidgets")
    from memarray import notebook

    m = notebook.monitor()
    m._save()  # what a click runs
    if not memarray.cuda.is_available():
        assert m.status.value == "no CUDA device here: nothing to save"
    else:
        assert "nothing to save" in m.status.value or m.status.value.startswith("saved ")

    def broken() -> list[int]:
        raise RuntimeError("driver gone")

    monkeypatch.setattr(m, "_devices", broken)
    m._save()
    assert m.status.value == "not saved: RuntimeError: driver gone"
    m.close()


def test_a_resource_shows_its_figures_in_the_notebook():
    s = mr.Statistics(mr.Pool(mr.Host()))
    a = s.allocate(1 << 20, source="torch")
    page = s._repr_html_()
    assert "memarray.resources.Statistics" in page and "torch" in page and "1.0 MiB" in page
    lim = mr.Limiting(mr.Host(), 1 << 30)
    b = lim.allocate(4096)
    assert "4.0 KiB (4,096 bytes) of 1.0 GiB" in lim._repr_html_()
    del a, b


@pytest.mark.gpu
def test_the_bands_agree_with_each_librarys_own_counters_and_the_driver():
    # Fresh processes: torch, CuPy and RMM on their own allocators, then through
    # memarray; on every device up to two.
    import json

    from children import child_stdout

    own = child_stdout(
        """
        import json
        import cupy, rmm, torch, memarray
        from memarray import notebook
        out = {}
        for d in range(min(2, memarray.cuda.device_count())):
            with torch.cuda.device(d), cupy.cuda.Device(d):
                pool = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(),
                                                 initial_pool_size=64 << 20)
                rmm.mr.set_per_device_resource(d, pool)
                t = torch.empty(256 << 20, dtype=torch.uint8, device=f"cuda:{d}")
                c = cupy.zeros(128 << 20, dtype=cupy.uint8)
                m = memarray.zeros((64 << 20,), "uint8", device=f"cuda:{d}")
                f = notebook.device_usage(d)
                out[d] = {"bands": {n: b for n, b, _ in f["bands"]}, "total": f["total"],
                          "free": f["free"], "torch": torch.cuda.memory_reserved(d),
                          "cupy": cupy.get_default_memory_pool().total_bytes(),
                          "rmm": pool.pool_size()}
                del t, c, m
        print(json.dumps(out))
        """
    )
    for d, got in json.loads(own.strip().splitlines()[-1]).items():
        bands = got["bands"]
        assert bands["torch (own allocator)"] == got["torch"], (d, got)
        assert bands["cupy (own pool)"] == got["cupy"], (d, got)
        assert bands["rmm (own pool)"] == got["rmm"], (d, got)
        assert bands["memarray"] >= 64 << 20, (d, got)
        used = got["total"] - got["free"]
        assert sum(bands.values()) == used, (d, got)
        # What no library accounts for: the contexts (CUDA, torch's, CuPy's) and whatever
        # other processes hold on the device (the suite runs in parallel groups there).
        assert bands.get("outside memarray", 0) > 0, (d, got)
    routed = child_stdout(
        """
        import json
        import cupy, torch, memarray, memarray.torch
        from memarray import notebook
        memarray.torch.install()
        cupy.cuda.set_allocator(memarray.cupy_allocator)
        out = {}
        for d in range(min(2, memarray.cuda.device_count())):
            with torch.cuda.device(d), cupy.cuda.Device(d):
                t = torch.empty(256 << 20, dtype=torch.uint8, device=f"cuda:{d}")
                c = cupy.zeros(128 << 20, dtype=cupy.uint8)
                f = notebook.device_usage(d)
                out[d] = {"bands": {n: b for n, b, _ in f["bands"]},
                          "torch": torch.cuda.memory_reserved(d)}
                del t, c
        print(json.dumps(out))
        """
    )
    for d, got in json.loads(routed.strip().splitlines()[-1]).items():
        bands = got["bands"]
        assert "torch (own allocator)" not in bands, (d, got)
        assert 256 << 20 <= bands["torch"] <= got["torch"] + (2 << 20), (d, got)
        assert bands["cupy"] >= 128 << 20 and "cupy (own pool)" not in bands, (d, got)


@pytest.mark.gpu
def test_the_monitor_sees_memarrays_arrays_and_the_driver_on_a_device():
    from memarray import notebook

    t = mr.Tracking(mr.Pool(mr.Device(0)), stacks=True)
    with mr.using(t, 0):
        x = memarray.zeros((1 << 22,), "float32", device="cuda")  # 16 MiB through memarray
        f = notebook.device_usage(0)
        del x
    bands = {name: n for name, n, _ in f["bands"]}
    assert bands.get("memarray", 0) >= 16 << 20, bands
    assert f["total"] and f["free"] is not None and f["total"] > f["free"]
    assert "cuda:0" in notebook.render([f])
    assert np.isfinite(f["total"])


def test_the_tour_notebook_runs_and_renders_in_a_browser(tmp_path):
    # Executed by a fresh kernel, exported as nbconvert's HTML, rendered by headless
    # Chromium (CI installs it; MEMARRAY_REQUIRE_BROWSER=1 makes a missing one a failure).
    import importlib.util
    import shutil
    import sys

    from children import run_command

    pytest.importorskip("nbclient")
    root = pathlib.Path(__file__).resolve().parents[2]
    browser = any(shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome"))
    # The live check also needs Voila and a DevTools client (./dev.sh installs both).
    live = browser and all(importlib.util.find_spec(m) for m in ("voila", "websocket"))
    if not live and os.environ.get("MEMARRAY_REQUIRE_BROWSER") == "1":
        raise AssertionError("MEMARRAY_REQUIRE_BROWSER=1 but no chromium, voila or websocket")
    args = ([] if browser else ["--no-browser"]) + ([] if live else ["--no-live"])
    r = run_command(
        [sys.executable, str(root / "scripts" / "notebook_check.py"), str(tmp_path), *args],
        timeout=900,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "tour executed" in r.stdout
    if browser:
        assert "rendered in chromium" in r.stdout
        assert (tmp_path / "tour.png").stat().st_size > 10_000
    if live:
        # Live: the widget drawn, its stamp moving, the button answered by the kernel.
        assert "live in chromium (voila)" in r.stdout, r.stdout
        assert (tmp_path / "tour-live.png").stat().st_size > 10_000


def test_a_finished_progress_bar_leaves_a_line_that_reads_right_in_a_saved_notebook():
    # Executed by a fresh kernel: the save's widget bar is replaced by its final state as
    # text, so the saved notebook (no widget state, no kernel) shows "done, ... in ... s",
    # not an empty widget or tqdm's "0%" fallback.
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipywidgets")
    pytest.importorskip("tqdm")
    code = (
        "import memarray, memarray._progress as p, tempfile, os\n"
        "p.AFTER = 0.0\n"
        "memarray.set_progress(True)\n"
        "a = memarray.zeros((96 << 20,), 'uint8')\n"
        "a.save(os.path.join(tempfile.mkdtemp(), 'x'))\n"
    )
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    outputs = nb.cells[0].outputs
    texts = [o.get("data", {}).get("text/plain", "") for o in outputs]
    assert any("save x: done, 96.0 MiB in" in t for t in texts), outputs
    assert not any(
        "application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs
    ), outputs
    assert not any("0%" in t for t in texts), outputs


def test_a_closed_monitor_leaves_its_last_frame_in_a_saved_notebook():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipywidgets")
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell("import memarray.notebook as n\nm = n.monitor()\nm"),
            nbformat.v4.new_code_cell("m.close()"),
        ]
    )
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    outputs = nb.cells[0].outputs
    assert len(outputs) == 1, outputs
    data = outputs[0]["data"]
    assert "application/vnd.jupyter.widget-view+json" not in data, data.keys()
    assert "refreshed" in data["text/html"], data
