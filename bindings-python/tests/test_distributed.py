"""Beyond one GPU: memarray.distributed (NCCL through the Rust layer),
torch.distributed on MemArrays, memarray.scatter / gather, the IPC pipeline example.

Tests needing two GPUs skip on one with the reason, and fail instead with
MEMARRAY_REQUIRE_PEER=1. Tests needing NCCL skip without it, and fail instead with
MEMARRAY_REQUIRE_PEER=1 or MEMARRAY_REQUIRE_NCCL=1."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from children import run_command

import memarray
import memarray.distributed as md
from conftest import REQUIRE_PEER, two_gpus

ROOT = Path(__file__).resolve().parents[2]
REQUIRE_NCCL = REQUIRE_PEER or os.environ.get("MEMARRAY_REQUIRE_NCCL") == "1"
gpu = pytest.mark.gpu


def nccl() -> dict:
    try:
        return md.load()
    except RuntimeError as e:
        if REQUIRE_NCCL:
            pytest.fail(f"NCCL required but did not load: {e}")
        pytest.skip(f"SKIPPED: NCCL not loadable ({e})")


def run(args, env=None, timeout=180) -> subprocess.CompletedProcess:
    full = dict(os.environ, **(env or {}))
    return run_command(args, cwd=ROOT, env=full, timeout=timeout)


# ---- CPU -------------------------------------------------------------------------------


def test_a_missing_nccl_is_a_clear_error(monkeypatch):
    if md._d.is_loaded():
        pytest.skip("SKIPPED: NCCL is loaded in this process already")
    with pytest.raises(RuntimeError, match=r"NCCL is unavailable.*/nonexistent/libnccl\.so\.2"):
        md.load("/nonexistent/libnccl.so.2")
    monkeypatch.setenv("MEMARRAY_NCCL_LIBRARY", "/elsewhere/libnccl.so.2")
    assert md.nccl_library() == "/elsewhere/libnccl.so.2"
    with pytest.raises(RuntimeError, match="/elsewhere/libnccl.so.2"):
        md.load()
    assert not md._d.is_loaded()


def test_init_needs_a_rank_and_a_world_size(monkeypatch):
    for var in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="RANK and WORLD_SIZE"):
        md.init()


def test_bad_unique_ids_and_ranks_are_refused_before_nccl_runs():
    with pytest.raises(RuntimeError, match="128 bytes"):
        md._d.init_rank(0, 2, 0, b"short")
    with pytest.raises(RuntimeError, match="hex digits"):
        md._d.init_rank(0, 2, 0, "not-hex")
    with pytest.raises(RuntimeError, match="rank 2 of 2"):
        md._d.init_rank(0, 2, 2, bytes(128))
    with pytest.raises(RuntimeError, match="each device once"):
        md._d.init_all([0, 0])


def test_gather_joins_host_parts_in_order_and_checks_them():
    a = memarray.asarray(np.arange(6, dtype=np.int16).reshape(2, 3))
    b = memarray.asarray(np.full((1, 3), 9, np.int16))
    g = memarray.gather([a, b, a], device="cpu")
    np.testing.assert_array_equal(
        g.to_numpy(), np.concatenate([a.to_numpy(), b.to_numpy(), a.to_numpy()])
    )
    with pytest.raises(ValueError, match="trailing shape"):
        memarray.gather([a, memarray.zeros((2, 2), "int16")], device="cpu")
    with pytest.raises(ValueError, match="dtype"):
        memarray.gather([a, memarray.zeros((2, 3), "int32")], device="cpu")
    with pytest.raises(ValueError, match="at least one"):
        memarray.gather([], device="cpu")
    with pytest.raises(TypeError, match="MemArrays"):
        memarray.gather([a, np.zeros((1, 3))], device="cpu")
    with pytest.raises(ValueError, match="cpu"):
        memarray.scatter(a, ["cpu"])
    with pytest.raises(ValueError, match="first axis"):
        memarray.scatter(memarray.zeros((), "float32"), [0])


def test_pack_refuses_what_it_cannot_pack_before_copying():
    from memarray import _memarray

    host = memarray.zeros((4,), "float32")
    pack, entries = _memarray._pack([host])  # host packs too, in the one layout
    assert (pack.nbytes, pack.device, entries) == (256, "cpu", [("float32", [4], 0)])
    with pytest.raises(ValueError, match="at least one"):
        _memarray._pack([])
    with pytest.raises(TypeError):
        _memarray._pack([np.zeros(3)])
    with pytest.raises(TypeError):
        _memarray._unpack(np.zeros(3), [])
    with pytest.raises(ValueError, match="entry 0 .* outside the 16-byte pack"):
        _memarray._unpack(host, [("uint8", [17], 0)])


def test_record_stream_needs_a_stream():
    a = memarray.zeros((4,), "float32")
    with pytest.raises(ValueError, match="needs a stream"):
        a.record_stream(None)


# ---- one GPU ---------------------------------------------------------------------------


def _scatter_kernel_gather(devices):
    host = np.arange(1001 * 37, dtype=np.int64).reshape(1001, 37)
    for src in (memarray.asarray(host), memarray.asarray(host, device="cuda:0")):
        parts = memarray.scatter(src, devices)
        assert [p.device for p in parts] == [f"cuda:{d}" for d in devices]
        assert sum(p.shape[0] for p in parts) == 1001
        for p in parts:
            p.add_index_tuple()
        want = host.copy()
        start = 0
        for p in parts:
            i, j = np.indices(p.shape)
            want[start : start + p.shape[0]] += i + j
            start += p.shape[0]
        for to in ("cpu", f"cuda:{devices[-1]}"):
            g = memarray.gather(parts, device=to)
            assert g.device == to
            np.testing.assert_array_equal(g.to_numpy(), want)
        np.testing.assert_array_equal(src.to_numpy(), host)


@gpu
def test_pack_and_unpack_on_one_gpu():
    from memarray import _memarray

    parts = [
        memarray.asarray(np.arange(n, dtype=dt), device="cuda")
        for n, dt in ((5, np.int16), (0, np.float32), (1000, np.float64), (3, np.uint8))
    ]
    pack, entries = _memarray._pack(parts)
    assert pack.device == "cuda:0" and str(pack.dtype) == "uint8"
    assert [(d, list(s)) for d, s, _ in entries] == [(str(p.dtype), list(p.shape)) for p in parts]
    assert all(off % 256 == 0 for _, _, off in entries)
    with pytest.raises(ValueError, match="more than max_each"):
        _memarray._pack(parts, max_each=100)
    back = _memarray._unpack(pack, entries)
    del pack
    for p, b in zip(parts, back, strict=True):
        assert b.device == "cuda:0"
        np.testing.assert_array_equal(b.to_numpy(), p.to_numpy())


@gpu
def test_scatter_gather_on_one_gpu():
    _scatter_kernel_gather([0, 0, 0])
    with pytest.raises(ValueError, match="no CUDA device 7"):
        memarray.scatter(memarray.zeros((4,), "float32"), [0, 7])


@gpu
def test_one_rank_communicator_runs_every_collective():
    info = nccl()
    assert info["version"] >= (2, 13, 0), info
    (comm,) = md.communicators([0])
    assert (comm.rank, comm.size, comm.device_id) == (0, 1, 0)
    assert "rank=0, size=1" in repr(comm)
    x = memarray.asarray(np.arange(1 << 20, dtype=np.int32), device="cuda:0")
    s = memarray.cuda.Stream(0)
    for _ in range(3):
        x.add_index_tuple(stream=s)  # pending on s when the collective runs elsewhere
    out = memarray.empty((1 << 20,), "int32", device="cuda:0")
    comm.all_reduce(x, out)
    np.testing.assert_array_equal(out.to_numpy(), 4 * np.arange(1 << 20, dtype=np.int32))
    comm.all_reduce(x, op="max", stream=s)
    g = memarray.empty((1 << 20,), "int32", device="cuda:0")
    comm.all_gather(x, g)
    np.testing.assert_array_equal(g.to_numpy(), x.to_numpy())
    comm.reduce_scatter(x, g)
    comm.broadcast(x, root=0)
    with pytest.raises(RuntimeError, match="recv = send"):
        comm.all_reduce(x, memarray.empty((3,), "int32", device="cuda:0"))
    with pytest.raises(RuntimeError, match="cannot reduce"):
        comm.all_reduce(memarray.zeros((4,), "bool", device="cuda:0"))
    with pytest.raises(ValueError, match="needs the array's data on cuda:0"):
        comm.all_reduce(memarray.zeros((4,), "int32"))
    with pytest.raises(RuntimeError, match="not in this communicator"):
        comm.send(x, 1)
    with pytest.raises(ValueError, match="xor"):
        comm.all_reduce(x, op="xor")
    with x.get_dlpack() as _t, pytest.raises(memarray.LockError):
        comm.all_reduce(x)


@gpu
def test_init_with_an_id_file_joins_and_removes_the_file(tmp_path):
    nccl()
    path = tmp_path / "nccl.id"
    comm = md.init(rank=0, world_size=1, device=0, id_file=path)
    assert comm.size == 1
    assert not path.exists(), "rank 0 removes the id file once every rank joined"
    comm2 = md.init(rank=0, world_size=1, device=0, unique_id=md.unique_id().hex())
    a = memarray.full((5,), 3, "int64", device="cuda:0")
    comm2.all_reduce(a)
    np.testing.assert_array_equal(a.to_numpy(), np.full(5, 3))


@gpu
def test_as_torch_orders_memarray_work_after_torch_work():
    torch = pytest.importorskip("torch")
    n = 1 << 24
    a = memarray.zeros((n,), "float32", device="cuda:0")
    ptr = a.__cuda_array_interface__["data"][0]
    with md.as_torch(a) as t:
        assert t.data_ptr() == ptr
        for _ in range(50):  # long work on torch's stream, not waited for
            t.add_(1.0)
    a.add_index_tuple(stream=memarray.cuda.Stream(0))  # memarray's stream: must wait
    got = a.to_numpy()
    np.testing.assert_array_equal(got[:8], 50.0 + np.arange(8, dtype=np.float32))
    assert got[-1] == np.float32(50.0 + (n - 1))
    torch.cuda.synchronize()


@gpu
def test_ipc_pipeline_example_orders_the_consumer_after_the_producer():
    r = run(
        [
            sys.executable,
            "examples/ipc_pipeline.py",
            "--frames",
            "16",
            "--mib",
            "64",
            "--kernels",
            "12",
        ]
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "every value checked" in r.stdout and r.stdout.rstrip().endswith("ok"), r.stdout


@gpu
def test_scatter_gather_example_runs():
    r = run([sys.executable, "examples/scatter_gather.py", "--rows", "5003"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "matches NumPy" in r.stdout, r.stdout


# ---- two GPUs --------------------------------------------------------------------------


@gpu
def test_an_aborted_communicator_raises_on_every_later_call():
    nccl()
    (comm,) = md.communicators([0])
    x = memarray.asarray(np.arange(8, dtype=np.int32), device="cuda:0")
    comm.all_reduce(x)
    assert not comm.aborted
    comm.abort()
    comm.abort()  # nothing more
    assert comm.aborted and "aborted" in repr(comm)
    for call in (lambda: comm.all_reduce(x), lambda: comm.broadcast(x), lambda: comm.send(x, 0)):
        with pytest.raises(RuntimeError, match="communicator was aborted"):
            call()
    np.testing.assert_array_equal(x.to_numpy(), np.arange(8))


@gpu
def test_abort_frees_a_receive_whose_sender_never_sends():
    two_gpus()
    nccl()
    comms = md.communicators([0, 1])
    x = memarray.asarray(np.arange(3, dtype=np.int32), device="cuda:0")
    y = memarray.zeros((3,), "int32", device="cuda:1")
    with md.group():  # connects the pair
        comms[0].send(x, 1)
        comms[1].recv(y, 0)
    np.testing.assert_array_equal(y.to_numpy(), [0, 1, 2])
    s = memarray.cuda.Stream(1)
    waiting = memarray.zeros((1 << 20,), "int32", device="cuda:1")
    comms[1].recv(waiting, 0, stream=s)  # rank 0 never sends
    timer = threading.Timer(0.5, lambda: [c.abort() for c in comms])
    start = time.perf_counter()
    timer.start()
    s.synchronize()
    assert time.perf_counter() - start >= 0.4
    assert all(c.aborted for c in comms)
    with pytest.raises(RuntimeError, match="communicator was aborted"):
        comms[1].recv(waiting, 0)


@gpu
def test_scatter_gather_across_two_gpus():
    two_gpus()
    _scatter_kernel_gather([0, 1])
    _scatter_kernel_gather([1, 0, 1])


@gpu
def test_one_process_two_gpu_collectives_are_exact():
    two_gpus()
    nccl()
    comms = md.communicators([0, 1])
    n = 3 * (1 << 18) + 7
    ins = [np.arange(n, dtype=np.int32) * (r + 1) + r for r in range(2)]
    arrays = [memarray.asarray(ins[r], device=f"cuda:{r}") for r in range(2)]
    with md.group():
        for c, a in zip(comms, arrays, strict=True):
            c.all_reduce(a)
    for a in arrays:
        np.testing.assert_array_equal(a.to_numpy(), ins[0] + ins[1])
    outs = [memarray.empty((2, 3), "int32", device=f"cuda:{r}") for r in range(2)]
    with md.group():
        for r, (c, o) in enumerate(zip(comms, outs, strict=True)):
            c.all_gather(memarray.asarray(np.full(3, r, np.int32), device=f"cuda:{r}"), o)
    for o in outs:
        np.testing.assert_array_equal(o.to_numpy(), [[0, 0, 0], [1, 1, 1]])


_WORKER = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import memarray, memarray.distributed as md
    assert "torch" not in sys.modules
    comm = md.init()
    r, w = comm.rank, comm.size
    n = (1 << 22) + 1
    a = memarray.asarray(np.arange(n, dtype=np.int64) * (r + 1), device=f"cuda:{r}")
    comm.all_reduce(a)
    want = np.arange(n, dtype=np.int64) * sum(k + 1 for k in range(w))
    assert np.array_equal(a.to_numpy(), want), "all_reduce"
    b = memarray.empty((w, 2), "int64", device=f"cuda:{r}")
    comm.all_gather(memarray.asarray(np.array([r, -r], np.int64), device=f"cuda:{r}"), b)
    assert b.to_numpy().tolist() == [[k, -k] for k in range(w)], "all_gather"
    assert "torch" not in sys.modules
    print(f"rank {r} ok")
    """
)


@gpu
def test_two_processes_without_torch_share_an_id_file(tmp_path):
    two_gpus()
    nccl()
    id_file = tmp_path / "id"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER],
            cwd=ROOT,
            env=dict(os.environ, RANK=str(r), WORLD_SIZE="2", MEMARRAY_NCCL_ID_FILE=str(id_file)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    try:
        outs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        for p in procs:  # a rank left waiting when the other timed out
            p.kill()
    for r, (p, out) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0 and f"rank {r} ok" in out, out


@gpu
def test_torchrun_example_runs_on_two_gpus():
    two_gpus()
    pytest.importorskip("torch")
    nccl()
    r = run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            "29517",
            "examples/distributed_torch.py",
        ]
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "collectives exact" in r.stdout and "ok" in r.stdout, r.stdout
