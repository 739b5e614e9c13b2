//! Python dtype-likes to [`DType`], NumPy dtype objects, and element <-> Python value.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyComplex, PyFloat, PyInt, PyString, PyType};

use memarray_core::{Complex32, Complex64, DType, Element, bf16, f16, with_dtype};

fn unsupported(what: &str) -> PyErr {
    PyTypeError::new_err(format!(
        "unsupported dtype {what}; supported dtypes: {}",
        DType::supported_names()
    ))
}

/// Parses anything NumPy accepts as a dtype (plus the string "bfloat16"). `None` is
/// float64, as in the original MemArray design.
pub fn parse_dtype(obj: Option<&Bound<'_, PyAny>>) -> PyResult<DType> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(DType::F64);
    };
    if obj.is_instance_of::<PyString>() {
        let text = crate::convert::text(obj, "dtype")?;
        if let Ok(d) = DType::from_name(&text) {
            return Ok(d);
        }
        // NumPy's type codes ("u1", "<f4", "c16"), without a call into NumPy (a few
        // microseconds, most of `memarray.empty(n, "u1")`).
        if let Some(d) = type_code(&text) {
            return Ok(d);
        }
    }
    if let Ok(t) = obj.cast::<PyType>() {
        // Python builtins, as NumPy maps them.
        let py = obj.py();
        if t.is(py.get_type::<PyBool>()) {
            return Ok(DType::Bool);
        } else if t.is(py.get_type::<PyInt>()) {
            return Ok(DType::I64);
        } else if t.is(py.get_type::<PyFloat>()) {
            return Ok(DType::F64);
        } else if t.is(py.get_type::<PyComplex>()) {
            return Ok(DType::Complex128);
        }
    }
    if let Some(d) = known_dtype(obj)? {
        return Ok(d);
    }
    if let Some(d) = torch_dtype(obj)? {
        return Ok(d);
    }
    let np = obj.py().import("numpy")?;
    let dt = np
        .getattr("dtype")?
        .call1((obj,))
        .map_err(|_| unsupported(&obj.repr().map(|r| r.to_string()).unwrap_or_default()))?;
    let name: String = dt.getattr("name")?.extract()?;
    let byteorder: String = dt.getattr("byteorder")?.extract()?;
    let typestr: String = dt.getattr("str")?.extract()?;
    if byteorder == ">" {
        return Err(PyTypeError::new_err(format!(
            "dtype '{typestr}' is big-endian, which memarray does not hold; convert with \
             .astype('{name}') (native byte order) first"
        )));
    }
    DType::from_name(&name).map_err(|_| unsupported(&format!("'{typestr}' ({name})")))
}

/// A torch dtype (`torch.float32`, `torch.bfloat16`) as the DType of the same name, read
/// from its text without importing torch; `None` for anything else. One torch has and
/// memarray does not (`torch.qint8`) is refused naming it.
fn torch_dtype(obj: &Bound<'_, PyAny>) -> PyResult<Option<DType>> {
    let ty = obj.get_type();
    if ty.module()?.to_cow()? != "torch" || ty.name()?.to_cow()? != "dtype" {
        return Ok(None);
    }
    let text = obj.str()?.to_string();
    let name = text.strip_prefix("torch.").unwrap_or(&text);
    DType::from_name(name)
        .map(Some)
        .map_err(|_| unsupported(&text))
}

/// A NumPy type code in native or little-endian order (`"u1"`, `"<f4"`, `"=i8"`, `"|b1"`,
/// `"?"`) as a DType; big-endian and anything else are left to NumPy.
fn type_code(code: &str) -> Option<DType> {
    let little = cfg!(target_endian = "little");
    let code = match code.as_bytes().first()? {
        b'=' | b'|' => &code[1..],
        b'<' if little => &code[1..],
        _ => code,
    };
    Some(match code {
        "?" | "b1" => DType::Bool,
        "i1" => DType::I8,
        "i2" => DType::I16,
        "i4" => DType::I32,
        "i8" => DType::I64,
        "u1" => DType::U8,
        "u2" => DType::U16,
        "u4" => DType::U32,
        "u8" => DType::U64,
        "f2" => DType::F16,
        "f4" => DType::F32,
        "f8" => DType::F64,
        "c8" => DType::Complex64,
        "c16" => DType::Complex128,
        _ => return None,
    })
}

static NDARRAY: PyOnceLock<Py<pyo3::types::PyType>> = PyOnceLock::new();

