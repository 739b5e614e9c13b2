"""torch keeps every feature while memarray allocates for it:
`memarray.torch.install()` routes each device's allocations to a MemPool over memarray, so
torch's caching allocator stays on top. Each feature runs in a fresh process, installed
before and after torch's first CUDA use; a small CNN trains with cuDNN autotuning to the
same losses as torch's own allocator; memarray's pressure relief gets torch's cached
segments back."""

from __future__ import annotations

import json

import pytest
from children import child_stdout
from test_interop import _peer

import memarray

PRE = {
    "before": "import memarray.torch as mt, torch\nmt.install()\n",
    "after": "import memarray.torch as mt, torch\ntorch.zeros(1, device='cuda')\nmt.install()\n",
}

FEATURES = {
    "cudnn_benchmark": """
torch.backends.cudnn.benchmark = True
m = torch.nn.Conv2d(3, 16, 3).cuda()
x = torch.randn(8, 3, 64, 64, device="cuda")
m(x).sum().backward()
torch.cuda.synchronize()
print("ok")
""",
    "statistics": """
x = torch.empty(1 << 20, device="cuda")
assert torch.cuda.memory_allocated() >= 4 << 20
assert torch.cuda.max_memory_allocated() >= 4 << 20
assert torch.cuda.memory_stats()["allocated_bytes.all.current"] >= 4 << 20
assert "Allocated memory" in torch.cuda.memory_summary()
del x
torch.cuda.reset_peak_memory_stats()
assert torch.cuda.max_memory_allocated() < 4 << 20
print("ok")
""",
    "snapshot": """
torch.cuda.memory._record_memory_history()
x = torch.empty(1 << 20, device="cuda")
s = torch.cuda.memory._snapshot()
assert s["segments"] and s["device_traces"][0], s.keys()
print("ok")
""",
    "cuda_graph": """
x = torch.ones(1 << 20, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        y = (x * 2).sin() * (x + 1).cos()
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y = (x * 2).sin() * (x + 1).cos()
eager = [torch.full((1 << 20,), 5.0, device="cuda") for _ in range(8)]
x.fill_(3.0)
g.replay()
torch.cuda.synchronize()
want = (torch.tensor(6.0).sin() * torch.tensor(4.0).cos()).item()
assert abs(y[0].item() - want) < 1e-5
assert all(bool((e == 5.0).all()) for e in eager), "replay wrote over eager tensors"
print("ok")
""",
    "compile_reduce_overhead": """
@torch.compile(mode="reduce-overhead")
def f(a):
    return (a * 2).relu() + 1
a = torch.randn(4096, device="cuda")
for _ in range(4):
    out = f(a)
torch.cuda.synchronize()
assert torch.allclose(out, (a * 2).relu() + 1)
print("ok")
""",
    "empty_cache_and_threads": """
import threading, memarray.resources as mr
mr.set_default_resource(mr.Statistics(mr.Pool(mr.Device(0))), 0)
before = mr.statistics(0)["by_source"].get("torch", {}).get("current_bytes", 0)
got = []
t = threading.Thread(target=lambda: got.append(torch.empty(1 << 24, device="cuda")))
t.start(); t.join()
side = torch.cuda.Stream()
with torch.cuda.stream(side):
    got.append(torch.empty(1 << 23, device="cuda"))
held = mr.statistics(0)["by_source"]["torch"]["current_bytes"] - before
assert held >= (1 << 26) + (1 << 25), held   # another thread's and stream's: memarray's
assert mt.live_blocks() > 0
del got
torch.cuda.synchronize()
torch.cuda.empty_cache()                     # the free segments go back to memarray
left = mr.statistics(0)["by_source"]["torch"]["current_bytes"] - before
assert left < held, (left, held)
print("ok")
""",
}


@pytest.mark.gpu
@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_torch_keeps_its_features_through_memarray(feature, when):
    _peer("torch")
    out = child_stdout(
        "import numpy as np\nnp.row_stack = np.vstack\n"
        + PRE[when]
        + FEATURES[feature]
        + "\nassert mt.installed()\n",
        timeout=600,
    )
    assert out.strip().endswith("ok"), out


TRAIN = """
import json, torch
torch.manual_seed(0)
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.deterministic = True
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
    torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
    torch.nn.Flatten(), torch.nn.Linear(32, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator(device="cpu").manual_seed(1)
losses = []
for step in range(8):
    x = torch.randn(32, 3, 32, 32, generator=g).cuda()
    y = torch.randint(0, 10, (32,), generator=g).cuda()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    losses.append(loss.item())
print(json.dumps(losses))
"""


