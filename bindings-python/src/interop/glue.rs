//! What the framework files share: the block alignment handed out and the stream
//! argument of C-level callers.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::{Mutex, PoisonError};

use pyo3::PyResult;
use pyo3::exceptions::PyValueError;

use memarray_core::resource::deallocate_counted;
use memarray_core::{MemoryResource, RawStream, Source};

/// Alignment of blocks handed to torch, CuPy, RMM and cuda.core (torch asks for none; its own
/// allocator gives 512).
pub(super) const BLOCK_ALIGN: usize = 256;

/// A stream handle from a C-level caller (torch, CuPy) as a core stream: 0 is the legacy
/// default stream.
pub(super) fn raw_stream(stream: usize) -> RawStream {
    if stream == 0 {
        RawStream::LEGACY
    } else {
        // SAFETY: the caller passes a live stream of the device's primary context,
        // current for the call (RawStream's contract).
        unsafe { RawStream::from_raw(stream) }
    }
}

/// Blocks a Python caller holds from a memarray resource (RMM's and cuda.core's callback
/// resources): address -> (bytes, the stream it was allocated on). Only blocks handed out
/// here are taken back.
#[derive(Default)]
pub(super) struct Blocks(Mutex<HashMap<usize, (usize, Option<RawStream>)>>);

impl Blocks {
    /// Notes a block handed out.
    pub(super) fn insert(&self, addr: usize, size: usize, stream: Option<RawStream>) {
        self.lock().insert(addr, (size, stream));
    }

    /// Blocks handed out and not yet returned.
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }

    /// Returns block `ptr` of `size` bytes (aligned to `align`) to `resource` for
    /// `source`, ordered on `stream` (None: the stream it was allocated on); anything not
    /// handed out here is ignored. A `size` other than the block's is a ValueError (the
    /// block stays live).
    pub(super) fn free(
        &self,
        resource: &dyn MemoryResource,
        source: Source,
        align: usize,
        ptr: usize,
        size: usize,
        stream: Option<Option<RawStream>>,
    ) -> PyResult<()> {
        let known = {
            let mut live = self.lock();
            match live.get(&ptr) {
                Some(&(recorded, _)) if recorded != size => {
                    return Err(PyValueError::new_err(format!(
                        "block {ptr:#x} was allocated with {recorded} bytes, not {size}"
                    )));
                }
                Some(_) => live.remove(&ptr),
                None => None,
            }
        };
        if let (Some((size, allocated_on)), Some(p)) = (known, NonNull::new(ptr as *mut u8)) {
            let stream = stream.unwrap_or(allocated_on);
            // SAFETY: p came from `resource` with (size, align) through the allocation
            // path for `source` when it was handed out and left the table above, so it is
            // freed once; the caller's work on it is ordered on `stream`.
            unsafe { deallocate_counted(resource, source, p, size, align, stream) };
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<usize, (usize, Option<RawStream>)>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
