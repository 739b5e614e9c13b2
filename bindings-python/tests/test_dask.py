"""MemArrays in Dask: sizes, tokens, both serializer families, worker set-up
and statistics, a LocalCluster of worker processes over TCP (host arrays here, device
arrays on the GPU machine), and dask-cuda's spilling leaving memarray's to memarray."""

from __future__ import annotations

import json
import os
import textwrap

import numpy as np
import pytest
from children import child_stdout, run_child, run_command
from test_interop import _peer

import memarray

# CI and the GPU machine install Dask (MEMARRAY_REQUIRE_DASK=1 there: missing is a failure).
try:
    import dask  # noqa: F401
    import distributed  # noqa: F401
except ImportError:
    if os.environ.get("MEMARRAY_REQUIRE_DASK") == "1":
        raise
    pytest.skip("SKIPPED: dask / distributed are not installed", allow_module_level=True)

from dask.base import tokenize  # noqa: E402
from dask.sizeof import sizeof  # noqa: E402
from distributed.protocol import deserialize, serialize  # noqa: E402

import memarray.dask as mdask  # noqa: E402

SHAPES = {"0-d": (), "size-0": (3, 0, 2), "1-d": (7,), "2-d": (3, 5), "32-d": (1,) * 31 + (2,)}


def _values(dtype: str, shape: tuple[int, ...]) -> memarray.MemArray:
    n = int(np.prod(shape, dtype=np.int64))
    raw = np.random.default_rng(len(shape) * 31 + len(dtype)).integers(0, 250, max(n, 1))
    if dtype == "bfloat16":
        a = memarray.zeros(shape, "bfloat16")
        if n:
            a.read_numpy_array(raw[:n].astype(np.float32).reshape(shape))
        return a
    return memarray.asarray(raw[:n].astype(dtype).reshape(shape))


def _same(a: memarray.MemArray, b: memarray.MemArray) -> bool:
    x, y = a.to_numpy(), b.to_numpy()
    return str(a.dtype) == str(b.dtype) and x.shape == y.shape and x.tobytes() == y.tobytes()


# ---------------------------------------------------------------- in this process


def test_sizeof_is_the_arrays_bytes():
    for dtype in ("bool", "float16", "complex128"):
        a = memarray.zeros((1000, 3), dtype)
        assert sizeof(a) == a.nbytes == 3000 * np.dtype(dtype).itemsize
    assert sizeof(memarray.zeros((0,), "float64")) == 0


def test_tokens_are_deterministic_and_change_with_any_write():
    a = memarray.asarray(np.arange(1000, dtype=np.float64))
    t = tokenize(a)
    assert tokenize(a) == t, "an unchanged array keeps its token"
    np.asarray(a)[10] = -1  # a write through a NumPy view
    t2 = tokenize(a)
    assert t2 != t
    a.read_numpy_array(np.arange(1000, dtype=np.float64))  # back to the first values
    assert tokenize(a) == t, "the token is the data's"
    a[5] = 3.5
    assert tokenize(a) != t
    # Same bytes, another layout or dtype: another token.
    b = memarray.asarray(np.zeros(8, np.uint8))
    assert tokenize(b) != tokenize(memarray.asarray(np.zeros((2, 4), np.uint8)))
    assert tokenize(b) != tokenize(memarray.asarray(np.zeros(8, np.int8)))
    assert tokenize(memarray.zeros((0,), "float32")) == tokenize(memarray.zeros((0,), "float32"))


@pytest.mark.parametrize("dtype", memarray.SUPPORTED_DTYPES)
def test_the_dask_family_round_trips_every_dtype_and_shape_class(dtype):
    for shape in SHAPES.values():
        a = _values(dtype, shape)
        header, frames = serialize(a, serializers=["dask"])
        assert header["serializer"] == "dask"
        b = deserialize(header, frames)
        assert isinstance(b, memarray.MemArray) and _same(a, b), (dtype, shape)
        if b.nbytes and dtype != "bfloat16":
            np.asarray(b).reshape(-1)[0] = 1  # writable on receipt
        # Read-only frames (bytes, as a socket delivers them) land writable too.
        c = deserialize(header, [bytes(f) for f in frames])
        assert _same(a, c)


