"""Tracking snapshots in torch's memory-snapshot format: the structure
here, without torch; on the device, torch's own `_memory_viz` reads and renders them and
the rendered page carries memarray's allocation sites."""

from __future__ import annotations

import base64
import os
import pickle
import re
import sys

import pytest
from children import run_command
from test_interop import _peer

from memarray import resources as mr

HERE = os.path.basename(__file__)


def _tracked():
    t = mr.Tracking(mr.Host(), stacks=True)
    a = t.allocate(1 << 20)  # this line is the allocation site
    b = t.allocate(4096)
    a.free()
    return t, b


def test_a_snapshot_in_torchs_format_has_segments_traces_and_frames(tmp_path):
    t, b = _tracked()
    snap = t.snapshot()
    d = mr.torch_snapshot(snap)
    assert [s["total_size"] for s in d["segments"]] == [4096]
    block = d["segments"][0]["blocks"][0]
    assert block["state"] == "active_allocated" and block["size"] == 4096
    trace = d["device_traces"][0]
    assert [e["action"] for e in trace] == ["alloc", "alloc", "free_requested", "free_completed"]
    assert trace[0]["size"] == 1 << 20 and trace[2]["addr"] == trace[0]["addr"]
    sites = {f["filename"] for e in trace for f in e["frames"]}
    assert any(name.endswith(HERE) for name in sites), sites
    assert d["memarray"]["tiers"] == {0: "host"}
    path = mr.save_torch_snapshot(snap, tmp_path / "snap.pickle")
    with open(path, "rb") as f:
        assert pickle.load(f) == d
    b.free()


def test_bad_input_is_a_value_error():
    for bad in (None, {}, {"live": 3, "timeline": [], "sources": []}, [1]):
        with pytest.raises(ValueError):
            mr.torch_snapshot(bad)
    # Without stacks: segments without frames, no trace.
    t = mr.Tracking(mr.Host())
    a = t.allocate(64)
    d = mr.torch_snapshot(t.snapshot())
    assert d["segments"][0]["frames"] == [] and d["device_traces"] == [[]]
    a.free()


@pytest.mark.gpu
def test_torchs_memory_viz_renders_memarrays_sites(tmp_path):
    _peer("torch")
    import memarray

    torch = sys.modules.get("torch") or __import__("torch")
    viz = __import__("torch.cuda._memory_viz", fromlist=["trace_plot"])
    t = mr.Tracking(mr.Pool(mr.Device(0)), stacks=True)
    with mr.using(t, 0):
        x = memarray.zeros((1 << 18,), "float32", device="cuda")  # a device allocation
        y = memarray.zeros((1 << 10,), "float32", device="cuda")
        del x
    snap = mr.save_torch_snapshot(t.snapshot(), tmp_path / "snap.pickle")
    with open(snap, "rb") as f:
        data = pickle.load(f)
    assert viz.segsum(data) and viz.trace(data)  # torch's own readers take it
    out = tmp_path / "out.html"
    r = run_command(
        [sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", snap, "-o", str(out)],
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    html = out.read_text()
    embedded = re.search(r'"base64": "([^"]+)"', html)
    assert embedded, "the page embeds no snapshot"
    shown = pickle.loads(base64.b64decode(embedded.group(1)))
    sites = {f["filename"] for e in shown["device_traces"][0] for f in e["frames"]}
    assert any(name.endswith(HERE) for name in sites), sites
    del y, torch


def test_forged_devices_and_stacks_are_value_errors_at_once():
    import time

    t = mr.Tracking(mr.Host(), stacks=True)
    a = t.allocate(64)
    snap = t.snapshot()
    a.free()
    for device in (10**7, 2**62, -1, True, "0", 1.0, 1024):
        forged = dict(snap, live=[dict(snap["live"][0], device=device)])
        start = time.perf_counter()
        with pytest.raises(ValueError, match="device"):
            mr.torch_snapshot(forged)
        assert time.perf_counter() - start < 0.5, device  # no list per device index
    forged = dict(snap, live=[dict(snap["live"][0], device=1023)])
    assert len(mr.torch_snapshot(forged)["device_traces"]) == 1025  # cuda:0..1023, host
    for stack in (5, b"x.py:1 in f", ["x.py:1 in f"]):
        forged = dict(snap, live=[dict(snap["live"][0], stack=stack)])
        with pytest.raises(ValueError, match="stack"):
            mr.torch_snapshot(forged)
