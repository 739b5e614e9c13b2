"""Documented exception types for hostile text, plots
and environments; memory linear in adaptor depth; no producer type kept alive; NumPy's
element casting; the newcomer's first hour. Hostile inputs run in fresh interpreters."""

from __future__ import annotations

import gc
import os
import re
import weakref

import numpy as np
import pytest
from children import child_stdout, run_child, run_command

import memarray
import memarray.cuda as mc
from memarray import resources

LONE = "a\ud800b"


# --- item 4: lone surrogates are ValueError naming the argument -------------------------


@pytest.mark.parametrize(
    ("call", "arg"),
    [
        (lambda: mc.Module.from_source(LONE), "source"),
        (lambda: mc.Module.from_source("x", LONE), "name"),
        (lambda: mc.Module.from_source("x", "k.cu", ["-I.", LONE]), "options[1]"),
        (lambda: mc.Module(LONE), "image"),
        (lambda: memarray.spill.enable(0, device_budget=LONE), "device_budget"),
        (lambda: memarray.spill.enable(0, host_budget=LONE), "host_budget"),
    ],
)
def test_lone_surrogates_are_value_errors_naming_the_argument(call, arg):
    with pytest.raises(ValueError, match=re.escape(arg) + " is not valid Unicode") as e:
        call()
    assert not isinstance(e.value, UnicodeError)


def test_module_options_must_be_a_list_of_str():
    with pytest.raises(TypeError, match="list of str"):
        mc.Module.from_source("x", "k.cu", "-I.")
    with pytest.raises(TypeError, match="options\\[0\\] must be a str"):
        mc.Module.from_source("x", "k.cu", [3])


# --- item 4 and 13: plot --------------------------------------------------------------


def _snapshot():
    t = resources.Tracking(resources.Host())
    a = t.allocate(1 << 20)
    snap = t.snapshot()
    a.free()
    return snap


HOSTILE_SNAPSHOTS = [
    {"timeline": [[10**400, 1]], "sources": ["memarray"], "live": []},
    {"timeline": [[float("inf"), 1]], "sources": ["memarray"], "live": []},
    {"timeline": [[0, 1]], "sources": ["memarray"], "live": [None]},
    {"timeline": [[0, 1]], "sources": ["memarray"], "live": [{"size": 1}]},
    {"timeline": [[0, 1, 2]], "sources": ["memarray"], "live": []},
    {"timeline": None, "sources": ["memarray"], "live": []},
    {"timeline": [[0, "x"]], "sources": ["memarray"], "live": []},
    {"timeline": [], "sources": 3, "live": []},
    {"timeline": [], "sources": [], "live": [], "events": [[1e400]]},
]


def test_plot_refuses_hostile_snapshots_and_csvs_with_value_error(tmp_path):
    pytest.importorskip("matplotlib")
    for i, snap in enumerate(HOSTILE_SNAPSHOTS):
        try:
            resources.plot(snap, tmp_path / f"s{i}.png")
        except ValueError:
            pass  # refused with the documented type, or drawn: never another type
    head = "event,address,size,source,time\n"
    for i, (text, refused) in enumerate(
        [
            (head + "allocate,0x1,1e999,x,0\n", True),
            (head + "allocate,0x1,10,x,notatime\n", True),
            (head + "allocate,0x1,10,x,1e400\n", True),  # an infinite time
            ("nothing,like,a,log\n1,2,3,4\n", True),
            ("", True),
            (head + '"allocate\n', False),
            ("event\x00,address\n\x00\n", True),
        ]
    ):
        p = tmp_path / f"log{i}.csv"
        p.write_text(text)
        try:
            resources.plot(str(p), tmp_path / f"l{i}.png")
            assert not refused, text
        except ValueError as e:
            assert "not a valid Logging CSV" in str(e)
    with pytest.raises(FileNotFoundError):
        resources.plot(str(tmp_path / "missing.csv"), tmp_path / "m.png")


def test_plot_returns_the_file_it_wrote_and_refuses_a_directory(tmp_path):
    pytest.importorskip("matplotlib")
    snap = _snapshot()
    out = resources.plot(snap, tmp_path / "memory")
    assert out == str(tmp_path / "memory.png") and os.path.exists(out)
    assert not os.path.exists(tmp_path / "memory")
    d = tmp_path / "adir"
    d.mkdir()
    with pytest.raises(IsADirectoryError):
        resources.plot(snap, d)
    assert not os.path.exists(str(d) + ".png")
    assert resources.plot(snap, str(tmp_path / "m.png")) == str(tmp_path / "m.png")


def test_plot_draws_the_last_step_of_the_timeline():
    from memarray._plot import _extend_last_step

    times = [0.0, 1.0, 2.0]
    series = {"memarray": [0, 5, 9]}
    _extend_last_step(times, series, 0.0)
    # The last value (9) now spans a width: it was drawn from t=2 to nowhere.
    assert times[-1] > 2.0 and series["memarray"][-2:] == [9, 9]
    times, series = [0.0, 1.0], {"x": [1, 2]}
    _extend_last_step(times, series, 5.0)  # up to the last spill/restore event
    assert times[-1] == 5.0 and series["x"][-1] == 2


