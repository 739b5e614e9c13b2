"""GPU memory on the Dask dashboard (``memarray.dask.setup(client, dashboard=True)``).

Each worker publishes memarray's figures as a worker metric (``worker.metrics["memarray"]``,
sent with every heartbeat): per device the monitor's frame (what each library holds
through memarray, memarray's cache, the libraries' own allocators, outside memarray, the
driver's total and free bytes, the spilled host and file tiers, the spill budget) and the
libraries' budgets, plus the process's pressure events. The scheduler samples them every
second into a short history per worker and serves a page, ``/memarray`` on the dashboard's
address (``/memarray.json`` the same data), that draws each worker's devices as the
notebook's monitor does, with their timelines; it reloads itself every second. Importing
this module imports distributed (``memarray.dask`` never does).
"""

from __future__ import annotations

import collections
import html
import time
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.http.utils import RequestHandler

from ... import cuda, notebook, resources

#: Seconds of history the page draws.
HISTORY = 300.0


def worker_sample(worker: Any = None) -> dict[str, Any]:
    """One sample of this process's figures (the metric a worker sends with its
    heartbeats): ``frames`` (the monitor's frame per device, host memory where there is no
    CUDA device), ``budgets`` (``resources.budgets()``) and ``pressure`` (events,
    recovered, spills). Counters only: no device work, no sync."""
    frames = []
    if cuda.is_available():
        for d in range(cuda.device_count()):
            frames.append(_plain(notebook.device_usage(d)))
    else:
        frames.append(_plain(notebook.usage(None, device="host", label="host")))
    pressure = resources.pressure_statistics()
    return {
        "frames": frames,
        "budgets": resources.budgets(),
        "pressure": {k: pressure[k] for k in ("events", "recovered", "spills")},
    }


def _plain(frame: dict[str, Any]) -> dict[str, Any]:
    """A frame as a heartbeat carries it: bands without their sites (asked only by hover
    in the notebook), the figures the page draws."""
    keep = ("label", "total", "free", "host_bytes", "file_bytes", "budget")
    out = {k: frame[k] for k in keep}
    out["bands"] = [[name, int(n)] for name, n, _ in frame["bands"]]
    return out


def _frame(plain: dict[str, Any]) -> dict[str, Any]:
    """A heartbeat's frame back in the form ``notebook.render`` takes."""
    return {**plain, "bands": [(name, n, []) for name, n in plain["bands"]]}


class Dashboard(SchedulerPlugin):  # type: ignore[misc]
    """The scheduler's half: samples every worker's ``memarray`` metric each second into a
    history and serves the page (see the module's docs)."""

    name = "memarray-dashboard"

    def __init__(self, history: float = HISTORY) -> None:
        self.history = history
        # Worker address -> (seconds, sample) of the last `history` seconds.
        self.points: dict[str, collections.deque] = {}

    async def start(self, scheduler: Any) -> None:
        from tornado.ioloop import PeriodicCallback

        self.scheduler = scheduler
        app = getattr(scheduler, "http_application", None)
        if app is not None:
            import dask

            # The dashboard's prefix (``distributed.scheduler.http-prefix``), as its own
            # pages have it.
            given = dask.config.get("distributed.scheduler.http-prefix", None) or ""
            prefix = ("/" + given.strip("/")).rstrip("/")
            app.add_handlers(
                r".*$",
                [
                    (prefix + r"/memarray", Page, {"plugin": self}),
                    (prefix + r"/memarray\.json", Data, {"plugin": self}),
                ],
            )
        self._callback = PeriodicCallback(self.sample, 1000)
        self._callback.start()
        self.sample()

    async def close(self) -> None:
        callback = getattr(self, "_callback", None)
        if callback is not None:
            callback.stop()

    def sample(self) -> None:
        """Takes each worker's last metric into its history; forgets workers gone."""
        now = time.time()
        workers = self.scheduler.workers
        for address, ws in workers.items():
            metric = (ws.metrics or {}).get("memarray")
            if metric is None:
                continue
            points = self.points.setdefault(address, collections.deque())
            notebook._add_point(points, now, metric, self.history)
        for gone in set(self.points) - set(workers):
            del self.points[gone]

    def data(self) -> dict[str, Any]:
        """Each worker's last sample and its history's length, by address."""
        return {
            address: {"last": points[-1][1], "samples": len(points), "since": points[0][0]}
            for address, points in self.points.items()
            if points
        }

    def page(self) -> str:
        """The page: per worker, each device's bar and timeline, its budgets and pressure."""
        out = [
            "<!DOCTYPE html><html><head><meta charset='utf-8'>"
            "<meta http-equiv='refresh' content='1'><title>memarray: GPU memory</title></head>"
            "<body style='font-family:sans-serif;font-size:13px;margin:16px'>"
            "<h2 style='margin:0 0 8px 0'>memarray: memory per worker</h2>"
        ]
        if not self.points:
            out.append(
                "<p>No worker has sent memarray's figures yet (they come with the next "
                "heartbeat of workers set up with <code>memarray.dask.setup(client, "
                "dashboard=True)</code>).</p>"
            )
        for address, points in sorted(self.points.items()):
            if not points:
                continue
            last = points[-1][1]
            name = html.escape(address)
            out.append(f"<h3 style='margin:14px 0 2px 0'>worker {name}</h3>")
            frames = [_frame(f) for f in last["frames"]]
            out.append(notebook.render(frames))
            for i, f in enumerate(frames):
                line = notebook.render_timeline(
                    [(t, _frame(s["frames"][i])) for t, s in points if len(s["frames"]) > i]
                )
                if line:
                    out.append(f"<div><b>{html.escape(f['label'])}</b> {line}</div>")
            p = last["pressure"]
            extra = [
                f"pressure: {p['events']} out-of-memory events, {p['recovered']} recovered, "
                f"{p['spills']} spilled"
            ]
            for b in last["budgets"]:
                where = "host memory" if b["device"] == "host" else f"cuda:{b['device']}"
                extra.append(
                    f"{b['source']} on {where}: {notebook._mib(b['live_bytes'])} of its budget "
                    f"{notebook._mib(b['budget'])}, {b['refused']} refused"
                )
            out.append(
                "<div style='color:#555;font-size:12px'>"
                + "<br>".join(html.escape(e) for e in extra)
                + "</div>"
            )
        out.append("</body></html>")
        return "".join(out)


class Page(RequestHandler):  # type: ignore[misc]
    def initialize(self, plugin: Dashboard) -> None:
        self.plugin = plugin

    def get(self) -> None:
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.write(self.plugin.page())


class Data(RequestHandler):  # type: ignore[misc]
    def initialize(self, plugin: Dashboard) -> None:
        self.plugin = plugin

    def get(self) -> None:
        self.write(self.plugin.data())


def add_metric(worker: Any) -> None:
    """Makes ``worker`` send ``worker_sample()`` with its heartbeats."""
    worker.metrics["memarray"] = worker_sample


__all__ = ["Dashboard", "add_metric", "worker_sample"]
