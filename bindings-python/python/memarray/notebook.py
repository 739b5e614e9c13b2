"""memarray in the notebook: a live memory monitor per device.

``memarray.notebook.monitor()`` (a cell's value, or ``display(monitor())``) draws, for each
device and refreshed about once a second by a background thread while it is shown, the
device's bytes as one bar: what each library holds through memarray (memarray's arrays,
torch, CuPy, Numba, RMM, cuda.core: memarray's ledger counts every allocation, no setup
needed), what memarray's pool keeps cached, what torch, CuPy and RMM hold in allocators of
their own (asked when they are imported), what the driver says is used outside all of
them, and free memory; beside the bar, the spilled host and file tiers and the spill
budget; under it, a timeline of the bands over the last minutes. Hovering a band shows its
top allocation sites when the device's default resource is a ``Tracking(stacks=True)``.
A button saves a torch-format snapshot
(``resources.save_torch_snapshot``) when there is a Tracking. The thread starts when the
monitor is first shown and stops when it is closed or the kernel restarts; a monitor never
shown costs nothing. A saved notebook keeps the last frame and the timeline as static
HTML.

Needs ipywidgets (``pip install "memarray[notebook]"``). ``usage``, ``render`` and
``render_timeline`` are the pure halves (one frame of figures, its HTML, a timeline's
HTML), usable without a notebook.
"""

from __future__ import annotations

import collections
import html
import math
import sys
import threading
import time
from typing import Any

from . import cuda, resources, spill

__all__ = ["Monitor", "monitor", "render", "render_timeline", "usage"]

#: Band colours, by name (libraries first, then memarray's cache and what is outside it).
COLOURS = {
    "memarray": "#4c72b0",
    "torch": "#dd8452",
    "cupy": "#55a868",
    "numba": "#c44e52",
    "rmm": "#8172b3",
    "cuda_core": "#937860",
    "through memarray": "#4c72b0",
    "cached by memarray": "#b0c4de",
    "torch (own allocator)": "#f0b58c",
    "cupy (own pool)": "#a3d1ad",
    "rmm (own pool)": "#bcb3d9",
    "outside memarray": "#999999",
}


def _stack(resource: resources.Resource | None) -> list[resources.Resource]:
    out = []
    while resource is not None:
        out.append(resource)
        resource = resource.upstream
    return out


def _sites(by_stack: list[tuple[str, str, int]], source: str, live: int, top: int = 3) -> list[str]:
    """The ``top`` allocation sites (innermost frame) of ``source``'s ``live`` bytes, from a
    Tracking's per-stack counters; bytes without a stack count as "(no stack)"."""
    from ._plot import _site

    sizes: dict[str, int] = {}
    for src, stack, n in by_stack:
        if src == source:
            site = _site(stack)
            sizes[site] = sizes.get(site, 0) + n
    unstacked = live - sum(sizes.values())
    if unstacked > 0:
        sizes[_site(None)] = sizes.get(_site(None), 0) + unstacked
    best = sorted(sizes.items(), key=lambda kv: kv[1], reverse=True)[:top]
    return [f"{_mib(b)} at {s}" for s, b in best]


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