@pytest.mark.gpu
def test_a_cnn_trains_to_torchs_own_losses_with_cudnn_autotuning():
    _peer("torch")
    own = json.loads(child_stdout(TRAIN).strip().splitlines()[-1])
    ours = json.loads(
        child_stdout("import memarray.torch as mt\nmt.install()\n" + TRAIN, timeout=300)
        .strip()
        .splitlines()[-1]
    )
    assert len(own) == len(ours) == 8
    # cuDNN autotuning picks algorithms by timing, so two runs of torch's own allocator
    # may differ in the last bits: equal to float32 rounding, step by step.
    worst = max(abs(a - b) / abs(a) for a, b in zip(own, ours, strict=True))
    assert worst < 1e-5, f"losses differ by {worst:.2e}: {own} vs {ours}"
    print(f"largest relative difference of the losses: {worst:.2e}")


@pytest.mark.gpu
def test_memarray_gets_torchs_cached_segments_back_under_pressure():
    _peer("torch")
    out = child_stdout(
        """
        import json, torch, memarray, memarray.torch as mt, memarray.resources as mr
        MiB = 1 << 20
        mr.set_default_resource(mr.Limiting(mr.Device(0), 256 * MiB), 0)
        mt.install()
        t = torch.empty(160 * MiB, dtype=torch.uint8, device="cuda")
        del t                                   # cached by torch, held from memarray
        reserved = torch.cuda.memory_reserved(0)
        before = mr.pressure_statistics()
        a = memarray.empty([160 * MiB], "uint8", device="cuda")   # must relieve torch
        after = mr.pressure_statistics()
        x = torch.ones(1000, device="cuda")     # torch still allocates (a fresh pool)
        print(json.dumps({
            "reserved": reserved, "size": a.nbytes, "sum": float(x.sum()),
            "recovered": after["recovered"] - before["recovered"],
            "torch": after["libraries"]["torch"]["released_bytes"]
            - before["libraries"]["torch"]["released_bytes"]}))
        """
    )
    r = json.loads(out.strip().splitlines()[-1])
    assert r["reserved"] >= 160 << 20, r
    assert r["recovered"] == 1 and r["torch"] >= 160 << 20, r
    assert r["sum"] == 1000.0


def test_a_tensor_that_requires_grad_is_not_shared_writable():
    # torch's own __dlpack__ and np.from_dlpack refuse it ("use tensor.detach()"); the C
    # exchange API memarray uses skips that check, so memarray makes it.
    torch = pytest.importorskip("torch")
    t = torch.ones(4, requires_grad=True)
    with pytest.raises(BufferError, match="detach"):
        memarray.asarray(t)
    with pytest.raises(BufferError, match="detach"):
        memarray.from_dlpack(t)
    shared = memarray.asarray(t.detach())
    shared[0] = 5.0
    assert float(t[0]) == 5.0, "detach() shares the memory, as torch documents"
    copy = memarray.asarray(t, copy=True)
    copy[1] = 7.0
    assert float(t[1]) == 1.0, "copy=True copies"
    assert t.requires_grad


def test_torch_dtypes_are_taken_as_dtypes():
    torch = pytest.importorskip("torch")
    for td, name in [
        (torch.float32, "float32"),
        (torch.bfloat16, "bfloat16"),
        (torch.int8, "int8"),
    ]:
        assert memarray.zeros((2,), td)._dtype_name == name
    with pytest.raises(TypeError, match="qint8"):
        memarray.zeros((2,), torch.qint8)


@pytest.mark.gpu
def test_without_torchs_cache_each_tensor_is_a_pool_block_given_back_when_freed():
    _peer("torch")
    out = child_stdout(
        """
        import json
        import torch, memarray.torch as mt
        from memarray import resources as mr

        mr.set_default_resource(mr.Pool(mr.Device(0), grow_in_place=8 << 30), 0)
        mt.install(cache=False)
        mt.install(cache=False)  # the same again: nothing
        try:
            mt.install()
            again = None
        except ValueError as e:
            again = str(e)

        def held():
            return sum(
                r["live_bytes"]
                for r in mr.library_usage()
                if r["source"] == "torch" and r["device"] == 0
            )

        x = torch.ones(3 << 20, dtype=torch.float32, device="cuda")  # 12 MiB
        during, total = held(), float(x.sum())
        del x
        torch.cuda.synchronize()
        print(json.dumps({"again": again, "during": during, "after": held(),
                          "sum": total, "installed": mt.installed()}))
        """
    )
    got = json.loads(out.strip().splitlines()[-1])
    assert got["installed"] and "cannot be put back" in got["again"], got
    # No cache of torch's on top: memarray holds the tensor's bytes, and none once freed.
    assert 12 << 20 <= got["during"] < (12 << 20) + 4096 and got["after"] == 0, got
    assert got["sum"] == float(3 << 20), got
    late = child_stdout(
        """
        import torch, memarray.torch as mt
        torch.zeros(1, device="cuda")
        try:
            mt.install(cache=False)
            print("not refused")
        except RuntimeError as e:
            print("refused:", e)
        """
    )
    assert "must come before torch's first CUDA allocation" in late, late
