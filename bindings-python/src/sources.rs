//! The libraries that allocate through memarray from Python, registered as
//! `memarray_core::Source`s when the module loads (memarray-core names none itself), in a
//! fixed order so statistics and timelines list them the same way in every process.

use std::sync::LazyLock;

use memarray_core::Source;

/// Registered in this order; "memarray" is always first.
const NAMES: [&str; 5] = ["torch", "cupy", "numba", "rmm", "cuda_core"];

fn source(name: &'static str) -> Source {
    // The five names are valid and fit Source::MAX (8): registration cannot fail.
    Source::register(name).expect("a built-in source name registers")
}

pub(crate) static TORCH: LazyLock<Source> = LazyLock::new(|| source("torch"));
pub(crate) static CUPY: LazyLock<Source> = LazyLock::new(|| source("cupy"));
pub(crate) static RMM: LazyLock<Source> = LazyLock::new(|| source("rmm"));
pub(crate) static CUDA_CORE: LazyLock<Source> = LazyLock::new(|| source("cuda_core"));

/// Registers every library's source (called once, when the module loads).
pub(crate) fn register_all() {
    for name in NAMES {
        source(name);
    }
}

/// The library called `name` (one of memarray's known libraries): ValueError otherwise.
pub(crate) fn named(name: &str) -> pyo3::PyResult<Source> {
    NAMES
        .iter()
        .find(|&&n| n == name)
        .map(|&n| source(n))
        .ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err(format!(
                "source {name:?}: expected one of {} (None: your own memory)",
                NAMES.join(", ")
            ))
        })
}
