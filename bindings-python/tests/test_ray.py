"""MemArrays in Ray: objects (ray.put, task and actor arguments and returns) for every dtype
and shape class, the ``"memarray"`` tensor transport between actors and to the driver (its
object-store way on the host here; CUDA IPC between actors on the GPU machine), many small
arrays in one object, a killed sender, and registration in either import order. Each case
runs in a child interpreter with its own Ray instance, so a crash fails the test."""

from __future__ import annotations

import json
import os
import textwrap

import pytest
from children import child_stdout, run_child, run_command

import memarray
from conftest import two_gpus

# CI installs Ray (MEMARRAY_REQUIRE_RAY=1 there and on the GPU machine: missing is a failure).
try:
    import ray  # noqa: F401
except ImportError:
    if os.environ.get("MEMARRAY_REQUIRE_RAY") == "1":
        raise
    pytest.skip("SKIPPED: ray is not installed", allow_module_level=True)

HEADER = """
import json, os, time
import numpy as np
import ray
import memarray, memarray.ray as mray

ray.init(num_cpus=2, num_gpus=NUM_GPUS, include_dashboard=False, log_to_driver=False)
out = {}

def values(dtype, shape):
    n = int(np.prod(shape, dtype=np.int64))
    x = (np.arange(n) % 7 + 1).astype("float32").reshape(shape)
    a = memarray.zeros(shape, dtype)
    if n:
        a.read_numpy_array(x)
    return a

def same(a, b):
    return (isinstance(b, memarray.MemArray) and str(a.dtype) == str(b.dtype)
            and tuple(a.shape) == tuple(b.shape)
            and a.to_numpy().tobytes() == b.to_numpy().tobytes())

try:
BODY
finally:
    print(json.dumps(out, default=str))
    ray.shutdown()
"""

SHAPES = {"0-d": (), "size-0": (2, 0), "1-d": (5,), "2-d": (3, 4), "32-d": (1,) * 31 + (2,)}


