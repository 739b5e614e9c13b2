#!/usr/bin/env python3
"""Runs examples/notebooks/tour.ipynb as a reader would and checks what they see.

Executes the notebook with nbclient (a fresh kernel of this Python; widget state kept),
fails on any error output, checks the outputs hold the MemArray table and the monitor's
picture, writes the executed notebook and nbconvert's HTML of it to OUT, then opens the
HTML in headless Chromium: the rendered page (its DOM after layout) must hold the table
and the monitor's bars, and a screenshot is written beside it.

    python3 scripts/notebook_check.py OUT_DIR [--no-browser]   # without: execution only
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOUR = ROOT / "examples" / "notebooks" / "tour.ipynb"


def execute(out: pathlib.Path) -> pathlib.Path:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(TOUR, as_version=4)
    with tempfile.TemporaryDirectory() as cwd:
        NotebookClient(
            nb,
            timeout=600,
            kernel_name="python3",
            resources={"metadata": {"path": cwd}},
            store_widget_state=True,
        ).execute()
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    if errors:
        raise SystemExit(f"the tour raised: {errors[0]['ename']}: {errors[0]['evalue']}")
    html_out = "\n".join(
        str(o.get("data", {}).get("text/html", "")) for c in nb.cells for o in c.get("outputs", [])
    )
    for want in ("memarray.MemArray", "data is in", "memarray.resources.Tracking"):
        if want not in html_out:
            raise SystemExit(f"the tour's outputs lack {want!r}")
    if "display:flex" not in html_out:
        raise SystemExit("the tour's outputs lack the monitor's bars")
    if not any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", [])):
        raise SystemExit("plot() drew no figure inline")
    executed = out / "tour.ipynb"
    nbformat.write(nb, executed)
    return executed


def to_html(executed: pathlib.Path) -> pathlib.Path:
    import nbformat
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(nbformat.read(executed, as_version=4))
    page = executed.with_suffix(".html")
    page.write_text(body)
    return page


def browser() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def look(page: pathlib.Path) -> pathlib.Path:
    """Renders the page in headless Chromium: its DOM after layout must hold the table
    and the bars; a screenshot of the top of the page is kept."""
    exe = browser()
    if exe is None:
        raise SystemExit("no chromium (apt-get install chromium)")
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        "--virtual-time-budget=5000",
    ]
    with tempfile.TemporaryDirectory() as profile:
        flags.append(f"--user-data-dir={profile}")
        url = page.resolve().as_uri()
        dom = subprocess.run(
            [exe, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120
        )
        if dom.returncode != 0 or "memarray.MemArray" not in dom.stdout:
            raise SystemExit(f"chromium did not render the tour: {dom.stderr[-2000:]}")
        for want in ("data is in", "display:flex", "memarray.resources.Tracking"):
            if want not in dom.stdout:
                raise SystemExit(f"the rendered page lacks {want!r}")
        shot = page.with_suffix(".png")
        r = subprocess.run(
            [exe, *flags, f"--screenshot={shot}", "--window-size=1100,2400", url],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if r.returncode != 0 or not shot.exists() or shot.stat().st_size < 10_000:
            raise SystemExit(f"no screenshot: {r.stderr[-2000:]}")
    return shot


def main(argv: list[str]) -> int:
    out = pathlib.Path(argv[0] if argv else "target/notebook")
    out.mkdir(parents=True, exist_ok=True)
    executed = execute(out)
    print(f"tour executed: {executed}")
    if "--no-browser" not in argv:
        page = to_html(executed)
        shot = look(page)
        print(f"rendered in chromium: {page} -> {shot}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    sys.exit(main(sys.argv[1:]))
