"""What a Bundle's table costs each time it crosses a process: the sender's pack and
pickle, the receiver's unpickle, check and unpack, for N small arrays (the table a Ray
transport's metadata and a pickled Bundle carry).

    python3 benches/bundle_table.py [--count 1000] [--kib 4] [--device cpu] [--reps 41]
                                    [--json out.json]

Rows (medians, ms per object of ``count`` arrays): ``_pack`` (table included),
``_share`` of the views, the table alone pickled (``dumps``) and unpickled (``loads``),
``_check_table`` of an unpickled table against its pack, ``_unpack``, and a Bundle's
whole round trip (``pickle.dumps``, ``pickle.loads``, every array made). Runs on the host
anywhere, on a device with ``--device cuda``. Old and new builds compare by running it
under each wheel in turn.
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys

import numpy as np

# Run as a script: its folder is on sys.path, and pack.py's timing loop is this one's.
from pack import median_ms

import memarray
from memarray import _memarray


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--kib", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=41)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.device != "cpu" and not memarray.cuda.is_available():
        print(f"SKIPPED: no CUDA device ({memarray.cuda.unavailable_reason()})")
        return 0
    n = args.kib << 8  # float32 elements
    arrays = [
        memarray.asarray(np.full(n, i, np.float32), device=args.device) for i in range(args.count)
    ]
    for a in arrays:
        a.synchronize()
    pack, table = _memarray._pack(arrays)
    views = _memarray._unpack(pack, table)
    pickled = pickle.dumps(table, protocol=5)
    bundle = memarray.Bundle(arrays)

    def round_trip() -> None:
        b = pickle.loads(pickle.dumps(bundle, protocol=5))
        list(b)

    rows = {
        "pack": median_ms(lambda: _memarray._pack(arrays), args.reps),
        "share": median_ms(lambda: _memarray._share(views), args.reps),
        "table dumps": median_ms(lambda: pickle.dumps(table, protocol=5), args.reps),
        "table loads": median_ms(lambda: pickle.loads(pickled), args.reps),
        "check": median_ms(
            lambda: _memarray._check_table(pack.nbytes, pickle.loads(pickled)), args.reps
        )
        - median_ms(lambda: pickle.loads(pickled), args.reps),
        "unpack": median_ms(lambda: _memarray._unpack(pack, table), args.reps),
        "bundle round trip": median_ms(round_trip, args.reps),
    }
    print(
        f"{args.count} x {args.kib} KiB on {args.device}, table pickle {len(pickled)} B, "
        f"medians of {args.reps} (ms):"
    )
    for k, v in rows.items():
        print(f"  {k:18} {v:8.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"count": args.count, "kib": args.kib, "device": args.device, **rows}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
