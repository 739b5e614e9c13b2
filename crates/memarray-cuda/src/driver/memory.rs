//! Allocation, memset and copies.

use std::ffi::{c_int, c_uint, c_void};

use cudarc::driver::sys;

use super::{CUcontext, CUdevice, CUmemoryPool, CUstream, check, init};
use crate::error::Result;

/// `cuMemAlloc`: `bytes` (> 0) of device memory of the current context.
///
/// # Safety
/// 1. A live context is current on the calling thread.
pub(crate) unsafe fn mem_alloc(bytes: usize) -> Result<u64> {
    init()?;
    let mut p: sys::CUdeviceptr = 0;
    // A capture in global or thread-local mode forbids cuMemAlloc on this thread (the call
    // fails and invalidates the capture). The allocation is no captured work (the memory
    // exists at once, for the graph and for eager work alike), so this thread's capture
    // mode is relaxed for this one call, as CUDA's documentation of
    // cuThreadExchangeStreamCaptureMode suggests for allocators.
    relaxed_capture_mode(|| {
        // SAFETY: item 1; the out pointer is valid.
        check("cuMemAlloc_v2", unsafe {
            sys::cuMemAlloc_v2(&mut p, bytes)
        })
    })?;
    Ok(p)
}

/// Runs `f` with this thread's stream capture mode relaxed, then restores the mode (if
/// the swap failed, `f` runs in the thread's mode as it was).
pub(super) fn relaxed_capture_mode<T>(f: impl FnOnce() -> T) -> T {
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: the out pointer is valid; the call swaps this thread's capture mode only.
    let swapped =
        unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) } == sys::CUresult::CUDA_SUCCESS;
    let out = f();
    if swapped {
        // SAFETY: as above; `mode` holds the thread's previous mode.
        let restored = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        debug_assert_eq!(restored, sys::CUresult::CUDA_SUCCESS);
    }
    out
}

/// `cuMemFree` (also frees managed memory).
///
/// # Safety
/// 1. `p` came from `mem_alloc` or `mem_alloc_managed`, is freed once, and no pending or
///    later access uses it.
/// 2. A context of the same device is current on the calling thread.
pub(crate) unsafe fn mem_free(p: u64) -> Result<()> {
    init()?;
    // SAFETY: items 1 and 2.
    check("cuMemFree_v2", unsafe { sys::cuMemFree_v2(p) })
}

/// `cuMemAllocAsync`: `bytes` (> 0) from the device's current pool, ordered on `s`.
///
/// # Safety
/// 1. `s` is a live stream of the current context, or 1/2 with a context current.
/// 2. The memory is used only by work ordered after this allocation on `s`.
pub(crate) unsafe fn mem_alloc_async(bytes: usize, s: CUstream) -> Result<u64> {
    init()?;
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: items 1 and 2; the out pointer is valid.
    check("cuMemAllocAsync", unsafe {
        sys::cuMemAllocAsync(&mut p, bytes, s)
    })?;
    Ok(p)
}

/// `cuMemFreeAsync`: returns `p` to its pool once work before this point on `s` is done.
///
/// # Safety
/// 1. `p` came from `mem_alloc_async` and is freed once.
/// 2. `s` is a live stream (or 1/2 with a context current), and every access to `p` is
///    ordered before this call on `s`.
pub(crate) unsafe fn mem_free_async(p: u64, s: CUstream) -> Result<()> {
    init()?;
    // SAFETY: items 1 and 2.
    check("cuMemFreeAsync", unsafe { sys::cuMemFreeAsync(p, s) })
}

/// The device's default stream-ordered memory pool.
pub(crate) fn device_default_mem_pool(dev: CUdevice) -> Result<CUmemoryPool> {
    init()?;
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: the out pointer is valid; a bad `dev` is an error.
    check("cuDeviceGetDefaultMemPool", unsafe {
        sys::cuDeviceGetDefaultMemPool(&mut pool, dev)
    })?;
    Ok(pool)
}

/// Sets how many unused bytes `pool` keeps cached at a synchronization point.
///
/// # Safety
/// 1. `pool` is a live memory pool.
pub(crate) unsafe fn mem_pool_set_release_threshold(pool: CUmemoryPool, bytes: u64) -> Result<()> {
    init()?;
    let mut v = bytes;
    let attr = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
    // A setting, no captured work: allowed under a capture begun before it (the pool may
    // be set up on first use, inside one), as `mem_alloc`.
    relaxed_capture_mode(|| {
        // SAFETY: item 1; this attribute takes a pointer to a u64 (cuuint64_t).
        check("cuMemPoolSetAttribute", unsafe {
            sys::cuMemPoolSetAttribute(pool, attr, (&raw mut v).cast::<c_void>())
        })
    })
}

