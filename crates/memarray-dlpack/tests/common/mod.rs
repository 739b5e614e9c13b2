//! Test helpers: counting owners and a fake foreign producer with a counting deleter.
#![allow(dead_code)] // each test binary uses its own subset

use std::ffi::c_void;
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use memarray_dlpack::ffi::{
    DLDataType, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor,
};

/// An owner whose drops are counted.
pub struct Counted(pub Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A fresh drop counter and an owner box that bumps it once when dropped.
pub fn counted() -> (Arc<AtomicUsize>, Box<Counted>) {
    let n = Arc::new(AtomicUsize::new(0));
    (n.clone(), Box::new(Counted(n)))
}

/// Host memory of `bytes` bytes, 16-byte aligned, with byte `i` = `i as u8`; kept alive by
/// whoever holds the returned Vec.
pub fn host_buffer(bytes: usize) -> (Vec<u128>, *mut c_void) {
    let mut v = vec![0u128; bytes.div_ceil(16).max(1)];
    let p = v.as_mut_ptr().cast::<u8>();
    for i in 0..bytes {
        // SAFETY: i < bytes <= the Vec's byte length.
        unsafe { p.add(i).write(i as u8) };
    }
    (v, p.cast())
}

/// Every field of a foreign tensor, to corrupt one at a time. The default is a valid
/// C-contiguous float32 tensor of shape [2, 3] on the CPU, version 1.3.
#[derive(Clone, Debug)]
pub struct Fields {
    pub version: (u32, u32),
    pub flags: u64,
    pub device_type: u32,
    pub device_id: i32,
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
    pub ndim: i32,
    pub shape: Option<Vec<i64>>,
    pub strides: Option<Vec<i64>>,
    pub byte_offset: u64,
    /// `None`: point into the producer's own 256-byte buffer.
    pub data: Option<*mut c_void>,
    pub has_deleter: bool,
}

impl Default for Fields {
    fn default() -> Self {
        Fields {
            version: (1, 3),
            flags: 0,
            device_type: 1,
            device_id: 0,
            code: 2,
            bits: 32,
            lanes: 1,
            ndim: 2,
            shape: Some(vec![2, 3]),
            strides: Some(vec![3, 1]),
            byte_offset: 0,
            data: None,
            has_deleter: true,
        }
    }
}

/// A fake producer's allocation. The deleter only counts (it frees nothing), so a wrong
/// second call shows up in the count instead of corrupting memory; `Foreign` frees all.
#[repr(C)]
struct Alloc<T> {
    managed: T,
    calls: Arc<AtomicUsize>,
    shape: Vec<i64>,
    strides: Vec<i64>,
    buffer: Vec<u128>,
}

unsafe extern "C" fn count_versioned(p: *mut DLManagedTensorVersioned) {
    // SAFETY: `p` is the first field of a live `Alloc` (the test frees it after use).
    unsafe {
        (*p.cast::<Alloc<DLManagedTensorVersioned>>())
            .calls
            .fetch_add(1, Ordering::SeqCst)
    };
}

unsafe extern "C" fn count_unversioned(p: *mut DLManagedTensor) {
    // SAFETY: as above.
    unsafe {
        (*p.cast::<Alloc<DLManagedTensor>>())
            .calls
            .fetch_add(1, Ordering::SeqCst)
    };
}

/// A foreign managed tensor; dropping this frees its memory (after the consumer is done).
pub struct Foreign<T> {
    alloc: NonNull<Alloc<T>>,
    pub calls: Arc<AtomicUsize>,
}

impl<T> Foreign<T> {
    pub fn ptr(&self) -> NonNull<T> {
        self.alloc.cast()
    }
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
    /// The producer's own 256-byte data buffer (where `data: None` points).
    pub fn buffer_ptr(&self) -> *mut c_void {
        // SAFETY: the allocation lives until self drops; only the Vec's pointer is read.
        unsafe { (*self.alloc.as_ptr()).buffer.as_ptr().cast_mut().cast() }
    }
}

impl<T> Drop for Foreign<T> {
    fn drop(&mut self) {
        // SAFETY: allocated by Box in `build`, freed only here.
        drop(unsafe { Box::from_raw(self.alloc.as_ptr()) });
    }
}

fn dl_tensor(f: &Fields, shape: &mut [i64], strides: &mut [i64], buffer: &mut [u128]) -> DLTensor {
    DLTensor {
        data: f.data.unwrap_or(buffer.as_mut_ptr().cast()),
        device: DLDevice {
            device_type: f.device_type,
            device_id: f.device_id,
        },
        ndim: f.ndim,
        dtype: DLDataType {
            code: f.code,
            bits: f.bits,
            lanes: f.lanes,
        },
        shape: if f.shape.is_some() {
            shape.as_mut_ptr()
        } else {
            ptr::null_mut()
        },
        strides: if f.strides.is_some() {
            strides.as_mut_ptr()
        } else {
            ptr::null_mut()
        },
        byte_offset: f.byte_offset,
    }
}

fn build<T>(f: &Fields, make: impl FnOnce(DLTensor) -> T) -> Foreign<T> {
    let calls = Arc::new(AtomicUsize::new(0));
    let mut shape = f.shape.clone().unwrap_or_default();
    let mut strides = f.strides.clone().unwrap_or_default();
    let mut buffer = vec![0u128; 16];
    // Moving the Vecs into the box below keeps their heap pointers valid.
    let t = dl_tensor(f, &mut shape, &mut strides, &mut buffer);
    let alloc = Box::new(Alloc {
        managed: make(t),
        calls: calls.clone(),
        shape,
        strides,
        buffer,
    });
    Foreign {
        alloc: NonNull::from(Box::leak(alloc)),
        calls,
    }
}

pub fn versioned(f: &Fields) -> Foreign<DLManagedTensorVersioned> {
    build(f, |t| DLManagedTensorVersioned {
        version: DLPackVersion {
            major: f.version.0,
            minor: f.version.1,
        },
        manager_ctx: ptr::null_mut(),
        deleter: if f.has_deleter {
            Some(count_versioned)
        } else {
            None
        },
        flags: f.flags,
        dl_tensor: t,
    })
}

pub fn unversioned(f: &Fields) -> Foreign<DLManagedTensor> {
    build(f, |t| DLManagedTensor {
        dl_tensor: t,
        manager_ctx: ptr::null_mut(),
        deleter: if f.has_deleter {
            Some(count_unversioned)
        } else {
            None
        },
    })
}
