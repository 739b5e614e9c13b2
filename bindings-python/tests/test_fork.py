"""Fork safety: a process forked while other threads are inside memarray
(releasing the NumPy block pool, copying arrays out, allocating through Tracking, filling
the dtype table) gets a child whose memarray works: no lock, once-cell or worker thread is
inherited half-held. Each scenario runs in a fresh interpreter; each child has an alarm, so
a hang is a failed child, not a hung run."""

from __future__ import annotations

import json

import pytest
from children import child_stdout

CHURN = """
import os, signal, sys, threading
import numpy as np
import memarray
from memarray import resources

stop = threading.Event()
tracked = resources.Tracking(resources.Host(), stacks=True)

def release():
    while not stop.is_set():
        resources.release_numpy_pool()

def to_numpy():
    a = memarray.MemArray([1 << 18], np.float32)  # 1 MiB: the block pool
    while not stop.is_set():
        a.to_numpy()

def track():
    while not stop.is_set():
        tracked.allocate(4096).free()

def dtypes():
    names = ["float16", "int8", "complex128", "bool", "uint64"]
    i = 0
    while not stop.is_set():
        memarray.zeros((3,), names[i % len(names)]).to_numpy()
        i += 1

def child_work():
    signal.alarm(20)
    a = memarray.MemArray([1 << 18], np.float32)
    for _ in range(3):
        assert a.to_numpy().nbytes == 1 << 20
    resources.release_numpy_pool()
    tracked.allocate(1 << 16).free()
    b = memarray.asarray(np.arange(1 << 20, dtype=np.float64))
    assert float(b.to_numpy().sum()) == float((1 << 20) * ((1 << 20) - 1) // 2)
    # The host thread pool: a parallel .npy load in the child.
    path = f"/tmp/memarray-fork-{os.getpid()}.npy"
    np.save(path, np.arange(1 << 22, dtype=np.float32))
    try:
        assert memarray.load(path).to_numpy()[-1] == (1 << 22) - 1
    finally:
        os.unlink(path)
"""


def test_os_fork_under_churn_never_hangs_a_child():
    out = child_stdout(
        CHURN
        + """
threads = [threading.Thread(target=f) for f in (release, to_numpy, track, dtypes, release)]
for t in threads:
    t.start()
bad = []
for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 60):
    pid = os.fork()
    if pid == 0:
        try:
            child_work()
        except BaseException as e:
            print("child failed:", repr(e), file=sys.stderr)
            os._exit(3)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        bad.append(status)
stop.set()
for t in threads:
    t.join()
print("bad", bad)
""",
        timeout=600,
    )
    assert "bad []" in out, out


def test_multiprocessing_fork_children_under_churn():
    out = child_stdout(
        CHURN
        + """
import multiprocessing as mp

def work(i):
    child_work()
    return i

if __name__ == "__main__":
    threads = [threading.Thread(target=f) for f in (release, to_numpy, track, dtypes)]
    for t in threads:
        t.start()
    ctx = mp.get_context("fork")
    done = []
    for _ in range(4):
        with ctx.Pool(4) as p:
            done += p.map(work, range(8), chunksize=1)
    stop.set()
    for t in threads:
        t.join()
    print("done", sorted(done) == sorted(list(range(8)) * 4))
""",
        timeout=600,
    )
    assert "done True" in out, out


def test_fork_while_the_dtype_table_is_first_filled():
    # A fresh interpreter per round: the table is empty until a thread's first use fills it
    # (importing ml_dtypes). NumPy is imported first: a child forked while another thread
    # imports a module hangs on that module's import lock (CPython's rule, not memarray's).
    for _ in range(5):
        out = child_stdout(
            """
import os, threading
import numpy
import memarray
t = threading.Thread(target=lambda: memarray.zeros((2,), "float16").to_numpy())
t.start()
pids = []
for _ in range(8):
    pid = os.fork()
    if pid == 0:
        import signal
        signal.alarm(20)
        ok = memarray.zeros((2,), "int16").to_numpy().sum() == 0
        os._exit(0 if ok else 3)
    pids.append(pid)
t.join()
print("statuses", [os.waitpid(p, 0)[1] for p in pids])
""",
            timeout=300,
        )
        assert "statuses [0, 0, 0, 0, 0, 0, 0, 0]" in out, out