/// `cuMemHostAlloc`: `bytes` (> 0) of page-locked host memory with `flags`
/// (`CU_MEMHOSTALLOC_*`).
///
/// # Safety
/// 1. A live context is current on the calling thread.
pub(crate) unsafe fn mem_host_alloc(bytes: usize, flags: c_uint) -> Result<*mut c_void> {
    init()?;
    let mut p: *mut c_void = std::ptr::null_mut();
    // No captured work: allowed under a capture, as `mem_alloc`.
    relaxed_capture_mode(|| {
        // SAFETY: item 1; the out pointer is valid.
        check("cuMemHostAlloc", unsafe {
            sys::cuMemHostAlloc(&mut p, bytes, flags)
        })
    })?;
    Ok(p)
}

/// `cuMemFreeHost`.
///
/// # Safety
/// 1. `p` came from `mem_host_alloc`, is freed once, and no pending or later access
///    (host or device) uses it.
/// 2. A live context is current on the calling thread.
pub(crate) unsafe fn mem_free_host(p: *mut c_void) -> Result<()> {
    init()?;
    // SAFETY: items 1 and 2.
    check("cuMemFreeHost", unsafe { sys::cuMemFreeHost(p) })
}

/// `cuMemHostRegister`: page-locks `bytes` of host memory at `p` in place.
///
/// # Safety
/// 1. `[p, p + bytes)` is host memory that stays allocated until `mem_host_unregister`.
/// 2. A live context is current on the calling thread.
pub(crate) unsafe fn mem_host_register(p: *mut c_void, bytes: usize, flags: c_uint) -> Result<()> {
    init()?;
    // SAFETY: items 1 and 2.
    check("cuMemHostRegister", unsafe {
        sys::cuMemHostRegister_v2(p, bytes, flags)
    })
}

/// `cuMemHostUnregister`.
///
/// # Safety
/// 1. `p` was registered by `mem_host_register`, is unregistered once, and no pending
///    device access uses it.
/// 2. A live context is current on the calling thread.
pub(crate) unsafe fn mem_host_unregister(p: *mut c_void) -> Result<()> {
    init()?;
    // SAFETY: items 1 and 2.
    check("cuMemHostUnregister", unsafe {
        sys::cuMemHostUnregister(p)
    })
}

/// `cuMemAllocManaged` with `CU_MEM_ATTACH_GLOBAL`: `bytes` (> 0) reachable from the host
/// and every device.
///
/// # Safety
/// 1. A live context is current on the calling thread.
pub(crate) unsafe fn mem_alloc_managed(bytes: usize) -> Result<u64> {
    init()?;
    let mut p: sys::CUdeviceptr = 0;
    let flags = sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL as c_uint;
    // SAFETY: item 1; the out pointer is valid.
    check("cuMemAllocManaged", unsafe {
        sys::cuMemAllocManaged(&mut p, bytes, flags)
    })?;
    Ok(p)
}

/// The ordinal of the device whose context allocated the memory at `p` (device, managed
/// or pinned memory known to the driver); an error for other addresses.
pub(crate) fn pointer_device_ordinal(p: u64) -> Result<u32> {
    init()?;
    let mut ordinal: c_int = -1;
    let attr = sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL;
    // SAFETY: this attribute writes one int to the out pointer; the driver validates `p`
    // (an unknown address is CUDA_ERROR_INVALID_VALUE, not undefined behaviour).
    check("cuPointerGetAttribute", unsafe {
        sys::cuPointerGetAttribute((&raw mut ordinal).cast::<c_void>(), attr, p)
    })?;
    Ok(ordinal.max(0) as u32)
}

/// Whether the driver knows the host address `p` (page-locked, registered or managed
/// memory, which DMA reads directly); `false` for ordinary pageable memory.
pub(crate) fn host_pointer_is_known(p: *const u8) -> bool {
    if init().is_err() {
        return false;
    }
    let mut ty: c_uint = 0;
    let mut attr = sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
    let mut data = (&raw mut ty).cast::<c_void>();
    // SAFETY: one attribute, whose value (an unsigned int) goes to `ty`. The plural call,
    // unlike cuPointerGetAttribute, answers an address the driver does not know with
    // CUDA_SUCCESS and a zero memory type rather than CUDA_ERROR_INVALID_VALUE, which
    // compute-sanitizer reports as an API error in the user's program on every staged
    // copy.
    let r = unsafe { sys::cuPointerGetAttributes(1, &raw mut attr, &raw mut data, p as u64) };
    r == sys::CUresult::CUDA_SUCCESS && ty != 0
}

