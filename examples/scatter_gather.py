"""Splits one array across every visible GPU, runs the add_index kernel on each part, and
joins the parts back (memarray.scatter / memarray.gather, peer copies between devices).

    python examples/scatter_gather.py [--rows 100003] [--cols 64]

On one GPU the parts all live on cuda:0 (three of them), which exercises the same paths.
Checks the result against NumPy: each element gains the sum of its indices within its part.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

#: The exit status of every example that this machine lacks what it needs for (a GPU).
NEEDS = 77


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=100_003)
    ap.add_argument("--cols", type=int, default=64)
    args = ap.parse_args(argv)
    import memarray

    if not memarray.cuda.is_available():
        print(f"scatter_gather needs a CUDA device: {memarray.cuda.unavailable_reason()}")
        return NEEDS
    n = memarray.cuda.device_count()
    devices = list(range(n)) if n > 1 else [0, 0, 0]
    host = np.arange(args.rows * args.cols, dtype=np.float64).reshape(args.rows, args.cols)
    a = memarray.asarray(host, device="cuda:0")
    parts = memarray.scatter(a, devices)
    print("parts:", ", ".join(f"{p.shape[0]} rows on {p.device}" for p in parts))
    for p in parts:
        p.add_index_tuple()  # each on its own device
    out = memarray.gather(parts, device="cpu").to_numpy()
    want = host.copy()
    start = 0
    for p in parts:
        rows = p.shape[0]
        i, j = np.indices((rows, args.cols))
        want[start : start + rows] += i + j
        start += rows
    np.testing.assert_array_equal(out, want)
    back = memarray.gather(parts, device=f"cuda:{devices[-1]}")
    assert back.device == f"cuda:{devices[-1]}"
    np.testing.assert_array_equal(back.to_numpy(), want)
    print(f"{args.rows}x{args.cols} float64 across {devices}: gathered result matches NumPy")
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