def _own_pools(device: int) -> list[tuple[str, int, list[str]]]:
    """Bands for the libraries loaded here that hold device memory in allocators of their
    own, asked through their own counters (a library not imported is never imported):
    torch's caching allocator (when memarray is not torch's source), CuPy's default pool,
    the pool or statistics adaptor of RMM's resource for the device (when it is not
    memarray's). Any failure asking a library leaves its band out."""
    out: list[tuple[str, int, list[str]]] = []
    torch = sys.modules.get("torch")
    ours = sys.modules.get("memarray.interop.torch")
    try:
        if (
            torch is not None
            and torch.cuda.is_initialized()
            and not (ours is not None and ours.installed())
        ):
            out.append(("torch (own allocator)", int(torch.cuda.memory_reserved(device)), []))
    except Exception:  # a monitor never fails on a library's question
        pass
    cupy = sys.modules.get("cupy")
    try:
        if cupy is not None:
            with cupy.cuda.Device(device):
                out.append(
                    ("cupy (own pool)", int(cupy.get_default_memory_pool().total_bytes()), [])
                )
    except Exception:
        pass
    try:
        if "rmm" in sys.modules:
            mr = sys.modules["rmm"].mr.get_per_device_resource(device)
            while mr is not None:
                if hasattr(mr, "pool_size"):
                    out.append(("rmm (own pool)", int(mr.pool_size()), []))
                    break
                if hasattr(mr, "get_allocation_counts"):
                    counts = mr.get_allocation_counts()
                    out.append(("rmm (own pool)", int(counts["current_bytes"]), []))
                    break
                mr = mr.get_upstream() if hasattr(mr, "get_upstream") else None
    except Exception:
        pass
    return [band for band in out if band[1] > 0]


def usage(
    resource: resources.Resource | None,
    *,
    total: int | None = None,
    free: int | None = None,
    spilled: dict[str, Any] | None = None,
    budget: int | None = None,
    label: str = "",
    device: int | str | None = None,
) -> dict[str, Any]:
    """One frame of figures: the bands (``[(name, bytes, sites)]``: each library through
    memarray, memarray's cache, each library's own allocator, outside memarray), the
    driver's ``total`` and ``free`` bytes where known, the spilled tiers, the budget,
    (``pool``) memarray's cache and its largest free block, and (``libraries``) the
    ledger's rows of ``device``.

    With ``device`` (a device id, or "host"), what each library holds there comes from
    memarray's ledger (every allocation through memarray, whatever the resource: no setup),
    or from a ``Tracking`` in ``resource``'s stack, which adds the top allocation sites; on
    a device, libraries that keep their own allocators (torch, CuPy, RMM) are asked what
    they hold. Without ``device``, the figures are ``resource``'s stack's alone (its
    ``Tracking`` or ``Statistics`` per library, or a ``Pool``'s bytes in use). Reads
    counters only: no device work, no sync, no walk over allocations."""
    stack = _stack(resource)
    bands: list[tuple[str, int, list[str]]] = []
    tracking = next((r for r in stack if isinstance(r, resources.Tracking)), None)
    stats = next((r for r in stack if isinstance(r, resources.Statistics)), None)
    pool = next((r for r in stack if isinstance(r, resources.Pool)), None)
    pool_stats = pool.statistics() if pool is not None else None
    rows = (
        [r for r in resources.library_usage() if r["device"] == device]
        if device is not None
        else []
    )
    through = 0
    if tracking is not None:
        by_stack = tracking.live_by_stack()
        for source, n in tracking.live_bytes().items():
            if n:
                bands.append((source, n, _sites(by_stack, source, n)))
                through += n
    elif device is not None:
        for row in rows:
            if row["live_bytes"]:
                bands.append((row["source"], int(row["live_bytes"]), []))
                through += int(row["live_bytes"])
    elif stats is not None:
        for source, s in stats.statistics().get("by_source", {}).items():
            if s["current_bytes"]:
                bands.append((source, int(s["current_bytes"]), []))
                through += int(s["current_bytes"])
    if tracking is None and pool_stats is not None and int(pool_stats["used_bytes"]) > through:
        # Bytes of the pool no library was counted for (all of them, without a device).
        rest = int(pool_stats["used_bytes"]) - through
        bands.append(("through memarray", rest, []))
        through += rest
    cached = int(pool_stats["cached_bytes"]) if pool_stats is not None else 0
    if cached:
        bands.append(("cached by memarray", cached, []))
    own = _own_pools(device) if isinstance(device, int) else []
    bands += own
    if total is not None and free is not None:
        outside = max(0, total - free - through - cached - sum(n for _, n, _ in own))
        if outside:
            bands.append(("outside memarray", outside, []))
    return {
        "label": label,
        "bands": bands,
        "total": total,
        "free": free,
        "host_bytes": int((spilled or {}).get("host_bytes", 0)),
        "file_bytes": int((spilled or {}).get("file_bytes", 0)),
        "budget": budget,
        "tracking": tracking is not None,
        # memarray's cache and its largest free block, where the stack has a Pool.
        "pool": (
            None
            if pool_stats is None
            else {k: int(pool_stats[k]) for k in ("cached_bytes", "largest_free_bytes")}
        ),
        "libraries": rows,
    }