/// Enqueues setting `n` bytes at `p` to `value` on `s`.
///
/// # Safety
/// 1. `[p, p + n)` is live device-accessible memory, not freed before the memset runs.
/// 2. `s` is a live stream (or 1/2) of the current context.
pub(crate) unsafe fn memset_d8_async(p: u64, value: u8, n: usize, s: CUstream) -> Result<()> {
    init()?;
    // SAFETY: items 1 and 2.
    check("cuMemsetD8Async", unsafe {
        sys::cuMemsetD8Async(p, value, n, s)
    })
}

/// Enqueues a host-to-device copy of `n` bytes on `s`.
///
/// # Safety
/// 1. `src` is valid for reads of `n` bytes until the copy has run (pageable memory is
///    staged before the call returns; page-locked memory is read later).
/// 2. `[dst, dst + n)` is live device-accessible memory.
/// 3. `s` is a live stream (or 1/2) of the current context.
pub(crate) unsafe fn memcpy_htod_async(
    dst: u64,
    src: *const u8,
    n: usize,
    s: CUstream,
) -> Result<()> {
    init()?;
    // SAFETY: items 1 to 3.
    check("cuMemcpyHtoDAsync_v2", unsafe {
        sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), n, s)
    })
}

/// Enqueues a device-to-host copy of `n` bytes on `s`.
///
/// # Safety
/// 1. `dst` is valid for writes of `n` bytes, and nothing else reads or writes them, until
///    the copy has run.
/// 2. `[src, src + n)` is live device-accessible memory.
/// 3. `s` is a live stream (or 1/2) of the current context.
pub(crate) unsafe fn memcpy_dtoh_async(
    dst: *mut u8,
    src: u64,
    n: usize,
    s: CUstream,
) -> Result<()> {
    init()?;
    // SAFETY: items 1 to 3.
    check("cuMemcpyDtoHAsync_v2", unsafe {
        sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, n, s)
    })
}

/// Enqueues a device-to-device copy of `n` bytes on `s`.
///
/// # Safety
/// 1. `[src, src + n)` and `[dst, dst + n)` are live memory of the current context's
///    device (or unified addresses it can reach).
/// 2. `s` is a live stream (or 1/2) of the current context.
pub(crate) unsafe fn memcpy_dtod_async(dst: u64, src: u64, n: usize, s: CUstream) -> Result<()> {
    init()?;
    // SAFETY: items 1 and 2.
    check("cuMemcpyDtoDAsync_v2", unsafe {
        sys::cuMemcpyDtoDAsync_v2(dst, src, n, s)
    })
}

/// Enqueues a copy of `n` bytes between two devices' memories on `s`.
///
/// # Safety
/// 1. `[dst, dst + n)` is live memory of `dst_ctx`'s device, `[src, src + n)` of
///    `src_ctx`'s; both contexts are live.
/// 2. `s` is a live stream (or 1/2) of the current context.
pub(crate) unsafe fn memcpy_peer_async(
    dst: u64,
    dst_ctx: CUcontext,
    src: u64,
    src_ctx: CUcontext,
    n: usize,
    s: CUstream,
) -> Result<()> {
    init()?;
    // SAFETY: items 1 and 2.
    check("cuMemcpyPeerAsync", unsafe {
        sys::cuMemcpyPeerAsync(dst, dst_ctx, src, src_ctx, n, s)
    })
}

/// The allocation `(base, size)` that contains `p`, in one `cuPointerGetAttributes` call
/// that needs no current context (unified addressing); `None` where the driver reports no
/// range (an address it does not know, or a virtual-memory mapping): ask
/// [`mem_get_address_range`] then, for the reason.
pub(crate) fn pointer_range(p: u64) -> Result<Option<(u64, usize)>> {
    init()?;
    let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
    let mut attrs = [
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    ];
    let mut data = [
        (&raw mut base).cast::<c_void>(),
        (&raw mut size).cast::<c_void>(),
    ];
    // SAFETY: two attributes, a CUdeviceptr and a size_t, each written to its out
    // pointer; an unknown address is answered with zeros (the plural call's rule).
    check("cuPointerGetAttributes", unsafe {
        sys::cuPointerGetAttributes(2, attrs.as_mut_ptr(), data.as_mut_ptr(), p)
    })?;
    Ok((size > 0 && base <= p && p < base + size as u64).then_some((base, size)))
}

