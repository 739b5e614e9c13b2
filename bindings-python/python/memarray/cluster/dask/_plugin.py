"""The distributed ``WorkerPlugin`` of ``memarray.dask.setup`` (apart: importing it
imports distributed, which ``memarray.dask`` itself never does)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from ._worker import _apply


class MemarrayPlugin(WorkerPlugin):  # type: ignore[misc]
    """Applies memarray's settings on each worker as it starts (and, with ``dashboard``,
    makes it send memarray's figures with its heartbeats)."""

    name = "memarray"

    def __init__(self, settings: Mapping[str, Any], dashboard: bool = False) -> None:
        self.settings = dict(settings)
        self.dashboard = dashboard

    def setup(self, worker: Any) -> None:
        worker.memarray = _apply(self.settings, getattr(worker, "name", None))
        if self.dashboard:
            from ._dashboard import add_metric

            add_metric(worker)