def test_the_cuda_family_refuses_host_arrays_so_distributed_uses_the_next():
    a = memarray.asarray(np.arange(6, dtype=np.int16))
    with pytest.raises(NotImplementedError, match="travels as host frames"):
        mdask.cuda_serialize(a)
    header, frames = serialize(a, serializers=["cuda", "dask"])
    assert header["serializer"] == "dask"
    assert _same(a, deserialize(header, frames))


def test_corrupt_or_truncated_frames_are_clear_errors_never_crashes():
    # In a child: a crash there fails this test instead of ending the run.
    code = textwrap.dedent(
        """
        import json, numpy as np, memarray, memarray.dask as md
        from distributed.protocol import serialize, deserialize
        a = memarray.asarray(np.arange(24, dtype=np.float32).reshape(4, 6))
        h, f = serialize(a, serializers=["dask"])
        sub = h["sub-header"] if "sub-header" in h else h
        cases = {
            "truncated": (h, [bytes(f[0])[:-1]]),
            "longer": (h, [bytes(f[0]) + b"x"]),
            "empty": (h, [b""]),
            "two frames": (h, [f[0], f[0]]),
            "no frames": (h, []),
        }
        bad = {"dtype": "float128", "shape": [-1, 6], "shape_type": "x",
               "ndim": [1] * 33, "device_id": -3}
        out = {}
        for name, (hh, ff) in cases.items():
            try:
                deserialize(hh, ff)
                out[name] = "accepted"
            except Exception as e:
                out[name] = type(e).__name__
        good = md.serialize(a)[0]
        for name, value in bad.items():
            hh = dict(good)
            if name == "ndim":
                hh["shape"] = value
            elif name == "shape_type":
                hh["shape"] = value
            else:
                hh[name] = value
            try:
                md.deserialize(hh, [bytes(f[0])])
                out[name] = "accepted"
            except Exception as e:
                out[name] = type(e).__name__
        for name, hh in {"not a dict": [1, 2], "missing keys": {"dtype": "float32"}}.items():
            try:
                md.deserialize(hh, [bytes(f[0])])
                out[name] = "accepted"
            except Exception as e:
                out[name] = type(e).__name__
        print(json.dumps(out))
        """
    )
    out = json.loads(child_stdout(code).strip().splitlines()[-1])
    assert all(v == "ValueError" for v in out.values()), out


FORGED_FRAMES = """
import json, numpy as np, memarray, memarray.dask as md

class Frame:
    # A device frame as the transport hands it over; only its interface is read before
    # the checks pass.
    def __init__(self, **cai):
        self.__cuda_array_interface__ = dict(
            {"version": 3, "shape": (96,), "typestr": "|u1", "data": (1 << 40, False),
             "strides": None, "stream": None}, **cai)

good = {"dtype": "float64", "shape": [12], "typestr": "<f8", "nbytes": 96}
cuda_cases = {
    "bool header viewed as float64": (
        {"dtype": "bool", "shape": [96], "typestr": "<f8", "nbytes": 96}, Frame()),
    "bool header, 768 bytes claimed": (
        {"dtype": "bool", "shape": [96], "typestr": "<f8", "nbytes": 768}, Frame()),
    "broadcast frame (1 byte of memory)": (good, Frame(strides=(0,))),
    "stepped frame": (good, Frame(shape=(48,), strides=(2,))),
    "frame smaller than nbytes": (good, Frame(shape=(95,))),
    "dtype as np.dtype": (dict(good, dtype=np.dtype("float64")), Frame()),
    "str shape in the frame": (good, Frame(shape="96")),
    "int shape in the frame": (good, Frame(shape=96)),
    "unknown typestr": (good, Frame(typestr="<q9")),
    "non-tuple data": (good, Frame(data=[1 << 40, False])),
    "nbytes disagrees": (dict(good, nbytes=8), Frame()),
    "bfloat16": ({"dtype": "bfloat16", "shape": [48], "typestr": "<V2", "nbytes": 96}, Frame()),
    "no interface": (good, object()),
}
host = memarray.asarray(np.arange(6.0))
h, f = md.serialize(host)
host_cases = {
    "host_memory 5": (dict(h, host_memory=5), f),
    "host_memory bytes": (dict(h, host_memory=b"pageable"), f),
    "2-d non-contiguous frame": (h, [np.arange(24.0).reshape(4, 6)[:, ::4]]),
    "dtype as np.dtype": (dict(h, dtype=np.dtype("float64")), f),
    "nbytes disagrees": (dict(h, nbytes=47), f),
    "frame not a buffer": (h, [object()]),
}
out = {}
for family, fn, cases in (("cuda", md.cuda_deserialize, cuda_cases),
                          ("dask", md.deserialize, host_cases)):
    for name, (hh, frame) in cases.items():
        try:
            fn(hh, frame if isinstance(frame, list) else [frame])
            out[family + ": " + name] = "accepted"
        except ValueError as e:
            out[family + ": " + name] = "ValueError" + (" nbytes" if "nbytes" in str(e) else "")
        except Exception as e:
            out[family + ": " + name] = type(e).__name__ + ": " + str(e)
print(json.dumps(out))
"""


