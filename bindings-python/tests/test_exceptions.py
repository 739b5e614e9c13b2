"""Every public callable raises only the exception types docs/python-guide.md names.

``walk()`` calls each public function, class and method with out-of-range integers,
wrong types, surrogate strings and hostile ``__index__`` / ``__len__`` / ``__iter__``
objects, on arrays in several states, and lists every exception of a type the guide's
"Errors" table does not name. It runs in a subprocess, so a crash fails the test too.
"""

from __future__ import annotations

import inspect
import itertools
import json
import os
import pathlib
import sys
import tempfile

import numpy as np
from children import run_command

HERE = pathlib.Path(__file__).parent


class Boom(Exception):
    """Raised by the hostile objects' own methods: it must come back unchanged."""


class BadIndex:
    def __index__(self):
        raise Boom("__index__")


class BadSeq:
    def __len__(self):
        raise Boom("__len__")

    def __iter__(self):
        raise Boom("__iter__")

    def __getitem__(self, i):
        raise Boom("__getitem__")


VALUES = [
    None,
    True,
    -1,
    0,
    1,
    2**63 - 1,
    2**63,
    2**64,
    2**70,
    -(2**70),
    1.5,
    float("nan"),
    float("inf"),
    "x",
    "\udcff",
    "",
    b"x",
    (),
    (2**64,),
    (-1,),
    (0, 2**64 - 1),
    [1] * 40,
    (1.5,),
    object(),
    np.int64(-1),
    np.uint64(2**64 - 1),
    {},
    BadIndex(),
    BadSeq(),
]
PAIRS = [None, -1, 0, 2**64, 1.5, "x", "\udcff", (2**64,), object(), BadIndex()]


def allowed(e: BaseException, module: str, label: str) -> bool:
    import memarray

    t = type(e)
    exact = {
        TypeError,
        ValueError,
        IndexError,
        BufferError,
        MemoryError,
        memarray.OutOfMemoryError,  # a MemoryError (the guide's table)
        AttributeError,
        memarray.LockError,
        memarray.CudaUnavailableError,
        Boom,
    }
    if t in exact or isinstance(e, OSError) or isinstance(e, ImportError):
        return True
    # An element value NumPy refuses with OverflowError (a Python int out of the dtype's
    # range) raises it here too (the guide's Exceptions table).
    if t is OverflowError and ("__setitem__" in label or "full" in label):
        return True
    # CUDA-layer failures other than a missing driver are RuntimeError (the guide's
    # table): on a machine without CUDA only IPC (host data cannot be shared) and NCCL
    # (not loaded) reach them.
    return t is RuntimeError and (module == "memarray.cluster.distributed" or "ipc" in label)


def callables():
    import memarray
    from memarray import cuda, distributed, resources

    out = []
    skip = {"exchange_id_file", "init", "init_process_group", "as_torch"}  # block or need peers
    for mod in (memarray, cuda, resources, distributed):
        for name in getattr(mod, "__all__", dir(mod)):
            if name.startswith("_") or name in skip:
                continue
            obj = getattr(mod, name, None)
            if callable(obj) and not (inspect.isclass(obj) and issubclass(obj, BaseException)):
                out.append((f"{mod.__name__}.{name}", mod.__name__, obj))
    return out


def arrays():
    import memarray

    a = memarray.MemArray((2, 3), np.float32)
    locked = memarray.MemArray((2,), np.int8)
    ctx = locked.get_dlpack()
    ctx.__enter__()
    return {
        "host": a,
        "empty": memarray.MemArray((0, 4), np.int8),
        "scalar": memarray.MemArray((), np.complex128),
        "bool": memarray.MemArray((5,), np.bool_),
        "locked": locked,
    }, ctx


def walk() -> list[str]:
    import memarray

    bad: list[str] = []
    calls = 0

    # Diagnostics only: MEMARRAY_WALK_SKIP lists callables (one per line) to leave out, to
    # find every crashing call of a run (the test itself never sets it).
    skip = [x for x in os.environ.get("MEMARRAY_WALK_SKIP", "").splitlines() if x]

    def call(label, module, fn, *args, **kwargs):
        nonlocal calls
        if any(label.startswith(x) for x in skip):
            return
        calls += 1
        # Before the call: a crash leaves the call that caused it last on stderr.
        sys.stderr.write(f"{label}{args!r:.160} {kwargs!r:.80}\n")
        try:
            r = fn(*args, **kwargs)
            if inspect.isgenerator(r) or hasattr(r, "__exit__"):
                return
        except BaseException as e:  # noqa: BLE001 - the point is to see every type
            if not allowed(e, module, label):
                kind = f"{type(e).__module__}.{type(e).__name__}"
                bad.append(f"{label}{args!r:.120} {kwargs!r:.60}: {kind}: {e}")

    saved = memarray.cuda.staging_config() if memarray.cuda.is_available() else None
    for label, module, fn in callables():
        call(label, module, fn)
        for v in VALUES:
            call(label, module, fn, v)
        for v, w in itertools.product(PAIRS, repeat=2):
            call(label, module, fn, v, w)
        for v in VALUES:
            call(label, module, fn, (2, 3), v)
    arrs, ctx = arrays()
    for state, a in arrs.items():
        for name in dir(a):
            if name.startswith("__") and name not in (
                "__getitem__",
                "__setitem__",
                "__delitem__",
                "__dlpack__",
                "__array__",
                "__len__",
                "__reduce_ex__",
                "__iter__",
                "__index__",
                "__int__",
                "__float__",
            ):
                continue
            attr = getattr(a, name, None)
            if not callable(attr):
                continue
            label = f"MemArray[{state}].{name}"
            call(label, "memarray", attr)
            for v in VALUES:
                call(label, "memarray", attr, v)
            for v, w in itertools.product(PAIRS, repeat=2):
                call(label, "memarray", attr, v, w)
        for kw in ("stream", "max_version", "dl_device", "copy"):
            for v in VALUES:
                call(f"MemArray[{state}].__dlpack__({kw}=)", "memarray", a.__dlpack__, **{kw: v})
        for v in VALUES:
            call(f"MemArray[{state}].move_memory", "memarray", a.move_memory, 1, v)
            call(f"MemArray[{state}].move_memory", "memarray", a.move_memory, v, 0)
            call(f"MemArray[{state}].to_numpy(out=)", "memarray", a.to_numpy, out=v)
    ctx.__exit__(None, None, None)
    for kw in ("threads", "chunk_bytes", "direct_below", "direction"):
        for v in VALUES:
            call("set_staging_config", "memarray.cuda", memarray.cuda.set_staging_config, **{kw: v})
    if saved is not None:
        for direction, c in saved.items():
            memarray.cuda.set_staging_config(direction, **c)
    print(json.dumps({"calls": calls, "bad": bad}))
    return bad


def test_every_public_callable_raises_only_documented_types():
    env = dict(os.environ, PYTHONPATH=str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryDirectory() as d:  # methods given "x" may write files there
        r = run_command(
            [sys.executable, "-c", "import test_exceptions as t; t.walk()"],
            timeout=600,
            env=env,
            cwd=d,
        )
    last = r.stderr.strip().splitlines()[-3:]
    assert r.returncode == 0, f"rc {r.returncode}; last calls: {last}"
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["calls"] > 10_000, out["calls"]
    assert not out["bad"], f"{len(out['bad'])} undocumented exceptions:\n" + "\n".join(
        out["bad"][:40]
    )
