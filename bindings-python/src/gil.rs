//! Whether the calling thread holds the GIL, asked without taking it.

unsafe extern "C" {
    // Not in the limited API's headers, but exported by every CPython since 3.4 (this
    // wheel's oldest is 3.11): the only way to ask whether a thread that pyo3 did not
    // attach (torch's, through pybind11) holds the GIL.
    fn PyGILState_Check() -> std::ffi::c_int;
}

/// Whether this thread holds the GIL (pyo3's or anyone's attachment).
pub(crate) fn held() -> bool {
    // SAFETY: PyGILState_Check only reads this thread's state; the interpreter is running
    // (this module is loaded into it).
    unsafe { PyGILState_Check() == 1 }
}