def test_forged_dask_frames_and_headers_are_value_errors_before_any_view():
    out = json.loads(child_stdout(FORGED_FRAMES).strip().splitlines()[-1])
    assert all(v.startswith("ValueError") for v in out.values()), out
    for name in (
        "cuda: nbytes disagrees",
        "cuda: frame smaller than nbytes",
        "dask: nbytes disagrees",
        "cuda: bool header, 768 bytes claimed",
    ):
        assert out[name] == "ValueError nbytes", out


@pytest.mark.gpu
def test_cuda_frames_are_viewed_within_their_own_bytes_and_flags():
    # A pooled frame: viewing past it would read a neighbour's bytes.
    out = child_stdout(
        """
import json, numpy as np, memarray, memarray.dask as md
from memarray.cuda import _Memory
res = {}
frame = memarray.asarray(np.arange(96, dtype=np.uint8), device="cuda")
ptr = frame.__cuda_array_interface__["data"][0]
for name, hh, fr in (
    ("bool as f8", {"dtype": "bool", "shape": [96], "typestr": "<f8", "nbytes": 96}, frame),
    ("broadcast", {"dtype": "uint8", "shape": [96], "typestr": "|u1", "nbytes": 96},
     type("F", (), {"__cuda_array_interface__": {"version": 3, "shape": (96,), "typestr": "|u1",
      "data": (ptr, False), "strides": (0,), "stream": None}})()),
):
    try:
        md.cuda_deserialize(hh, [fr])
        res[name] = "accepted"
    except ValueError:
        res[name] = "ValueError"
# A read-only frame arrives as a copy: the sender's bytes cannot be written through it.
ro = _Memory(frame, ptr, (96,), "|u1", read_only=True)
c = md.cuda_deserialize({"dtype": "uint8", "shape": [96], "typestr": "|u1", "nbytes": 96}, [ro])
c[0] = 200
res["read-only copied"] = [c.__cuda_array_interface__["data"][0] != ptr,
                           int(frame.to_numpy()[0]) == 0, int(c.to_numpy()[0]) == 200]
# An honest frame is still shared zero-copy.
d = md.cuda_deserialize({"dtype": "uint8", "shape": [96], "typestr": "|u1", "nbytes": 96}, [frame])
res["honest shared"] = d.__cuda_array_interface__["data"][0] == ptr
print(json.dumps(res))
"""
    )
    r = json.loads(out.strip().splitlines()[-1])
    assert r == {
        "bool as f8": "ValueError",
        "broadcast": "ValueError",
        "read-only copied": [True, True, True],
        "honest shared": True,
    }, r


def test_registration_happens_in_either_import_order():
    for first, then in (("memarray", "dask"), ("dask", "memarray"), ("distributed", "memarray")):
        out = child_stdout(
            f"""
import sys
import {first}
import {then}
import numpy as np, memarray
from dask.sizeof import sizeof
assert "distributed" not in sys.modules or "{first}" == "distributed"
a = memarray.zeros((10, 10), "float64")
import distributed.protocol as dp
h, f = dp.serialize(a, serializers=["dask"])
print(sizeof(a), h["serializer"])
"""
        )
        assert out.split() == ["800", "dask"], (first, then, out)


