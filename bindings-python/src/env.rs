//! memarray-cuda's environment readers for the Python package's own variables
//! (`memarray._env`): the same words for a switch and the same byte counts as every
//! variable Rust reads, and the same errors.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// `name`'s value as text; ValueError naming it when it is not UTF-8.
fn text(name: &str) -> PyResult<Option<String>> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(raw)) => Err(PyValueError::new_err(format!(
            "{name}={:?}: expected UTF-8 text",
            raw.to_string_lossy()
        ))),
    }
}

/// A switch: True for `1`/`on`/`true`/`yes`, False for `0`/`off`/`false`/`no` (any
/// case), None when unset or empty; any other value is a ValueError naming `name`.
#[pyfunction]
pub fn _env_switch(name: &str) -> PyResult<Option<bool>> {
    let Some(v) = text(name)? else {
        return Ok(None);
    };
    memarray_core::env::parse_switch(&v).map_err(|_| {
        PyValueError::new_err(format!(
            "{name}={v:?}: expected {}",
            memarray_core::env::EXPECTED
        ))
    })
}

/// A byte count (`4096`, `64KiB`, `4GB`), None when unset or empty; anything else is a
/// ValueError naming `name`.
#[pyfunction]
pub fn _env_bytes(name: &str) -> PyResult<Option<u64>> {
    let Some(v) = text(name)?.filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    memarray_cuda::env::parse_bytes(&v)
        .map(Some)
        .map_err(|e| PyValueError::new_err(format!("{name}: {e}")))
}

/// `name`'s value as text (None when unset); ValueError naming it when not UTF-8.
#[pyfunction]
pub fn _env_text(name: &str) -> PyResult<Option<String>> {
    text(name)
}
