"""A MemArray follows NumPy's conventions where a user would expect it:
repr, iteration, truth value, scalar conversion, equality, device spellings in
move_memory, __version__."""

from __future__ import annotations

import operator

import numpy as np
import pytest
from children import run_child

import memarray


def filled(shape, dtype="float64"):
    a = memarray.MemArray(shape, dtype)
    a.read_numpy_array(np.arange(int(np.prod(shape))).reshape(shape))
    return a


def test_repr_shows_the_data_as_numpy_does():
    a = filled((2, 3), "float32")
    want = repr(np.asarray(a)).replace("array(", "MemArray(").replace("\n      ", "\n         ")
    assert repr(a) == want.replace("dtype=float32)", "dtype=float32, device=cpu)")
    big = memarray.MemArray((5000,))
    assert "..." in repr(big), "large arrays are summarised"
    assert repr(memarray.MemArray((), "int8")) == "MemArray(0, dtype=int8, device=cpu)"


def test_repr_of_a_locked_array_is_a_summary_not_an_error():
    a = filled((2, 2))
    with a.get_dlpack():
        r = repr(a)
    assert r == "MemArray(shape=(2, 2), dtype=float64, device=cpu, nbytes=32, locked)"


def test_repr_names_what_differs_from_plain_host_memory():
    b = memarray.zeros((2,), "bfloat16")  # no NumPy text: the summary, with its bytes
    assert repr(b) == "MemArray(shape=(2,), dtype=bfloat16, device=cpu, nbytes=4)"
    if memarray.cuda.is_available():
        p = memarray.MemArray([3], "float32", host_memory="pinned")
        assert repr(p).endswith("dtype=float32, device=cpu, pinned)"), repr(p)


def test_iteration_is_right_or_a_typeerror_never_empty():
    assert list(filled((4,))) == [0.0, 1.0, 2.0, 3.0]
    assert [x for x in filled((3,), "int16")] == [0, 1, 2]
    assert list(memarray.MemArray((0,))) == []
    with pytest.raises(TypeError, match="np.asarray"):
        list(filled((2, 3)))
    with pytest.raises(TypeError, match="0-d"):
        iter(memarray.MemArray(()))


def test_truth_value_follows_numpy():
    z = memarray.MemArray(())
    assert bool(z) is False
    z[()] = 2.0
    assert bool(z) is True
    assert bool(filled((1, 1))) is False  # the one element is 0
    for shape in [(2,), (0,), (3, 3)]:
        with pytest.raises(ValueError, match="ambiguous"):
            bool(memarray.MemArray(shape))


def test_scalar_conversions_of_one_element_arrays():
    z = memarray.MemArray((), "int32")
    z[()] = 7
    assert (float(z), int(z), complex(z), operator.index(z)) == (7.0, 7, 7 + 0j, 7)
    assert np.arange(10)[z] == 7
    f = memarray.MemArray((1,), "float64")
    f[0] = 2.75
    assert float(f) == 2.75 and int(f) == 2
    with pytest.raises(TypeError):
        operator.index(f)  # only 0-d integer arrays are indices
    c = memarray.MemArray((), "complex64")
    c[()] = 1 + 2j
    assert complex(c) == 1 + 2j
    with pytest.raises(TypeError, match="complex"):
        float(c)
    with pytest.raises(ValueError):
        float(memarray.MemArray((2,)))


def test_equality_is_identity_by_design():
    a = filled((3,))
    assert a == a
    assert a != a.copy()
    np.testing.assert_array_equal(a.to_numpy(), a.copy().to_numpy())


def test_move_memory_takes_the_device_spellings_of_zeros():
    a = filled((3,))
    a.move_memory("cpu")
    a.move_memory((memarray.dlpack.kDLCPU, 0))
    a.move_memory(memarray.dlpack.kDLCPU)
    assert a.device == "cpu"
    with pytest.raises(ValueError):
        a.move_memory("tpu")
    if not memarray.cuda.is_available():
        with pytest.raises(memarray.CudaUnavailableError):
            a.move_memory("cuda")