REENTRANT_DELETER = """
import ctypes, os, signal, sys, threading, time
import numpy as np
import memarray
from hostile import (KEEP, DLDataType, DLDevice, DLManagedTensorVersioned, DLPackVersion,
                     DLTensor, _new_capsule)

DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
calls = []

def deleter(_p):
    # Python code, as NumPy's, CuPy's and torch's deleters may be, calling memarray from
    # inside the import's detached copy.
    time.sleep(0.002)
    memarray.MemArray([4], np.float32).copy()
    calls.append(1)

DEL = DELETER(deleter)
data = (ctypes.c_double * 64)(*range(64))
shape, strides = (ctypes.c_int64 * 1)(8), (ctypes.c_int64 * 1)(2)
KEEP.extend([DEL, data, shape, strides])

def strided_capsule():
    t = DLTensor()
    t.data, t.device, t.ndim = ctypes.addressof(data), DLDevice(1, 0), 1
    t.dtype = DLDataType(2, 64, 1)
    t.shape, t.strides = ctypes.addressof(shape), ctypes.addressof(strides)
    m = DLManagedTensorVersioned()
    m.version, m.dl_tensor = DLPackVersion(1, 3), t
    m.deleter = ctypes.cast(DEL, ctypes.c_void_p)
    KEEP.append(m)
    return _new_capsule(ctypes.addressof(m), b"dltensor_versioned", None)

stop = threading.Event()

def importer():
    while not stop.is_set():
        a = memarray.from_dlpack(strided_capsule())  # strided: a copy, GIL released
        assert a.to_numpy()[1] == 2.0

t = threading.Thread(target=importer, daemon=True)
t.start()
time.sleep(0.05)
statuses = []
for _ in range(20):
    pid = os.fork()
    if pid == 0:
        signal.alarm(20)
        ok = memarray.MemArray([3], np.float32).copy().to_numpy().sum() == 0
        os._exit(0 if ok else 3)
    statuses.append(os.waitpid(pid, 0)[1])
stop.set()
t.join()
print("statuses", statuses, "deleter ran", bool(calls))
"""


def test_fork_returns_while_a_deleter_reenters_memarray_inside_an_import():
    # The fork waits for sections in flight; a section nested in one (the deleter's call)
    # must not wait for the fork in turn. A hang is TimeoutExpired: the test fails.
    out = child_stdout(REENTRANT_DELETER, timeout=120)
    assert "statuses " + str([0] * 20) + " deleter ran True" in out, out


@pytest.mark.gpu
def test_a_child_forked_after_cuda_started_gets_one_clear_error_and_keeps_host_arrays():
    out = child_stdout(
        """
import json, os, signal
import numpy as np
import memarray

a = memarray.asarray(np.arange(64.0), device="cuda")   # CUDA starts in the parent
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    signal.alarm(30)
    res = {}
    for name, call in (
        ("zeros", lambda: memarray.zeros((64,), "float32", device="cuda")),
        ("to_numpy", lambda: a.to_numpy()),
        ("move_memory", lambda: a.move_memory("cpu")),
        ("stream", lambda: memarray.cuda.Stream()),
    ):
        try:
            call()
            res[name] = "worked"
        except memarray.CudaUnavailableError as e:
            res[name] = "CudaUnavailableError" + (" spawn" if "'spawn'" in str(e) else "")
        except Exception as e:
            res[name] = type(e).__name__ + ": " + str(e)[:200]
    res["available"] = memarray.cuda.is_available()
    h = memarray.asarray(np.arange(1 << 20, dtype=np.float32))
    res["host"] = float(h.to_numpy().sum()) == float(np.arange(1 << 20, dtype=np.float32).sum())
    os.write(w, json.dumps(res).encode())
    os._exit(0)
os.close(w)
data = b""
while chunk := os.read(r, 65536):
    data += chunk
os.waitpid(pid, 0)
print(data.decode())
"""
    )
    res = json.loads(out.strip().splitlines()[-1])
    want = "CudaUnavailableError spawn"
    assert res == {
        "zeros": want,
        "to_numpy": want,
        "move_memory": want,
        "stream": want,
        "available": False,
        "host": True,
    }, res


@pytest.mark.gpu
def test_host_arrays_do_not_start_cuda_so_a_forked_child_may():
    out = child_stdout(
        """
import os, signal
import memarray

a = memarray.MemArray([3], "float32", host_memory="pageable")  # host only: no CUDA yet
pid = os.fork()
if pid == 0:
    signal.alarm(30)
    d = memarray.zeros((4,), "float32", device="cuda")
    os._exit(0 if d.to_numpy().sum() == 0 else 3)
print("child status", os.waitpid(pid, 0)[1], a.device_id)
"""
    )
    assert "child status 0 0" in out, out