# --- item 5: the environment is checked at import, whatever else is set -----------------


@pytest.mark.parametrize("var", ["MEMARRAY_DEVICE_BUDGET", "MEMARRAY_HOST_BUDGET"])
@pytest.mark.parametrize("spill", [None, "0", "1"])
def test_a_bad_budget_fails_the_import_with_or_without_spilling(var, spill):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMARRAY_")}
    env[var] = "lots"
    if spill is not None:
        env["MEMARRAY_SPILL"] = spill
    r = run_child("import memarray", env=env)
    assert r.returncode == 1, r.stderr
    assert "ValueError" in r.stderr and var in r.stderr, r.stderr[-2000:]
    env[var] = "2GiB"
    r = run_child("import memarray", env=env)
    assert r.returncode == 0, r.stderr


# --- item 6: adaptor names are bounded -------------------------------------------------


def test_nested_adaptors_hold_memory_linear_in_depth():
    r = resources.Host()
    lengths = []
    for i in range(4000):
        r = resources.Statistics(r) if i % 2 else resources.Limiting(r, 1 << 40)
        lengths.append(len(repr(r)))
    assert max(lengths) < 250, max(lengths)
    assert "host" in repr(r)
    a = r.allocate(64)
    a.free()


# --- item 7: from_dlpack keeps no producer class alive -----------------------------------


def test_from_dlpack_keeps_no_runtime_class_alive():
    def make():
        base = np.arange(6.0)

        class Producer:
            def __dlpack__(self, **kw):
                return base.__dlpack__(**kw)

            def __dlpack_device__(self):
                return base.__dlpack_device__()

        a = memarray.from_dlpack(Producer())
        assert a.to_numpy().tolist() == base.tolist()
        return weakref.ref(Producer)

    refs = [make() for _ in range(40)]
    gc.collect()
    alive = [r for r in refs if r() is not None]
    assert not alive, f"{len(alive)} of 40 producer classes kept alive"
    # The cache still works for a class that lives.
    t = weakref.ref(type(np.arange(1)))
    assert memarray.from_dlpack(np.arange(3.0)).to_numpy().tolist() == [0.0, 1.0, 2.0]
    assert t() is np.ndarray


# --- item 9: elements follow NumPy ------------------------------------------------------

VALUES = [
    2.7,
    -2.7,
    np.float64(2.7),
    np.float32(3.9),
    np.True_,
    np.False_,
    True,
    7,
    -1,
    300,
    2**40,
    2**70,
    np.int64(-1),
    np.int64(2**40),
    np.uint64(5),
    1e20,
    float("nan"),
    float("inf"),
    "3",
    "1.5",
    "x",
    1 + 2j,
    np.complex64(1 + 0j),
    None,
    [1],
]
DTYPES = [
    "bool",
    "int8",
    "uint8",
    "int32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
]


def _numpy_store(dtype, v):
    x = np.zeros(2, dtype)
    try:
        x[0] = v
    except Exception as e:  # noqa: BLE001 - NumPy's refusal, whatever its type
        return type(e)
    return x[0]


@pytest.mark.filterwarnings("ignore::numpy.exceptions.ComplexWarning")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", DTYPES)
def test_element_assignment_casts_as_numpy_does(dtype):
    for v in VALUES:
        want = _numpy_store(dtype, v)
        a = memarray.zeros((2,), dtype)
        try:
            a[0] = v
            got = a[0]
        except Exception as e:  # noqa: BLE001
            got = type(e)
        if isinstance(want, type):
            assert got is want, (
                f"{v!r} into {dtype}: NumPy raises {want.__name__}, memarray {got!r}"
            )
            assert a[0] == 0, "a refused value leaves the array unchanged"
        else:
            assert not isinstance(got, type), (
                f"{v!r} into {dtype}: NumPy stores {want!r}, memarray raised {got}"
            )
            assert np.array(got, dtype=dtype).tobytes() == np.array(
                want, dtype=dtype
            ).tobytes() or (np.isnan(want) and np.isnan(got)), (
                f"{v!r} into {dtype}: NumPy {want!r}, memarray {got!r}"
            )
        # full() takes its fill value the same way.
        if not isinstance(want, type):
            f = memarray.full((3,), v, dtype).to_numpy()
            assert f.tobytes() == np.full(3, want, dtype).tobytes() or np.isnan(want)


def test_index_of_a_0d_bool_array_is_a_type_error():
    import operator

    with pytest.raises(TypeError):
        operator.index(np.array(True))
    with pytest.raises(TypeError, match="integer"):
        operator.index(memarray.asarray(np.array(True)))
    assert operator.index(memarray.asarray(np.array(5, np.int16))) == 5


