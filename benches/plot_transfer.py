"""Plots benches/transfer.py's JSON: throughput against size, memarray and its peers.

python3 benches/plot_transfer.py transfer.json docs/transfer.png
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("SKIPPED: the plot needs matplotlib (pip install matplotlib)")
        return 0
    with open(sys.argv[1]) as f:
        r = json.load(f)
    kinds = []
    for row in r["rows"]:
        if row["kind"] not in kinds:
            kinds.append(row["kind"])
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5), sharex=True)
    styles = {"memarray": ("C3", "o", 2.2), "torch": ("C0", "s", 1.2), "cupy": ("C2", "^", 1.2)}
    for ax, kind in zip(axes.flat, kinds, strict=False):
        rows = [x for x in r["rows"] if x["kind"] == kind]
        sizes = [x["bytes"] for x in rows]
        for who, (color, marker, lw) in styles.items():
            ys = [x["gbps"].get(who, 0.0) for x in rows]
            ax.plot(sizes, ys, color=color, marker=marker, lw=lw, ms=4, label=who)
        ax.set_xscale("log", base=2)
        ax.set_title(kind)
        ax.set_ylabel("GB/s")
        ax.grid(True, which="both", alpha=0.3)
        ticks = [4 << 10, 256 << 10, 16 << 20, 1 << 30]
        ax.set_xticks([t for t in ticks if t <= max(sizes)])
        ax.set_xticklabels(["4 KiB", "256 KiB", "16 MiB", "1 GiB"][: len(ax.get_xticks())])
    axes.flat[0].legend()
    fig.suptitle(
        f"Host <-> device throughput, {r['device']}, {r['date']} "
        "(benches/transfer.py; medians; pageable = ordinary NumPy memory)"
    )
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    print(f"wrote {sys.argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