def device_usage(device: int) -> dict[str, Any]:
    """``usage`` of ``device``: what each library holds there through memarray (the
    ledger, or the default resource's ``Tracking``), memarray's cache, the libraries' own
    allocators, the driver's figures and spilling's."""
    r = resources.get_default_resource(device)
    info = r.memory_info()
    free, total = info if info is not None else (None, None)
    settings = spill.settings(device) or {}
    return usage(
        r,
        total=total,
        free=free,
        spilled=spill.statistics(device),
        budget=settings.get("device_budget"),
        label=f"cuda:{device}",
        device=device,
    )


def render(frames: list[dict[str, Any]], note: str = "") -> str:
    """The HTML of frames: a bar per device (bands in proportion to the device's total, or
    to their sum where the total is unknown), a legend with the figures, the spilled tiers
    and the budget. Plain HTML, escaped, no scripts."""
    out = ["<div style='font-family:sans-serif;font-size:12px'>"]
    if note:
        out.append(f"<div>{html.escape(note)}</div>")
    for f in frames:
        bands = f["bands"]
        scale = f["total"] or sum(b for _, b, _ in bands) or 1
        out.append(f"<div style='margin-top:6px'><b>{html.escape(f['label'])}</b>")
        if f["total"] is not None:
            used = f["total"] - (f["free"] or 0)
            out.append(f" &mdash; {_mib(used)} used of {_mib(f['total'])}")
        out.append(
            "<div style='display:flex;width:100%;height:18px;border:1px solid #ccc;"
            "background:#fff'>"
        )
        for name, n, sites in bands:
            tip = f"{name}: {_mib(n)}" + "".join(f"\n{s}" for s in sites)
            width = 100.0 * n / scale
            out.append(
                f"<div title='{html.escape(tip, quote=True)}' "
                f"style='width:{width:.3f}%;background:{COLOURS.get(name, '#64b5cd')}'></div>"
            )
        out.append("</div><div>")
        out.append(
            " &nbsp; ".join(
                f"<span style='color:{COLOURS.get(name, '#64b5cd')}'>&#9632;</span> "
                f"{html.escape(name)} {_mib(n)}"
                for name, n, _ in bands
            )
            or "nothing held through memarray"
        )
        extra = []
        if f["host_bytes"] or f["file_bytes"]:
            extra.append(f"spilled: host {_mib(f['host_bytes'])}, file {_mib(f['file_bytes'])}")
        if f["budget"]:
            extra.append(f"budget {_mib(int(f['budget']))}")
        if extra:
            out.append(" &nbsp;|&nbsp; " + html.escape("; ".join(extra)))
        out.append("</div></div>")
    out.append("</div>")
    return "".join(out)


#: Most points a timeline draws: a longer history is thinned to this many, evenly in
#: time, the newest kept (a refresh then costs the same at any history length: a full
#: five minutes of one-second points took 3.8 ms a device to draw whole).
TIMELINE_POINTS = 120


def _add_point(points: collections.deque, now: float, frame: Any, history: float) -> None:
    """Appends ``(now, frame)`` to a timeline's points and drops those older than
    ``history`` seconds (the monitor's and the Dask dashboard's histories)."""
    points.append((now, frame))
    while points and now - points[0][0] > history:
        points.popleft()


