//! Recycling pools for exported managed-tensor structs, with a FIFO quarantine.
//!
//! DLPack deleters must be idempotent, but the struct a deleter receives is also the only
//! place it can record "already deleted". Freeing the struct inside the deleter would turn a
//! second call into a use-after-free; never freeing it would leak one struct per export.
//!
//! So each struct lives in a slot that is never returned to the allocator while it is
//! recent. A deleted slot has `manager_ctx` nulled (the "dead" mark), its `shape`, `strides`
//! and `data` nulled and its owner dropped, and goes to the back of a free list. An export
//! reuses the slot at the front only while the list holds more than [`QUARANTINE`] slots,
//! and otherwise allocates a fresh one; beyond [`MAX_FREE`] free slots, the oldest are
//! returned to the allocator.
//!
//! Trade-off: a repeated deleter call is harmless as long as fewer than [`QUARANTINE`] other
//! exports of the same struct type were deleted in between (it sees a null `manager_ctx` and
//! returns). DLPack allows one call only; the quarantine makes the usual form of a repeat
//! (a capsule destructor and its consumer both calling, moments apart) harmless. A call
//! repeated after that many deletions may hit a recycled slot that belongs to a newer export
//! and end it early. In exchange, memory stays bounded: at most [`MAX_FREE`] free slots per
//! struct type (608 bytes each, about 2.4 MiB) plus the live exports.

use std::any::Any;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::ptr::{self, NonNull};
use std::sync::{Mutex, PoisonError};

use dlpack_rs::ffi::{DLManagedTensor, DLManagedTensorVersioned, DLTensor};
use memarray_core::MAX_NDIM;

use crate::device::Device;

/// Deleted slots kept out of reuse before the oldest may be handed out again.
pub const QUARANTINE: usize = 1024;

/// Free slots kept at most per struct type; the oldest beyond this are deallocated.
pub const MAX_FREE: usize = 4 * QUARANTINE;

/// One pooled allocation: the FFI struct first (so a pointer to the slot is a pointer to the
/// struct), then the storage its `shape` / `strides` point into, then the export's owner.
#[repr(C)]
pub(crate) struct Slot<T> {
    /// The managed-tensor struct handed to the consumer.
    pub(crate) tensor: T,
    /// `shape` in `[..MAX_NDIM]`, `strides` in `[MAX_NDIM..]`.
    pub(crate) dims: [i64; 2 * MAX_NDIM],
    /// Kept alive until the deleter runs.
    pub(crate) owner: Option<Box<dyn Any + Send>>,
}

/// The two managed-tensor struct types: field access and a process-wide pool each.
pub(crate) trait Managed: Sized + 'static {
    /// The pool for this struct type.
    fn pool() -> &'static Pool<Self>;
    /// A struct with null pointers, no deleter and a zero-dimensional CPU tensor.
    fn blank() -> Self;
    /// `&raw mut (*p).manager_ctx`.
    ///
    /// # Safety
    /// 1. `p` points into a live allocation of `Self`.
    unsafe fn manager_ctx(p: *mut Self) -> *mut *mut c_void;
    /// `&raw mut (*p).dl_tensor`.
    ///
    /// # Safety
    /// 1. `p` points into a live allocation of `Self`.
    unsafe fn dl_tensor(p: *mut Self) -> *mut DLTensor;
}

const fn blank_tensor() -> DLTensor {
    DLTensor {
        data: ptr::null_mut(),
        device: Device::CPU.to_dl(),
        ndim: 0,
        dtype: dlpack_rs::ffi::DLDataType {
            code: 0,
            bits: 0,
            lanes: 0,
        },
        shape: ptr::null_mut(),
        strides: ptr::null_mut(),
        byte_offset: 0,
    }
}

static UNVERSIONED: Pool<DLManagedTensor> = Pool::new();
static VERSIONED: Pool<DLManagedTensorVersioned> = Pool::new();

impl Managed for DLManagedTensor {
    fn pool() -> &'static Pool<Self> {
        &UNVERSIONED
    }
    fn blank() -> Self {
        DLManagedTensor {
            dl_tensor: blank_tensor(),
            manager_ctx: ptr::null_mut(),
            deleter: None,
        }
    }
    unsafe fn manager_ctx(p: *mut Self) -> *mut *mut c_void {
        // SAFETY: `p` points into a live allocation (item 1); no reference is created.
        unsafe { &raw mut (*p).manager_ctx }
    }
    unsafe fn dl_tensor(p: *mut Self) -> *mut DLTensor {
        // SAFETY: as above.
        unsafe { &raw mut (*p).dl_tensor }
    }
}

impl Managed for DLManagedTensorVersioned {
    fn pool() -> &'static Pool<Self> {
        &VERSIONED
    }
    fn blank() -> Self {
        DLManagedTensorVersioned {
            version: dlpack_rs::ffi::DLPackVersion { major: 0, minor: 0 },
            manager_ctx: ptr::null_mut(),
            deleter: None,
            flags: 0,
            dl_tensor: blank_tensor(),
        }
    }
    unsafe fn manager_ctx(p: *mut Self) -> *mut *mut c_void {
        // SAFETY: `p` points into a live allocation (item 1); no reference is created.
        unsafe { &raw mut (*p).manager_ctx }
    }
    unsafe fn dl_tensor(p: *mut Self) -> *mut DLTensor {
        // SAFETY: as above.
        unsafe { &raw mut (*p).dl_tensor }
    }
}

/// A free slot. Only the pool's mutex holder touches it.
struct FreeSlot<T>(NonNull<Slot<T>>);