def test_str_is_numpys_str():
    for x in [
        np.arange(6.0).reshape(2, 3),
        np.array(3),
        np.arange(2000),
        np.array([True, False]),
        np.zeros((0, 2)),
    ]:
        assert str(memarray.asarray(x)) == str(x)
    a = memarray.asarray(np.arange(4))
    with a.get_dlpack(memarray.dlpack.kDLCPU):
        assert str(a).startswith("MemArray(shape=(4,)")  # locked: the summary, no error


# --- item 13: the first hour's output -------------------------------------------------


def test_the_release_extension_carries_no_debug_info():
    size = os.path.getsize(memarray._memarray.__file__)
    assert size < 8 << 20, (
        f"the extension is {size / 2**20:.1f} MiB (debug info in the release profile?)"
    )


def test_help_shows_each_signature_once():
    import memarray.distributed as md
    from memarray import resources as mr

    seen = 0
    for mod in (memarray, mc, mr, md, memarray._memarray):
        for name in dir(mod):
            obj = getattr(mod, name)
            targets = (
                [obj] + [getattr(obj, m) for m in dir(obj) if not m.startswith("__")]
                if isinstance(obj, type)
                else [obj]
            )
            for f in targets:
                sig = getattr(f, "__text_signature__", None)
                doc = getattr(f, "__doc__", None) or ""
                if sig and callable(f):
                    seen += 1
                    fname = getattr(f, "__name__", "")
                    first = doc.strip().splitlines()[0] if doc.strip() else ""
                    assert not first.startswith(f"{fname}("), (
                        f"{fname}: the docstring repeats the signature"
                    )
    assert seen > 30


def test_unsupported_numpy_dtypes_are_type_errors_naming_them():
    for x, named in [
        (np.array(["a", "b"]), "<U1"),
        (np.arange(3, dtype=">f4"), ">f4"),
        (np.array([1, "x"], dtype=object), "|O"),
    ]:
        for f in (memarray.asarray, memarray.from_dlpack):
            with pytest.raises(TypeError, match=re.escape(named)):
                f(x)
    with pytest.raises(TypeError, match=re.escape("'>f4' is big-endian")):
        memarray.MemArray(3, ">f4")


def test_pressure_counts_only_loaded_libraries():
    out = child_stdout(
        """
import sys
import memarray
from memarray import resources
r = resources.Limiting(resources.Host(), 10)
try:
    r.allocate(100)
except MemoryError:
    pass
s = resources.pressure_statistics()
assert s["events"] == 1, s
loaded = [k for k in ("torch", "cupy", "rmm") if k in sys.modules]
assert not loaded, loaded
print({k: v["calls"] for k, v in s["libraries"].items()})
"""
    )
    assert "{'torch': 0, 'cupy': 0, 'rmm': 0}" in out, out


@pytest.mark.parametrize(
    "example",
    ["demo.py", "one_pool.py", "distributed_torch.py", "ipc_pipeline.py", "scatter_gather.py"],
)
def test_examples_end_in_one_clear_line_without_a_gpu(example):
    import pathlib
    import sys

    if mc.is_available():
        pytest.skip("checks what a machine without a GPU prints")
    path = pathlib.Path(__file__).resolve().parents[2] / "examples" / example
    r = run_command([sys.executable, str(path)], timeout=300)
    out = (r.stdout + r.stderr).strip()
    assert "Traceback" not in out, out[-2000:]
    # 0: it ran on the host; 77: the examples' one status for "this machine lacks what I
    # need", after one line saying what (README).
    assert r.returncode in (0, 77), (r.returncode, out[-2000:])
    if r.returncode == 77:
        assert "needs" in out.splitlines()[-1], out[-2000:]


# --- item 12: the docs stand alone ------------------------------------------------------


def test_docs_name_nothing_outside_the_repo_without_a_link():
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    user_docs = [
        "README.md",
        "docs/python-guide.md",
        "docs/rust-guide.md",
        "docs/c-cpp-guide.md",
        "docs/memory-manager.md",
        "docs/spilling.md",
    ]
    problems = []
    for name in user_docs + ["docs/architecture.md"]:
        text = (root / name).read_text()
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        prose = re.sub(r"`[^`\n]*`", "", prose)
        for m in re.finditer(r"\b(the seed|umem|NBEP 7)\b", prose, flags=re.I):
            around = prose[max(0, m.start() - 1) : m.end() + 2]
            if (
                not (around.startswith("[") or "](" in prose[m.end() : m.end() + 4])
                and name != "README.md"
            ):
                problems.append(f"{name}: {m.group(0)!r} without a link")
        if "shared/design" in text or "contract outside" in text:
            problems.append(f"{name}: names something outside the repo")
        if name in user_docs and re.search(r"\bissues? \d", prose):
            problems.append(f"{name}: a bare issue number")
    assert not problems, "\n".join(problems)