@pytest.mark.gpu
def test_move_memory_by_name_on_the_gpu():
    a = filled((3,))
    a.move_memory("cuda")
    assert a.device == "cuda:0"
    assert repr(a).startswith("MemArray(shape=(3,), dtype=float64, device=cuda:0, nbytes=24")
    a.move_memory("cpu")
    np.testing.assert_array_equal(a.to_numpy(), [0.0, 1.0, 2.0])


def test_move_memory_never_drops_a_device_id_given_with_a_name():
    a = filled((3,))
    with pytest.raises(ValueError, match="disagree"):
        a.move_memory("cuda:2", 1)
    with pytest.raises(ValueError, match="host has no device id"):
        a.move_memory("cpu", 0)
    with pytest.raises(ValueError, match="device_id"):
        a.move_memory("cuda", -1)
    assert a.device == "cpu"
    a.move_memory("cpu")  # no id: fine
    if not memarray.cuda.is_available():
        with pytest.raises(memarray.CudaUnavailableError):
            a.move_memory("cuda", 0)


@pytest.mark.gpu
def test_move_memory_by_name_goes_to_the_device_id_given():
    a = filled((3,))
    a.move_memory("cuda", 0)
    a.move_memory("cuda:0", 0)
    assert a.device == "cuda:0"
    n = memarray.cuda.device_count()
    if n > 1:
        a.move_memory("cuda", 1)
        assert a.device == "cuda:1"
    else:
        # One GPU: device 1 does not exist, so the move is refused instead of staying on 0.
        with pytest.raises(ValueError, match="1"):
            a.move_memory("cuda", 1)
        assert a.device == "cuda:0"
    np.testing.assert_array_equal(a.to_numpy(), [0.0, 1.0, 2.0])


def test_version():
    assert memarray.__version__ and memarray.__version__[0].isdigit()


@pytest.mark.parametrize(
    "verb, hint",
    [
        ("cuda", "move_memory"),
        ("cpu", "to_numpy"),
        ("to", "to_device"),
        ("numpy", "to_numpy"),
        ("get", "to_numpy"),
        ("item", r"float\(a\)"),
        ("T", "torch.from_dlpack"),
        ("reshape", "torch.from_dlpack"),
        ("sum", "cupy.asarray"),
    ],
)
def test_familiar_verbs_of_other_libraries_name_memarrays_own(verb, hint):
    a = filled((3,))
    with pytest.raises(AttributeError, match=hint):
        getattr(a, verb)
    assert not hasattr(a, verb)  # still an AttributeError: hasattr and getattr(.., d) work
    with pytest.raises(AttributeError) as e:
        a.no_such_attribute  # noqa: B018
    assert "no attribute 'no_such_attribute'" in str(e.value)