// SAFETY: a free slot holds no owner (taken by the deleter before release) and its pointers
// are null or point into the slot itself; whoever pops it under the mutex has it exclusively.
unsafe impl<T> Send for FreeSlot<T> {}

struct Inner<T> {
    free: VecDeque<FreeSlot<T>>,
    live: usize,
    fresh: u64,
    reused: u64,
    deallocated: u64,
}

/// A process-wide pool of slots for one struct type.
pub(crate) struct Pool<T> {
    inner: Mutex<Inner<T>>,
}

impl<T: Managed> Pool<T> {
    const fn new() -> Self {
        Pool {
            inner: Mutex::new(Inner {
                free: VecDeque::new(),
                live: 0,
                fresh: 0,
                reused: 0,
                deallocated: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<T>> {
        // Nothing panics while the lock is held; recover rather than poison every export.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for a new export: the oldest free one past the quarantine, else a fresh one.
    /// Its `tensor` and `dims` hold stale or blank values; `owner` is `None`.
    pub(crate) fn acquire(&self) -> NonNull<Slot<T>> {
        {
            let mut inner = self.lock();
            inner.live += 1;
            if inner.free.len() > QUARANTINE {
                inner.reused += 1;
                if let Some(FreeSlot(slot)) = inner.free.pop_front() {
                    return slot;
                }
            }
            inner.fresh += 1;
        }
        let slot = Box::new(Slot {
            tensor: T::blank(),
            dims: [0; 2 * MAX_NDIM],
            owner: None,
        });
        NonNull::from(Box::leak(slot))
    }

    /// Returns a dead slot to the back of the free list.
    ///
    /// # Safety
    /// 1. `slot` came from [`Pool::acquire`] of this pool and is not in the free list.
    /// 2. Its owner was taken and its `manager_ctx` nulled; nobody uses it afterwards except
    ///    through a (harmless) repeated deleter call.
    pub(crate) unsafe fn release(&self, slot: NonNull<Slot<T>>) {
        let evicted = {
            let mut inner = self.lock();
            inner.live -= 1;
            inner.free.push_back(FreeSlot(slot));
            if inner.free.len() > MAX_FREE {
                inner.deallocated += 1;
                inner.free.pop_front()
            } else {
                None
            }
        };
        if let Some(FreeSlot(old)) = evicted {
            // SAFETY: `old` was allocated by `Box` in `acquire` and, being in the free list,
            // is owned by nobody else; it has waited out MAX_FREE later deletions.
            drop(unsafe { Box::from_raw(old.as_ptr()) });
        }
    }

    /// Counters for [`pool_stats`].
    fn stats(&self) -> SlotStats {
        let inner = self.lock();
        SlotStats {
            live: inner.live,
            free: inner.free.len(),
            fresh_allocations: inner.fresh,
            reused: inner.reused,
            deallocated: inner.deallocated,
        }
    }
}

/// Counters of one struct type's pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SlotStats {
    /// Exports whose deleter has not run yet.
    pub live: usize,
    /// Deleted slots waiting in the free list (quarantine included).
    pub free: usize,
    /// Slots ever allocated fresh.
    pub fresh_allocations: u64,
    /// Exports that reused a free slot.
    pub reused: u64,
    /// Free slots returned to the allocator because the list exceeded [`MAX_FREE`].
    pub deallocated: u64,
}

impl SlotStats {
    /// Slots currently allocated (live plus free): bounded by live + [`MAX_FREE`].
    pub fn allocated(&self) -> usize {
        self.live + self.free
    }
}

/// Counters of both pools.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// `DLManagedTensor` slots.
    pub unversioned: SlotStats,
    /// `DLManagedTensorVersioned` slots.
    pub versioned: SlotStats,
}

/// A snapshot of the process-wide export pools.
pub fn pool_stats() -> PoolStats {
    PoolStats {
        unversioned: UNVERSIONED.stats(),
        versioned: VERSIONED.stats(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_pointer_is_struct_pointer() {
        // The deleter and `export_*` rely on the FFI struct sitting at offset 0.
        assert_eq!(std::mem::offset_of!(Slot<DLManagedTensor>, tensor), 0);
        assert_eq!(
            std::mem::offset_of!(Slot<DLManagedTensorVersioned>, tensor),
            0
        );
        assert_eq!(
            std::mem::size_of::<Slot<DLManagedTensorVersioned>>(),
            80 + 512 + 16
        );
    }

    #[test]
    fn acquire_release_counts_live_slots() {
        // A private pool, so parallel tests using the global ones do not interfere.
        let pool: Pool<DLManagedTensor> = Pool::new();
        let a = pool.acquire();
        let b = pool.acquire();
        assert_eq!(pool.stats().live, 2);
        assert_eq!(pool.stats().fresh_allocations, 2);
        // SAFETY: both came from `pool`, hold no owner and are not used again.
        unsafe {
            pool.release(a);
            pool.release(b);
        }
        let s = pool.stats();
        assert_eq!((s.live, s.free, s.reused), (0, 2, 0));
        // Under the quarantine: a fresh slot, not `a` again.
        let c = pool.acquire();
        assert_ne!(c, a);
        assert_eq!(pool.stats().fresh_allocations, 3);
        // SAFETY: as above.
        unsafe { pool.release(c) };
        // Leak-free teardown of the private pool.
        for FreeSlot(p) in pool.lock().free.drain(..) {
            // SAFETY: free slots are Box allocations owned by the list.
            drop(unsafe { Box::from_raw(p.as_ptr()) });
        }
    }
}
