//! Opaque handles: every type memarray hands to C by pointer (`memarray_array`,
//! `memarray_stream`, `memarray_resource`, `memarray_module`, `memarray_function`,
//! `memarray_access`) is a [`Handle`], made, borrowed, taken back and freed one way.

use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::error::{Error, Result};

/// A Rust value owned by C through a pointer from [`Handle::into_raw`].
pub(crate) trait Handle: Sized {
    /// A new handle owning `self`, for C to hold.
    fn into_raw(self) -> *mut Self {
        Box::into_raw(Box::new(self))
    }

    /// Borrows handle argument `p`: an error naming `name` when it is NULL.
    ///
    /// # Safety
    /// A non-null `p` came from [`Handle::into_raw`] and is live for `'a`.
    unsafe fn arg<'a>(p: *const Self, name: &str) -> Result<&'a Self> {
        // SAFETY: the caller's contract for non-null pointers.
        unsafe { p.as_ref() }.ok_or_else(|| Error::arg(format!("{name} is NULL")))
    }

    /// Takes ownership back (a call that consumes its handle).
    ///
    /// # Safety
    /// `p` is non-null, came from [`Handle::into_raw`] and is not used afterwards.
    unsafe fn from_raw(p: *mut Self) -> Box<Self> {
        // SAFETY: the caller's contract.
        unsafe { Box::from_raw(p) }
    }

    /// Frees a handle from C; NULL frees nothing. A panic in the value's drop is caught
    /// (it must not unwind into C) and, a free having no status to return, left to the
    /// panic hook, which has reported it.
    ///
    /// # Safety
    /// `p` is NULL, or came from [`Handle::into_raw`] and is not used afterwards.
    unsafe fn free(p: *mut Self) {
        if p.is_null() {
            return;
        }
        // SAFETY: the caller's contract.
        let owned = unsafe { Self::from_raw(p) };
        let _ = catch_unwind(AssertUnwindSafe(move || drop(owned)));
    }
}
