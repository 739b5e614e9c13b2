"""``memarray.resources.plot``: memory over time per source, and the largest sites."""

from __future__ import annotations

import csv
import math
import os
from collections import defaultdict
from typing import Any

from ._pressure import printable


def _figure_class() -> Any:
    """matplotlib's ``Figure``, used without pyplot: no backend is chosen or changed and
    no figure is registered (so none is left open)."""
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError(
            'memarray.resources.plot needs matplotlib: pip install "memarray[plot]"'
        ) from e
    return Figure


Events = list[tuple[float, str]]

LOG_COLUMNS = "time,event,device,address,size,stream,source"


def _bytes(v: Any) -> int:
    """A byte count as a snapshot or log holds it: an int in 0..2**64 (what a resource can
    count); anything else is a ValueError while reading, not an error while drawing."""
    n = int(v)
    if not 0 <= n < 1 << 64:
        raise ValueError(f"byte count {v!r} is outside 0..2**64")
    return n


def _seconds(v: float) -> float:
    if not math.isfinite(v):
        raise ValueError(f"time {v!r} is not finite")
    return v


def _from_snapshot(
    snap: dict,
) -> tuple[list[float], dict[str, list[int]], dict[str, int], Events]:
    names = list(snap["sources"])
    times: list[float] = []
    series: dict[str, list[int]] = {n: [] for n in names}
    for row in snap["timeline"]:
        times.append(_seconds(row[0] / 1e9))
        for n, b in zip(names, row[1:], strict=True):
            series[n].append(_bytes(b))
    sites: dict[str, int] = defaultdict(int)
    for a in snap["live"]:
        sites[printable(f"{a['source']}: {_site(a.get('stack'))}")] += _bytes(a["size"])
    events = [(_seconds(e[0] / 1e9), str(e[1])) for e in snap.get("events", [])]
    return times, series, dict(sites), events


def _site(stack: str | None) -> str:
    """The allocation site of a stack: its innermost frame outside installed packages
    (the user's line that led to the allocation), as ``file:line in function`` with the
    file's base name; the innermost frame when every frame is a package's."""
    if not stack:
        return "(no stack)"
    frames = stack.splitlines()
    mine = [f for f in frames if "site-packages" not in f and "dist-packages" not in f]
    frame = (mine or frames)[-1]
    path, _, rest = frame.partition(":")
    return f"{os.path.basename(path)}:{rest}"


