"""torch through memarray against torch's own allocator: per call of
`torch.empty` (1 MiB), per MLP training step and per CUDA-graph replay, each measured in
a fresh process per allocator, the two alternating, medians. Targets: empty <= 1.2x,
step and replay within 2%.

    python3 benches/torch_route.py [--rounds 3] [--json out.json]

Prints one line without a GPU or torch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

WORK = r"""
import json, statistics, time, sys
import torch
if sys.argv[1] == "memarray":
    import memarray.torch
    memarray.torch.install()
out = {}
for _ in range(500):
    torch.empty(1 << 18, device="cuda")
ts = []
for _ in range(15):
    t = time.perf_counter()
    for _ in range(2000):
        torch.empty(1 << 18, device="cuda")
    ts.append((time.perf_counter() - t) / 2000 * 1e6)
out["empty_1MiB_us"] = statistics.median(ts)

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                            torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                            torch.nn.Linear(4096, 1024)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(256, 1024, device="cuda")
def step():
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
for _ in range(20):
    step()
torch.cuda.synchronize()
ts = []
for _ in range(15):
    t = time.perf_counter()
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    ts.append((time.perf_counter() - t) / 20 * 1e3)
out["mlp_step_ms"] = statistics.median(ts)

static_x = torch.randn(256, 1024, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        y = model(static_x)
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y = model(static_x)
for _ in range(20):
    g.replay()
torch.cuda.synchronize()
ts = []
for _ in range(15):
    t = time.perf_counter()
    for _ in range(50):
        g.replay()
    torch.cuda.synchronize()
    ts.append((time.perf_counter() - t) / 50 * 1e6)
out["graph_replay_us"] = statistics.median(ts)
print(json.dumps(out))
"""

TARGETS = {"empty_1MiB_us": 1.2, "mlp_step_ms": 1.02, "graph_replay_us": 1.02}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("torch_route needs torch (pip install torch)")
        return 1
    if not torch.cuda.is_available():
        print("torch_route needs a CUDA device")
        return 1
    runs: dict[str, list[dict]] = {"torch": [], "memarray": []}
    for _ in range(args.rounds):
        for who in ("torch", "memarray"):
            r = subprocess.run(
                [sys.executable, "-c", WORK, who], capture_output=True, text=True, timeout=600
            )
            if r.returncode != 0:
                print(f"{who} run failed:\n{r.stderr[-2000:]}")
                return 1
            runs[who].append(json.loads(r.stdout.strip().splitlines()[-1]))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.rounds} rounds")
    result: dict[str, dict] = {}
    missed = 0
    for key, target in TARGETS.items():
        own = statistics.median(r[key] for r in runs["torch"])
        ours = statistics.median(r[key] for r in runs["memarray"])
        ratio = ours / own
        ok = ratio <= target
        missed += not ok
        result[key] = {"torch": own, "memarray": ratio * own, "ratio": ratio, "target": target}
        print(
            f"{key:18s} torch {own:9.3f}  memarray {ours:9.3f}  ratio {ratio:5.3f}"
            f"  (target <= {target}) {'met' if ok else 'MISSED'}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, "result": result}, f, indent=1)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
