"""The crash-proof suite's child process: runs one group of adversarial cases
and prints ``CASES <n>`` when every case came back as an ordinary exception or a result.

Run by ``test_crashproof.py`` in a subprocess, so a signal (SIGSEGV, SIGBUS) or a Rust
panic fails that test instead of ending the run. Before each case its id goes to stderr,
so a crash names the case that caused it.

    python crash_cases.py GROUP [SEED]
"""

from __future__ import annotations

import io
import os
import pickle
import random
import sys
import tempfile
import threading
import time

import hostile
import numpy as np

import memarray

COUNT = 0


def case(label, fn, *args, **kwargs):
    """Runs one case: any Exception is fine; a BaseException that is not (a Rust
    PanicException) fails the whole group."""
    global COUNT
    COUNT += 1
    sys.stderr.write(f"case {COUNT}: {label}\n")
    try:
        return fn(*args, **kwargs)
    except Exception:  # noqa: BLE001 - an ordinary, typed error is the right outcome
        return None
    except BaseException as e:  # noqa: BLE001
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        print(f"NOT AN EXCEPTION from case {COUNT} ({label}): {type(e).__name__}: {e}")
        sys.exit(3)


def dlpack(seed):
    rng = random.Random(seed)
    for i in range(3000):
        cap = hostile.random_capsule(rng)
        m = case(f"capsule {i}", memarray.from_dlpack, cap)
        if m is not None and m.device == "cpu" and hostile.honest(m):
            case(f"capsule {i} read", lambda m=m: np.asarray(m).sum())
        del m
    # The two first reported and their neighbours, both kinds.
    for versioned in (True, False):
        for off in (2**63, 2**62, 2**57, 2**47, 2**64 - 8):
            cap = hostile.capsule(versioned=versioned, byte_offset=off)
            case(f"byte_offset {off}", memarray.from_dlpack, cap)
        for stride in (2**40, 2**33, 2**20, 2**60):
            cap = hostile.capsule(versioned=versioned, shape=(2, 2), strides=(stride, 1), ndim=2)
            case(f"stride {stride}", memarray.from_dlpack, cap)
        for ptr in (8, 2**46, 2**63):
            cap = hostile.capsule(versioned=versioned, shape_ptr=ptr)
            case(f"shape pointer {ptr}", memarray.from_dlpack, cap)
            cap = hostile.capsule(versioned=versioned, strides_ptr=ptr)
            case(f"strides pointer {ptr}", memarray.from_dlpack, cap)
        for dev in ((1, 0), (2, 0), (3, 0), (13, 0)):
            cap = hostile.capsule(versioned=versioned, device=dev, byte_offset=2**63)
            case(f"device {dev} offset", memarray.from_dlpack, hostile.Producer(cap, dev))


def subclasses(seed):
    del seed
    bases = [np.arange(2.0)[::2], np.arange(6.0).reshape(2, 3), np.zeros(3, np.float32)]
    for base in bases:
        for lies in hostile.lies_for(base):
            x = hostile.liar(base, **lies)
            a = memarray.MemArray(base.shape, base.dtype)
            name = ",".join(lies)
            case(f"to_numpy(out=) {name}", a.to_numpy, out=x)
            big = memarray.MemArray((1 << 20,), base.dtype)
            case(f"to_numpy(out=) big {name}", big.to_numpy, out=x)
            case(f"read_numpy_array {name}", a.read_numpy_array, x)
            case(f"asarray {name}", memarray.asarray, x)
            case(f"from_dlpack {name}", memarray.from_dlpack, x)
            case(f"setitem {name}", a.__setitem__, 0, x)
            case(f"MemArray(shape=) {name}", memarray.MemArray, x)
            case(f"full {name}", memarray.full, (2,), x)
            case(f"move_many {name}", memarray.move_many, [x], "cpu")
            case(f"__array__ {name}", a.__array__, x)


