"""HTML views for the notebook: ``MemArray._repr_html_`` and the resources'. Plain HTML
(a table and a ``<pre>``), escaped, no scripts: it renders the same in Jupyter, VS Code and
a static nbconvert page."""

from __future__ import annotations

import html
from typing import Any


def size_short(n: int) -> str:
    """Bytes in a few characters: ``4.0 MiB``, ``512 bytes``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:,} bytes"


def size_text(n: int) -> str:
    """Bytes for a reader: ``4.0 MiB (4,194,304 bytes)``."""
    short = size_short(n)
    return short if n < 1 << 10 else f"{short} ({n:,} bytes)"


def where(a: Any) -> str:
    """Where the data is now, in words: the device, or the host buffer's kind, or the
    spill tier."""
    if a.spilled:
        return f"spilled from cuda:{a.device_id} to the host"
    if a.on_device:
        return f"{a.device} memory"
    return f"host ({a.host_memory})"


def _table(rows: list[tuple[str, str]], title: str) -> str:
    body = "".join(
        f"<tr><th style='text-align:left;padding-right:1em'>{html.escape(k)}</th>"
        f"<td style='text-align:left'>{html.escape(v)}</td></tr>"
        for k, v in rows
    )
    return f"<div><b>{html.escape(title)}</b><table>{body}</table>"


def array_html(a: Any) -> str:
    """``a._repr_html_()``: the facts and NumPy's elided values (host data viewed, device
    data of up to 1,000 elements copied, as ``str(a)``)."""
    lock = f"locked (token {a.lock_id})" if a.locked else "unlocked"
    rows = [
        ("shape", str(tuple(a.shape))),
        ("dtype", a._dtype_name),
        ("device", a.device),
        ("data is in", where(a)),
        ("bytes", size_text(int(a.nbytes))),
        ("lock", lock),
        ("pending work", "recorded on a stream, not waited for yet" if a.pending_work else "none"),
    ]
    values = _values(a) if not a.locked else "(locked: values not read)"
    return _table(rows, "memarray.MemArray") + f"<pre>{html.escape(values)}</pre></div>"


def _values(a: Any) -> str:
    """``str(a)``, or, where the values cannot be shown (bfloat16 without ml_dtypes, a
    device gone), the text repr and why: a notebook cell's repr never raises."""
    try:
        return str(a)
    except Exception as e:  # noqa: BLE001 - shown in the cell instead
        try:
            text = repr(a)
        except Exception:  # noqa: BLE001
            text = f"memarray.MemArray(shape={tuple(a.shape)}, dtype={a.dtype})"
        return f"{text}\n(values not shown: {type(e).__name__}: {e})"


def resource_html(r: Any) -> str:
    """A resource's ``_repr_html_``: its kind and device, the figures it keeps
    (``r._figures()``: each resource class says its own), and what is below it."""
    rows = [("resource", r.name), ("memory kind", str(r.kind))]
    if r.device_id is not None:
        rows.append(("device", f"cuda:{r.device_id}"))
    rows += r._figures()
    if r.upstream is not None:
        rows.append(("upstream", r.upstream.name))
    return _table(rows, f"memarray.resources.{type(r).__name__}") + "</div>"
