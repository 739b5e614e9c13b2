"""What the notebook views cost: the live monitor's refresh beside a torch training loop,
and the HTML repr of arrays.

    python3 benches/monitor_cost.py [--json out.json] [--steps 300]

- A small convolutional net trains on the GPU (torch, its caching allocator as usual);
  the same loop runs with and without a thread doing what a shown monitor does
  (``notebook.device_usage`` + ``render`` every second, and a stress run every 0.05 s),
  1,000 steps a measurement (longer than the 1 s interval), 9 rounds in rotating order.
  Target: <= 1% more time per step at one refresh a second; nothing when no monitor is
  shown (no thread exists then).
- One refresh alone (usage + render of every device), in microseconds.
- ``repr(a)``, ``str(a)`` and ``a._repr_html_()`` of host and device arrays (1,000 and
  10**6 elements): the HTML view does no device work beyond what ``str`` does.

Medians. A missed target prints MISS and the script exits 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time


def refresher(stop: threading.Event, interval: float, count: list[int]) -> None:
    from memarray import cuda, notebook

    while not stop.wait(interval):
        frames = [notebook.device_usage(d) for d in range(cuda.device_count())]
        notebook.render(frames)
        count[0] += 1


def steps(model, opt, x, y, n: int) -> float:
    import torch

    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--steps", type=int, default=1000, help="steps per measurement")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    import numpy as np

    import memarray
    from memarray import notebook

    out: dict = {}
    if not memarray.cuda.is_available():
        print("SKIPPED: needs a CUDA device")
        return 0
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(64, 64, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(64, 10),
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 3, 64, 64, device="cuda")
    y = torch.randint(0, 10, (64,), device="cuda")
    steps(model, opt, x, y, 50)  # warm-up
    rows: dict[str, list[float]] = {"none": [], "1 s": [], "0.05 s": []}
    refreshes = {"1 s": [0], "0.05 s": [0]}
    intervals = {"none": None, "1 s": 1.0, "0.05 s": 0.05}
    order = list(rows)
    for r in range(args.rounds):
        # The three configurations in a rotating order: drift is shared, not attributed.
        for label in order[r % 3 :] + order[: r % 3]:
            interval = intervals[label]
            if interval is None:
                rows[label].append(steps(model, opt, x, y, args.steps))
                continue
            stop = threading.Event()
            t = threading.Thread(target=refresher, args=(stop, interval, refreshes[label]))
            t.start()
            rows[label].append(steps(model, opt, x, y, args.steps))
            stop.set()
            t.join()
    base = statistics.median(rows["none"])
    for label, vals in rows.items():
        m = statistics.median(vals)
        out[f"step_ms_{label}"] = m
        print(f"train step, monitor refreshing every {label:>6}: {m:.3f} ms ({m / base:.4f}x)")
    out["refreshes"] = {k: v[0] for k, v in refreshes.items()}
    print(f"refreshes made: {out['refreshes']} (the 1 s monitor refreshes once a measurement)")
    n = 200
    t = time.perf_counter()
    for _ in range(n):
        notebook.render([notebook.device_usage(d) for d in range(memarray.cuda.device_count())])
    out["refresh_us"] = (time.perf_counter() - t) / n * 1e6
    print(f"one refresh (usage + render, every device): {out['refresh_us']:.1f} us")
    for place in ("cpu", "cuda"):
        for size in (1000, 10**6):
            a = memarray.asarray(np.arange(size, dtype=np.float32), device=place)
            for name, f in (
                ("repr", repr),
                ("str", str),
                ("_repr_html_", lambda v: v._repr_html_()),
            ):
                k = 50
                t = time.perf_counter()
                for _ in range(k):
                    f(a)
                us = (time.perf_counter() - t) / k * 1e6
                out[f"{name}_{place}_{size}_us"] = us
                print(f"{name:>12} of a {size:>7}-element {place} array: {us:9.1f} us")
    ok = out["step_ms_1 s"] / base <= 1.01
    print(
        ("ok" if ok else "MISS")
        + f": monitor at 1 s costs {out['step_ms_1 s'] / base - 1:+.2%} per step"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