def render_timeline(points: list[tuple[float, dict[str, Any]]], width: int = 560) -> str:
    """The HTML of one device's timeline: ``points`` are ``(seconds, frame)`` in time order
    (the frames ``usage`` gives); each band's bytes stacked over time as an inline SVG
    (the bands' colours as in ``render``; free memory is not drawn), scaled to the most
    held in the window (named above it), at most ``TIMELINE_POINTS`` points (a longer
    history thinned evenly, the first and the newest kept). Plain HTML, escaped, no
    scripts; "" for fewer than two points."""
    if len(points) < 2:
        return ""
    if len(points) > TIMELINE_POINTS:
        step = (len(points) - 1) / (TIMELINE_POINTS - 1)
        points = [points[round(i * step)] for i in range(TIMELINE_POINTS)]
    # Each point's bytes by band name, once.
    held = [dict((name, n) for name, n, _ in f["bands"]) for _, f in points]
    names: list[str] = []
    for row in held:
        names += [name for name in row if name not in names]
    height, t0, t1 = 60, points[0][0], points[-1][0]
    span = (t1 - t0) or 1.0
    top = max(sum(row.values()) for row in held) or 1
    xs = [f"{width * (t - t0) / span:.1f}" for t, _ in points]
    below = [0.0] * len(points)
    # Each band's polygon: its top edge, then the band below's top edge backwards (each
    # edge formatted once).
    below_edge = [f"{x},{height:.1f}" for x in xs]
    shapes = []
    for name in names:
        above = [b + row.get(name, 0) for b, row in zip(below, held, strict=True)]
        edge = [f"{x},{height * (1 - a / top):.1f}" for x, a in zip(xs, above, strict=True)]
        path = " ".join(edge + below_edge[::-1])
        colour = COLOURS.get(name, "#64b5cd")
        shapes.append(
            f"<polygon points='{path}' fill='{colour}'><title>{html.escape(name)}</title></polygon>"
        )
        below, below_edge = above, edge
    window = f"{span:.0f} s" if span < 120 else f"{span / 60:.1f} min"
    return (
        f"<div style='font-family:sans-serif;font-size:11px;color:#888'>the last "
        f"{window}, up to {_mib(top)}</div>"
        f"<svg width='{width}' height='{height}' style='border:1px solid #ccc;background:#fff'>"
        + "".join(shapes)
        + "</svg>"
    )