def _from_log(
    path: str,
) -> tuple[list[float], dict[str, list[int]], dict[str, int], Events]:
    live: dict[str, tuple[str, int]] = {}
    events: list[tuple[float, str]] = []
    current: dict[str, int] = defaultdict(int)
    times: list[float] = []
    rows: list[dict[str, int]] = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = {"event", "address", "size", "source", "time"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(
                f"no column {sorted(missing)} (a Logging CSV's header is {LOG_COLUMNS})"
            )
        for row in reader:
            event, addr, source = row["event"], row["address"], row["source"]
            if event == "allocate":
                size = _bytes(row["size"])
                live[addr] = (source, size)
                current[source] += size
            elif event == "deallocate" and addr in live:
                src, size = live.pop(addr)
                current[src] -= size
            elif event in ("spill", "restore"):
                events.append((_seconds(float(row["time"])), event))
                continue
            else:
                continue
            times.append(_seconds(float(row["time"])))
            rows.append(dict(current))
    start = min(times[:1] + [t for t, _ in events[:1]], default=0.0)
    names = sorted({n for r in rows for n in r})
    series = {n: [r.get(n, 0) for r in rows] for n in names}
    sites: dict[str, int] = defaultdict(int)
    for src, size in live.values():
        sites[printable(src)] += size
    return [t - start for t in times], series, dict(sites), [(t - start, k) for t, k in events]


# What a malformed snapshot or CSV raises while it is read: each becomes one ValueError.
_MALFORMED = (KeyError, TypeError, ValueError, AttributeError, OverflowError, IndexError, csv.Error)


def _output(path: Any) -> str:
    """The file ``plot`` writes: ``path`` with ``.png`` added when it has no suffix, or
    ``png`` when it ends in a bare dot (matplotlib would add them silently, and the returned
    path would not be the file); an empty path is a ValueError, a directory
    IsADirectoryError."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, not {type(path).__name__}")
    out = os.fspath(path)
    if isinstance(out, bytes):
        out = os.fsdecode(out)
    if not out:
        raise ValueError("path is empty: name the file plot writes (e.g. 'memory.png')")
    if os.path.isdir(out):
        raise IsADirectoryError(21, "plot writes a file, not into a directory", out)
    suffix = os.path.splitext(out)[1]
    if suffix == ".":
        out += "png"
    elif not suffix:
        out += ".png"
    return out


def _extend_last_step(times: list[float], series: dict[str, list[int]], end: float) -> None:
    """Steps are drawn from each sample to the next: the last sample gets a width, to
    ``end`` (the last event, or a hundredth of the span past the last sample)."""
    if not times:
        return
    span = times[-1] - times[0]
    stop = max(end, times[-1] + (span / 100 if span > 0 else 1e-3))
    times.append(stop)
    for v in series.values():
        v.append(v[-1])


def plot(data: Any, path: str | os.PathLike[str] | None = None, top: int = 10) -> Any:
    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise ValueError(f"top must be a positive int, not {top!r}")
    out = None if path is None else _output(path)
    if isinstance(data, dict):
        if not {"timeline", "sources", "live"} <= data.keys():
            raise ValueError(
                "not a memarray.resources snapshot: expected the keys 'timeline', 'sources' "
                "and 'live'"
            )
        try:
            times, series, sites, events = _from_snapshot(data)
        except _MALFORMED as e:
            raise ValueError(f"not a valid memarray.resources snapshot: {e!r}") from e
    elif isinstance(data, (str, os.PathLike)):
        log = os.fspath(data)
        try:
            times, series, sites, events = _from_log(log)
        except _MALFORMED as e:
            raise ValueError(f"{log!r} is not a valid Logging CSV: {e!r}") from e
    else:
        raise TypeError(
            f"plot takes a snapshot() dict or a Logging CSV path, not {type(data).__name__}"
        )
    _extend_last_step(times, series, max((t for t, _ in events), default=0.0))
    fig = _figure_class()(figsize=(10, 8))
    ax1, ax2 = fig.subplots(2, 1, height_ratios=[3, 2])
    _draw(fig, ax1, ax2, times, series, sites, events, top)
    if out is None:
        _show_inline(type(fig))
        return fig
    fig.savefig(out, dpi=100)
    return out


def _show_inline(figure_class: Any) -> None:
    """In IPython, figures draw inline as PNG: IPython does that itself once pyplot's
    inline backend is active, which this module never activates; where no PNG formatter
    for figures is registered, one is (the backend is left as it is)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return
    png = shell.display_formatter.formatters["image/png"]
    if figure_class in png.type_printers:
        return

    def to_png(fig: Any) -> bytes:
        import io

        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        return buf.getvalue()

    png.for_type(figure_class, to_png)


def _draw(
    fig: Any,
    ax1: Any,
    ax2: Any,
    times: list[float],
    series: dict[str, list[int]],
    sites: dict[str, int],
    events: Events,
    top: int,
) -> None:
    used = {n: v for n, v in series.items() if any(v)}
    mib = 1 << 20
    if used and times:
        ax1.stackplot(
            times,
            *[[b / mib for b in v] for v in used.values()],
            labels=list(used),
            step="post",
        )
    for kind, color in (("spill", "tab:red"), ("restore", "tab:green")):
        at = [t for t, k in events if k == kind]
        if at:
            # Spills and restores (memarray.spill) as ticks along the bottom.
            ax1.plot(
                at, [0] * len(at), "|", color=color, markersize=14, label=f"{kind} ({len(at)})"
            )
    if (used and times) or events:
        ax1.legend(loc="upper left")
    ax1.set_xlabel("seconds")
    ax1.set_ylabel("live MiB")
    ax1.set_title("memory through memarray, per library")
    biggest = sorted(sites.items(), key=lambda kv: kv[1], reverse=True)[:top]
    if biggest:
        labels = [k if len(k) <= 60 else k[:57] + "..." for k, _ in biggest]
        ax2.barh(range(len(biggest)), [v / mib for _, v in biggest])
        ax2.set_yticks(range(len(biggest)), labels, fontsize=7)
        ax2.invert_yaxis()
    ax2.set_xlabel("live MiB")
    ax2.set_title(f"largest live allocation sites (top {top})")
    fig.tight_layout()