/// `numpy.ndarray`, looked up once.
pub fn ndarray_type(py: Python<'_>) -> PyResult<&Bound<'_, pyo3::types::PyType>> {
    Ok(crate::once::once(&NDARRAY, py, || -> PyResult<_> {
        Ok(py
            .import("numpy")?
            .getattr("ndarray")?
            .cast_into::<pyo3::types::PyType>()?
            .unbind())
    })?
    .bind(py))
}

static NP_DTYPES: PyOnceLock<Vec<Py<PyAny>>> = PyOnceLock::new();
static NP_SCALAR_TYPES: PyOnceLock<Vec<Py<PyAny>>> = PyOnceLock::new();

/// The dtype whose NumPy dtype object `obj` is, by identity: NumPy's builtin dtypes are
/// singletons that every array of the type shares (`np.dtype("float32")`, an array's
/// `dtype`), so the common case costs no NumPy call. `None` for any other object (a
/// foreign byte order, `np.longlong` where `int64` is `long`: the caller's slow path).
pub(crate) fn numpy_dtype_of(obj: &Bound<'_, PyAny>) -> PyResult<Option<DType>> {
    let py = obj.py();
    if NP_DTYPES.get(py).is_none() {
        numpy_dtype(py, DType::F64)?; // fills the table
    }
    // A missing entry (bfloat16 without ml_dtypes) is None, which is no dtype.
    if obj.is_none() {
        return Ok(None);
    }
    Ok(NP_DTYPES
        .get(py)
        .and_then(|all| all.iter().position(|t| t.as_ptr() == obj.as_ptr()))
        .map(|i| DType::ALL[i]))
}

/// Fills the NumPy tables when NumPy is loaded (before a fork: a child that filled them
/// itself would import `ml_dtypes`, and hang on the import lock of a parent thread that was
/// importing it when the process forked).
pub fn fill_tables(py: Python<'_>) -> PyResult<()> {
    if py.import("sys")?.getattr("modules")?.contains("numpy")? {
        numpy_dtype(py, DType::F64)?;
        ndarray_type(py)?;
        known_dtype(&py.None().into_bound(py))?;
    }
    Ok(())
}

/// The dtype of a NumPy dtype object or scalar type memarray made or knows (`np.float32`,
/// `np.dtype("int8")`) by identity: the common case costs no NumPy call (about 2 us
/// saved per array constructor).
fn known_dtype(obj: &Bound<'_, PyAny>) -> PyResult<Option<DType>> {
    if let Some(d) = numpy_dtype_of(obj)? {
        return Ok(Some(d));
    }
    let py = obj.py();
    let scalars = crate::once::once(&NP_SCALAR_TYPES, py, || -> PyResult<_> {
        let np = py.import("numpy")?;
        DType::ALL
            .iter()
            .map(|d| -> PyResult<Py<PyAny>> {
                Ok(match d {
                    DType::BF16 => py.None(),
                    other => np
                        .getattr("dtype")?
                        .call1((other.name(),))?
                        .getattr("type")?
                        .unbind(),
                })
            })
            .collect()
    })?;
    Ok(DType::ALL
        .iter()
        .zip(scalars)
        .find(|(_, t)| !t.is_none(py) && obj.is(t.bind(py)))
        .map(|(d, _)| *d))
}

/// The NumPy dtype object for `d` (bfloat16 needs `ml_dtypes`).
pub fn numpy_dtype<'py>(py: Python<'py>, d: DType) -> PyResult<Bound<'py, PyAny>> {
    let all = crate::once::once(&NP_DTYPES, py, || -> PyResult<_> {
        let np = py.import("numpy")?;
        DType::ALL
            .iter()
            .map(|d| -> PyResult<Py<PyAny>> {
                match d {
                    DType::BF16 => match py.import("ml_dtypes") {
                        Ok(m) => Ok(np
                            .getattr("dtype")?
                            .call1((m.getattr("bfloat16")?,))?
                            .unbind()),
                        Err(_) => Ok(py.None()),
                    },
                    other => Ok(np.getattr("dtype")?.call1((other.name(),))?.unbind()),
                }
            })
            .collect()
    })?;
    let obj = all
        .get(d.index())
        .ok_or_else(|| unsupported(d.name()))?
        .bind(py)
        .clone();
    if obj.is_none() {
        return Err(PyTypeError::new_err(
            "bfloat16 has no NumPy dtype without the ml_dtypes package (pip install ml_dtypes); \
             DLPack consumers such as torch and jax read bfloat16 arrays directly",
        ));
    }
    Ok(obj)
}

