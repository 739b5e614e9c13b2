//! Python arguments to Rust values, one way for the whole binding.
//!
//! Integers go through `__index__` (so NumPy integers and user types work) and then to
//! the Rust type; a value outside its range is a `ValueError` naming the argument and
//! the range, never pyo3's `OverflowError`. Anything that is not an integer is a
//! `TypeError` naming the argument. An exception raised by the caller's own `__index__`
//! propagates unchanged (it is theirs, as in NumPy). Strings refuse lone surrogates with
//! a `ValueError` (not `UnicodeEncodeError`); paths take `str`, `bytes` and
//! `os.PathLike`.

use std::path::PathBuf;
use std::time::Duration;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyString};

use memarray_core::MAX_NDIM;
use memarray_cuda::array::HostKind;

use crate::errors::type_name;

/// A Rust integer type an argument converts to.
pub(crate) trait IntArg: Sized + Copy {
    /// Smallest value.
    const MIN: i128;
    /// Largest value.
    const MAX: i128;
    /// The value, known to be in range.
    fn from_i128(v: i128) -> Self;
}

macro_rules! int_arg {
    ($($t:ty),*) => {$(
        impl IntArg for $t {
            const MIN: i128 = <$t>::MIN as i128;
            const MAX: i128 = <$t>::MAX as i128;
            fn from_i128(v: i128) -> Self {
                v as $t
            }
        }
    )*};
}
int_arg!(u8, u32, u64, usize, i32, i64);

