"""safetensors files: memarray.load_safetensors and save_safetensors against safetensors'
own reader and writer (every dtype both define, bit for bit), names, metadata, and hostile
files (each refused with ValueError, in a child process so a crash fails the test)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from children import assert_clean, run_child

import memarray

safetensors = pytest.importorskip("safetensors", reason="safetensors is in dev.sh's packages")
from safetensors import numpy as st_numpy  # noqa: E402

# memarray dtype -> (safetensors' name, a NumPy dtype of the same bytes)
DTYPES = {
    "bool": ("BOOL", np.bool_),
    "int8": ("I8", np.int8),
    "int16": ("I16", np.int16),
    "int32": ("I32", np.int32),
    "int64": ("I64", np.int64),
    "uint8": ("U8", np.uint8),
    "uint16": ("U16", np.uint16),
    "uint32": ("U32", np.uint32),
    "uint64": ("U64", np.uint64),
    "float16": ("F16", np.float16),
    "bfloat16": ("BF16", np.uint16),
    "float32": ("F32", np.float32),
    "float64": ("F64", np.float64),
    "complex64": ("C64", np.complex64),
}
SHAPES = {"0-d": (), "size-0": (2, 0), "2-d": (3, 5), "32-d": (1,) * 31 + (2,)}


def _data(dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Bytes of `shape` in `dtype` (a bfloat16 array's as uint16)."""
    n = int(np.prod(shape, dtype=np.int64))
    raw = np.random.default_rng(seed).integers(0, 256, n * np.dtype(DTYPES[dtype][1]).itemsize)
    a = raw.astype(np.uint8).view(DTYPES[dtype][1]).reshape(shape)
    return np.asarray(a & 1, dtype=np.bool_) if dtype == "bool" else a


def test_every_dtype_round_trips_bit_for_bit_against_safetensors(tmp_path):
    arrays, expect = {}, {}
    for i, dtype in enumerate(DTYPES):
        for name, shape in SHAPES.items():
            key = f"{dtype} {name}"
            expect[key] = _data(dtype, shape, i)
            arrays[key] = memarray.zeros(shape, dtype)
            if expect[key].size:
                arrays[key].read_numpy_array(expect[key].view(arrays[key].dtype))
    path = tmp_path / "ours.safetensors"
    memarray.save_safetensors(path, arrays, {"made by": "memarray"})
    # safetensors' own reader takes our file: every tensor's dtype, shape and bytes.
    theirs = dict(safetensors.deserialize(path.read_bytes()))
    assert set(theirs) == set(expect)
    for key, a in expect.items():
        t = theirs[key]
        assert t["dtype"] == DTYPES[key.split()[0]][0] and tuple(t["shape"]) == a.shape, key
        assert bytes(t["data"]) == a.tobytes(), key
    with safetensors.safe_open(path, framework="numpy") as f:
        assert f.metadata() == {"made by": "memarray"}
    # Ours reads it back; safetensors' NumPy writer's file too.
    back, meta = memarray.load_safetensors(path, metadata=True)
    assert meta == {"made by": "memarray"} and set(back) == set(expect)
    for key, a in expect.items():
        got = back[key]
        assert str(got.dtype) == key.split()[0] and got.shape == a.shape, key
        assert got.to_numpy().tobytes() == a.tobytes(), key
    plain = {k: v for k, v in expect.items() if not k.startswith("bfloat16")}
    st_numpy.save_file(plain, tmp_path / "theirs.safetensors")
    mine = memarray.load_safetensors(tmp_path / "theirs.safetensors")
    for key, a in plain.items():
        assert mine[key].to_numpy().tobytes() == a.tobytes(), key


def test_names_pick_tensors_and_what_memarray_cannot_hold_is_refused_by_name(tmp_path):
    path = tmp_path / "f8.safetensors"
    header = {
        "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "q": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [8, 12]},
    }
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + np.float32([1, 2]).tobytes() + bytes(4))
    with pytest.raises(ValueError, match='"q" is F8_E4M3: memarray holds no such dtype'):
        memarray.load_safetensors(path)
    got = memarray.load_safetensors(path, names=["w"])
    assert list(got) == ["w"] and got["w"].to_numpy().tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match='no tensor named "nope"'):
        memarray.load_safetensors(path, names=["nope", "w"])
    with pytest.raises(TypeError):
        memarray.load_safetensors(path, names="w")


def test_what_the_format_cannot_hold_is_refused_before_the_file_is_written(tmp_path):
    path = tmp_path / "x.safetensors"
    with pytest.raises(ValueError, match="no complex128"):
        memarray.save_safetensors(path, {"z": memarray.zeros((2,), "complex128")})
    with pytest.raises(ValueError, match="reserved"):
        memarray.save_safetensors(path, {"__metadata__": memarray.zeros((2,), "float32")})
    assert not path.exists()
    with pytest.raises(TypeError):
        memarray.save_safetensors(path, [memarray.zeros((2,), "float32")])
    with pytest.raises(TypeError):
        memarray.save_safetensors(path, {1: memarray.zeros((2,), "float32")})
    with pytest.raises(TypeError):
        memarray.save_safetensors(path, {"a": memarray.zeros((2,), "float32")}, {"k": 1})
    with pytest.raises(FileNotFoundError):
        memarray.load_safetensors(tmp_path / "missing.safetensors")
    # NumPy arrays are taken as asarray takes them.
    memarray.save_safetensors(path, {"a": np.arange(3, dtype=np.int16)})
    assert memarray.load_safetensors(path)["a"].to_numpy().tolist() == [0, 1, 2]