def _ray(body: str, gpus: int = 0, timeout: int = 300, **env_extra: str) -> dict:
    """Runs `body` in a child with a fresh Ray instance (and `env_extra` in its
    environment); `out`, a dict the body fills, comes back."""
    code = HEADER.replace("NUM_GPUS", str(gpus)).replace(
        "BODY", textwrap.indent(textwrap.dedent(body), " " * 4)
    )
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", **env_extra)
    r = run_child(code, env=env, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_registration_happens_in_either_import_order():
    for first, then in (("memarray", "ray"), ("ray", "memarray")):
        out = child_stdout(
            f"""
import {first}
import {then}
from ray.experimental.rdt import util
info = util.transport_manager_info["MEMARRAY"]
nccl = util.transport_manager_info["MEMARRAY_NCCL"]
import memarray.ray
print(info.transport_manager_class is memarray.ray.MemArrayTransport,
      info.data_type is memarray.MemArray, sorted(info.devices),
      nccl.transport_manager_class is memarray.ray.MemArrayNcclTransport,
      nccl.data_type is memarray.MemArray, nccl.devices)
"""
        )
        assert out.split() == ["True", "True", "['cpu',", "'cuda']", "True", "True", "['cuda']"], (
            first,
            then,
            out,
        )
    # memarray.ray first: its own `import ray` finishes Ray's import while it executes;
    # registration still happens once, with no warning.
    out = child_stdout(
        """
import warnings
warnings.simplefilter("error")
import memarray.ray
from ray.experimental.rdt import util
print(util.transport_manager_info["MEMARRAY"].transport_manager_class.__name__)
"""
    )
    assert out.split() == ["MemArrayTransport"], out


def test_objects_carry_every_dtype_and_shape_class():
    out = _ray(
        f"""
        SHAPES = {SHAPES!r}
        @ray.remote
        def echo(x):
            return x

        bad = []
        for dtype in memarray.SUPPORTED_DTYPES:
            for name, shape in SHAPES.items():
                a = values(dtype, shape)
                if not same(a, ray.get(ray.put(a))):
                    bad.append(f"put {{dtype}} {{name}}")
                if not same(a, ray.get(echo.remote(a))):
                    bad.append(f"task {{dtype}} {{name}}")
        out["bad"] = bad
        # The receiver's array is its own and writable (the store's bytes are immutable).
        b = ray.get(ray.put(memarray.asarray(np.arange(6.0))))
        np.asarray(b)[0] = 7.0
        out["written"] = float(b.to_numpy()[0])
        # Host bytes go out of band: a 64 MiB array is not pickled in band.
        big = memarray.asarray(np.ones(8 << 20))
        ref = ray.put(big)
        out["big_same"] = same(big, ray.get(ref))
        """
    )
    assert out["bad"] == [], out
    assert out["written"] == 7.0 and out["big_same"], out


def test_phases_keep_the_last_samples_of_each_timed_phase_and_reset():
    out = child_stdout(
        """
import memarray.ray as mray
from memarray.cluster.ray import _counts
for i in range(300):
    _counts.count("store", 1, store_s=float(i))
_counts.add(peer_refused=1, nccl_wait_s=2.5)
p = mray.phases()
print(len(p["store_s"]), p["store_s"][0], p["store_s"][-1], p["nccl_wait_s"],
      "peer_refused" in p, mray.statistics()["store_s"] == sum(range(300)),
      mray.phases(reset=True) == p, mray.phases())
"""
    )
    assert out.split() == ["256", "44.0", "299.0", "[2.5]", "False", "True", "True", "{}"], out


def test_a_packs_tensor_meta_reads_its_table_and_pickles_it_once():
    out = child_stdout(
        """
import pickle
from ray import cloudpickle
import memarray
from memarray.cluster.ray import MemArrayTransportMetadata, _base
parts = [memarray.zeros((n, 2), "int16") for n in range(1, 6)] + [memarray.zeros((), "float64")]
pack, table = memarray._memarray._pack(parts)
tm = _base.TensorMeta(table)
want = [(tuple(p.shape), p._dtype_name) for p in parts]
assert len(tm) == 6 and bool(tm) and list(tm) == want and tm[-1] == ((), "float64"), list(tm)
assert tm[1:3] == want[1:3] and tm == want
meta = MemArrayTransportMetadata(tensor_meta=tm, tensor_device="cuda", packed=table)
data = cloudpickle.dumps(meta)
back = cloudpickle.loads(data)
assert back.tensor_meta == want and back.packed == table
assert back.tensor_meta._table is back.packed, "the table pickled once"
big = memarray._memarray._pack([memarray.zeros((4,), "float32")] * 1000)[1]
with_list = MemArrayTransportMetadata(
    tensor_meta=list(_base.TensorMeta(big)), tensor_device="cuda", packed=big)
with_view = MemArrayTransportMetadata(
    tensor_meta=_base.TensorMeta(big), tensor_device="cuda", packed=big)
view, listed, alone = (len(cloudpickle.dumps(m)) for m in (with_view, with_list, big))
print(view < listed, view < alone + 2000, view, listed, alone)
"""
    )
    assert out.split()[:2] == ["True", "True"], out


def test_the_transport_delivers_the_right_arrays_after_ray_restarts_in_the_process():
    # The driver finds what a transport received through the worker's serialization context
    # of the current job: a second ray.init in the same process makes new contexts under
    # the same job id, whose arrays must not be the first's (a lookup cached per job id
    # failed here).
    out = _ray(
        """
        def run(k):
            @ray.remote(enable_tensor_transport=True)
            class Sender:
                @ray.method(tensor_transport="memarray")
                def many(self, n, k):
                    return [memarray.asarray(np.full(4, 10 * k + i, np.int64))
                            for i in range(n)]
            s = Sender.remote()
            # From the second object on, the sender's arrays travel through memarray's
            # serializer, whose receiving side looks the received arrays up.
            return [[int(a.to_numpy()[0]) for a in ray.get(s.many.remote(3, k))]
                    for _ in range(3)]

        out["first"] = run(1)
        ray.shutdown()
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        out["second"] = run(2)
        """
    )
    assert out["first"] == [[10, 11, 12]] * 3 and out["second"] == [[20, 21, 22]] * 3, out


def test_the_transport_moves_host_arrays_actor_to_actor_and_to_the_driver():
    out = _ray(
        f"""
        SHAPES = {SHAPES!r}
        @ray.remote(enable_tensor_transport=True)
        class Sender:
            @ray.method(tensor_transport="memarray")
            def make(self, dtype, shape):
                return values(dtype, shape)
            @ray.method(tensor_transport="memarray")
            def many(self, n):
                return [memarray.asarray(np.full(512, i, np.float64)) for i in range(n)]
            def plain(self):
                return values("float32", (3, 4))
            def reducer(self):
                from ray import cloudpickle
                fn, _ = cloudpickle.CloudPickler.dispatch[memarray.MemArray](memarray.zeros(3))
                return fn.__module__ + "." + fn.__name__

        @ray.remote(enable_tensor_transport=True)  # a receiver needs Ray's transfer thread
        class Receiver:
            def digest(self, x):
                arrays = x if isinstance(x, list) else [x]
                return ([a.to_numpy().tobytes().hex() for a in arrays],
                        mray.statistics())
            def count(self, x):
                return len(x), float(sum(float(a.to_numpy()[0]) for a in x))

        s, r = Sender.remote(), Receiver.remote()
        bad = []
        for dtype in memarray.SUPPORTED_DTYPES:
            for name, shape in SHAPES.items():
                ref = s.make.remote(dtype, shape)
                want = values(dtype, shape)
                hexes, _ = ray.get(r.digest.remote(ref))
                got = ray.get(ref)  # the driver's own fetch
                if hexes != [want.to_numpy().tobytes().hex()] or not same(want, got):
                    bad.append(f"{{dtype}} {{name}}")
        out["bad"] = bad
        _, stats = ray.get(r.digest.remote(s.make.remote("float32", (3,))))
        out["receiver_stats"] = stats
        out["driver_stats"] = mray.statistics()
        # After its transport sends, the actor's plain MemArray returns go out of band
        # through memarray's serializer (Ray's would pickle them in band).
        out["reducer"] = ray.get(s.reducer.remote())
        out["plain_same"] = same(values("float32", (3, 4)), ray.get(s.plain.remote()))
        # 1,000 arrays of 4 KiB in one object, actor to actor.
        ray.get(r.count.remote(s.many.remote(1000)))  # warm
        times = []
        for _ in range(5):
            t = time.perf_counter()
            n, total = ray.get(r.count.remote(s.many.remote(1000)))
            times.append(time.perf_counter() - t)
        out["many"] = [n, total]
        out["many_ms"] = sorted(times)[2] * 1e3
        """
    )
    assert out["bad"] == [], out
    n = len(memarray.SUPPORTED_DTYPES) * len(SHAPES)
    # Host arrays come through the sending actor and the object store, never by IPC.
    assert out["receiver_stats"]["store_objects"] == n + 1, out
    assert out["receiver_stats"]["ipc_objects"] == 0, out
    assert out["driver_stats"]["store_objects"] == n, out
    assert out["many"] == [1000, float(sum(range(1000)))], out
    assert out["reducer"] == "memarray.cluster.ray._deserialize", out
    assert out["plain_same"], out
    print(f"1,000 host arrays of 4 KiB actor to actor: {out['many_ms']:.1f} ms")


def test_a_bundle_is_one_array_for_ray_and_gives_every_array_back():
    out = _ray(
        f"""
        SHAPES = {SHAPES!r}
        parts = [values(d, shape) for d in memarray.SUPPORTED_DTYPES for shape in SHAPES.values()]
        b = mray.Bundle(parts)
        out["len"], out["repr"] = len(b), repr(b)
        out["slice"] = len(b[1:4]) == 3 and same(parts[-1], b[-1])

        @ray.remote(enable_tensor_transport=True)
        class Sender:
            @ray.method(tensor_transport="memarray")
            def by_transport(self):
                return b
            def as_object(self):
                return b

        @ray.remote(enable_tensor_transport=True)
        class Receiver:
            def check(self, x):
                return (type(x).__name__, [same(p, a) for p, a in zip(parts, x)],
                        mray.statistics())

        s, r = Sender.remote(), Receiver.remote()
        out["put"] = [same(p, a) for p, a in zip(parts, ray.get(ray.put(b)))]
        out["object"] = ray.get(r.check.remote(s.as_object.remote()))
        out["transport"] = ray.get(r.check.remote(s.by_transport.remote()))
        errors = []
        for bad in ([memarray.zeros(3), np.zeros(3)], [1]):
            try:
                mray.Bundle(bad)
                errors.append("accepted")
            except TypeError as e:
                errors.append(str(e))
        out["errors"] = errors
        out["empty"] = len(ray.get(ray.put(mray.Bundle([]))))
        """
    )
    n = len(memarray.SUPPORTED_DTYPES) * len(SHAPES)
    assert out["len"] == n and f"Bundle({n} arrays" in out["repr"] and out["slice"], out
    assert out["put"] == [True] * n, out
    kind, same_, _ = out["object"]
    assert kind == "Bundle" and same_ == [True] * n, out
    kind, same_, stats = out["transport"]
    assert kind == "Bundle" and same_ == [True] * n, out
    # Ray carried one array for the whole bundle.
    assert (stats["store_objects"], stats["store_arrays"]) == (1, 1), out
    assert out["errors"] == [
        "a Bundle holds MemArrays; item 1 is ndarray",
        "a Bundle holds MemArrays; item 0 is int",
    ], out
    assert out["empty"] == 0, out


@pytest.mark.gpu
def test_a_device_bundle_moves_as_one_array_by_ipc_and_over_nccl():
    gpus = 2 if memarray.cuda.device_count() >= 2 else 1
    out = _ray(
        """
        @ray.remote(num_gpus=0.5 if NUM_GPUS == 1 else 1, enable_tensor_transport=True)
        class Worker:
            @ray.method(tensor_transport="memarray")
            def by_ipc(self, k):
                return mray.Bundle([memarray.asarray(np.full(1024, i, np.float32),
                                                     device="cuda") for i in range(k)])
            @ray.method(tensor_transport="memarray_nccl")
            def by_nccl(self, k):
                return self.by_ipc(k)
            def check(self, x):
                return (type(x).__name__, x.device, [float(a.to_numpy().sum()) for a in x],
                        mray.statistics())

        a, b = Worker.remote(), Worker.remote()
        out["ipc"] = ray.get(b.check.remote(a.by_ipc.remote(300)))
        if NUM_GPUS == 2:
            mray.create_nccl_group([a, b])
            out["nccl"] = ray.get(b.check.remote(a.by_nccl.remote(300)))
        """.replace("NUM_GPUS", str(gpus)),
        gpus=gpus,
    )
    want = [1024.0 * i for i in range(300)]
    # By IPC on one GPU and between two (each actor seeing only its own: a peer mapping).
    kind, device, sums, stats = out["ipc"]
    assert kind == "Bundle" and device.startswith("cuda") and sums == want, out
    assert (stats["ipc_objects"], stats["ipc_arrays"], stats["store_objects"]) == (1, 1, 0), out
    if gpus == 2:
        kind, device, sums, stats = out["nccl"]
        assert kind == "Bundle" and sums == want, out
        assert (stats["nccl_objects"], stats["nccl_arrays"]) == (1, 1), out


def test_a_killed_sender_is_a_clear_error_and_loses_nothing_fetched():
    out = _ray(
        """
        @ray.remote(enable_tensor_transport=True, max_restarts=0)
        class Sender:
            @ray.method(tensor_transport="memarray")
            def make(self, n):
                return memarray.asarray(np.arange(n, dtype=np.int64))
            def pid(self):
                return os.getpid()

        s = Sender.remote()
        kept = ray.get(s.make.remote(1000))
        pending = s.make.remote(10)
        ray.wait([pending])
        ray.kill(s)
        time.sleep(1)
        try:
            ray.get(pending, timeout=60)
            out["error"] = None
        except Exception as e:
            out["error"] = type(e).__name__
            out["message"] = str(e)[:300]
        out["kept"] = bool(np.array_equal(kept.to_numpy(), np.arange(1000)))
        """
    )
    assert out["error"] in ("ActorDiedError", "RayActorError"), out
    assert "died" in out["message"].lower() or "dead" in out["message"].lower(), out
    assert out["kept"], out


def test_the_transport_refuses_foreign_metadata_and_given_buffers():
    out = child_stdout(
        """
import ray
import memarray, memarray.ray as mray
from ray.experimental.rdt.tensor_transport_manager import (
    CommunicatorMetadata, TensorTransportMetadata)
t = mray.MemArrayTransport()
for call in (
    lambda: t.recv_multiple_tensors("x", TensorTransportMetadata([((1,), "f4")]),
                                    CommunicatorMetadata()),
    lambda: t.recv_multiple_tensors("x", mray.MemArrayTransportMetadata([((1,), "f4")]),
                                    CommunicatorMetadata(), [memarray.zeros((1,))]),
    lambda: t.recv_multiple_tensors("x", mray.MemArrayTransportMetadata([((1,), "f4")],
                                    "cpu"), CommunicatorMetadata()),
    lambda: t.extract_tensor_transport_metadata("x", [object()]),
):
    try:
        call()
        print("accepted")
    except (TypeError, ValueError) as e:
        print(type(e).__name__, str(e).split(":")[0].split("(")[0].strip()[:40].replace(" ", "_"))
print(t.recv_multiple_tensors("x", mray.MemArrayTransportMetadata([]), CommunicatorMetadata()))
"""
    )
    lines = out.strip().splitlines()
    assert lines[0].startswith("TypeError not_the_memarray_transport"), out
    assert lines[1].startswith("ValueError the_memarray_transport_does_not"), out
    # No IPC handles and no sending actor: nothing to fetch from, said so.
    assert lines[2].startswith("ValueError these_MemArrays_cannot_be_opened"), out
    assert lines[3].startswith("TypeError the_memarray_transport_carries"), out
    assert lines[4] == "[]", out


@pytest.mark.gpu
def test_device_arrays_move_actor_to_actor_on_one_gpu_by_ipc():
    if memarray.cuda.device_count() < 1:
        pytest.skip("SKIPPED: needs a CUDA device")
    out = _ray(
        """
        @ray.remote(num_gpus=0.5, enable_tensor_transport=True)
        class Sender:
            def __init__(self):
                self.kept = []
            @ray.method(tensor_transport="memarray")
            def make(self, n, k):
                arrays = [memarray.asarray(np.arange(n, dtype=np.float64) * (i + 1),
                                           device="cuda") for i in range(k)]
                return arrays
            @ray.method(tensor_transport="memarray")
            def mixed(self):
                return [memarray.zeros((2,), device="cuda"), memarray.zeros((2,))]

        @ray.remote(num_gpus=0.5, enable_tensor_transport=True)
        class Receiver:
            def check(self, arrays, keep=True):
                ok = all(a.device == "cuda:0" for a in arrays)
                sums = [float(a.to_numpy().sum()) for a in arrays]
                if keep:
                    self.kept = arrays
                return ok, sums, mray.statistics()
            def kept_sums(self):
                return [float(a.to_numpy().sum()) for a in self.kept]

        s, r = Sender.remote(), Receiver.remote()
        n = 1 << 20
        ref = s.make.remote(n, 3)
        ok, sums, stats = ray.get(r.check.remote(ref))
        out["ok"], out["sums"], out["stats"] = ok, sums, stats
        # Many small arrays: one pack, one handle, one copy here.
        ok2, sums2, stats2 = ray.get(r.check.remote(s.make.remote(512, 100), False))
        out["small"] = [ok2, sums2 == [float(sum(range(512))) * (i + 1) for i in range(100)],
                        stats2["ipc_objects"] - stats["ipc_objects"],
                        stats2["ipc_arrays"] - stats["ipc_arrays"], stats2["store_arrays"]]
        del ref
        ray.kill(s)  # the sender's memory goes; the receiver's copies stay
        time.sleep(1)
        out["kept"] = ray.get(r.kept_sums.remote())
        s2 = Sender.remote()
        try:
            ray.get(r.check.remote(s2.mixed.remote()))
            out["mixed"] = None
        except Exception as e:
            out["mixed"] = str(e)[-300:]
        """,
        gpus=1,
    )
    base = float(sum(range(1 << 20)))
    assert out["ok"] and out["sums"] == [base, 2 * base, 3 * base], out
    assert out["stats"]["ipc_objects"] == 1 and out["stats"]["ipc_arrays"] == 3, out
    assert out["kept"] == out["sums"], out
    assert out["small"] == [True, True, 1, 100, 0], out
    assert "must all be on devices or all on the host" in (out["mixed"] or ""), out


@pytest.mark.gpu
@pytest.mark.parametrize("see_both", [True, False], ids=["seeing-both", "one-gpu-each"])
def test_device_arrays_move_between_two_gpus_by_ipc_and_a_peer_copy(see_both):
    # Seeing both GPUs (Ray told not to narrow CUDA_VISIBLE_DEVICES) or, Ray's default, each
    # actor only its own: either way the receiver maps the sender's memory on its own GPU.
    two_gpus()
    out = _ray(
        """
        env = {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}} if SEE_BOTH else {}

        @ray.remote(num_gpus=1, enable_tensor_transport=True, runtime_env=env)
        class Worker:
            def __init__(self):
                self.gpu = mray.use_assigned_gpu()
            def gpu_id(self):
                return self.gpu
            @ray.method(tensor_transport="memarray")
            def make(self, n):
                return memarray.asarray(np.arange(n, dtype=np.int32), device="cuda")
            def check(self, a):
                return a.device, int(a.to_numpy().astype(np.int64).sum()), mray.statistics()

        a, b = Worker.remote(), Worker.remote()
        out["gpus"] = sorted(ray.get([a.gpu_id.remote(), b.gpu_id.remote()]))
        out["there"] = ray.get(b.check.remote(a.make.remote(1 << 22)))
        out["back"] = ray.get(a.check.remote(b.make.remote(1000)))
        out["visible"] = ray.get([w.__ray_call__.remote(
            lambda self: os.environ.get("CUDA_VISIBLE_DEVICES")) for w in (a, b)])
        """.replace("SEE_BOTH", str(see_both)),
        gpus=2,
    )
    (dev_b, sum_b, stats_b), (dev_a, sum_a, stats_a) = out["there"], out["back"]
    if see_both:
        assert out["gpus"] == [0, 1], out
        assert {dev_a, dev_b} == {"cuda:0", "cuda:1"}, out  # each lands on its receiver's GPU
    else:
        assert sorted(out["visible"]) == ["0", "1"] and dev_a == dev_b == "cuda:0", out
    assert sum_b == sum(range(1 << 22)) and sum_a == sum(range(1000)), out
    for stats in (stats_a, stats_b):
        assert stats["ipc_objects"] == 1 and stats["store_objects"] == 0, out
        assert stats["peer_refused"] == 0, out


def test_packed_batches_unpack_in_order_and_refuse_holes():
    import numpy as np

    import memarray.ray as mray

    packed = np.arange(10, dtype=np.int32)
    one = memarray.asarray(np.array([7.5, 8.5]))
    snap = memarray._pickle.Snapshot.of(one)
    items = [
        ("in",),
        ("one", np.frombuffer(snap.data, np.uint8), snap.dtype, tuple(snap.shape), "pageable"),
        ("pack", packed, [3, 0, 7], [2, 0, 3]),
        ("in",),
    ]
    got = mray._unpack(items)
    assert [g.tolist() for g in got] == [[], [7.5, 8.5], [0, 1, 2], [3, 4, 5, 6, 7, 8, 9]]
    with pytest.raises(ValueError, match="incomplete"):
        mray._unpack([("in",), items[1]])


def test_the_pipeline_example_matches_numpy():
    import pathlib
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    r = run_command(
        [
            sys.executable,
            str(root / "examples" / "ray_pipeline.py"),
            "--chunks",
            "3",
            "--particles",
            "100000",
            "--grid",
            "32",
        ],
        timeout=300,
        env=env,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "matches NumPy" in r.stdout, r.stdout


def test_the_nccl_transport_refuses_what_it_cannot_carry():
    out = _ray(
        """
        from ray.experimental.rdt.tensor_transport_manager import (
            CommunicatorMetadata, TensorTransportMetadata)

        @ray.remote(enable_tensor_transport=True)
        class Worker:
            @ray.method(tensor_transport="memarray_nccl")
            def host(self):
                return [memarray.zeros((3,))]
            def size(self, x):
                return len(x)

        a, b = Worker.remote(), Worker.remote()
        errors = []
        for call in (
            lambda: mray.create_nccl_group([a]),
            lambda: mray.create_nccl_group([a, a]),
            lambda: mray.destroy_nccl_group("nope"),
            lambda: mray.MemArrayNcclTransport().recv_multiple_tensors(
                "x", mray.MemArrayNcclTransport().extract_tensor_transport_metadata("x", []),
                mray.MemArrayNcclTransport().get_communicator_metadata(a, b)),
            lambda: mray.MemArrayNcclTransport().send_multiple_tensors(
                [], TensorTransportMetadata([]), CommunicatorMetadata()),
            lambda: ray.get(b.size.remote(a.host.remote())),
        ):
            try:
                call()
                errors.append("accepted")
            except Exception as e:
                errors.append(f"{type(e).__name__}: {str(e)[-400:]}")
        out["errors"] = errors
        # Without NCCL (or a GPU) the group cannot form; the name stays free.
        for _ in range(2):
            try:
                mray.create_nccl_group([a, b])
                out["group"] = "made"
            except Exception as e:
                out["group"] = str(e)[-300:]
        """
    )
    e = out["errors"]
    assert e[0].startswith("ValueError: an NCCL group needs at least two actors"), e
    assert e[1].startswith("ValueError: an actor appears twice"), e
    assert e[2].startswith("ValueError: no NCCL group named 'nope'"), e
    assert (
        e[3].startswith("ValueError: no NCCL group holds both") and "create_nccl_group" in e[3]
    ), e
    assert e[4].startswith("TypeError: not the memarray_nccl transport's metadata"), e
    assert "carries device arrays" in e[5], e
    if not memarray.cuda.is_available():
        assert "NCCL is unavailable" in out["group"] or "CUDA" in out["group"], out


def test_an_aborted_nccl_group_is_refused_by_name_until_made_again():
    out = _ray(
        """
        from memarray.cluster.ray import _nccl as rn

        class Comm:  # the communicator's part the transport uses
            aborted = False
            def abort(self):
                self.aborted = True

        t = mray.MemArrayNcclTransport()
        comm = rn._comms["g"] = Comm()
        cm = rn.MemArrayNcclCommunicatorMetadata(group="g", src_rank=0, dst_rank=1)
        out["can_abort"] = t.can_abort_transport()
        t.abort_transport("obj", cm)
        t.abort_transport("obj", cm)  # Ray may call it twice: nothing more happens
        t.abort_transport("obj", rn.MemArrayNcclCommunicatorMetadata(refused="no group"))
        out["aborted"] = comm.aborted
        out["aborts"] = mray.statistics()["aborts"]
        try:
            rn._comm("g")
            out["refused"] = "accepted"
        except ValueError as e:
            out["refused"] = str(e)
        try:
            rn._done(comm, "receive")
            out["done"] = "accepted"
        except RuntimeError as e:
            out["done"] = str(e)
        rn._leave(None, "g")
        try:
            rn._comm("g")
        except ValueError as e:
            out["after_leave"] = str(e)
        """
    )
    assert out["can_abort"] is True and out["aborted"] is True, out
    assert out["aborts"] == 1, out
    assert "was aborted" in out["refused"] and "destroy_nccl_group('g')" in out["refused"], out
    assert out["done"] == "the receive was aborted (a failed transfer in its NCCL group)", out
    assert "is not in the NCCL group 'g'" in out["after_leave"], out


@pytest.mark.gpu
def test_a_transfer_whose_message_never_comes_is_aborted_and_the_actors_live():
    two_gpus("NCCL needs two CUDA devices")
    out = _ray(
        """
        @ray.remote(num_gpus=1, enable_tensor_transport=True)
        class Worker:
            @ray.method(tensor_transport="memarray_nccl")
            def make(self, n):
                return [memarray.asarray(np.arange(n, dtype=np.float32), device="cuda")]
            def lose_sends(self, lose):
                # A message lost on the way: this actor's sends send nothing.
                t = mray.MemArrayNcclTransport
                if lose:
                    t._real_send, t.send_multiple_tensors = t.send_multiple_tensors, (
                        lambda self, *a: None)
                else:
                    t.send_multiple_tensors = t._real_send
            def total(self, arrays):
                return float(arrays[0].to_numpy().sum())
            def stats(self):
                return mray.statistics()

        a, b = Worker.remote(), Worker.remote()
        mray.create_nccl_group([a, b])
        out["first"] = ray.get(b.total.remote(a.make.remote(8)))  # connects the pair
        ray.get(a.lose_sends.remote(True))
        start = time.perf_counter()
        try:
            ray.get(b.total.remote(a.make.remote(1 << 20)))
            out["lost"] = "accepted"
        except Exception as e:
            out["lost"] = f"{type(e).__name__}: {str(e)[-600:]}"
        out["lost_s"] = time.perf_counter() - start
        # Ray's abort calls run on the actors' own threads, each as NCCL tears down.
        for _ in range(60):
            out["stats"] = ray.get([a.stats.remote(), b.stats.remote()], timeout=60)
            if all(s["aborts"] for s in out["stats"]):
                break
            time.sleep(0.5)
        ray.get(a.lose_sends.remote(False))
        try:
            ray.get(b.total.remote(a.make.remote(8)), timeout=60)
            out["in_aborted_group"] = "accepted"
        except Exception as e:
            out["in_aborted_group"] = str(e)[-600:]
        mray.destroy_nccl_group()
        mray.create_nccl_group([a, b])
        out["again"] = ray.get(b.total.remote(a.make.remote(1 << 20)), timeout=120)
        """,
        gpus=2,
        RAY_rdt_fetch_fail_timeout_milliseconds="5000",
    )
    assert out["first"] == 28.0, out
    assert out["lost"] != "accepted" and out["lost_s"] < 60, out
    assert [s["aborts"] for s in out["stats"]] == [1, 1], out
    assert "was aborted" in out["in_aborted_group"], out
    assert out["again"] == float(sum(range(1 << 20))), out


@pytest.mark.gpu
def test_device_arrays_move_between_two_gpus_over_nccl():
    two_gpus("NCCL needs two CUDA devices")
    out = _ray(
        """
        @ray.remote(num_gpus=1, enable_tensor_transport=True)
        class Worker:
            @ray.method(tensor_transport="memarray_nccl")
            def make(self, n, k):
                return [memarray.asarray((np.arange(n) % 251).astype(np.float32) * (i + 1),
                                         device="cuda") for i in range(k)]
            @ray.method(tensor_transport="memarray_nccl")
            def mixed(self):
                return [memarray.zeros((0,), "int8", device="cuda"),
                        memarray.asarray(np.arange(6, dtype=np.int16).reshape(2, 3), device="cuda"),
                        memarray.full((), 7.5, device="cuda")]
            def check(self, arrays):
                return ([a.device for a in arrays],
                        [float(a.to_numpy().astype(np.float64).sum()) for a in arrays],
                        [[str(a.dtype), list(a.shape)] for a in arrays], mray.statistics())

        a, b = Worker.remote(), Worker.remote()
        out["devices"] = mray.create_nccl_group([a, b])
        out["big"] = ray.get(b.check.remote(a.make.remote(1 << 22, 2)))
        out["small"] = ray.get(a.check.remote(b.make.remote(512, 100)))  # one pack, back
        out["mixed"] = ray.get(b.check.remote(a.mixed.remote()))
        mray.destroy_nccl_group()
        try:
            ray.get(b.check.remote(a.make.remote(4, 1)))
            out["after"] = "accepted"
        except Exception as e:
            out["after"] = str(e)[-300:]
        """,
        gpus=2,
    )
    assert out["devices"] == [0, 0], out  # each actor sees its one GPU as device 0
    step = float(sum(i % 251 for i in range(1 << 22)))
    devs, sums, _, stats = out["big"]
    assert devs == ["cuda:0", "cuda:0"] and sums == [step, 2 * step], out
    assert stats["nccl_objects"] == 1 and stats["nccl_arrays"] == 2, out
    devs, sums, _, stats = out["small"]
    assert sums == [float(sum(j % 251 for j in range(512))) * (i + 1) for i in range(100)], out
    assert stats["nccl_objects"] == 1 and stats["nccl_arrays"] == 100, out
    devs, sums, kinds, _ = out["mixed"]
    assert kinds == [["int8", [0]], ["int16", [2, 3]], ["float64", []]], out
    assert sums == [0.0, 15.0, 7.5], out
    assert "no NCCL group holds both" in out["after"], out


def test_the_metadata_carries_the_sender_as_bytes_and_the_driver_as_none():
    # An ActorHandle object in each object's metadata costs Ray a reference-counted handle
    # per object; the transport carries the sender's handle pickled once, which a
    # receiver unpickles only to fetch from the sender.
    out = _ray(
        """
        import pickle
        from memarray.cluster.ray import MemArrayTransport

        @ray.remote
        class Sender:
            def describe(self):
                t = MemArrayTransport()
                metas = [t.describe(f"obj{i}", [memarray.zeros(3)]) for i in range(2)]
                return (metas[0].source, metas[0].source is metas[1].source,
                        ray.get_runtime_context().get_actor_id())

            def ping(self):
                return "pong"

        s = Sender.remote()  # held: a pickled handle does not keep its actor alive
        source, once, me = ray.get(s.describe.remote())
        back = pickle.loads(source)  # the handle, as a receiver fetching from it gets it
        out["actor"] = [type(source).__name__, once, back._actor_id.hex() == me,
                        ray.get(back.ping.remote())]
        out["driver"] = repr(MemArrayTransport().describe("obj", [memarray.zeros(3)]).source)
        """
    )
    assert out["actor"] == ["bytes", True, True, "pong"], out
    assert out["driver"] == "None", out