/// `obj` as an integer of type `T`; `name` is the argument's name for errors.
pub(crate) fn int<T: IntArg>(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<T> {
    let v = index(obj, name)?;
    if !(T::MIN..=T::MAX).contains(&v) {
        return Err(out_of_range(name, &v.to_string(), T::MIN, T::MAX));
    }
    Ok(T::from_i128(v))
}

/// `obj` as an integer of type `T`, or `None` for `None`.
pub(crate) fn opt_int<T: IntArg>(
    obj: Option<&Bound<'_, PyAny>>,
    name: &str,
) -> PyResult<Option<T>> {
    match obj {
        Some(o) if !o.is_none() => int(o, name).map(Some),
        _ => Ok(None),
    }
}

/// `obj.__index__()` as an `i128`: a `ValueError` when even that is too wide.
fn index(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<i128> {
    let as_int = to_int(obj, name)?;
    as_int.extract::<i128>().map_err(|_| {
        let text = as_int.repr().map(|r| r.to_string()).unwrap_or_default();
        out_of_range(name, &text, i128::MIN, i128::MAX)
    })
}

/// `obj` as a Python int, through `__index__`: a `TypeError` naming `name` when it is not
/// an integer; the error of a raising `__index__` unchanged.
pub(crate) fn to_int<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    Ok(if obj.is_instance_of::<PyInt>() {
        obj.clone()
    } else if obj.hasattr(pyo3::intern!(py, "__index__"))? {
        // SAFETY: obj is live and the GIL is held; PyNumber_Index returns a new reference
        // or null with an exception set (the caller's own `__index__` error, propagated).
        unsafe { Bound::from_owned_ptr_or_err(py, pyo3::ffi::PyNumber_Index(obj.as_ptr()))? }
    } else {
        return Err(PyTypeError::new_err(format!(
            "{name} must be an integer, not {}",
            type_name(obj)
        )));
    })
}

fn out_of_range(name: &str, value: &str, min: i128, max: i128) -> PyErr {
    let shown = if value.len() > 40 {
        format!("{}...", &value[..40])
    } else {
        value.to_string()
    };
    PyValueError::new_err(format!(
        "{name}={shown} is out of range: it must be in {min}..={max}"
    ))
}

/// `obj` as a Rust string; `ValueError` for text that is not valid Unicode (a lone
/// surrogate), `TypeError` for a non-string.
pub(crate) fn text(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<String> {
    let s = obj.cast::<PyString>().map_err(|_| {
        PyTypeError::new_err(format!("{name} must be a str, not {}", type_name(obj)))
    })?;
    s.to_str().map(str::to_owned).map_err(|_| {
        PyValueError::new_err(format!(
            "{name} is not valid Unicode text (it holds a lone surrogate): {}",
            s.repr().map(|r| r.to_string()).unwrap_or_default()
        ))
    })
}

/// `obj` as a file path: `str`, `bytes` or any `os.PathLike` (through `os.fsdecode`).
pub(crate) fn path(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let py = obj.py();
    let fspath = py.import("os")?.getattr("fspath")?;
    let p = fspath.call1((obj,)).map_err(|_| {
        PyTypeError::new_err(format!(
            "{name} must be a str, bytes or os.PathLike, not {}",
            type_name(obj)
        ))
    })?;
    let bytes: Vec<u8> = if let Ok(s) = p.cast::<PyString>() {
        // Surrogate escapes round-trip to the original bytes, as os.fsencode gives them.
        py.import("os")?
            .getattr("fsencode")?
            .call1((s,))?
            .extract()?
    } else {
        p.extract()?
    };
    if bytes.contains(&0) {
        return Err(PyValueError::new_err(format!("{name} contains a NUL byte")));
    }
    Ok(PathBuf::from(std::ffi::OsStr::from_bytes(&bytes)))
}

/// `secs` seconds as a `Duration`: infinity waits forever; NaN and negatives are a
/// `ValueError` naming `name`.
pub(crate) fn seconds(secs: f64, name: &str) -> PyResult<Duration> {
    if secs.is_nan() || secs < 0.0 {
        return Err(PyValueError::new_err(format!(
            "{name}={secs} must be a number of seconds >= 0 (inf waits forever)"
        )));
    }
    Ok(Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX))
}

pub(crate) fn parse_shape(shape: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    // A tuple first: asking it for `__index__` raises and catches an AttributeError inside
    // CPython, most of a small `empty((n,), ...)` call's cost.
    let items: Vec<Bound<'_, PyAny>> = if let Ok(t) = shape.cast::<pyo3::types::PyTuple>() {
        t.iter().take(1025).collect()
    } else if shape.is_instance_of::<PyInt>() || shape.hasattr("__index__")? {
        vec![shape.clone()]
    } else {
        let it = shape.try_iter().map_err(|_| {
            PyTypeError::new_err(format!(
                "shape must be an int or a sequence of ints, not {}",
                crate::errors::type_name(shape)
            ))
        })?;
        let mut items = Vec::new();
        for d in it {
            items.push(d?);
            // Bounded: an endless iterator is refused, not followed forever.
            if items.len() > 1024 {
                break;
            }
        }
        items
    };
    if items.len() > MAX_NDIM {
        let n = items.len();
        let n = if n > 1024 {
            "> 1024".to_string()
        } else {
            n.to_string()
        };
        return Err(PyValueError::new_err(format!(
            "ndim {n} exceeds the maximum of {MAX_NDIM}"
        )));
    }
    let dims: Vec<i64> = items
        .iter()
        .map(|d| int(d, "shape entry"))
        .collect::<PyResult<_>>()?;
    dims.iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| {
                PyValueError::new_err(format!("negative dimension {d} in shape {dims:?}"))
            })
        })
        .collect()
}

/// The `host_memory` argument (`None` is "auto").
pub(crate) fn host_kind_arg(arg: Option<&Bound<'_, PyAny>>) -> PyResult<Option<HostKind>> {
    match arg.filter(|a| !a.is_none()) {
        Some(a) => parse_host_kind(&text(a, "host_memory")?),
        None => Ok(None),
    }
}

pub(crate) fn parse_host_kind(s: &str) -> PyResult<Option<HostKind>> {
    match s {
        "auto" => Ok(None),
        "pageable" => Ok(Some(HostKind::Pageable)),
        "pinned" => Ok(Some(HostKind::Pinned)),
        "managed" => Ok(Some(HostKind::Managed)),
        other => Err(PyValueError::new_err(format!(
            "host_memory must be 'auto', 'pageable', 'pinned' or 'managed', not {other:?}"
        ))),
    }
}

/// The Python name of a host memory kind.
pub(crate) fn host_kind_name(kind: HostKind) -> &'static str {
    match kind {
        HostKind::Pageable => "pageable",
        HostKind::Pinned => "pinned",
        HostKind::Managed => "managed",
    }
}
