"""The Python half of shared memory pressure and allocation stacks (``src/interop/pressure.rs``).

When an allocation through memarray runs out of device memory, memarray releases its own
cached blocks, then calls ``relieve(library, device)`` for each library here that is loaded
(torch's ``empty_cache``, CuPy's default pool ``free_all_blocks``, RMM pools'
``release``), then retries once. A library that is not imported is never imported here.
``stack()`` gives the tracking adaptor the allocating thread's Python stack.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import FrameType

_HERE = os.path.dirname(os.path.abspath(__file__))


def _torch(device: int | None) -> int | None:
    torch = sys.modules.get("torch")
    if torch is None or device is None or not torch.cuda.is_initialized():
        return None
    ours = sys.modules.get("memarray.torch")
    if ours is not None and ours.installed():
        # torch's segments are memarray's: torch gives its cached ones back.
        return int(ours.release(device))
    before = torch.cuda.memory_reserved(device)
    torch.cuda.empty_cache()
    return max(0, before - torch.cuda.memory_reserved(device))


def _cupy(device: int | None) -> int | None:
    cupy = sys.modules.get("cupy")
    if cupy is None or device is None:
        return None
    pool = cupy.get_default_memory_pool()
    with cupy.cuda.Device(device):
        before = pool.total_bytes()
        pool.free_all_blocks()
        return max(0, before - pool.total_bytes())


def _rmm(device: int | None) -> int | None:
    if "rmm" not in sys.modules or device is None:
        return None
    import rmm.mr

    released = 0
    mr = rmm.mr.get_per_device_resource(device)
    while mr is not None:
        release = getattr(mr, "release", None)
        if callable(release):
            before = mr.pool_size() if hasattr(mr, "pool_size") else 0
            release()
            after = mr.pool_size() if hasattr(mr, "pool_size") else 0
            released += max(0, before - after)
        mr = mr.get_upstream() if hasattr(mr, "get_upstream") else None
    return released


_RELIEVERS: dict[str, Callable[[int | None], int | None]] = {
    "torch": _torch,
    "cupy": _cupy,
    "rmm": _rmm,
}


def relieve(library: str, device: int | None) -> int | None:
    """Makes ``library`` give its cached memory on ``device`` back; returns the bytes it
    released where it says, or None when it is not loaded (then it was not asked)."""
    f = _RELIEVERS.get(library)
    got = f(device) if f is not None else None
    return None if got is None else int(got)


def stack(limit: int = 24) -> str:
    """The calling thread's Python stack, outermost first, memarray's own frames left
    out: one ``file:line in function`` per line. What UTF-8 cannot encode (a file under a
    path that is not valid UTF-8 holds lone surrogates) is backslash-escaped, so the stack
    is always kept."""
    frame: FrameType | None = sys._getframe(1)
    rows: list[str] = []
    while frame is not None and len(rows) < limit:
        code = frame.f_code
        if not code.co_filename.startswith(_HERE):
            rows.append(f"{code.co_filename}:{frame.f_lineno} in {code.co_name}")
        frame = frame.f_back
    return printable("\n".join(reversed(rows)))


def printable(text: str) -> str:
    """``text`` with what UTF-8 cannot encode (lone surrogates, from paths that are not
    UTF-8) backslash-escaped: stacks and the labels plots draw."""
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
