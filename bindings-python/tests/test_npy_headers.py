"""`.npy` header parsing agrees with NumPy's: generated
headers (duplicate keys, spacing, comments, versions 1.0/2.0/3.0 and others, every descr
NumPy writes and some it does not, shapes as tuples, ints, lists) are loaded by both
``np.load`` and ``memarray.load``. Where NumPy refuses, memarray refuses (ValueError);
where NumPy accepts, memarray gives the same values at the same indices (Fortran order and
big-endian files included, in native byte order and C order), or refuses
a dtype it cannot hold (strings, objects, long double, structured) with a ValueError
saying so."""

from __future__ import annotations

import random
import warnings

import numpy as np
import pytest

import memarray

DESCRS = [
    "'<f8'",
    "'<f4'",
    "'<f2'",
    "'|b1'",
    "'|u1'",
    "'|i1'",
    "'<i2'",
    "'<i4'",
    "'<i8'",
    "'<u2'",
    "'<u4'",
    "'<u8'",
    "'<c8'",
    "'<c16'",
    "'>f8'",
    "'>u1'",
    "'=f4'",
    "'f8'",
    "'float32'",
    "'<V2'",
    "'<U3'",
    "'O'",
    '"<f8"',
    "u'<f8'",
    "'<f' '8'",
    "[('a', '<f8')]",
    "3",
    "'xyz'",
    # Descriptors NumPy reads.
    "'<q'",
    "'<l'",
    "'d'",
    "'double'",
    "'<e'",
    "'?'",
    "'<f'",
    "'<B'",
    "'>D'",
    "'>c8'",
    "'<f 4'",
    "'i 8'",
    "'f04'",
    "'<float32'",
    "'<g'",
    "'<f16'",
    "'\\x3cf8'",
    "'<f\\x34'",
    "'\\74i2'",
    "'\\u003cf4'",
    "'\\U0000003cu2'",
    "'<\\N{DIGIT FOUR}'",
    "'\\x3'",
    "('<f4', (2,))",
    "('<i2', 3)",
    "('<f4', ())",
]
SHAPES = [
    "(6,)",
    "(2, 3)",
    "(3, 2)",
    "()",
    "(6)",
    "[6]",
    "(6, )",
    "(2,3,)",
    "(1, 6)",
    "(0,)",
    "(-1,)",
    "(6L,)",
    "(True, 6)",
    "(0x6,)",
    "(6.0,)",
    "(2, 3,  )",
    "(06,)",
    "(1_2,)",
    "(6 ,)",
    "(--6,)",
    "(+6,)",
    "(+2, +3)",
    "(-(6),)",
    "(-True,)",
]
ORDERS = ["False", "True", "0", "None", "'False'"]
VERSIONS = [(1, 0), (2, 0), (3, 0), (1, 9), (0, 1), (4, 0)]


def build(rng: random.Random) -> tuple[bytes, tuple]:
    items = [
        ("descr", rng.choice(DESCRS)),
        ("fortran_order", rng.choice(ORDERS)),
        ("shape", rng.choice(SHAPES)),
    ]
    # Duplicates, extra keys, missing keys, any order.
    for _ in range(rng.choice([0, 0, 1, 2])):
        k = rng.choice(["descr", "fortran_order", "shape", "extra"])
        v = {"descr": DESCRS, "fortran_order": ORDERS, "shape": SHAPES, "extra": ["1"]}[k]
        items.insert(rng.randrange(len(items) + 1), (k, rng.choice(v)))
    if rng.random() < 0.05:
        items.pop(rng.randrange(len(items)))
    rng.shuffle(items)
    q = rng.choice(["'", '"'])
    sp = rng.choice(["", " ", "  ", "\t"])
    body = ("," + sp).join(f"{q}{k}{q}{sp}:{sp}{v}" for k, v in items)
    text = "{" + sp + body + rng.choice(["", ",", ", "]) + sp + "}"
    if rng.random() < 0.05:
        text = text + " # a comment"
    if rng.random() < 0.05:
        text = "(" + text + ")"
    version = rng.choice(VERSIONS)
    h = text.encode("latin1")
    prefix = b"\x93NUMPY" + bytes(version)
    n = len(prefix) + (2 if version[0] == 1 else 4)
    total = -(-(n + len(h) + 1) // 64) * 64
    h = h + b" " * (total - n - len(h) - 1) + b"\n"
    size = len(h).to_bytes(2 if version[0] in (0, 1) else 4, "little")
    return prefix + size + h + bytes(range(48)) * 2, (version, text)


def test_generated_headers_agree_with_numpy(tmp_path):
    rng = random.Random(13)
    agree = accepted = refused_before = 0
    p = tmp_path / "h.npy"
    for _ in range(3000):
        blob, what = build(rng)
        p.write_bytes(blob)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # NumPy's note on Python 2 'L' suffixes
                want = np.load(p, allow_pickle=False)
        except Exception:  # noqa: BLE001 - NumPy's refusal, whatever its type
            want = None
        try:
            got = memarray.load(p)
        except ValueError as e:
            got = e
        except Exception as e:  # noqa: BLE001
            pytest.fail(f"{what}: {type(e).__name__}: {e}")
        if want is None:
            assert isinstance(got, ValueError), f"NumPy refuses {what}, memarray loaded it"
            agree += 1
            continue
        native = want.dtype.newbyteorder("=")
        holdable = native.name in memarray.SUPPORTED_DTYPES
        # Fortran order and big-endian data load too.
        fortran_or_swapped = (want.ndim > 1 and np.isfortran(want)) or not want.dtype.isnative
        refused_before += fortran_or_swapped
        if isinstance(got, ValueError):
            assert not holdable, f"NumPy loads {what} as {want.dtype}{want.shape}: {got}"
            agree += 1
            continue
        accepted += 1
        assert got.shape == want.shape and got.dtype == native, what
        np.testing.assert_array_equal(got.to_numpy(), want)
        agree += 1
    assert agree == 3000
    assert accepted > 100, f"only {accepted} headers were loadable: the generator is too hostile"
    assert refused_before > 50, "too few Fortran-order or big-endian files were generated"