/// `cuMemGetAddressRange`: the allocation `(base, size)` that contains `p`.
///
/// # Safety
/// 1. A context of `p`'s device is current on the calling thread.
pub(crate) unsafe fn mem_get_address_range(p: u64) -> Result<(u64, usize)> {
    init()?;
    let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
    // SAFETY: item 1; the out pointers are valid.
    check("cuMemGetAddressRange_v2", unsafe {
        sys::cuMemGetAddressRange_v2(&mut base, &mut size, p)
    })?;
    Ok((base, size))
}

/// `cuIpcGetMemHandle`: the 64-byte handle another process opens to map the allocation
/// starting at `base`.
///
/// # Safety
/// 1. `base` is the start of a live `cuMemAlloc` allocation; its context is current.
pub(crate) unsafe fn ipc_get_mem_handle(base: u64) -> Result<[u8; 64]> {
    init()?;
    let mut h = sys::CUipcMemHandle_st { reserved: [0; 64] };
    // SAFETY: item 1; the out pointer is valid.
    check("cuIpcGetMemHandle", unsafe {
        sys::cuIpcGetMemHandle(&mut h, base)
    })?;
    Ok(h.reserved.map(|b| b as u8))
}

/// `cuIpcOpenMemHandle` (lazy peer access): maps another process's allocation.
///
/// # Safety
/// 1. A context of the allocation's device is current on the calling thread.
pub(crate) unsafe fn ipc_open_mem_handle(handle: &[u8; 64]) -> Result<u64> {
    init()?;
    let h = sys::CUipcMemHandle_st {
        reserved: handle.map(|b| b as ::core::ffi::c_char),
    };
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: item 1; the out pointer is valid; a bad handle is an error, not UB.
    check("cuIpcOpenMemHandle_v2", unsafe {
        sys::cuIpcOpenMemHandle_v2(&mut p, h, 1)
    })?;
    Ok(p)
}

/// `cuIpcCloseMemHandle`.
///
/// # Safety
/// 1. `p` came from `ipc_open_mem_handle`, is closed once, and nothing uses it after.
/// 2. Its device's context is current.
pub(crate) unsafe fn ipc_close_mem_handle(p: u64) -> Result<()> {
    init()?;
    // SAFETY: items 1 and 2.
    check("cuIpcCloseMemHandle", unsafe {
        sys::cuIpcCloseMemHandle(p)
    })
}

/// Creates an event other processes can open (`CU_EVENT_INTERPROCESS`, no timing).
///
/// # Safety
/// 1. A live context is current on the calling thread.
pub(crate) unsafe fn event_create_interprocess() -> Result<super::CUevent> {
    init()?;
    let flags = sys::CUevent_flags::CU_EVENT_INTERPROCESS as u32
        | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
    let mut e: super::CUevent = std::ptr::null_mut();
    // SAFETY: item 1; the out pointer is valid.
    check("cuEventCreate", unsafe {
        sys::cuEventCreate(&mut e, flags)
    })?;
    Ok(e)
}

/// `cuIpcGetEventHandle`: the 64-byte handle of an interprocess event.
///
/// # Safety
/// 1. `e` is a live event made by [`event_create_interprocess`]; its context is current.
pub(crate) unsafe fn ipc_get_event_handle(e: super::CUevent) -> Result<[u8; 64]> {
    init()?;
    let mut h = sys::CUipcEventHandle_st { reserved: [0; 64] };
    // SAFETY: item 1; the out pointer is valid.
    check("cuIpcGetEventHandle", unsafe {
        sys::cuIpcGetEventHandle(&mut h, e)
    })?;
    Ok(h.reserved.map(|b| b as u8))
}

