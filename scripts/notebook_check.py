#!/usr/bin/env python3
"""Runs examples/notebooks/tour.ipynb as a reader would and checks what they see.

Executes the notebook with nbclient (a fresh kernel of this Python; widget state kept),
fails on any error output, checks the outputs hold the MemArray table and the monitor's
picture, writes the executed notebook and nbconvert's HTML of it to OUT, then opens the
HTML in headless Chromium: the rendered page (its DOM after layout) must hold the table
and the monitor's bars, and a screenshot is written beside it.

Then the live check, as a reader of a running notebook sees it: Voila serves the tour with
a kernel behind it (its own copy of the widget manager: no CDN), headless Chromium opens
it over the DevTools protocol, and the page must show the monitor as a live widget (its
button exists only then), its refresh stamp must change while the page is open, and a
click on the button must come back from the kernel with an answer. Screenshot:
OUT/tour-live.png.

    python3 scripts/notebook_check.py OUT_DIR [--no-browser] [--no-live]
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

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


#: Headless Chromium as both checks run it: no sandbox (root in CI), no GPU, nothing
#: fetched in the background.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--hide-scrollbars",
]


def look(page: pathlib.Path) -> pathlib.Path:
    """Renders the page in headless Chromium: its DOM after layout must hold the table
    and the bars; a screenshot of the top of the page is kept."""
    exe = browser()
    if exe is None:
        raise SystemExit("no chromium (apt-get install chromium)")
    flags = [*CHROMIUM_FLAGS, "--disable-quic", "--disable-sync", "--virtual-time-budget=5000"]
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, probe, timeout: float):  # type: ignore[no-untyped-def]
    """``probe()`` until it returns something truthy; SystemExit naming ``what`` after
    ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while True:
        try:
            got = probe()
        except (OSError, ValueError):
            got = None
        if got:
            return got
        if time.monotonic() > end:
            raise SystemExit(f"live check: {what} did not happen in {timeout:.0f} s")
        time.sleep(0.25)


class Page:
    """One Chromium tab driven over the DevTools protocol."""

    def __init__(self, ws_url: str) -> None:
        import websocket

        self.ws = websocket.create_connection(ws_url, timeout=60, suppress_origin=True)
        self.next = 0

    def call(self, method: str, **params):  # type: ignore[no-untyped-def]
        self.next += 1
        self.ws.send(json.dumps({"id": self.next, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next:
                if "error" in msg:
                    raise SystemExit(f"live check: {method}: {msg['error']}")
                return msg["result"]

    def js(self, expression: str):  # type: ignore[no-untyped-def]
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return r["result"].get("value")


def look_live(out: pathlib.Path) -> pathlib.Path:
    """Voila serves the tour; Chromium must show the monitor live (see the module docs)."""
    exe = browser()
    if exe is None:
        raise SystemExit("no chromium (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as work:
        nb = pathlib.Path(work) / "tour.ipynb"
        shutil.copy(TOUR, nb)
        port, debug = free_port(), free_port()
        log = open(out / "voila.log", "w")
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "voila",
                str(nb),
                "--no-browser",
                f"--port={port}",
                "--Voila.ip=127.0.0.1",
                "--show_tracebacks=True",
                "--VoilaConfiguration.file_allowlist=['.*']",
            ],
            cwd=work,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        chrome = None
        try:
            url = f"http://127.0.0.1:{port}/"
            wait_for("voila's server", lambda: urllib.request.urlopen(url, timeout=120), 120)
            profile = pathlib.Path(work) / "profile"
            chrome = subprocess.Popen(
                [
                    exe,
                    *CHROMIUM_FLAGS,
                    "--window-size=1100,1600",
                    f"--remote-debugging-port={debug}",
                    f"--user-data-dir={profile}",
                    "about:blank",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

            def tab() -> str | None:
                with urllib.request.urlopen(f"http://127.0.0.1:{debug}/json/list") as r:
                    pages = [t for t in json.load(r) if t.get("type") == "page"]
                return pages[0]["webSocketDebuggerUrl"] if pages else None

            page = Page(wait_for("chromium's DevTools", tab, 60))
            page.call("Page.navigate", url=url)
            text = "document.body ? document.body.innerText : ''"
            # The button is drawn only by the widget manager talking to the kernel.
            button = (
                "[...document.querySelectorAll('button')]"
                ".find(b => b.textContent.includes('save torch snapshot'))"
            )
            try:
                wait_for("the monitor's live widget", lambda: page.js(f"!!({button})"), 180)
            except SystemExit:
                # What the page showed instead, for the reader of the failure.
                (out / "tour-live-failed.txt").write_text(str(page.js(text)))
                png = page.call("Page.captureScreenshot", format="png")["data"]
                (out / "tour-live-failed.png").write_bytes(base64.b64decode(png))
                raise
            for want in ("memarray.MemArray", "data is in", "memarray.resources.Tracking"):
                if want not in page.js(text):
                    raise SystemExit(f"live check: the page lacks {want!r}")
            stamp = "(document.body.innerText.match(/refreshed (\\d\\d:\\d\\d:\\d\\d)/) || [])[1]"
            first = wait_for("the monitor's refresh stamp", lambda: page.js(stamp), 30)
            later = wait_for("a second refresh", lambda: (s := page.js(stamp)) != first and s, 15)
            page.js(f"{button}.click()")
            said = (
                "(document.body.innerText.match(/(saved .*|not saved: .*|.*nothing to save)/)"
                " || [])[1]"
            )
            answer = wait_for("the kernel's answer to the button", lambda: page.js(said), 30)
            shot = out / "tour-live.png"
            png = page.call("Page.captureScreenshot", format="png")["data"]
            shot.write_bytes(base64.b64decode(png))
            print(f"live: monitor refreshed {first} -> {later}; button answered: {answer!r}")
            return shot
        finally:
            if chrome is not None:
                chrome.terminate()
                chrome.wait(30)
            server.terminate()
            server.wait(30)
            log.close()


def main(argv: list[str]) -> int:
    out = pathlib.Path(argv[0] if argv else "target/notebook")
    out.mkdir(parents=True, exist_ok=True)
    executed = execute(out)
    print(f"tour executed: {executed}")
    if "--no-browser" not in argv:
        page = to_html(executed)
        shot = look(page)
        print(f"rendered in chromium: {page} -> {shot}")
        if "--no-live" not in argv:
            shot = look_live(out)
            print(f"live in chromium (voila): {shot}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    sys.exit(main(sys.argv[1:]))