def test_a_property_raising_attribute_error_keeps_its_reason_after_misses():
    # A fresh interpreter: the class's names are read on the first miss, which here is a
    # name the class lacks; the host array's CUDA Array Interface (a property that
    # raises) must still give its own reason afterwards, and a from_dlpack of a MemArray
    # (which skips the autograd probe) still shares its memory.
    code = """
import numpy as np, memarray
a = memarray.asarray(np.arange(4, dtype=np.float32))
assert not hasattr(a, "requires_grad")
try:
    a.__cuda_array_interface__
except AttributeError as e:
    assert "only while the data is on a CUDA device" in str(e), e
else:
    raise SystemExit("no AttributeError")
b = memarray.from_dlpack(a)
np.asarray(b)[0] = 7.0
assert np.asarray(a)[0] == 7.0
print("ok")
"""
    r = run_child(code, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_arithmetic_points_to_the_libraries_that_compute():
    a = filled((3,))
    for op in (
        lambda: a + 1,
        lambda: 1 + a,
        lambda: a * 2,
        lambda: a - a,
        lambda: a / 2,
        lambda: a // 2,
        lambda: a @ a,
        lambda: -a,
    ):
        with pytest.raises(TypeError, match="torch.from_dlpack"):
            op()
    assert (np.asarray(a) + 1).tolist() == [1.0, 2.0, 3.0]  # the route it names works


def test_data_where_a_shape_belongs_points_to_asarray():
    for data in (np.array([2, 3]), memarray.zeros((2,), "int64")):
        with pytest.raises(TypeError, match="memarray.asarray"):
            memarray.MemArray(data)
    assert memarray.MemArray([2, 3]).shape == (2, 3)


def test_to_device_returns_the_array_or_a_new_one_there():
    a = filled((3,))
    assert a.to_device("cpu") is a
    assert a.to_device((memarray.dlpack.kDLCPU, 0)) is a
    if not memarray.cuda.is_available():
        with pytest.raises(memarray.CudaUnavailableError):
            a.to_device("cuda")
        with pytest.raises(memarray.CudaUnavailableError):
            memarray.cuda.current_device()
        with pytest.raises(memarray.CudaUnavailableError):
            memarray.cuda.set_device(0)
        with pytest.raises(memarray.CudaUnavailableError):
            memarray.cuda.set_default_device(0)
    with pytest.raises(ValueError, match="not the host"):
        memarray.cuda.set_device("cpu")
    with pytest.raises(ValueError, match="set_default_device takes a CUDA device"):
        memarray.cuda.set_default_device("cpu")
    assert memarray.cuda.default_device() == 0
    assert a.device == "cpu"


def test_repr_html_shows_where_the_data_is_and_the_values():
    a = filled((2, 3))
    page = a._repr_html_()
    for fact in ("(2, 3)", "float64", "host (", "48 bytes", "unlocked", "pending work"):
        assert fact in page, (fact, page)
    assert "<pre>[[0. 1. 2.]" in page
    with a.get_dlpack():
        assert "locked (token" in a._repr_html_()
    big = memarray.zeros((100_000,), "float32")
    assert "..." in big._repr_html_()  # NumPy's elision
    assert "<script" not in page


@pytest.mark.gpu
def test_the_current_device_is_cudas_and_cuda_means_it():
    import threading

    seen = {}

    def worker():
        seen["before"] = memarray._memarray.cuda._current_context_device()
        with memarray.cuda.device(0) as d:
            seen["inside"] = (d, memarray.cuda.current_device())
            seen["born"] = memarray.zeros((4,), "float32", device="cuda").device
            seen["default"] = memarray.MemArray([4]).device_id
        seen["after"] = memarray._memarray.cuda._current_context_device()

    t = threading.Thread(target=worker)  # a fresh thread: no context current
    t.start()
    t.join()
    assert seen == {
        "before": None,
        "inside": (0, 0),
        "born": "cuda:0",
        "default": 0,
        "after": None,
    }, seen
    a = filled((3,))
    b = a.to_device("cuda")
    assert b is not a and b.device == "cuda:0" and a.device == "cpu"
    assert b.to_device("cuda:0") is b
    np.testing.assert_array_equal(b.to_numpy(), [0.0, 1.0, 2.0])
    n = memarray.cuda.device_count()
    with pytest.raises(ValueError):
        memarray.cuda.set_device(n)
    with pytest.raises(ValueError):
        memarray.cuda.set_default_device(n)
    assert memarray.cuda.default_device() == 0  # a refused default changes nothing
    torch = pytest.importorskip("torch")
    memarray.cuda.set_device(0)
    assert torch.cuda.current_device() == memarray.cuda.current_device() == 0


@pytest.mark.gpu
def test_the_process_default_device_is_what_threads_without_one_use():
    import threading

    last = memarray.cuda.device_count() - 1
    seen = {}

    def fresh():  # no context current: the process default decides
        seen["current"] = memarray.cuda.current_device()
        seen["born"] = memarray.zeros((2,), "float32", device="cuda").device
        with memarray.cuda.device(0):  # a thread's own choice wins
            seen["own"] = memarray.zeros((2,), "float32", device="cuda").device

    memarray.cuda.set_default_device(last)
    try:
        t = threading.Thread(target=fresh)
        t.start()
        t.join()
    finally:
        memarray.cuda.set_default_device(0)
    assert seen == {"current": last, "born": f"cuda:{last}", "own": "cuda:0"}, seen
