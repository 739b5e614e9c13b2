//! A host range that misbehaves on request, for the tests of pools growing in place: its
//! next backing fails with a given error, or its first release gives back only its last
//! piece.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use memarray_core::{CoreError, GrowableRange, HostRange, Location, MemoryKind, Result};

/// See the module's docs.
#[derive(Debug)]
pub(crate) struct Faulty {
    inner: HostRange,
    map_error: Mutex<Option<CoreError>>,
    stubborn: AtomicBool,
}

impl Faulty {
    /// 64 MiB in 2 MiB pieces whose next backing fails with `error` (once).
    pub(crate) fn failing(error: CoreError) -> Self {
        Self::make(Some(error), false)
    }

    /// 64 MiB in 2 MiB pieces whose first release gives back only its last piece.
    pub(crate) fn stubborn() -> Self {
        Self::make(None, true)
    }

    /// 64 MiB in 2 MiB pieces that behaves until told ([`fail_next`](Self::fail_next)).
    pub(crate) fn plain() -> Self {
        Self::make(None, false)
    }

    /// Its next backing fails with `error` (once).
    pub(crate) fn fail_next(&self, error: CoreError) {
        *self.map_error.lock().expect("not poisoned") = Some(error);
    }

    fn make(error: Option<CoreError>, stubborn: bool) -> Self {
        Faulty {
            inner: HostRange::reserve(64 << 20, 2 << 20).expect("64 MiB of address space"),
            map_error: Mutex::new(error),
            stubborn: AtomicBool::new(stubborn),
        }
    }
}

impl GrowableRange for Faulty {
    fn base(&self) -> usize {
        self.inner.base()
    }
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }
    fn granularity(&self) -> usize {
        self.inner.granularity()
    }
    fn map(&self, from: usize, to: usize) -> Result<()> {
        match self.map_error.lock().expect("not poisoned").take() {
            Some(e) => Err(e),
            None => self.inner.map(from, to),
        }
    }
    fn unmap(&self, from: usize, to: usize) -> usize {
        let g = self.inner.granularity();
        if self.stubborn.swap(false, Ordering::SeqCst) && to - from > g {
            return self.inner.unmap(to - g, to);
        }
        self.inner.unmap(from, to)
    }
    fn backed(&self) -> usize {
        self.inner.backed()
    }
    fn pieces(&self) -> Vec<usize> {
        self.inner.pieces()
    }
    fn kind(&self) -> MemoryKind {
        self.inner.kind()
    }
    fn is_accessible_from(&self, location: Location) -> bool {
        self.inner.is_accessible_from(location)
    }
    fn device_id(&self) -> Option<u32> {
        None
    }
    fn name(&self) -> &str {
        "faulty host range"
    }
}
