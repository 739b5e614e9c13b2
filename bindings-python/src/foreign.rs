//! The bindings' side of the one import road: every foreign tensor (DLPack capsules and
//! exchange tables, the CUDA Array Interface, NumPy's fields), once described as a
//! [`ForeignTensor`], becomes an array here, through memarray-cuda's
//! [`RawArray::import`], with one rule for when the GIL is released.

use pyo3::prelude::*;

use memarray_core::ForeignTensor;
use memarray_cuda::StreamRef;
use memarray_cuda::array::{CopyPolicy, RawArray};

use crate::errors::IntoPyResult;
use crate::fork::Detach;

/// The array of `t`, as `from_dlpack(x, copy=copy)` makes it; CUDA data is ordered after
/// `producer`. Sharing the memory (C-contiguous, writable, non-empty, no copy asked) only
/// wraps it: cheaper with the GIL held than releasing it. A copy, an empty array's
/// allocation and a refusal (whose producer deleter may take the GIL itself) run
/// detached.
pub(crate) fn import(
    py: Python<'_>,
    t: ForeignTensor,
    copy: Option<bool>,
    producer: Option<StreamRef>,
) -> PyResult<RawArray> {
    let copy = CopyPolicy::from(copy);
    if copy != CopyPolicy::Always && t.shareable().is_ok() {
        return RawArray::import(t, copy, producer).py();
    }
    py.detach_section(|| RawArray::import(t, copy, producer))
        .py()
}
