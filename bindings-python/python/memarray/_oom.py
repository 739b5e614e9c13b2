"""What ``memarray.OutOfMemoryError.report`` holds: who holds what when an allocation
through memarray ran out, built at the failing call from counters (no device work, no
sync): the bytes asked for and the resource that refused them, per library the bytes it
holds through memarray there and its budget (the ledger), memarray's cache (the device's
default resource, as the monitor reads it), what the driver says is used outside
memarray, what relief and spilling tried so far, the top allocation sites where a
``Tracking(stacks=True)`` is in the stack, and one line saying what to do."""

from __future__ import annotations

import html
import re
from typing import Any

_ASKED = re.compile(r"out of memory: (\d+) bytes from (.+?): (.*)", re.S)
_DEVICE = re.compile(r"cuda:(\d+)")
_BUDGET = re.compile(r"past (\w+)'s budget on ")


def _mib(n: int) -> str:
    from ._html import size_text

    return size_text(n)


class OutOfMemoryReport:
    """The report (see the module docs): ``to_dict()`` for logs, ``str()`` a short text,
    ``_repr_html_()`` the monitor's picture of the device with the text."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self._fields = fields

    def to_dict(self) -> dict[str, Any]:
        return dict(self._fields)

    def __getitem__(self, key: str) -> Any:
        return self._fields[key]

    def lines(self) -> list[str]:
        f = self._fields
        where = f"cuda:{f['device']}" if f["device"] is not None else "host memory"
        out = [f"asked for {_mib(f['asked'] or 0)} on {where} from {f['resource']}"]
        frame = f["frame"]
        if frame is not None:
            held = ", ".join(f"{name} {_mib(n)}" for name, n, _ in frame["bands"]) or "nothing"
            out.append(f"held: {held}")
            if frame["total"] is not None:
                out.append(f"driver: {_mib(frame['free'] or 0)} free of {_mib(frame['total'])}")
        libs = f.get("libraries") or []
        if libs:
            held = ", ".join(
                f"{row['source']} {_mib(row['live_bytes'])}"
                + (f" (budget {_mib(row['budget'])})" if row["budget"] is not None else "")
                for row in libs
            )
            out.append(f"through memarray here: {held}")
        spilling = f.get("spill")
        if spilling is not None:
            out.append(
                f"memarray's spillable arrays: {_mib(spilling['resident_bytes'])} on the device, "
                f"{_mib(spilling['current_spilled_bytes'])} spilled"
            )
        pool = f["pool"]
        if pool is not None:
            out.append(
                f"memarray's cache: {_mib(pool['cached_bytes'])}, its largest free block "
                f"{_mib(pool['largest_free_bytes'])}"
            )
        r = f["relief"]
        tried = f"relief so far: {r['events']} out-of-memory events, {r['recovered']} recovered"
        if r["spills"]:
            tried += f", spilling freed {_mib(r['spilled_bytes'])}"
        out.append(tried)
        for s in f["sites"]:
            out.append(f"site: {s}")
        out.append(f"what to do: {f['advice']}")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def __repr__(self) -> str:
        return f"OutOfMemoryReport({self._fields['asked']} bytes, {self._fields['resource']!r})"

    def _repr_html_(self) -> str:
        from .notebook import render

        picture = render([self._fields["frame"]]) if self._fields["frame"] else ""
        text = "<br>".join(html.escape(line) for line in self.lines())
        return f"{picture}<div style='font-family:sans-serif;font-size:12px'>{text}</div>"


def _advice(device: int | None, frame: dict[str, Any] | None, tracking: bool, reason: str) -> str:
    budget = _BUDGET.search(reason)
    if budget:
        where = 'device="host"' if device is None else f"device={device}"
        return (
            f"{budget[1]} reached its budget: free some of its memory or raise the budget "
            f'(memarray.resources.set_budget("{budget[1]}", ..., {where}))'
        )
    if device is None:
        return "free host memory or raise the limit of the resource that refused"
    bands = dict((name, n) for name, n, _ in (frame or {}).get("bands", []))
    outside = bands.get("outside memarray", 0)
    mine = sum(n for name, n in bands.items() if name not in ("outside memarray",))
    if outside > mine:
        return (
            "most of the device is used outside memarray (another library's own allocator, "
            "another process): route it through memarray or free it there"
        )
    hint = "" if tracking else "; Tracking(stacks=True) as the default resource shows where"
    return (
        f"free arrays, turn spilling on (memarray.spill.enable({device}, device_budget=...)) "
        f"or register a reliever (memarray.resources.register_reliever){hint}"
    )


def report(message: str) -> OutOfMemoryReport:
    """The report of an out-of-memory error whose text is ``message``."""
    from . import cuda, notebook, resources, spill

    m = _ASKED.match(message)
    asked, resource, reason = (int(m[1]), m[2], m[3]) if m else (None, "", message)
    d = _DEVICE.search(resource) or _DEVICE.search(reason)
    device = int(d[1]) if d else None
    frame = None
    if device is not None and cuda.is_available():
        try:
            frame = notebook.device_usage(device)
        except Exception:  # a report never hides the error it explains
            frame = None
    spilling = None
    if device is not None:
        try:
            counts = spill.statistics(device)
        except Exception:  # a report never hides the error it explains
            counts = None
        if counts is not None:
            spilling = {k: int(counts[k]) for k in ("resident_bytes", "current_spilled_bytes")}
    relief = resources.pressure_statistics()
    here = "host" if device is None else device
    libraries = [row for row in resources.library_usage() if row["device"] == here]
    sites: list[str] = []
    if frame is not None:
        for name, _, s in frame["bands"]:
            sites += [f"{name}: {x}" for x in s[:1]]
    return OutOfMemoryReport(
        {
            "asked": asked,
            "resource": resource,
            "reason": reason,
            "device": device,
            "frame": frame,
            "pool": frame["pool"] if frame is not None else None,
            "relief": {
                k: relief[k] for k in ("events", "recovered", "failed", "spills", "spilled_bytes")
            },
            "relievers": relief.get("relievers", []),
            "libraries": libraries,
            "spill": spilling,
            "sites": sites[:3],
            "advice": _advice(device, frame, bool(frame and frame.get("tracking")), reason),
        }
    )