/// Element types convertible to and from Python scalars.
trait PyScalar: Element {
    fn to_py<'py>(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>>;
    fn from_py(obj: &Bound<'_, PyAny>) -> PyResult<Self>;
}

macro_rules! scalar_int {
    ($($t:ty),*) => {$(
        impl PyScalar for $t {
            fn to_py<'py>(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
                Ok(self.into_pyobject(py)?.into_any())
            }
            fn from_py(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
                obj.extract::<$t>().map_err(|e| {
                    PyValueError::new_err(format!(
                        "cannot store {} in a {} array: {e}",
                        obj.repr().map(|r| r.to_string()).unwrap_or_default(),
                        <$t as Element>::DTYPE
                    ))
                })
            }
        }
    )*};
}
scalar_int!(i8, i16, i32, i64, u8, u16, u32, u64, f32, f64);

impl PyScalar for bool {
    fn to_py<'py>(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(PyBool::new(py, self).to_owned().into_any())
    }
    fn from_py(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        obj.is_truthy()
    }
}

macro_rules! scalar_half {
    ($($t:ty),*) => {$(
        impl PyScalar for $t {
            fn to_py<'py>(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
                Ok(self.to_f64().into_pyobject(py)?.into_any())
            }
            fn from_py(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
                Ok(<$t>::from_f64(f64::from_py(obj)?))
            }
        }
    )*};
}
scalar_half!(f16, bf16);

impl PyScalar for Complex32 {
    fn to_py<'py>(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(PyComplex::from_doubles(py, self.re.into(), self.im.into()).into_any())
    }
    fn from_py(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        let c = Complex64::from_py(obj)?;
        Ok(Complex32::new(c.re as f32, c.im as f32))
    }
}

impl PyScalar for Complex64 {
    fn to_py<'py>(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(PyComplex::from_doubles(py, self.re, self.im).into_any())
    }
    fn from_py(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        obj.extract::<Complex64>().map_err(|e| {
            PyValueError::new_err(format!("cannot store {obj} in a complex array: {e}"))
        })
    }
}

/// Converts element bytes of dtype `d` to a Python scalar.
pub fn bytes_to_py<'py>(py: Python<'py>, d: DType, bytes: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    if d == DType::Bool {
        // Any nonzero byte is true, as Element::load reads it.
        return (bytes[0] != 0).to_py(py);
    }
    with_dtype!(d, T => {
        debug_assert_eq!(bytes.len(), std::mem::size_of::<T>());
        // SAFETY: bytes holds one element of a type whose every bit pattern is valid
        // (bool returned above); read_unaligned has no alignment requirement.
        let v: T = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) };
        v.to_py(py)
    })
}

/// Converts a Python value to element bytes of dtype `d` as NumPy's assignment does
/// (`x[()] = obj` on a 0-d ndarray of the dtype): floats truncate into integer arrays,
/// NumPy scalars cast, strings parse, and what NumPy refuses raises NumPy's exception
/// (OverflowError for 300 into int8, ValueError for NaN into an integer array). Python
/// ints, floats, bools and complex numbers of a kind the dtype holds take a Rust path
/// that gives the same result without calling NumPy.
pub fn py_to_bytes(obj: &Bound<'_, PyAny>, d: DType) -> PyResult<Vec<u8>> {
    let (code, _, _) = d.dlpack();
    let integer = matches!(code, 0 | 1);
    let float_or_complex = !integer && d != DType::Bool;
    let exact_int = obj.is_exact_instance_of::<PyInt>();
    let fast = obj.is_exact_instance_of::<PyBool>()
        || (exact_int && d != DType::Bool)
        || (obj.is_exact_instance_of::<PyFloat>() && float_or_complex)
        || (obj.is_exact_instance_of::<PyComplex>()
            && matches!(d, DType::Complex64 | DType::Complex128));
    if fast {
        let got = with_dtype!(d, T => T::from_py(obj).map(|v| element_bytes(&v)));
        return match got {
            // NumPy's message and type for a Python int out of range.
            Err(_) if exact_int && integer => Err(pyo3::exceptions::PyOverflowError::new_err(
                format!("Python integer {obj} out of bounds for {d}"),
            )),
            other => other,
        };
    }
    let py = obj.py();
    match numpy_dtype(py, d) {
        Ok(np_dtype) if !np_dtype.is_none() => {
            let np = py.import("numpy")?;
            let cell = np.getattr("empty")?.call1(((), np_dtype))?;
            cell.set_item(pyo3::types::PyTuple::empty(py), obj)?;
            cell.call_method0("tobytes")?.extract()
        }
        // bfloat16 without ml_dtypes: NumPy has no such dtype to ask.
        _ => with_dtype!(d, T => T::from_py(obj).map(|v| element_bytes(&v))),
    }
}

/// The bytes of one element.
fn element_bytes<T: Element>(v: &T) -> Vec<u8> {
    // SAFETY: T is plain data of size_of::<T>() bytes.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
        .to_vec()
}