def test_dask_cuda_leaves_memarrays_to_memarrays_spilling():
    # dask-cuda itself needs CUDA packages; its dispatcher module is what memarray
    # registers with, so a copy of that module (as dask-cuda 26.10 ships it) stands in.
    code = """
import os, sys, tempfile, types
d = tempfile.mkdtemp()
os.makedirs(os.path.join(d, "dask_cuda"))
open(os.path.join(d, "dask_cuda", "__init__.py"), "w").close()
open(os.path.join(d, "dask_cuda", "is_spillable_object.py"), "w").write(
    "from dask.utils import Dispatch\\n"
    "is_spillable_object = Dispatch(name='is_spillable_object')\\n"
    "@is_spillable_object.register(object)\\n"
    "def _(o):\\n    return False\\n")
sys.path.insert(0, d)
import memarray, numpy as np
from dask_cuda.is_spillable_object import is_spillable_object
import memarray.dask as md
a = memarray.zeros((4,), "float32")
print(is_spillable_object(a), is_spillable_object(np.zeros(4)))
md.spill.settings = lambda device: {"device_budget": 1}
class Dev:
    on_device = True
    device_id = 0
print(md.spilling_handles(Dev()))
"""
    assert child_stdout(code).split() == ["False", "False", "True"]


def test_setup_checks_its_settings_before_any_worker_changes():
    class NoClient:
        def register_plugin(self, *a, **k):
            raise AssertionError("reached the workers")

    for kwargs, match in (
        ({"device_budget": "lots"}, "device_budget"),
        ({"host_budget": -1}, "host_budget"),
        ({"resource": "fast"}, "resource must be one of"),
        ({"hooks": ["jax"]}, "hooks are"),
    ):
        with pytest.raises((ValueError, TypeError, OverflowError), match=match):
            mdask.setup(NoClient(), **kwargs)


def test_each_worker_serves_a_gpu_by_its_setting_its_name_or_its_one_device():
    from memarray.cluster.dask._worker import worker_gpu

    assert worker_gpu(0, 1, None) == (0, "the one device this worker sees")
    assert worker_gpu(5, 1, None)[0] == 0
    assert [worker_gpu(i, 4, None)[0] for i in range(6)] == [0, 1, 2, 3, 0, 1]
    assert worker_gpu(3, 2, 0) == (0, "MEMARRAY_DASK_DEVICE=0")
    assert worker_gpu(0, 2, None) == (0, "worker 0 of a cluster on 2 devices")
    d, why = worker_gpu("tcp://10.0.0.3:4000", 8, None)
    assert d == 0 and "not a number" in why and "CUDA_VISIBLE_DEVICES" in why
    assert worker_gpu(True, 2, None)[0] == 0 and "not a number" in worker_gpu(True, 2, None)[1]
    with pytest.raises(ValueError, match="sees 2 device"):
        worker_gpu(0, 2, 2)


# ---------------------------------------------------------------- worker processes


CLUSTER = """
import json, os, numpy as np, memarray, memarray.dask as md
from distributed import Client, LocalCluster
if __name__ == "__main__":
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None, preload=["memarray.dask"]) as cluster, \\
            Client(cluster) as client:
        out = {}
BODY
        print(json.dumps(out))
"""


