"""Your own relievers on the out-of-memory relief path (memarray.resources.register_reliever),
over host resources: priority order with a retry after each until the allocation fits, a
reliever that raises is reported and passed, one for a library is not asked while that
library allocates, removal, and no recursion when a reliever's own allocation runs out.
Each case runs in a fresh process: the relievers are process-wide."""

from __future__ import annotations

import pytest
from children import assert_clean, run_child

from memarray import resources as mr

# A host resource with room for 1000 bytes, 900 of them held: 500 more do not fit.
PRELUDE = """
import gc
import memarray
from memarray import resources as mr

cap = mr.Limiting(mr.Host(), 1000)
held = [cap.allocate(900)]  # 900 of 1000 bytes live: 500 more do not fit
"""


def test_relievers_run_in_priority_order_until_the_allocation_fits():
    r = run_child(
        PRELUDE
        + """
order = []

def frees(device, nbytes):
    order.append(("frees", device, nbytes))
    held.pop().free()
    return 900

def never(device, nbytes):
    order.append(("never", device, nbytes))
    return 0

def raises(device, nbytes):
    order.append(("raises", device, nbytes))
    raise RuntimeError("a reliever that raises")

def torchs(device, nbytes):
    order.append(("torch's", device, nbytes))
    return 0

unraisable = []
import sys
sys.unraisablehook = lambda u: unraisable.append(str(u.exc_value))
low = mr.register_reliever(never, priority=-1)
mid = mr.register_reliever(frees, priority=1)
high = mr.register_reliever(raises, priority=5, name="the raiser")
tor = mr.register_reliever(torchs, source="torch", priority=9)
a = cap.allocate(500, source="torch")  # torch allocating: its reliever is not asked
assert [o[0] for o in order] == ["raises", "frees"], order
assert order[0][1:] == (None, 500), order
assert unraisable == ["a reliever that raises"], unraisable
rows = {r["name"]: r for r in mr.pressure_statistics()["relievers"]}
assert [r["name"] for r in mr.pressure_statistics()["relievers"]] == [
    "torchs", "the raiser", "frees", "never"]
assert (rows["the raiser"]["calls"], rows["the raiser"]["failures"]) == (1, 1)
assert (rows["frees"]["calls"], rows["frees"]["released_bytes"]) == (1, 900)
assert rows["never"]["calls"] == rows["torchs"]["calls"] == 0
assert rows["torchs"]["source"] == "torch" and rows["frees"]["source"] is None
assert mid.statistics()["calls"] == 1
# Removed relievers are never asked again.
for x in (low, mid, high, tor):
    assert x.remove() and not x.remove()
assert mid.statistics() is None
held.append(cap.allocate(500))
try:
    cap.allocate(100)
    raise SystemExit("no MemoryError")
except MemoryError:
    pass
assert len(order) == 2, order
print("ok")
"""
    )
    assert_clean(r)
    assert "ok" in r.stdout, r.stderr[-3000:]


def test_a_reliever_that_allocates_and_runs_out_is_not_asked_again_and_with_removes():
    r = run_child(
        PRELUDE
        + """
calls = []

def allocates(device, nbytes):
    calls.append(nbytes)
    try:
        cap.allocate(800)  # runs out too: no reliever is asked for it
    except MemoryError:
        pass
    return 0

with mr.register_reliever(allocates) as rel:
    try:
        cap.allocate(500)
        raise SystemExit("no MemoryError")
    except MemoryError:
        pass
    assert calls == [500], calls
    assert rel.statistics()["calls"] == 1
assert rel.statistics() is None  # the with block removed it
print("ok")
"""
    )
    assert_clean(r)
    assert "ok" in r.stdout, r.stderr[-3000:]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"device": -1}, ValueError),
        ({"device": "0"}, ValueError),
        ({"source": "tensorflow"}, ValueError),
        ({"priority": 1.5}, TypeError),
    ],
)
def test_bad_arguments_are_typed_errors_and_register_nothing(kwargs, error):
    before = len(mr.pressure_statistics()["relievers"])
    with pytest.raises(error):
        mr.register_reliever(lambda d, n: 0, **kwargs)
    with pytest.raises(TypeError, match="callable"):
        mr.register_reliever(42)
    assert len(mr.pressure_statistics()["relievers"]) == before