def files(seed):
    del seed
    d = tempfile.mkdtemp()
    p = os.path.join(d, "a.npy")
    x = np.arange(2 << 20, dtype=np.float64)  # 16 MiB
    np.save(p, x)
    with open(p, "rb") as f:
        blob = f.read()
    stop = threading.Event()

    def mutate():
        # Another writer (not memarray: no lock) shrinks and restores the file.
        while not stop.is_set():
            with open(p, "r+b") as f:
                f.truncate(4096)
            with open(p, "r+b") as f:
                f.write(blob)

    t = threading.Thread(target=mutate)
    t.start()
    deadline = time.monotonic() + 3
    try:
        while time.monotonic() < deadline:
            a = case("load while truncated", memarray.load, p)
            if a is not None:
                case("read loaded", a.to_numpy)
    finally:
        stop.set()
        t.join()
    # A File resource never truncates a file another one maps.
    from memarray import resources as mr

    q = os.path.join(d, "file.bin")
    a = memarray.MemArray((1 << 20,), "u1", host_resource=mr.File(q))
    a[100] = 7
    for _ in range(20):
        case("second File", mr.File, q)
        case("save over mapped file", memarray.MemArray((4,)).save, q)
        case("load of mapped file", memarray.load, q)
        case("read after", a.__getitem__, 100)
    assert a[100] == 7


class _Only(pickle.Unpickler):
    """Unpickles only what a MemArray pickle names (a hostile pickle aims at memarray's
    rebuild, not at pickle's own ability to call anything)."""

    def find_class(self, module, name):
        if (module, name) in {
            ("memarray._pickle", "rebuild"),
            ("memarray._pickle", "ipc_handle"),
            ("builtins", "bytearray"),
            ("builtins", "getattr"),
            ("memarray._bundle", "Bundle"),
            ("memarray._bundle", "Bundle._of"),
            ("memarray._memarray", "_pack_table"),
        }:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed here")


def pickles(seed):
    rng = random.Random(seed)
    from memarray import _pickle

    arrays = [
        memarray.MemArray((3, 4), "f4"),
        memarray.MemArray((5,), "u1"),
        memarray.MemArray((), "c16"),
    ]
    bundles = [
        memarray.Bundle(arrays),
        memarray.Bundle([memarray.MemArray((n,), "i2") for n in range(40)]),
    ]
    blobs = [pickle.dumps(a, protocol=p) for a in arrays + bundles for p in (2, 4, 5)]
    for i in range(1500):
        b = _mutated(rng, rng.choice(blobs))
        case(f"mutated pickle {i}", lambda b=b: _opened(_Only(io.BytesIO(bytes(b))).load()))
    # A Bundle's table pickles as one bytes object: mutated, it is a ValueError or a table
    # whose entries the pack then checks.
    tables = [pickle.loads(pickle.dumps(b._entries)) for b in bundles]
    encoded = [t.__reduce__()[1][0] for t in tables]
    for i in range(1500):
        b = _mutated(rng, rng.choice(encoded))
        pack = bundles[i % 2].pack
        case(
            f"mutated table {i}",
            lambda b=b, pack=pack: _opened(
                memarray.Bundle._of(pack, memarray._memarray._pack_table(bytes(b)))
            ),
        )
    shapes = [(8 << 30,), (0, 2**64 - 1), (-1,), (2**63,), (2**62, 4), (3,), "x", (1.5,), [2] * 40]
    dtypes = ["uint8", "float64", "bfloat16", "nope", "\udcff", 3]
    payloads = [b"", b"\0" * 24, bytearray(8), memoryview(b"\0" * 48)[::2]]
    for shape in shapes:
        for dtype in dtypes:
            for data in payloads:
                for dev in (None, 0, -1, 2**40):
                    case(
                        f"rebuild {shape} {dtype!r}",
                        _pickle.rebuild,
                        data,
                        dtype,
                        shape,
                        dev,
                        0 if dev is None else dev,
                        "auto",
                    )


def _mutated(rng, blob):
    """`blob` with one to three random changes: a byte overwritten, the tail cut off, or
    up to eight random bytes inserted."""
    b = bytearray(blob)
    for _ in range(rng.randrange(1, 4)):
        op = rng.randrange(3)
        if op == 0 and b:
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif op == 1:
            b = b[: rng.randrange(len(b) + 1)]
        else:
            at = rng.randrange(len(b) + 1)
            b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
    return b


def _opened(x):
    """Reads every array of an unpickled Bundle (views made from its table)."""
    if isinstance(x, memarray.Bundle):
        return [a.to_numpy() for a in x]
    return x


GROUPS = {"dlpack": dlpack, "subclasses": subclasses, "files": files, "pickles": pickles}

if __name__ == "__main__":
    group = sys.argv[1]
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 13
    GROUPS[group](seed)
    print(f"CASES {COUNT}")
