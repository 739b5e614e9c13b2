"""memarray.OutOfMemoryError: every allocation through memarray that runs out raises it (a
MemoryError), carrying a report of who holds what, built at the failing call."""

from __future__ import annotations

import json

import pytest
from children import child_stdout

import memarray
from memarray import resources as mr


def test_an_out_of_memory_error_reports_who_holds_what():
    cap = mr.Limiting(mr.Host(), 1000)
    held = cap.allocate(600)
    with pytest.raises(memarray.OutOfMemoryError) as info:
        cap.allocate(5000)
    e = info.value
    assert isinstance(e, MemoryError), "existing `except MemoryError` still catches it"
    r = e.report
    d = r.to_dict()
    assert (d["asked"], d["device"]) == (5000, None), d
    assert "limiting" in d["resource"] and "600 of 1000" in d["reason"], d
    assert d["relief"]["events"] >= 1, d
    text = str(r)
    for part in ("asked for", "host memory", "relief so far", "what to do"):
        assert part in text, text
    assert "<div" in r._repr_html_()
    held.free()


@pytest.mark.gpu
def test_a_real_out_of_memory_on_a_device_reports_who_holds_what():
    # A fresh process: memarray's budget 64 MiB on cuda:0 (far below the card), CuPy
    # through memarray beside it, then memarray past its budget.
    out = child_stdout(
        """
        import json
        import cupy, memarray
        from memarray import resources as mr

        cupy.cuda.set_allocator(memarray.cupy_allocator)
        c = cupy.zeros(32 << 20, dtype=cupy.uint8)
        mr.set_budget("memarray", "64MiB", device=0)
        kept = memarray.zeros((48 << 20,), "uint8", device="cuda")
        try:
            memarray.zeros((32 << 20,), "uint8", device="cuda")
            print(json.dumps(None))
        except memarray.OutOfMemoryError as e:
            d = e.report.to_dict()
            print(json.dumps({"text": str(e.report), "device": d["device"],
                              "libraries": d["libraries"], "advice": d["advice"],
                              "total": d["frame"]["total"], "html": e.report._repr_html_()}))
        """
    )
    got = json.loads(out.strip().splitlines()[-1])
    assert got is not None, "the allocation past the budget was refused"
    assert got["device"] == 0 and got["total"], got
    rows = {r["source"]: r for r in got["libraries"]}
    assert rows["memarray"]["budget"] == 64 << 20 and rows["memarray"]["live_bytes"] >= 48 << 20
    assert rows["cupy"]["live_bytes"] >= 32 << 20, rows
    assert 'set_budget("memarray"' in got["advice"], got["advice"]
    for part in ("on cuda:0", "through memarray here: memarray", "cupy", "driver:"):
        assert part in got["text"], got["text"]
    assert "<div" in got["html"]


@pytest.mark.gpu
def test_memarrays_budget_spills_its_arrays_first_when_spilling_is_on():
    out = child_stdout(
        """
        import json
        import numpy as np, memarray
        from memarray import resources as mr

        memarray.spill.enable(0)
        mr.set_budget("memarray", "64MiB", device=0)
        a = memarray.asarray(np.arange(12 << 20, dtype=np.float32), device="cuda")  # 48 MiB
        b = memarray.zeros((8 << 20,), "float32", device="cuda")  # 32 MiB: a spills first
        s = memarray.spill.statistics(0)
        print(json.dumps({"spilled": a.spilled, "spilled_arrays": s["spilled_arrays"],
                          "same": bool((a.to_numpy() == np.arange(12 << 20)).all())}))
        """
    )
    got = json.loads(out.strip().splitlines()[-1])
    assert got["spilled"] and got["spilled_arrays"] >= 1, got
    assert got["same"], "the spilled array's data came back intact"
