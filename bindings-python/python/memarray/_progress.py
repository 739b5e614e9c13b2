"""Progress bars for long work in an interactive session: `.npy` loads and saves still
running after about a second show a byte bar (tqdm.auto: a widget in Jupyter, text on a
terminal). Never in non-interactive output (a log, CI); `memarray.set_progress(False)` or
``MEMARRAY_PROGRESS=0`` (or ``off``, ``false``, ``no``) turns them off, ``set_progress(True)``
or ``MEMARRAY_PROGRESS=1`` (``on``, ``true``, ``yes``) on everywhere. Without tqdm nothing is shown.
"""

from __future__ import annotations

import html
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from . import _env, _memarray

T = TypeVar("T")

#: Seconds a call runs before its bar appears.
AFTER = 1.0
#: Work smaller than this never gets a bar (it cannot last a second).
SMALLEST = 64 << 20

_choice: bool | None = None


def set_progress(on: bool | None) -> None:
    """Progress bars on (``True``: also outside interactive sessions), off (``False``), or
    as the session decides (``None``: on in Jupyter and on a terminal)."""
    global _choice
    if on is not None and not isinstance(on, bool):
        raise TypeError(f"set_progress takes True, False or None, not {on!r}")
    _choice = on


def _interactive() -> bool:
    try:
        from IPython import get_ipython

        if get_ipython() is not None:
            return True
    except ImportError:
        pass
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def wanted(nbytes: int, smallest: int = SMALLEST) -> bool:
    """Whether work of ``nbytes`` (or other units: at least ``smallest`` of them) may show
    a bar."""
    if nbytes < smallest:
        return False
    choice = _choice
    if choice is None:
        choice = _env.switch("MEMARRAY_PROGRESS")
    if choice is False:
        return False
    if choice is None and not _interactive():
        return False
    try:
        import tqdm.auto  # noqa: F401
    except ImportError:
        return False
    return True


class Count:
    """A counter that Python work advances itself (``done += n``), for :func:`run`."""

    done = 0


def run(
    work: Callable[[Any], T],
    total: int,
    desc: str,
    *,
    counter: Any = None,
    unit: str = "B",
    smallest: int = SMALLEST,
) -> T:
    """``work(counter)`` (a counter of ``unit`` the work advances: by default a byte
    counter that memarray's Rust side advances) in a thread of its own; a bar follows the
    counter once the work has run ``AFTER`` seconds. Returns or raises what the work did."""
    if counter is None:
        counter = _memarray._Progress()
    if not wanted(total, smallest):
        return work(counter)
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = work(counter)
        except BaseException as e:  # re-raised in the caller's thread
            out["error"] = e

    t = threading.Thread(target=target, name="memarray-progress", daemon=True)
    t.start()
    t.join(AFTER)
    if t.is_alive():
        from tqdm.auto import tqdm

        scale = {"unit_scale": True, "unit_divisor": 1024} if unit == "B" else {}
        start = time.perf_counter() - AFTER
        shown = _notebook_bar(total, desc, unit, scale)
        with tqdm(total=total, desc=desc, unit=unit, **scale) if shown is None else shown[0] as bar:
            while t.is_alive():
                t.join(0.1)
                bar.update(counter.done - bar.n)
            bar.update(counter.done - bar.n)
        if shown is not None:
            # The widget needs a live kernel; a saved notebook keeps this line instead.
            _finish(shown[1], desc, counter.done, unit, time.perf_counter() - start, out)
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def _notebook_bar(total: int, desc: str, unit: str, scale: dict[str, Any]) -> Any:
    """In a Jupyter kernel with ipywidgets: tqdm's widget shown through a display handle,
    so the finished bar can be replaced by a line of text (``_finish``); None elsewhere
    (a terminal: tqdm's own text bar)."""
    try:
        from IPython import get_ipython
        from IPython.display import display

        shell = get_ipython()
        if shell is None or "IPKernelApp" not in shell.config:
            return None
        from tqdm.notebook import tqdm as widget_bar

        bar = widget_bar(total=total, desc=desc, unit=unit, display=False, **scale)
        return bar, display(bar.container, display_id=True)
    except Exception:  # noqa: BLE001 - no widgets here: tqdm.auto decides
        return None


def amount(n: int, unit: str) -> str:
    """``n`` of ``unit`` for a reader: ``3.0 GiB`` for bytes, ``120 arrays`` otherwise."""
    from ._html import size_short

    return size_short(n) if unit == "B" else f"{n:,} {unit}"


def _finish(handle: Any, desc: str, done: int, unit: str, seconds: float, out: dict) -> None:
    """Replaces the widget of ``handle`` with the final state as plain text and HTML."""
    state = "failed" if "error" in out else "done"
    text = f"{desc}: {state}, {amount(done, unit)} in {seconds:.2f} s"
    try:
        handle.update(
            {"text/plain": text, "text/html": f"<pre>{html.escape(text)}</pre>"}, raw=True
        )
    except Exception:  # noqa: BLE001 - the work's own result matters more than its bar
        pass


def load(path: Any, device: Any = None, host_memory: Any = None) -> Any:
    """``memarray.load`` with a bar when it runs long."""
    size = 0  # anything but a statable path: the load itself says what is wrong
    if isinstance(path, str | bytes | os.PathLike):  # never an int: os.stat takes fds
        try:
            size = os.stat(path).st_size
        except (OSError, ValueError):
            pass
    return run(
        lambda p: _memarray.load(path, device, host_memory, _progress=p),
        size,
        f"load {os.path.basename(os.fsdecode(os.fspath(path))) if size else ''}",
    )


def load_safetensors(
    path: Any, device: Any, host_memory: Any, names: Any
) -> tuple[dict[str, Any], dict[str, str]]:
    """``memarray.load_safetensors`` with a bar when it runs long."""
    size = 0
    if isinstance(path, str | bytes | os.PathLike):
        try:
            size = os.stat(path).st_size
        except (OSError, ValueError):
            pass
    return run(
        lambda p: _memarray.load_safetensors(path, device, host_memory, names, _progress=p),
        size,
        f"load {os.path.basename(os.fsdecode(os.fspath(path))) if size else ''}",
    )


def save_safetensors(path: Any, pairs: list[tuple[str, Any]], metadata: list) -> None:
    """``memarray.save_safetensors`` with a bar when it runs long."""
    run(
        lambda p: _memarray.save_safetensors(path, pairs, metadata, _progress=p),
        sum(int(a.nbytes) for _, a in pairs),
        f"save {os.path.basename(os.fsdecode(os.fspath(path)))}",
    )


def save(a: Any, path: Any) -> None:
    """``a.save(path)`` with a bar when it runs long (called by ``MemArray.save``)."""
    run(
        lambda p: a.save(path, _progress=p),  # type: ignore[call-arg]  # hidden from help()
        int(a.nbytes),
        f"save {os.path.basename(os.fsdecode(os.fspath(path)))}",
    )


def move_many(arrays: list[Any], device: Any, stream: Any, total: int) -> None:
    """``memarray.move_many`` of a large batch with a bar when it runs long (called by
    ``move_many`` itself, on MemArrays it has already imported)."""
    run(
        lambda p: _memarray.move_many(arrays, device, stream, _progress=p),  # type: ignore[call-arg]
        total,
        f"move {len(arrays)} array{'s' if len(arrays) != 1 else ''}",
    )
