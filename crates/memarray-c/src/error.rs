//! Status codes, this thread's last message, and the guard every entry point runs in.

use std::cell::RefCell;
use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use memarray_core::{CoreError, ErrorKind};
use memarray_cuda::CudaError;
use memarray_dlpack::DlpackError;

/// What a call did. Every error comes with a message from [`memarray_last_error`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum memarray_status {
    /// The call succeeded.
    Ok = 0,
    /// A null pointer, a size or count that does not fit, an unknown code, a bad shape,
    /// an argument list that does not match a kernel, a malformed DLPack tensor.
    InvalidArgument = 1,
    /// A dtype that does not match, or one memarray does not support.
    WrongDtype = 2,
    /// The array is locked by another token (or the token given does not hold it).
    Locked = 3,
    /// The data is not where the call needs it (a host pointer of device data).
    WrongLocation = 4,
    /// An allocation failed or a resource's limit was reached.
    OutOfMemory = 5,
    /// No CUDA driver or device, or a missing library (NVRTC).
    CudaUnavailable = 6,
    /// The CUDA driver refused a call (its error is in the message).
    Cuda = 7,
    /// Anything else that failed (I/O, a file resource).
    Failed = 8,
    /// A bug in memarray (a panic, caught at the boundary).
    Internal = 9,
}

thread_local! {
    static LAST: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// This thread's last error message: the message of the last call on this thread that
/// failed, or "" after one that succeeded. Never NULL; valid until the next call on this
/// thread.
#[unsafe(no_mangle)]
pub extern "C" fn memarray_last_error() -> *const c_char {
    LAST.with(|m| match &*m.borrow() {
        Some(s) => s.as_ptr(),
        None => c"".as_ptr(),
    })
}

/// An error on its way to the caller.
#[derive(Debug)]
pub(crate) struct Error {
    status: memarray_status,
    message: String,
}

impl Error {
    pub(crate) fn new(status: memarray_status, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    pub(crate) fn arg(message: impl Into<String>) -> Self {
        Self::new(memarray_status::InvalidArgument, message)
    }
}

pub(crate) type Result<T> = std::result::Result<T, Error>;

/// The status of each [`ErrorKind`], the one classification the Python exceptions map
/// from too.
fn status(kind: ErrorKind) -> memarray_status {
    use memarray_status as S;
    match kind {
        ErrorKind::OutOfRange | ErrorKind::InvalidArgument => S::InvalidArgument,
        ErrorKind::Dtype => S::WrongDtype,
        ErrorKind::Locked => S::Locked,
        ErrorKind::WrongLocation => S::WrongLocation,
        ErrorKind::OutOfMemory => S::OutOfMemory,
        ErrorKind::Unavailable => S::CudaUnavailable,
        ErrorKind::Driver => S::Cuda,
        _ => S::Failed,
    }
}

impl From<CoreError> for Error {
    fn from(e: CoreError) -> Self {
        Self::new(status(e.kind()), e.to_string())
    }
}

impl From<CudaError> for Error {
    fn from(e: CudaError) -> Self {
        Self::new(status(e.kind()), e.to_string())
    }
}

impl From<DlpackError> for Error {
    fn from(e: DlpackError) -> Self {
        Self::new(status(e.kind()), e.to_string())
    }
}

fn set_last(message: Option<String>) {
    LAST.with(|m| {
        let mut m = m.borrow_mut();
        match message {
            None => {
                if m.is_some() {
                    *m = None;
                }
            }
            Some(s) => *m = Some(CString::new(s.replace('\0', " ")).unwrap_or_default()),
        }
    });
}

/// Runs an entry point's body: its error becomes the status and this thread's message;
/// a panic is caught here and becomes `Internal`.
pub(crate) fn guard(f: impl FnOnce() -> Result<()>) -> memarray_status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => {
            set_last(None);
            memarray_status::Ok
        }
        Ok(Err(e)) => {
            set_last(Some(e.message));
            e.status
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            set_last(Some(format!(
                "internal error in memarray (please report it): {what}"
            )));
            memarray_status::Internal
        }
    }
}

/// `p` as a reference, or an error naming parameter `name` when it is NULL.
///
/// # Safety
/// A non-null `p` points to a live `T` that outlives the returned reference.
pub(crate) unsafe fn non_null<'a, T>(p: *const T, name: &str) -> Result<&'a T> {
    // SAFETY: the caller's contract for non-null pointers.
    unsafe { p.as_ref() }.ok_or_else(|| Error::arg(format!("{name} is NULL")))
}

/// Writes `v` through out-pointer `out`, or an error naming `name` when it is NULL.
///
/// # Safety
/// A non-null `out` is valid for a write of `T`.
pub(crate) unsafe fn write_out<T>(out: *mut T, name: &str, v: T) -> Result<()> {
    if out.is_null() {
        return Err(Error::arg(format!("{name} is NULL")));
    }
    // SAFETY: the caller's contract; `out` is not null.
    unsafe { out.write(v) };
    Ok(())
}

/// Checks an out-pointer before any work is done (so a NULL one wastes nothing).
pub(crate) fn check_out<T>(out: *mut T, name: &str) -> Result<()> {
    if out.is_null() {
        return Err(Error::arg(format!("{name} is NULL")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use memarray_core::Location;

    #[test]
    fn a_refused_resource_is_an_invalid_argument() {
        let e = Error::from(CudaError::Inaccessible {
            resource: "host".into(),
            location: Location::Device(0),
        });
        assert_eq!(e.status, memarray_status::InvalidArgument);
        assert!(e.message.contains("not accessible from"), "{}", e.message);
    }
}
