//! The pool as NVTX's memory extension sees it, while a tool (Nsight Systems,
//! compute-sanitizer) takes that extension: each upstream allocation is a heap, each block
//! handed out a region in its allocation's heap. Without such a tool every call here is
//! one relaxed load and returns.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use crate::device::{BindGuard, Device};
use crate::nvtx;

/// Upstream allocation -> its NVTX heap (only allocations the tool took as heaps), and
/// the blocks described as regions (only those are unregistered: a block handed out while
/// its stream was captured, or before its allocation was a heap, never was).
#[derive(Debug, Default)]
pub(super) struct NvtxHeaps(Mutex<Described>);

#[derive(Debug, Default)]
struct Described {
    heaps: HashMap<usize, usize>,
    regions: HashSet<usize>,
}

impl NvtxHeaps {
    /// The upstream allocation at `addr` of `size` bytes becomes a heap.
    pub(super) fn allocation_added(&self, device: Option<&Arc<Device>>, addr: usize, size: usize) {
        if let Some(_ctx) = bind(device) {
            let heap = nvtx::heap_register(addr, size);
            if heap != 0 {
                self.map().heaps.insert(addr, heap);
            }
        }
    }

    /// The upstream allocation at `addr` goes back: its heap (if any) goes with it.
    pub(super) fn allocation_removed(&self, device: Option<&Arc<Device>>, addr: usize) {
        let heap = self.map().heaps.remove(&addr);
        if let Some(heap) = heap {
            let _ctx = bind(device);
            nvtx::heap_unregister(heap);
        }
    }

    /// The block at `addr` of `size` bytes, in the upstream allocation `base()` names (a
    /// small block is one of its own, a large one lies in a segment), is handed out.
    pub(super) fn block_out(
        &self,
        device: Option<&Arc<Device>>,
        base: impl FnOnce() -> usize,
        addr: usize,
        size: usize,
    ) {
        if self.in_heap(device, base, |heap| nvtx::region_register(heap, addr, size)) {
            self.map().regions.insert(addr);
        }
    }

    /// The block at `addr` comes back to the pool: its region goes, if it was described.
    pub(super) fn block_back(&self, device: Option<&Arc<Device>>, addr: usize) {
        if !nvtx::mem_active() {
            return;
        }
        let described = self.map().regions.remove(&addr);
        if described && let Some(_ctx) = bind(device) {
            nvtx::region_unregister(addr);
        }
    }

    /// Calls `describe` with the heap of the allocation `base()` names, the device bound,
    /// and says whether it did: not without a tool or where that allocation is no heap (a
    /// pass-through block's, a host pool's, one allocated inside a capture, one the tool
    /// refused).
    fn in_heap(
        &self,
        device: Option<&Arc<Device>>,
        base: impl FnOnce() -> usize,
        describe: impl FnOnce(usize),
    ) -> bool {
        if !nvtx::mem_active() {
            return false;
        }
        let heap = self.map().heaps.get(&base()).copied().unwrap_or(0);
        if heap != 0
            && let Some(_ctx) = bind(device)
        {
            describe(heap);
            return true;
        }
        false
    }

    fn map(&self) -> std::sync::MutexGuard<'_, Described> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// With a tool that takes NVTX's memory extension and a pool on a device: the device
/// bound for the NVTX memory calls (compute-sanitizer refuses them with no current
/// context). None otherwise: a host pool's memory is no CUDA heap, and without a tool
/// nothing is described.
fn bind(device: Option<&Arc<Device>>) -> Option<BindGuard> {
    if !nvtx::mem_active() {
        return None;
    }
    device.and_then(|d| d.bind().ok())
}
