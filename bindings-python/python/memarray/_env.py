"""The environment variables the Python package reads itself, each read one way: switches
take the words every memarray switch takes (``1``/``on``/``true``/``yes``,
``0``/``off``/``false``/``no``, any case; empty is the default), byte counts are read as
Rust reads them, and lists and numbers say what they take. ``check()`` runs at
``import memarray`` (the extension checks the variables Rust reads when it loads), so a
value memarray does not understand fails the import with a ValueError naming the
variable, never a silent default."""

from __future__ import annotations

from . import _memarray

#: What ``MEMARRAY_DASK_HOOKS`` lists (comma-separated).
HOOKS = ("torch", "cupy", "rmm", "numba")
#: What ``MEMARRAY_DASK_RESOURCE`` names.
RESOURCES = ("pool", "device", "async", "managed")


def switch(name: str) -> bool | None:
    """``name`` as a switch: True, False, or None when unset or empty."""
    return _memarray._env_switch(name)


def text(name: str) -> str | None:
    """``name``'s value, None when unset or only spaces (ValueError when not UTF-8)."""
    v = _memarray._env_text(name)
    return v if v is not None and v.strip() else None


def device_number(name: str) -> int | None:
    """``name`` as a device number (0, 1, ...), None when unset or empty."""
    v = text(name)
    if v is None:
        return None
    try:
        d = int(v.strip())
    except ValueError:
        d = -1
    if d < 0:
        raise ValueError(f"{name}={v!r}: expected a device number (0, 1, ...)")
    return d


def names(name: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """``name`` as a comma-separated list of ``allowed`` words (empty when unset)."""
    v = text(name)
    if v is None:
        return ()
    got = tuple(w.strip() for w in v.split(",") if w.strip())
    wrong = [w for w in got if w not in allowed]
    if wrong:
        raise ValueError(f"{name}={v!r}: {wrong[0]!r} is not one of {', '.join(allowed)}")
    return got


def choice(name: str, allowed: tuple[str, ...]) -> str | None:
    """``name`` as one of ``allowed``, None when unset or empty."""
    v = text(name)
    if v is None:
        return None
    if v.strip() not in allowed:
        raise ValueError(f"{name}={v!r}: expected one of {', '.join(allowed)}")
    return v.strip()


def nccl_id(name: str) -> str | None:
    """``name`` as an NCCL unique id (256 hex digits), None when unset or empty."""
    v = text(name)
    if v is None:
        return None
    v = v.strip()
    try:
        ok = len(v) == 256 and len(bytes.fromhex(v)) == 128
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"{name}: expected 256 hex digits (an NCCL unique id), got {len(v)} characters"
        )
    return v


def check() -> None:
    """Reads every variable the Python package reads; the first value not understood is a
    ValueError naming its variable."""
    switch("MEMARRAY_PROGRESS")
    switch("MEMARRAY_MPI_CUDA_AWARE")
    device_number("MEMARRAY_DASK_DEVICE")
    names("MEMARRAY_DASK_HOOKS", HOOKS)
    choice("MEMARRAY_DASK_RESOURCE", RESOURCES)
    nccl_id("MEMARRAY_NCCL_ID")
