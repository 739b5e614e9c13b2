"""Draws benches/spill.py's JSON: time per pass against data / device budget.

python3 benches/plot_spill.py spill.json docs/spill.png
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    src, out = sys.argv[1], sys.argv[2]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = json.load(open(src))
    rows = sorted(d["rows"], key=lambda r: r["factor"])
    f = [r["factor"] for r in rows]
    ms = 1e3
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(f, [r["transparent"]["pass_s"] * ms for r in rows], "o-", label="memarray, no hints")
    ax.plot(f, [r["prefetch"]["pass_s"] * ms for r in rows], "s-", label="memarray, prefetch next")
    ax.plot(
        f,
        [r["bound_s"] * ms for r in rows],
        "k--",
        label="bound: (data - budget) both ways, pinned",
    )
    ax.axhline(
        d["offload"]["pass_s"] * ms, color="tab:red", label="double-buffered CuPy offload loop"
    )
    ax.set_xlabel("data / device budget")
    ax.set_ylabel("ms per pass (median)")
    gib = d["data_bytes"] / 2**30
    ax.set_title(
        f"{gib:.0f} GiB in {gib * 1024 / d['chunk_mib']:.0f} chunks, a CuPy kernel over each, "
        f"{d['device']}",
        fontsize=9,
    )
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    main()
