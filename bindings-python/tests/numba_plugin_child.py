"""Run by test_numba_cupy.py in a subprocess with NUMBA_CUDA_MEMORY_MANAGER=memarray.numba:
Numba allocates through memarray; the findings are printed as one JSON line."""

import gc
import json
import pickle
import subprocess
import sys
import time

import numpy as np

from memarray import resources as mr

if not hasattr(np, "row_stack"):
    # Numba 0.68's typing tables name np.row_stack, which NumPy 2.5 removed (seen on the
    # GPU machine: the first @cuda.jit compile fails). Not memarray's concern; shimmed so
    # the kernel below compiles.
    np.row_stack = np.vstack

stats = mr.Statistics(mr.Pool(mr.Device(0)))
mr.set_default_resource(stats, 0)
from numba import cuda  # noqa: E402 - after the default resource is set

mm = cuda.current_context().memory_manager
assert type(mm).__name__ == "MemarrayNumbaManager", type(mm)
assert mm.interface_version == 1
out = {}
x = np.arange(100_000, dtype=np.float32)
d = cuda.to_device(x)
out["after_to_device"] = stats.statistics()["current_count"]
e = cuda.device_array(x.size, np.float32)


@cuda.jit
def twice(a, b):
    i = cuda.grid(1)
    if i < a.size:
        b[i] = a[i] * 2


twice[(x.size + 255) // 256, 256](d, e)
out["kernel_ok"] = bool((e.copy_to_host() == 2 * x).all())
with cuda.defer_cleanup():
    del e
    gc.collect()
    out["inside_defer"] = stats.statistics()["current_count"]
out["after_defer"] = stats.statistics()["current_count"]
free, total = mm.get_memory_info()
out["memory_info_ok"] = 0 < free <= total

# An IPC handle opened in a second process.
h = d.get_ipc_handle()
child = (
    "import pickle, sys\n"
    "h = pickle.loads(sys.stdin.buffer.read())\n"
    "with h as arr:\n"
    "    v = arr.copy_to_host()\n"
    "print(float(v[0]), float(v[-1]), v.size)\n"
)
r = subprocess.run(
    [sys.executable, "-c", child], input=pickle.dumps(h), capture_output=True, timeout=120
)
out["ipc"] = r.stdout.decode().split() if r.returncode == 0 else r.stderr.decode()[-2000:]


def med(f, n=500):
    """Median microseconds per call over 15 samples of n calls."""
    f()
    s = []
    for _ in range(15):
        t = time.perf_counter()
        for _ in range(n):
            f()
        s.append((time.perf_counter() - t) / n * 1e6)
    return sorted(s)[len(s) // 2]


out["device_array_1mib_us"] = med(lambda: cuda.device_array(262144, np.float32))
out["stats"] = stats.statistics()
print("RESULT", json.dumps(out))