def _cluster(body: str, env: dict | None = None, timeout: int = 240) -> dict:
    """Runs `body` in a child with a LocalCluster of two worker processes (TCP) and a
    client; `out`, a dict the body fills, comes back."""
    code = CLUSTER.replace("BODY", textwrap.indent(textwrap.dedent(body), " " * 8))
    r = run_child(code, env=dict(os.environ, **(env or {})), timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_local_cluster_moves_every_dtype_and_shape_class_between_workers():
    out = _cluster(
        """
        workers = list(client.scheduler_info()["workers"])
        out["workers"] = len(workers)
        out["preloaded"] = sorted(str(v["devices"]) for v in client.run(
            lambda dask_worker: dask_worker.memarray).values())
        results = {}
        for dtype in memarray.SUPPORTED_DTYPES:
            for name, shape in {"0-d": (), "size-0": (2, 0), "2-d": (3, 4),
                                "32-d": (1,) * 31 + (2,)}.items():
                n = int(np.prod(shape, dtype=np.int64))
                x = (np.arange(n) % 7).astype("float32").reshape(shape)
                a = memarray.zeros(shape, dtype)
                if n:
                    a.read_numpy_array(x)
                # Made on worker 0, used on worker 1 (a worker-to-worker transfer), back
                # to the client.
                f = client.scatter(a, workers=[workers[0]])
                g = client.submit(lambda v: v, f, workers=[workers[1]], pure=False)
                b = g.result()
                same = (isinstance(b, memarray.MemArray) and str(b.dtype) == dtype
                        and tuple(b.shape) == shape
                        and b.to_numpy().tobytes() == a.to_numpy().tobytes())
                results[f"{dtype} {name}"] = same
        out["bad"] = [k for k, v in results.items() if not v]
        out["checked"] = len(results)
        # A Bundle the same way: its pack and table (the serializers it registers).
        bundle = memarray.Bundle([memarray.full((3,), i, "float32") for i in range(20)])
        [f] = client.scatter([bundle], workers=[workers[0]])
        g = client.submit(lambda v: (type(v).__name__, [float(a[0]) for a in v]), f,
                          workers=[workers[1]], pure=False)
        out["bundle"] = g.result()
        stats = md.statistics(client)
        out["stats"] = sorted(stats[w]["pressure"]["events"] for w in stats)
        """
    )
    assert out["workers"] == 2 and out["bad"] == [], out
    assert out["checked"] == 4 * len(memarray.SUPPORTED_DTYPES)
    assert out["bundle"] == ["Bundle", [float(i) for i in range(20)]], out["bundle"]
    assert out["stats"] == [0, 0]


DASHBOARD = """
import json, time, urllib.request
import memarray, memarray.dask as md
from distributed import Client, LocalCluster
if __name__ == "__main__":
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        out = {}
        try:
            md.setup(client, dashboard="yes")
        except TypeError as e:
            out["refused"] = str(e)
        md.setup(client, dashboard=True)
        def hold():
            # On the worker's first frame: cuda:0 where there is a device, else the host.
            import builtins
            from memarray import cuda, resources as r
            gpu = cuda.is_available()
            builtins._held = (r.Device(0) if gpu else r.Host()).allocate(3 << 20, source="torch")
            r.set_budget("torch", "8MiB", device=0 if gpu else "host")
        client.run(hold)
        link = cluster.dashboard_link.rsplit("/", 1)[0]
        data = {}
        for _ in range(100):  # the next heartbeats, then the scheduler's next samples
            data = json.loads(urllib.request.urlopen(link + "/memarray.json").read())
            if any(w["samples"] >= 2 for w in data.values()):
                break
            time.sleep(0.2)
        out["data"] = data
        out["page"] = urllib.request.urlopen(link + "/memarray").read().decode()
        out["worker"] = list(client.scheduler_info()["workers"])[0]
        print(json.dumps(out))
"""


def test_the_dashboard_page_shows_each_workers_figures_over_time():
    r = run_child(DASHBOARD, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert "dashboard must be True or False" in out["refused"], out
    last = out["data"][out["worker"]]["last"]
    frame = last["frames"][0]
    bands = dict(frame["bands"])
    assert bands.get("torch", 0) >= 3 << 20, frame
    assert [b for b in last["budgets"] if b["source"] == "torch"][0]["budget"] == 8 << 20
    assert out["data"][out["worker"]]["samples"] >= 2, out["data"]
    page = out["page"]
    assert out["worker"] in page and "torch" in page, page[:2000]
    assert "of its budget 8.0 MiB" in page and "<svg" in page, page[:2000]
    assert "http-equiv='refresh'" in page and "<script" not in page


def test_a_worker_killed_mid_computation_is_a_clear_error_and_loses_nothing_gathered():
    out = _cluster(
        """
        import time
        from distributed import KilledWorker
        workers = list(client.scheduler_info()["workers"])
        kept = client.gather(client.map(
            lambda i: memarray.asarray(np.full(1000, i, np.int64)), range(6)))
        def die(x):
            if x == 3:
                os._exit(1)
            time.sleep(0.2)
            return memarray.asarray(np.arange(5) * x)
        # allowed_failures=0: the first death is the task's failure, not a retry.
        futures = client.map(die, range(6), pure=False)
        try:
            client.gather(futures)
            out["error"] = None
        except Exception as e:
            out["error"] = type(e).__name__
            out["message"] = str(e)[:200]
        out["kept"] = [int(k.to_numpy()[0]) for k in kept]
        out["kept_ok"] = all(isinstance(k, memarray.MemArray) and k.nbytes == 8000 for k in kept)
        """,
        # The first death is the task's failure, not a retry on the other worker.
        env={"DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "0"},
    )
    assert out["error"] == "KilledWorker", out
    assert "die" in out["message"], out
    assert out["kept"] == list(range(6)) and out["kept_ok"], out


def test_setup_reaches_every_worker_and_statistics_gather_them():
    out = _cluster(
        """
        import contextlib, io
        import memarray._progress as progress
        progress.AFTER = 0.0  # the bar at once (in a session: after a second)
        memarray.set_progress(True)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            done = md.setup(client, resource="pool", hooks=[])
        out["bar"] = err.getvalue()
        out["done"] = sorted(v["devices"] for v in done.values())
        # Each worker's tasks use its GPU: "cuda" in a task thread is the worker's device.
        if memarray.cuda.is_available():
            out["gpu"] = {w: v["device"] for w, v in done.items()}
            out["task_gpu"] = {w: client.submit(lambda: memarray.cuda.current_device(),
                                                workers=[w], pure=False).result() for w in done}
        out["keys"] = sorted(next(iter(md.statistics(client).values())))
        """
    )
    assert len(out["done"]) == 2 and out["keys"] == ["devices", "pressure"], out
    # Checked, then set up, on both workers: four worker steps.
    assert "memarray on 2 workers" in out["bar"] and "4/4" in out["bar"], out["bar"]
    if memarray.cuda.is_available():
        n = memarray.cuda.device_count()
        assert sorted(out["gpu"].values()) == sorted(i % n for i in range(2)), out
        assert out["task_gpu"] == out["gpu"], out


def test_setup_with_a_spill_dir_no_worker_has_changes_no_worker(tmp_path):
    out = _cluster(
        f"""
        before = client.run(lambda dask_worker: dask_worker.memarray)
        try:
            md.setup(client, spill_dir="/nonexistent/memarray-spill")
            out["error"] = None
        except ValueError as e:
            out["error"] = str(e)
        out["unchanged"] = client.run(lambda dask_worker: dask_worker.memarray) == before
        out["plugins"] = sorted(client.run(lambda dask_worker: list(dask_worker.plugins)).values())
        done = md.setup(client, spill_dir={str(tmp_path)!r})
        out["done"] = sorted(str(v.get("spill", "skipped")) for v in done.values())
        """
    )
    assert out["error"] and "changed no worker" in out["error"], out
    assert "/nonexistent/memarray-spill" in out["error"] and out["unchanged"], out
    assert all("memarray" not in p for p in out["plugins"]), out
    assert len(out["done"]) == 2, out


def test_a_worker_checks_everything_before_changing_anything(tmp_path):
    from memarray.cluster.dask._worker import _check

    _check({"spill": True, "spill_dir": str(tmp_path), "hooks": []})
    for settings, match in (
        ({"spill": True, "spill_dir": str(tmp_path / "missing")}, "not a directory"),
        ({"hooks": ["no-such-hook"]}, "hooks are"),
    ):
        with pytest.raises(ValueError, match=match):
            _check(settings)
    f = tmp_path / "a-file"
    f.write_text("")
    with pytest.raises(ValueError, match="not a directory"):
        _check({"spill": True, "spill_dir": str(f)})


def test_the_pipeline_example_matches_numpy():
    import sys

    root = os.path.join(os.path.dirname(__file__), "..", "..")
    args = [] if memarray.cuda.is_available() else ["--chunks", "8", "--particles", "100000"]
    r = run_command(
        [sys.executable, "examples/dask_pipeline.py", *args],
        cwd=root,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "matches NumPy" in r.stdout, r.stdout
    if memarray.cuda.is_available():
        spilled = int(r.stdout.split("arrays spilled on the workers: ")[1].split()[0])
        assert spilled > 0, r.stdout


# ---------------------------------------------------------------- the GPU machine


@pytest.mark.gpu
def test_device_arrays_both_families_side_stream_work_arrives_complete():
    _peer("cupy")
    out = child_stdout(
        """
import json, numpy as np, cupy, memarray, memarray.cuda as mc, memarray.dask as md
from distributed.protocol import serialize, deserialize
from dask.base import tokenize
from dask.sizeof import sizeof
res = {}
n = 1 << 26                                   # 256 MiB of float32
a = memarray.zeros((n,), "float32", device="cuda")
res["sizeof"] = sizeof(a) == 4 * n
import time
t0 = time.perf_counter(); t = tokenize(a); t1 = time.perf_counter()
res["token_ms"] = (t1 - t0) * 1e3
t0 = time.perf_counter(); t = tokenize(a); res["token_warm_ms"] = (time.perf_counter() - t0) * 1e3
res["token_same"] = tokenize(a) == t
# Written on a side stream, no sync: every family must see the write.
s = cupy.cuda.Stream(non_blocking=True)
with s:
    cupy.from_dlpack(a)[:] = 3.0             # queued on s
a.record_stream(s.ptr)
res["token_changed"] = tokenize(a) != t
for fam in ("dask", "cuda"):
    b = memarray.zeros((1 << 20,), "float32", device="cuda")
    with s:
        cupy.from_dlpack(b)[:] = 5.0
    b.record_stream(s.ptr)
    h, f = serialize(b, serializers=[fam])
    c = deserialize(h, f)
    res[fam] = [h["serializer"], c.device, float(c.to_numpy().min()), float(c.to_numpy().max())]
# A spilled array travels from its host copy and stays spilled.
import memarray.spill as sp
sp.enable(0)
y = memarray.asarray(np.arange(1 << 16, dtype=np.float64), device="cuda")
sp.evict(y)
h, f = serialize(y, serializers=["cuda", "dask"])
z = deserialize(h, f)
res["spilled"] = [h["serializer"], y.spilled, z.device,
                  bool((z.to_numpy() == np.arange(1 << 16)).all())]
sp.disable(0)
# Foreign device frames into memarray zero-copy: CuPy memory.
x = cupy.arange(12, dtype=cupy.float64)
h, f = md.cuda_serialize(memarray.from_dlpack(x))
c = md.cuda_deserialize(h, [x])
res["foreign"] = [c.__cuda_array_interface__["data"][0] == x.data.ptr,
                  c.to_numpy().tolist() == list(range(12))]
print(json.dumps(res))
"""
    )
    r = json.loads(out.strip().splitlines()[-1])
    assert r["sizeof"] and r["token_same"] and r["token_changed"], r
    assert r["token_warm_ms"] < 50, r  # a kernel over 256 MiB, no copy back
    assert r["dask"] == ["dask", "cuda:0", 5.0, 5.0], r
    assert r["cuda"] == ["cuda", "cuda:0", 5.0, 5.0], r
    assert r["foreign"] == [True, True], r
    assert r["spilled"] == ["dask", True, "cuda:0", True], r


@pytest.mark.gpu
def test_workers_spill_on_the_gpu_they_serve_under_a_budget_and_move_device_arrays():
    # Any number of GPUs: each worker serves the device setup chose for it (on two GPUs a
    # LocalCluster's worker may serve cuda:1), and its spilling shows on that device.
    out = _cluster(
        """
        done = md.setup(client, device_budget="64MiB")
        out["devices"] = sorted(v["devices"] for v in done.values())
        workers = list(client.scheduler_info()["workers"])
        served = done[workers[0]]["device"]
        out["served"] = served
        def make(i):
            import memarray
            return memarray.asarray(np.full(4 << 20, i, np.float32), device="cuda")
        # 24 arrays of 16 MiB on worker 0 under a 64 MiB budget: most spill.
        fs = [client.submit(make, i, workers=[workers[0]], pure=False) for i in range(24)]
        from distributed import wait
        wait(fs)
        stats = md.statistics(client)[workers[0]]["devices"]
        out["spilled"] = stats[served]["spill"]["spilled_arrays"]
        out["made_on"] = client.submit(lambda a: a.device_id, fs[0], workers=[workers[0]],
                                       pure=False).result()
        # Used on worker 1: each arrives on the device, from its host copy if spilled.
        got = client.gather([client.submit(lambda a: (a.device, float(a.to_numpy()[7])), f,
                                           workers=[workers[1]], pure=False) for f in fs])
        out["got"] = got
        """,
    )
    assert out["devices"] == [1, 1] or min(out["devices"]) >= 1, out
    assert out["made_on"] == out["served"], out
    assert out["spilled"] > 0, out
    assert [g[1] for g in out["got"]] == [float(i) for i in range(24)], out
    assert all(g[0].startswith("cuda") for g in out["got"]), out