class Monitor:
    """The widget ``monitor()`` returns: an HTML view refreshed by a background thread
    while shown (each device's bar and its timeline over the last ``history`` seconds),
    and a button that saves a torch-format snapshot."""

    def __init__(self, devices: list[int] | None, interval: float, history: float = 300.0) -> None:
        import ipywidgets as w

        self.devices = devices
        self.interval = _interval(interval)
        self.history = _interval(history, "history")
        self._clock = time.monotonic
        # Per device label, the (seconds, frame) of the last `history` seconds.
        self._points: dict[str, collections.deque] = {}
        self.view = w.HTML()
        self.button = w.Button(description="save torch snapshot")
        self.status = w.Label()
        self.button.on_click(self._save)
        self.widget = w.VBox([self.view, w.HBox([self.button, self.status])])
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle: Any = None  # the notebook display, once shown there
        self.refresh()

    def _devices(self) -> list[int]:
        """The devices shown: none where CUDA is unavailable."""
        if not cuda.is_available():
            return []
        return list(self.devices if self.devices is not None else range(cuda.device_count()))

    def frames(self) -> tuple[list[dict[str, Any]], str]:
        if not cuda.is_available():
            return [], f"no CUDA device here: {cuda.unavailable_reason()}"
        return [device_usage(d) for d in self._devices()], ""

    def refresh(self) -> None:
        """Draws one frame now, stamped with the time it was drawn, with each device's
        timeline."""
        frames, note = self.frames()
        now = self._clock()
        lines = []
        for f in frames:
            points = self._points.setdefault(f["label"], collections.deque())
            _add_point(points, now, f, self.history)
            line = render_timeline(list(points))
            if line:
                lines.append(
                    f"<div style='font-family:sans-serif;font-size:12px;margin-top:4px'>"
                    f"<b>{html.escape(f['label'])}</b> {line}</div>"
                )
        stamp = time.strftime("%H:%M:%S")
        self.view.value = (
            render(frames, note)
            + "".join(lines)
            + (
                f"<div style='color:#888;font-size:11px'>refreshed {stamp}, "
                f"every {self.interval:g} s</div>"
            )
        )

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if self.view.comm is None:  # closed
                break
            try:
                self.refresh()
            except Exception as e:  # shown in the widget, never raised in a thread
                self.view.value = f"<pre>{html.escape(repr(e))}</pre>"

    def start(self) -> None:
        """Starts refreshing (done when the monitor is first shown)."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, daemon=True, name="memarray-monitor")
            self._thread.start()

    def close(self) -> None:
        """Stops refreshing and closes the widget. Where the monitor was shown in a
        notebook, its last frame takes the widget's place (a saved notebook shows it
        without a kernel)."""
        self._stop.set()
        if self._handle is not None:
            self.refresh()
            frame = self.view.value
            self._handle.update({"text/html": frame, "text/plain": "memarray monitor"}, raw=True)
            self._handle = None
        self.widget.close()

    def _save(self, _button: Any = None, path: str = "memarray-snapshot.pickle") -> None:
        # A button's callback: what happened goes to the status line, never only to the
        # kernel's log.
        try:
            self.status.value = self._save_snapshot(path)
        except Exception as e:
            self.status.value = f"not saved: {type(e).__name__}: {e}"

    def _save_snapshot(self, path: str) -> str:
        for d in self._devices():
            tracking = next(
                (
                    r
                    for r in _stack(resources.get_default_resource(d))
                    if isinstance(r, resources.Tracking)
                ),
                None,
            )
            if tracking is not None:
                out = resources.save_torch_snapshot(tracking.snapshot(), path)
                return f"saved {out} (python -m torch.cuda._memory_viz)"
        if not cuda.is_available():
            return "no CUDA device here: nothing to save"
        return "no Tracking in the default resource: nothing to save"

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        """The widget, plus its current picture as static HTML for pages without a live
        kernel (nbconvert, GitHub's viewer)."""
        self.start()
        bundle = self.widget._repr_mimebundle_(**kwargs)
        if isinstance(bundle, tuple):
            data, meta = bundle
        else:
            data, meta = bundle, {}
        return {**data, "text/html": self.view.value}, meta

    def _ipython_display_(self) -> None:
        """Shown in a notebook: the same bundle under a display id, so ``close()`` can
        put the last frame in the widget's place."""
        from IPython.display import display

        data, meta = self._repr_mimebundle_()
        self._handle = display(data, metadata=meta, raw=True, display_id=True)


def _interval(interval: Any, what: str = "interval") -> float:
    """``interval`` as seconds (between refreshes, or of ``history``): a real number above 0
    that the refresh thread can wait (NaN, infinities and more than
    ``threading.TIMEOUT_MAX`` are ValueError, never a busy loop or a thread that dies)."""
    if isinstance(interval, bool) or not isinstance(interval, int | float):
        raise TypeError(f"{what} must be a number of seconds, not {type(interval).__name__}")
    seconds = float(interval)
    if not (math.isfinite(seconds) and 0 < seconds <= threading.TIMEOUT_MAX):
        raise ValueError(
            f"{what} must be a finite number of seconds above 0 (at most "
            f"{threading.TIMEOUT_MAX:g}), not {interval!r}"
        )
    return seconds


def monitor(
    devices: list[int] | None = None, interval: float = 1.0, history: float = 300.0
) -> Monitor:
    """A live memory monitor (see the module's docs): every device, or ``devices``,
    refreshed every ``interval`` seconds while shown, with a timeline of the last
    ``history`` seconds under each bar. Needs ipywidgets. ValueError for an interval or a
    history that is not a finite number of seconds above 0."""
    _interval(interval)
    _interval(history, "history")
    try:
        import ipywidgets  # noqa: F401
    except ImportError as e:
        raise ImportError(
            'memarray.notebook.monitor needs ipywidgets: pip install "memarray[notebook]"'
        ) from e
    return Monitor(devices, interval, history)
