"""What checking a foreign DLPack tensor costs: memarray's import of a host producer that
is not an ndarray (so the struct, shape, strides and data are checked readable) against
NumPy's and torch's imports of the same producer, which check none of them.

    python3 benches/import_check.py [--json out.json]

Two producers: 4 float64 (every range one page: the probe) and 128 MiB (the data range
answered by the mappings). Medians of 7 rounds; torch where installed.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
from python_interop import per_call_us  # benches/ is the script's folder

import memarray


class Producer:
    """A host DLPack producer that is not an ndarray (as a torch CPU tensor or a JAX array
    is to memarray): its capsule comes from NumPy."""

    def __init__(self, x: np.ndarray) -> None:
        self.x = x

    def __dlpack__(self, **kw):  # noqa: ANN003, ANN201
        return self.x.__dlpack__(**{k: v for k, v in kw.items() if k != "stream"})

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.x.__dlpack_device__()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    importers = {"memarray": memarray.from_dlpack, "numpy": np.from_dlpack}
    try:
        import torch

        importers["torch"] = torch.from_dlpack
    except ImportError:
        pass
    out: dict = {}
    for label, x, n in (
        ("4 float64", np.arange(4.0), 20000),
        ("128 MiB", np.zeros(1 << 24), 5000),
    ):
        p = Producer(x)
        row = {
            name: per_call_us(lambda f=f, p=p: f(p), n=n, warmup=100)
            for name, f in importers.items()
        }
        out[label] = row
        print(
            f"{label:>10}: "
            + "  ".join(f"{name} {us:6.2f} us" for name, us in row.items())
            + f"  (memarray / numpy {row['memarray'] / row['numpy']:.2f}x)"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
