//! The pool as NVTX's memory extension sees it, while a tool (Nsight Systems,
//! compute-sanitizer) takes that extension: each upstream allocation is a heap, each block
//! handed out a region in its allocation's heap. Without such a tool every call here is
//! one relaxed load and returns.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::device::{BindGuard, Device};
use crate::nvtx;

/// Upstream allocation -> its NVTX heap (only allocations the tool took as heaps).
#[derive(Debug, Default)]
pub(super) struct NvtxHeaps(Mutex<HashMap<usize, usize>>);

impl NvtxHeaps {
    /// The upstream allocation at `addr` of `size` bytes becomes a heap.
    pub(super) fn allocation_added(&self, device: Option<&Arc<Device>>, addr: usize, size: usize) {
        if let Some(_ctx) = bind(device) {
            let heap = nvtx::heap_register(addr, size);
            if heap != 0 {
                self.map().insert(addr, heap);
            }
        }
    }

    /// The upstream allocation at `addr` goes back: its heap (if any) goes with it.
    pub(super) fn allocation_removed(&self, device: Option<&Arc<Device>>, addr: usize) {
        if let Some(heap) = self.map().remove(&addr) {
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
        self.in_heap(device, base, |heap| nvtx::region_register(heap, addr, size));
    }

    /// The block at `addr` (in the allocation `base()` names) comes back to the pool.
    pub(super) fn block_back(
        &self,
        device: Option<&Arc<Device>>,
        base: impl FnOnce() -> usize,
        addr: usize,
    ) {
        self.in_heap(device, base, |_| nvtx::region_unregister(addr));
    }

    /// Calls `describe` with the heap of the allocation `base()` names, the device bound;
    /// nothing without a tool or where that allocation is no heap (a pass-through block's,
    /// a host pool's, one the tool refused).
    fn in_heap(
        &self,
        device: Option<&Arc<Device>>,
        base: impl FnOnce() -> usize,
        describe: impl FnOnce(usize),
    ) {
        if !nvtx::mem_active() {
            return;
        }
        let heap = self.map().get(&base()).copied().unwrap_or(0);
        if heap != 0
            && let Some(_ctx) = bind(device)
        {
            describe(heap);
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<usize, usize>> {
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
