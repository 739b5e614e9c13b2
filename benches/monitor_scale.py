"""The monitor's refresh at scale, as ``Monitor.refresh`` does it: one frame
(``notebook.usage``), its bar (``render``) and its timeline over a full five-minute history
of one-second frames (``render_timeline``), for a ``Tracking(stacks=True)`` stack holding
100,000 live allocations, read from the Tracking's counters (per source and per allocation
stack, kept as allocations come and go); the same with no setup (memarray's ledger: per
library, whatever the resource); and the frame built as the monitor built it before the
counters: a snapshot of every live allocation, walked in Python. Host memory: no GPU
needed.

    python3 benches/monitor_scale.py [--allocations 100000] [--rounds 9] [--json out.json]

The allocations come from three sources (memarray, torch, cupy) at four call sites, 256
bytes each. Medians of ``--rounds`` refreshes of each kind, alternating. Target: one
refresh from counters at most 1 ms; a miss prints MISS and exits 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from memarray import notebook
from memarray import resources as mr


def walked(t: mr.Tracking) -> dict:
    """The frame as the monitor built it before the counters: every live allocation
    snapshotted, summed per source and per site in Python."""
    from memarray._plot import _site

    snap = t.snapshot()
    by_source: dict[str, int] = {}
    sites: dict[str, dict[str, int]] = {}
    for a in snap["live"]:
        by_source[a["source"]] = by_source.get(a["source"], 0) + int(a["size"])
        per = sites.setdefault(a["source"], {})
        s = _site(a.get("stack"))
        per[s] = per.get(s, 0) + int(a["size"])
    bands = [
        (src, n, sorted(sites[src].items(), key=lambda kv: -kv[1])[:3])
        for src, n in by_source.items()
    ]
    return {"bands": bands}


def site_a(t: mr.Tracking, n: int, source: str) -> list:
    return [t.allocate(256, source=source) for _ in range(n)]


def site_b(t: mr.Tracking, n: int, source: str) -> list:
    return [t.allocate(256, source=source) for _ in range(n)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--allocations", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--json")
    args = ap.parse_args()
    t = mr.Tracking(mr.Host(), stacks=True)
    quarter = args.allocations // 4
    held = (
        site_a(t, quarter, "memarray")
        + site_b(t, quarter, "memarray")
        + site_a(t, quarter, "torch")
        + site_b(t, args.allocations - 3 * quarter, "cupy")
    )
    assert t.live_count() == len(held)
    frame = notebook.usage(t, label="host")
    want = {"memarray": 2 * quarter * 256, "torch": quarter * 256}
    got = {name: n for name, n, _ in frame["bands"]}
    assert all(got[k] == v for k, v in want.items()), got
    plain = {name: n for name, n, _ in notebook.usage(None, device="host")["bands"]}
    assert all(plain[k] >= v for k, v in want.items()), plain
    # A full history: 300 one-second frames before this one (the monitor's default).
    history = [(float(i), frame) for i in range(300)]

    def refresh(f: dict) -> None:
        notebook.render([f])
        notebook.render_timeline([*history[1:], (300.0, f)])

    counters: list[float] = []
    ledger: list[float] = []
    walks: list[float] = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        refresh(notebook.usage(t, label="host"))
        counters.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        refresh(notebook.usage(None, device="host", label="host"))
        ledger.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        walked(t)
        walks.append(time.perf_counter() - t0)
    c_ms = statistics.median(counters) * 1e3
    w_ms = statistics.median(walks) * 1e3
    l_ms = statistics.median(ledger) * 1e3
    print(f"{len(held):,} live allocations, 3 sources, 4 sites (median of {args.rounds})")
    print(f"  one refresh from counters (frame, bar, 5-min timeline): {c_ms:8.3f} ms")
    print(f"  one refresh with no setup (the ledger):                 {l_ms:8.3f} ms")
    walk = f"{w_ms:8.3f} ms ({w_ms / c_ms:.0f}x)"
    print(f"  the walk over every allocation (before):                {walk}")
    ok = max(c_ms, l_ms) <= 1.0
    print(("ok" if ok else "MISS") + f": a refresh at {len(held):,} allocations within 1 ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"counters_ms": c_ms, "ledger_ms": l_ms, "walk_ms": w_ms, "allocations": len(held)},
                f,
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