HOSTILE = r"""
import json, struct, sys, memarray

def f(header, data=b"", raw=None):
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return raw if raw is not None else struct.pack("<Q", len(text)) + text + data

t = lambda d, s, b, e: {"dtype": d, "shape": s, "data_offsets": [b, e]}
cases = {
    "short": f(None, raw=b"\x01\x00"),
    "header past the file": struct.pack("<Q", 1 << 20) + b"{}",
    "header past 100 MB": struct.pack("<Q", 10**9) + b"{}",
    "not json": f(b"{nope"),
    "not an object": f(b"[1, 2]"),
    "bad utf-8": f(b'{"\xff": 1}'),
    "duplicate names": f(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                         b'"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"x"),
    "offset past the data": f({"a": t("U8", [4], 0, 4)}, b"xy"),
    "overlapping": f({"a": t("U8", [4], 0, 4), "b": t("U8", [4], 2, 6)}, b"x" * 6),
    "unsorted gap": f({"a": t("U8", [2], 4, 6), "b": t("U8", [2], 0, 2)}, b"x" * 6),
    "size disagrees": f({"a": t("F32", [3], 0, 8)}, b"x" * 8),
    "unknown dtype": f({"a": t("F128", [1], 0, 16)}, b"x" * 16),
    "negative extent": f({"a": t("U8", [-1], 0, 0)}),
    "huge extent": f({"a": t("F32", [2**62, 2**62], 0, 0)}),
    "trailing bytes": f({"a": t("U8", [1], 0, 1)}, b"xyz"),
    "too many dimensions": f({"a": t("U8", [1] * 40, 0, 1)}, b"x"),
    "deep nesting": f(b"{" + b'"a":' * 1 + b"[" * 5000 + b"]" * 5000 + b"}"),
}
out = {}
for name, data in cases.items():
    path = sys.argv[1] + "/" + name.replace(" ", "_")
    open(path, "wb").write(data)
    try:
        memarray.load_safetensors(path)
        out[name] = "loaded"
    except ValueError as e:
        out[name] = "ValueError: " + str(e)
    except Exception as e:
        out[name] = type(e).__name__ + ": " + str(e)
print(json.dumps(out))
"""


def test_hostile_files_are_value_errors_never_a_crash(tmp_path):
    code = HOSTILE.replace("sys.argv[1]", repr(str(tmp_path)))
    r = run_child(code)
    assert_clean(r)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    bad = {k: v for k, v in out.items() if not v.startswith("ValueError")}
    assert not bad, bad
    assert "past the limit" in out["header past 100 MB"], out
    assert "given twice" in out["duplicate names"], out
    assert "overlaps" in out["overlapping"], out


@pytest.mark.gpu
def test_a_device_load_is_bit_exact_against_safetensors_own(tmp_path):
    path = tmp_path / "w.safetensors"
    expect = {
        f"layer{i}": np.random.default_rng(i).standard_normal((256, 1024)).astype(np.float32)
        for i in range(8)
    }
    st_numpy.save_file(expect, path)
    got = memarray.load_safetensors(path, device="cuda")
    for k, a in expect.items():
        assert got[k].device == "cuda:0" and got[k].to_numpy().tobytes() == a.tobytes(), k
    memarray.save_safetensors(tmp_path / "back.safetensors", got)
    back = st_numpy.load_file(tmp_path / "back.safetensors")
    assert all(back[k].tobytes() == a.tobytes() for k, a in expect.items())


@pytest.mark.gpu
@pytest.mark.parametrize("scale", [1, 64])
def test_a_device_load_of_mixed_tensors_fills_each_from_its_own_bytes(tmp_path, scale):
    # Sizes that split pipeline chunks and pieces anywhere: odd byte counts, an empty
    # tensor, one of 16 MiB (scale 64: about 21 MiB in all, the staged lanes; scale
    # 1: 340 KiB, the short path or the direct copy), and a subset by name.
    rng = np.random.default_rng(scale)
    expect = {
        "a_int8": rng.integers(-128, 127, 7 * scale, dtype=np.int8),
        "b_empty": np.zeros((0, 3), np.float32),
        "c_f16": rng.standard_normal((33, 129 * 8 * scale)).astype(np.float16),
        "d_u8": rng.integers(0, 255, 3, dtype=np.uint8),
        "e_f64": rng.standard_normal(1001 * 32 * scale),
        "f_i32": rng.integers(-(2**31), 2**31 - 1, (5, 7, 11 * 8 * scale), dtype=np.int32),
    }
    path = tmp_path / "mixed.safetensors"
    st_numpy.save_file(expect, path)
    got = memarray.load_safetensors(path, device="cuda")
    assert sorted(got) == sorted(expect)
    for k, a in expect.items():
        g = got[k].to_numpy()
        assert g.dtype == a.dtype and g.shape == a.shape and g.tobytes() == a.tobytes(), k
    some = memarray.load_safetensors(path, device="cuda", names=["f_i32", "a_int8", "e_f64"])
    assert sorted(some) == ["a_int8", "e_f64", "f_i32"]
    for k, g in some.items():
        assert g.to_numpy().tobytes() == expect[k].tobytes(), k
