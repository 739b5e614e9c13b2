"""Budgets per library (memarray.resources.set_budget) and what each library holds through
memarray (library_usage), over host memory: a budget stops the library it names and no
other, its OutOfMemoryError names the budget, frees make room, and the counts stay exact
with threads allocating while they are read."""

from __future__ import annotations

import threading

import pytest

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
        (("torch", 1), {"device": "gpu"}, ValueError),
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