/// `cuIpcOpenEventHandle`: another process's interprocess event, as an event of this one
/// (destroyed with `event_destroy`).
///
/// # Safety
/// 1. A context of the event's device is current on the calling thread.
pub(crate) unsafe fn ipc_open_event_handle(handle: &[u8; 64]) -> Result<super::CUevent> {
    init()?;
    let h = sys::CUipcEventHandle_st {
        reserved: handle.map(|b| b as ::core::ffi::c_char),
    };
    let mut e: super::CUevent = std::ptr::null_mut();
    // SAFETY: item 1; the out pointer is valid; a bad handle is an error, not UB.
    check("cuIpcOpenEventHandle", unsafe {
        sys::cuIpcOpenEventHandle(&mut e, h)
    })?;
    Ok(e)
}

/// Batches `memcpy_batch_async` gave to `cuMemcpyBatchAsync`, and ones it refused.
pub(crate) static BATCHED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub(crate) static BATCH_REFUSED: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// Which way a batch of copies goes: host to `device`, `device` to host, or within it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BatchWay {
    ToDevice,
    ToHost,
    OnDevice,
}

/// Whether the driver exports `cuMemcpyBatchAsync` (CUDA 12.8+), looked up once without
/// the panic a missing symbol would cause in cudarc's loader.
fn has_memcpy_batch() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        init().is_ok()
            // SAFETY: the library is the driver cudarc loaded (init succeeded); only the
            // symbol's presence is checked, it is not called through this pointer.
            && unsafe { sys::culib().get::<*const c_void>(b"cuMemcpyBatchAsync\0") }.is_ok()
    })
}

/// Refuses lists of copies whose destinations, sources and sizes differ in number.
pub(crate) fn same_lengths(
    what: &'static str,
    dsts: usize,
    srcs: usize,
    sizes: usize,
) -> Result<()> {
    if dsts == srcs && srcs == sizes {
        return Ok(());
    }
    Err(crate::error::CudaError::InvalidArgument {
        what,
        detail: format!("{dsts} destinations, {srcs} sources, {sizes} sizes"),
    })
}

/// Enqueues `dsts.len()` copies (`sizes[i]` bytes from `srcs[i]` to `dsts[i]`, unified
/// addresses: device memory or page-locked host memory) on `s` in one driver call where
/// the driver has `cuMemcpyBatchAsync` and `s` is not a default stream, else one
/// `cuMemcpyAsync` each. `way` says where the batch's sources and destinations are (a
/// location hint).
///
/// # Safety
/// 1. Every range is live device memory of the current context or page-locked host
///    memory, not freed or (host) touched until the copies have run.
/// 2. `s` is a live stream (or 1/2) of the current context.
pub(crate) unsafe fn memcpy_batch_async(
    dsts: &mut [u64],
    srcs: &mut [u64],
    sizes: &mut [usize],
    way: BatchWay,
    device: c_int,
    s: CUstream,
) -> Result<()> {
    init()?;
    same_lengths("memcpy batch", dsts.len(), srcs.len(), sizes.len())?;
    if dsts.is_empty() {
        return Ok(());
    }
    let default_stream = (s as usize) <= 2;
    if has_memcpy_batch() && !default_stream {
        let host = sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST,
            id: 0,
        };
        let dev = sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        };
        let (src_loc, dst_loc) = match way {
            BatchWay::ToDevice => (host, dev),
            BatchWay::ToHost => (dev, host),
            BatchWay::OnDevice => (dev, dev),
        };
        let mut attrs = [sys::CUmemcpyAttributes {
            srcAccessOrder: sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
            srcLocHint: src_loc,
            dstLocHint: dst_loc,
            flags: 0,
        }];
        let mut attr_idx = [0usize];
        let mut fail_idx = usize::MAX;
        // SAFETY: items 1 and 2; the arrays hold `len` entries each, one attribute applies
        // from index 0, and the out index is valid.
        let r = unsafe {
            sys::cuMemcpyBatchAsync(
                dsts.as_mut_ptr(),
                srcs.as_mut_ptr(),
                sizes.as_mut_ptr(),
                dsts.len(),
                attrs.as_mut_ptr(),
                attr_idx.as_mut_ptr(),
                1,
                &mut fail_idx,
                s,
            )
        };
        if r == sys::CUresult::CUDA_SUCCESS {
            BATCHED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Ok(());
        }
        BATCH_REFUSED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Refused (e.g. an attribute this driver rejects): copies are idempotent, so
        // enqueue them one by one below.
    }
    for i in 0..dsts.len() {
        // SAFETY: items 1 and 2, for one range each.
        check("cuMemcpyAsync", unsafe {
            sys::cuMemcpyAsync(dsts[i], srcs[i], sizes[i], s)
        })?;
    }
    Ok(())
}
