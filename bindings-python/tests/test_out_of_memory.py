"""memarray.OutOfMemoryError: every allocation through memarray that runs out raises it (a
MemoryError), carrying a report of who holds what, built at the failing call."""

from __future__ import annotations

import pytest

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
