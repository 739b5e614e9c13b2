//! [`VmmRange`]: device memory as a [`GrowableRange`], over CUDA's virtual memory API: an
//! address range reserved once (`cuMemAddressReserve`), backed piece by piece
//! (`cuMemCreate` + `cuMemMap` + `cuMemSetAccess`, one physical handle per piece, so each
//! piece can be registered with a transport as one allocation) and released from its end
//! in the pieces it was backed in. [`crate::resource::CachingPool::growing`] carves its
//! large blocks from one.
//!
//! Such memory has no CUDA IPC handle (`cuIpcGetMemHandle` refuses it) and is reachable
//! from the reserving device only (no peer access is granted).

use std::sync::{Arc, Mutex, PoisonError};

use memarray_core::{CoreError, GrowableRange, Location, MemoryKind, Result};

use crate::device::Device;
use crate::driver;

/// A device's reserved address range, backed piece by piece.
#[derive(Debug)]
pub struct VmmRange {
    device: Arc<Device>,
    base: u64,
    capacity: usize,
    granularity: usize,
    name: String,
    /// The backed pieces, in address order: (offset, bytes, physical handle).
    pieces: Mutex<Vec<(usize, usize, u64)>>,
}

impl VmmRange {
    /// Reserves `capacity` bytes of address space on `device` (rounded up to the device's
    /// recommended granularity, typically 2 MiB); nothing is backed yet.
    ///
    /// # Errors
    /// [`CoreError::Alloc`] when the driver has no virtual memory support or refuses the
    /// reservation (too large for the address space), `Unavailable` without a driver.
    pub fn reserve(device: &Arc<Device>, capacity: usize) -> Result<Self> {
        let name = format!("vmm range(cuda:{})", device.id());
        let fail = |e: crate::CudaError| e.into_alloc(capacity, 1, &name);
        let _ctx = device.bind().map_err(fail)?;
        let id = device.id() as i32;
        let granularity = driver::vmm_granularity(id).map_err(fail)?;
        let capacity = capacity
            .max(1)
            .checked_next_multiple_of(granularity)
            .filter(|&c| c <= isize::MAX as usize)
            .ok_or_else(|| CoreError::Alloc {
                bytes: capacity,
                align: granularity,
                resource: name.clone(),
                reason: "more address space than a process has".into(),
            })?;
        let base = driver::vmm_reserve(capacity, granularity).map_err(fail)?;
        Ok(VmmRange {
            device: device.clone(),
            base,
            capacity,
            granularity,
            name: format!("vmm range[{capacity} bytes](cuda:{})", device.id()),
            pieces: Mutex::new(Vec::new()),
        })
    }

    fn backed_end(pieces: &[(usize, usize, u64)]) -> usize {
        pieces.last().map_or(0, |&(at, n, _)| at + n)
    }
}

impl GrowableRange for VmmRange {
    fn base(&self) -> usize {
        self.base as usize
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn granularity(&self) -> usize {
        self.granularity
    }

    fn map(&self, from: usize, to: usize) -> Result<()> {
        let mut pieces = self.pieces.lock().unwrap_or_else(PoisonError::into_inner);
        let end = Self::backed_end(&pieces);
        if from != end
            || from >= to
            || to > self.capacity
            || !from.is_multiple_of(self.granularity)
            || !to.is_multiple_of(self.granularity)
        {
            return Err(CoreError::OutOfMemory {
                bytes: to.saturating_sub(from),
                resource: self.name.clone(),
                reason: format!(
                    "cannot back [{from}, {to}): {end} bytes are backed of {} reserved",
                    self.capacity
                ),
            });
        }
        let _ctx = self
            .device
            .bind()
            .map_err(|e| e.into_alloc(to - from, self.granularity, &self.name))?;
        // SAFETY: [base + from, base + to) is inside the reservation and unmapped (the
        // pieces end at `from`).
        let handle =
            unsafe { driver::vmm_map(self.base + from as u64, to - from, self.device.id() as i32) }
                .map_err(|e| e.into_alloc(to - from, self.granularity, &self.name))?;
        pieces.push((from, to - from, handle));
        Ok(())
    }

    fn unmap(&self, from: usize, to: usize) -> usize {
        let mut pieces = self.pieces.lock().unwrap_or_else(PoisonError::into_inner);
        if to != Self::backed_end(&pieces) {
            return Self::backed_end(&pieces);
        }
        let Ok(_ctx) = self.device.bind() else {
            return to;
        };
        while let Some(&(at, n, handle)) = pieces.last() {
            if at < from {
                break; // a piece reaching below `from` stays whole
            }
            // SAFETY: a piece mapped by `map`; the caller's contract: nothing uses it.
            let gone = unsafe { driver::vmm_unmap(self.base + at as u64, n, handle) };
            if gone.is_err() {
                crate::parked::park_err("unmapping a pool range", gone);
                break;
            }
            pieces.pop();
        }
        Self::backed_end(&pieces)
    }

    fn backed(&self) -> usize {
        Self::backed_end(&self.pieces.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn pieces(&self) -> Vec<usize> {
        let pieces = self.pieces.lock().unwrap_or_else(PoisonError::into_inner);
        pieces.iter().map(|&(at, n, _)| at + n).collect()
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Device
    }

    fn is_accessible_from(&self, location: Location) -> bool {
        location == Location::Device(self.device.id())
    }

    fn device_id(&self) -> Option<u32> {
        Some(self.device.id())
    }

    fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for VmmRange {
    fn drop(&mut self) {
        let end = Self::backed_end(&self.pieces.lock().unwrap_or_else(PoisonError::into_inner));
        let Ok(_ctx) = self.device.bind() else {
            return; // no context: the reservation goes with the process
        };
        if self.unmap(0, end) == 0 {
            // SAFETY: the whole reservation, nothing mapped in it any more.
            let freed = unsafe { driver::vmm_free_reservation(self.base, self.capacity) };
            crate::parked::park_err("freeing a pool range's reservation", freed);
        }
    }
}
