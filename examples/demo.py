"""memarray demo: the seed's flow, on the GPU when there is one, on the host otherwise.

Run with ``./dev.sh demo`` (builds the wheel into .venv first).
"""

from __future__ import annotations

import numpy as np

import memarray
from memarray import dlpack


def main() -> None:
    gpu = memarray.cuda.is_available()
    where = f"GPU ({memarray.cuda.device_count()} device(s))" if gpu else "host (no CUDA device)"
    print(f"memarray demo on the {where}")

    a = memarray.MemArray([2, 4, 7], np.float32)
    print("created  ", a)

    # Fill from NumPy (any layout, cast to the array's dtype).
    a.read_numpy_array(np.full((2, 4, 7), 2.0))

    if gpu:
        a.move_memory(dlpack.kDLCUDA)
        print("moved    ", a)
    # Adds the sum of each element's indices: the CUDA kernel on the GPU, else the host.
    a.add_index_tuple()
    a.move_memory(dlpack.kDLCPU)

    # Zero-copy, writable NumPy view while the array is locked.
    with a.get_dlpack(dlpack.kDLCPU) as t:
        view = np.from_dlpack(t)
        expected = 2.0 + np.indices(a.shape).sum(axis=0)
        assert np.array_equal(view, expected), "add_index_tuple gave a wrong result"
        print("a[1, 3, 6] =", view[1, 3, 6], "(2 + 1 + 3 + 6)")

    if gpu:
        try:
            import torch
        except ImportError:
            torch = None
        a.move_memory(dlpack.kDLCUDA)
        if torch is not None:
            t = torch.from_dlpack(a)  # zero-copy on the GPU (DLPack)
            print("torch sees", tuple(t.shape), t.dtype, t.device, "sum =", float(t.sum()))
        try:
            import cupy
        except ImportError:
            cupy = None
        if cupy is not None:
            c = cupy.asarray(a)  # zero-copy on the GPU (CUDA Array Interface)
            print("cupy sees ", c.shape, c.dtype, "device", c.device.id, "sum =", float(c.sum()))
    print("ok")


if __name__ == "__main__":
    main()
