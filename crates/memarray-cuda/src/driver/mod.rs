//! The only place raw CUDA driver calls live (cudarc's `sys` layer, loaded at run time).
//!
//! Thin functions, one per driver entry point, each returning [`Result`]. Every entry
//! first checks, once per process, that libcuda can be loaded and `cuInit(0)` succeeds:
//! cudarc panics when the library is missing, memarray returns
//! [`CudaError::Unavailable`] instead. Handles (`CUcontext`, `CUstream`, ...) and device
//! addresses (`u64`) never leave the crate's private API.
//!
//! Functions taking handles are `unsafe`: a handle that is stale or belongs to another
//! context is undefined behaviour in the driver, not an error.

mod exec;
mod graph;
mod memory;
mod vmm;

use std::ffi::{CStr, c_char, c_int};
use std::sync::OnceLock;

use cudarc::driver::sys;

use crate::error::{CudaError, Result};

pub(crate) use exec::*;
pub(crate) use graph::*;
pub(crate) use memory::*;
pub(crate) use vmm::*;

pub(crate) use sys::{CUcontext, CUdevice, CUevent, CUfunction, CUmemoryPool, CUmodule, CUstream};

/// `CUDA_ERROR_NOT_READY`.
const NOT_READY: sys::CUresult = sys::CUresult::CUDA_ERROR_NOT_READY;

/// The outcome of [`init`]: the fork generation (memarray_core::fork) `cuInit` succeeded
/// in, or why it did not.
static INIT: OnceLock<Result<u64, String>> = OnceLock::new();

/// Whether [`init`] has run in this process (successfully or not): asking anything of the
/// driver before it would start CUDA.
pub(crate) fn started() -> bool {
    INIT.get().is_some()
}

/// Loads libcuda and runs `cuInit(0)` once; later calls return the cached outcome. In a
/// process forked after CUDA was initialised (the driver's state does not survive a fork:
/// every call there fails with `CUDA_ERROR_NOT_INITIALIZED` or worse), every call is
/// [`CudaError::Unavailable`] naming the cause and the fix, as torch says it.
pub(crate) fn init() -> Result<()> {
    let outcome = INIT.get_or_init(|| {
        // SAFETY: loading libcuda runs its initialisers, which is what every CUDA program
        // does; no other code of ours runs concurrently with the OnceLock initialiser.
        if !unsafe { sys::is_culib_present() } {
            return Err(
                "libcuda.so not found: no NVIDIA driver on this machine (searched the \
                        loader path for libcuda.so and libcuda.so.1; set LD_LIBRARY_PATH if the \
                        driver is installed elsewhere)"
                    .to_string(),
            );
        }
        // cudarc resolves each entry point on first use and panics when one is missing:
        // check them all here, once.
        probe_entry_points()?;
        let generation = memarray_core::fork::generation();
        // SAFETY: the library is present (checked above); cuInit takes a plain integer.
        let r = unsafe { sys::cuInit(0) };
        if r == sys::CUresult::CUDA_SUCCESS {
            Ok(generation)
        } else {
            let (name, message) = describe(r);
            Err(format!("cuInit failed: {name} ({message})"))
        }
    });
    match outcome {
        Ok(generation) if *generation == memarray_core::fork::generation() => Ok(()),
        Ok(_) => Err(CudaError::Unavailable {
            reason: FORKED_AFTER_INIT.to_string(),
        }),
        Err(reason) => Err(CudaError::Unavailable {
            reason: reason.clone(),
        }),
    }
}

/// Why CUDA is unusable in a child forked after its parent initialised CUDA.
pub(crate) const FORKED_AFTER_INIT: &str = "CUDA cannot be used in a process forked after \
    CUDA was initialised in its parent (the driver's state does not survive fork). Start \
    child processes with the 'spawn' or 'forkserver' method \
    (multiprocessing.set_start_method('spawn'), or \
    concurrent.futures.ProcessPoolExecutor(mp_context=multiprocessing.get_context('spawn'))), \
    or fork before the parent first uses CUDA. Host arrays keep working here";

/// Every driver entry point memarray calls. cudarc resolves each on its first call and
/// panics when the library lacks it; [`init`] checks them all first. A unit test keeps
/// this list equal to the `sys::cu*` calls in the crate.
const ENTRY_POINTS: &[&str] = &[
    "cuCtxEnablePeerAccess",
    "cuCtxGetCurrent",
    "cuCtxGetDevice",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuDeviceCanAccessPeer",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDeviceGetCount",
    "cuDeviceGetDefaultMemPool",
    "cuDeviceGetName",
    "cuDevicePrimaryCtxRetain",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventElapsedTime",
    "cuEventQuery",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuGetErrorName",
    "cuGraphDestroy",
    "cuGraphExecDestroy",
    "cuGraphGetNodes",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphUpload",
    "cuGetErrorString",
    "cuInit",
    "cuIpcCloseMemHandle",
    "cuIpcGetEventHandle",
    "cuIpcGetMemHandle",
    "cuIpcOpenEventHandle",
    "cuIpcOpenMemHandle_v2",
    "cuLaunchKernel",
    "cuMemAllocAsync",
    "cuMemAllocManaged",
    "cuMemAlloc_v2",
    "cuMemFreeAsync",
    "cuMemFreeHost",
    "cuMemFree_v2",
    "cuMemGetAddressRange_v2",
    "cuMemGetInfo_v2",
    "cuMemHostAlloc",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuMemPoolSetAttribute",
    "cuMemcpyAsync",
    "cuMemcpyBatchAsync",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyPeerAsync",
    "cuMemsetD8Async",
    "cuModuleGetFunction",
    "cuFuncGetParamInfo",
    "cuModuleLoadData",
    "cuModuleUnload",
    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    "cuOccupancyMaxPotentialBlockSize",
    "cuPointerGetAttribute",
    "cuPointerGetAttributes",
    "cuStreamBeginCapture_v2",
    "cuStreamCreate",
    "cuStreamEndCapture",
    "cuStreamGetCaptureInfo_v2",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuThreadExchangeStreamCaptureMode",
    "cuUserObjectCreate",
    "cuGraphRetainUserObject",
];

/// Opens the library cudarc will use (the first of its candidate names that loads) and
/// checks it exports every entry point in [`ENTRY_POINTS`]; otherwise the error names the
/// library's path and the first missing symbol.
fn probe_entry_points() -> std::result::Result<(), String> {
    for name in cudarc::get_lib_name_candidates("cuda") {
        // SAFETY: loading libcuda runs its initialisers, as every CUDA program does; this
        // is the library cudarc itself opens next (same names, same order).
        let Ok(lib) = (unsafe { libloading::os::unix::Library::new(&name) }) else {
            continue;
        };
        let handle = lib.into_raw();
        let path = loaded_path(handle).unwrap_or(name);
        // SAFETY: `handle` came from `into_raw` just above and is wrapped once again.
        let lib = unsafe { libloading::os::unix::Library::from_raw(handle) };
        for sym in ENTRY_POINTS {
            // SAFETY: the symbol is only looked up, never called or dereferenced.
            if unsafe { lib.get::<*const std::ffi::c_void>(sym.as_bytes()) }.is_err() {
                return Err(format!(
                    "{path} is not a usable NVIDIA driver library: it has no {sym} \
                     (memarray needs driver 525 or newer; check LD_LIBRARY_PATH for a stray \
                     libcuda)"
                ));
            }
        }
        return Ok(());
    }
    Err("libcuda.so not found on the loader path".into())
}

/// The file a loaded library came from (`dlinfo`), when the loader says.
fn loaded_path(handle: *mut std::ffi::c_void) -> Option<String> {
    /// The leading fields of glibc's `struct link_map`.
    #[repr(C)]
    struct LinkMap {
        l_addr: usize,
        l_name: *const c_char,
    }
    let mut map: *const LinkMap = std::ptr::null();
    // SAFETY: `handle` is a live dlopen handle; RTLD_DI_LINKMAP writes one pointer.
    let rc = unsafe { libc::dlinfo(handle, libc::RTLD_DI_LINKMAP, (&raw mut map).cast()) };
    if rc != 0 || map.is_null() {
        return None;
    }
    // SAFETY: the loader's link_map lives while the library is loaded (the caller holds
    // the handle), and
    // `l_name` is a NUL-terminated path.
    let name = unsafe { (*map).l_name };
    if name.is_null() {
        return None;
    }
    // SAFETY: as above.
    Some(
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// `cuGetErrorName` and `cuGetErrorString` of `r`. Only called once libcuda is loaded.
fn describe(r: sys::CUresult) -> (String, String) {
    let text = |f: unsafe fn(sys::CUresult, *mut *const c_char) -> sys::CUresult| {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: libcuda is loaded (callers run after `is_culib_present`); the out pointer
        // is valid; on success the driver returns a static NUL-terminated string.
        let ok = unsafe { f(r, &mut p) } == sys::CUresult::CUDA_SUCCESS && !p.is_null();
        // SAFETY: on success `p` points at a static C string owned by the driver.
        ok.then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    let name = text(sys::cuGetErrorName).unwrap_or_else(|| format!("CUresult {}", r as i32));
    let message = text(sys::cuGetErrorString).unwrap_or_else(|| "unknown error".into());
    (name, message)
}

/// `Ok` for `CUDA_SUCCESS`, otherwise a [`CudaError::Driver`] naming `call`.
pub(crate) fn check(call: &'static str, r: sys::CUresult) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let (name, mut message) = describe(r);
    if matches!(
        r,
        sys::CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION | sys::CUresult::CUDA_ERROR_INVALID_PTX
    ) {
        message.push_str(
            "; memarray's kernels are PTX ISA 9.0 and need an NVIDIA driver >= 580 (CUDA 13.0)",
        );
    }
    Err(CudaError::Driver {
        call,
        code: r as i32,
        name,
        message,
    })
}

// ---- devices and contexts -------------------------------------------------------------

/// Number of visible devices.
pub(crate) fn device_count() -> Result<u32> {
    init()?;
    let mut n: c_int = 0;
    // SAFETY: the driver is initialised; the out pointer is valid.
    check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut n) })?;
    Ok(n.max(0) as u32)
}

/// The device handle of `ordinal`.
pub(crate) fn device_get(ordinal: u32) -> Result<CUdevice> {
    init()?;
    let mut d: CUdevice = 0;
    // SAFETY: the driver is initialised; an out-of-range ordinal is an error, not UB.
    check("cuDeviceGet", unsafe {
        sys::cuDeviceGet(&mut d, ordinal as c_int)
    })?;
    Ok(d)
}

/// The device's marketing name.
pub(crate) fn device_name(dev: CUdevice) -> Result<String> {
    init()?;
    let mut buf = [0 as c_char; 256];
    // SAFETY: the buffer is valid for its stated length; a bad `dev` is an error.
    check("cuDeviceGetName", unsafe {
        sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as c_int, dev)
    })?;
    // SAFETY: the driver wrote a NUL-terminated string into the buffer.
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

/// One integer device attribute.
pub(crate) fn device_attribute(dev: CUdevice, attr: sys::CUdevice_attribute) -> Result<i32> {
    init()?;
    let mut v: c_int = 0;
    // SAFETY: the out pointer is valid; a bad `dev` or attribute is an error.
    check("cuDeviceGetAttribute", unsafe {
        sys::cuDeviceGetAttribute(&mut v, attr, dev)
    })?;
    Ok(v)
}

/// Whether `dev` can access memory of `peer` directly.
pub(crate) fn device_can_access_peer(dev: CUdevice, peer: CUdevice) -> Result<bool> {
    init()?;
    let mut v: c_int = 0;
    // SAFETY: the out pointer is valid; bad handles are errors.
    check("cuDeviceCanAccessPeer", unsafe {
        sys::cuDeviceCanAccessPeer(&mut v, dev, peer)
    })?;
    Ok(v != 0)
}

/// Retains the device's primary context (one more reference; memarray never releases it).
pub(crate) fn primary_ctx_retain(dev: CUdevice) -> Result<CUcontext> {
    init()?;
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: the out pointer is valid; a bad `dev` is an error.
    check("cuDevicePrimaryCtxRetain", unsafe {
        sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
    })?;
    Ok(ctx)
}

/// The context current on the calling thread (null if none).
pub(crate) fn ctx_get_current() -> Result<CUcontext> {
    init()?;
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: the out pointer is valid.
    check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut ctx) })?;
    Ok(ctx)
}

/// The device of the context current on the calling thread; `None` when none is.
pub(crate) fn ctx_get_device() -> Result<Option<u32>> {
    if ctx_get_current()?.is_null() {
        return Ok(None);
    }
    let mut dev: CUdevice = 0;
    // SAFETY: the out pointer is valid; a context is current (checked above).
    check("cuCtxGetDevice", unsafe { sys::cuCtxGetDevice(&mut dev) })?;
    Ok(u32::try_from(dev).ok())
}

/// Makes `ctx` current on the calling thread (null: none is).
///
/// # Safety
/// 1. `ctx` is a live context (a retained primary context), or null.
pub(crate) unsafe fn ctx_set_current(ctx: CUcontext) -> Result<()> {
    init()?;
    // SAFETY: item 1.
    check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })
}

/// Enables access from the current context to `peer`'s memory. `Ok(false)` if it was
/// already enabled.
///
/// # Safety
/// 1. A live context is current on the calling thread.
/// 2. `peer` is a live context of another device.
pub(crate) unsafe fn ctx_enable_peer_access(peer: CUcontext) -> Result<bool> {
    init()?;
    // Not captured work: a capture on this thread (a peer move being captured) would
    // otherwise refuse it and be invalidated, so the thread's capture mode is relaxed
    // for the call, as for allocations.
    // SAFETY: items 1 and 2; flags must be 0.
    let r = memory::relaxed_capture_mode(|| unsafe { sys::cuCtxEnablePeerAccess(peer, 0) });
    if r == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
        return Ok(false);
    }
    check("cuCtxEnablePeerAccess", r).map(|()| true)
}

/// Blocks until all work of the current context is done.
///
/// # Safety
/// 1. A live context is current on the calling thread.
pub(crate) unsafe fn ctx_synchronize() -> Result<()> {
    init()?;
    // SAFETY: item 1.
    check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
}

/// Free and total bytes of the current context's device.
///
/// # Safety
/// 1. A live context is current on the calling thread.
pub(crate) unsafe fn mem_get_info() -> Result<(u64, u64)> {
    init()?;
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: item 1; out pointers are valid.
    check("cuMemGetInfo_v2", unsafe {
        sys::cuMemGetInfo_v2(&mut free, &mut total)
    })?;
    Ok((free as u64, total as u64))
}

// ---- streams --------------------------------------------------------------------------

/// A stream handle from its integer value (1 = legacy, 2 = per-thread default stream).
pub(crate) fn stream_handle(raw: usize) -> CUstream {
    raw as CUstream
}

/// Creates a non-blocking stream (it does not synchronize with the legacy stream).
///
/// # Safety
/// 1. A live context is current on the calling thread; the stream belongs to it.
pub(crate) unsafe fn stream_create_non_blocking() -> Result<CUstream> {
    init()?;
    let mut s: CUstream = std::ptr::null_mut();
    let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
    // SAFETY: item 1; the out pointer is valid.
    check("cuStreamCreate", unsafe {
        sys::cuStreamCreate(&mut s, flags)
    })?;
    Ok(s)
}

/// Blocks until all work on `s` is done.
///
/// # Safety
/// 1. `s` is a live stream, or 1/2 (legacy/per-thread) with its context current.
pub(crate) unsafe fn stream_synchronize(s: CUstream) -> Result<()> {
    init()?;
    // SAFETY: item 1.
    check("cuStreamSynchronize", unsafe {
        sys::cuStreamSynchronize(s)
    })
}

/// Makes later work on `s` wait for `e`'s last recorded work, without blocking the host.
///
/// # Safety
/// 1. `s` is a live stream, or 1/2 with its context current.
/// 2. `e` is a live event.
pub(crate) unsafe fn stream_wait_event(s: CUstream, e: CUevent) -> Result<()> {
    init()?;
    // SAFETY: items 1 and 2; flags must be 0.
    check("cuStreamWaitEvent", unsafe {
        sys::cuStreamWaitEvent(s, e, 0)
    })
}

/// `cuStreamWaitEvent` with `CU_EVENT_WAIT_EXTERNAL`: under a capture of `s`, an
/// external event wait node.
///
/// # Safety
/// As [`stream_wait_event`]; `s` is being captured.
pub(crate) unsafe fn stream_wait_event_external(s: CUstream, e: CUevent) -> Result<()> {
    init()?;
    // SAFETY: items 1 and 2 of `stream_wait_event`; the flag is CU_EVENT_WAIT_EXTERNAL.
    check("cuStreamWaitEvent", unsafe {
        sys::cuStreamWaitEvent(s, e, sys::CUevent_wait_flags::CU_EVENT_WAIT_EXTERNAL as u32)
    })
}

// ---- events ---------------------------------------------------------------------------

/// Creates an event; `timing` false passes `CU_EVENT_DISABLE_TIMING` (cheaper to record).
///
/// # Safety
/// 1. A live context is current on the calling thread.
pub(crate) unsafe fn event_create(timing: bool) -> Result<CUevent> {
    init()?;
    let flags = if timing {
        sys::CUevent_flags::CU_EVENT_DEFAULT
    } else {
        sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
    };
    let mut e: CUevent = std::ptr::null_mut();
    // SAFETY: item 1; the out pointer is valid.
    check("cuEventCreate", unsafe {
        sys::cuEventCreate(&mut e, flags as u32)
    })?;
    Ok(e)
}

/// Destroys `e` (pending work completes first; the driver frees it then).
///
/// # Safety
/// 1. `e` is a live event, not used after this call.
pub(crate) unsafe fn event_destroy(e: CUevent) -> Result<()> {
    init()?;
    // SAFETY: item 1.
    check("cuEventDestroy_v2", unsafe { sys::cuEventDestroy_v2(e) })
}

/// Records `e` at the current end of `s`.
///
/// # Safety
/// 1. `e` is a live event and `s` a live stream (or 1/2 with a context current), of the
///    same context.
pub(crate) unsafe fn event_record(e: CUevent, s: CUstream) -> Result<()> {
    init()?;
    // SAFETY: item 1.
    check("cuEventRecord", unsafe { sys::cuEventRecord(e, s) })
}

/// Blocks until the work `e` recorded is done.
///
/// # Safety
/// 1. `e` is a live event.
pub(crate) unsafe fn event_synchronize(e: CUevent) -> Result<()> {
    init()?;
    // SAFETY: item 1.
    check("cuEventSynchronize", unsafe { sys::cuEventSynchronize(e) })
}

/// Whether the work `e` recorded is done (`CUDA_ERROR_NOT_READY` gives `false`).
///
/// # Safety
/// 1. `e` is a live event.
pub(crate) unsafe fn event_query(e: CUevent) -> Result<bool> {
    init()?;
    // SAFETY: item 1.
    let r = unsafe { sys::cuEventQuery(e) };
    if r == NOT_READY {
        return Ok(false);
    }
    check("cuEventQuery", r).map(|()| true)
}

/// Milliseconds between two completed, timed events.
///
/// # Safety
/// 1. `start` and `end` are live events created with timing.
pub(crate) unsafe fn event_elapsed_ms(start: CUevent, end: CUevent) -> Result<f32> {
    init()?;
    let mut ms = 0f32;
    // SAFETY: item 1; the out pointer is valid. The v1 entry point is exported by every
    // driver from 11.x to 13.x; `_v2` only from 12.8.
    check("cuEventElapsedTime", unsafe {
        sys::cuEventElapsedTime(&mut ms, start, end)
    })?;
    Ok(ms)
}

#[cfg(test)]
mod tests {
    #[test]
    fn entry_points_list_every_driver_call() {
        // The driver module's sources, embedded at build time (the test
        // binary runs on the GPU machine, far from this checkout). Driver calls live only
        // here (the crate's rule: sys -> result -> safe).
        let sources = [
            include_str!("mod.rs"),
            include_str!("memory.rs"),
            include_str!("exec.rs"),
            include_str!("graph.rs"),
        ];
        let mut called = std::collections::BTreeSet::new();
        for text in sources {
            for (i, _) in text.match_indices("sys::cu") {
                let name: String = text[i + 5..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                // "culib" is the loader; a bare "cu" is this test's own pattern;
                // `cuuint64_t` is a type.
                if name != "culib" && name != "cu" && name != "cuuint64_t" {
                    called.insert(name);
                }
            }
        }
        let listed: std::collections::BTreeSet<String> =
            super::ENTRY_POINTS.iter().map(|s| s.to_string()).collect();
        assert_eq!(called, listed, "driver calls and ENTRY_POINTS differ");
    }

    #[test]
    fn gpu_host_pointers_known_to_the_driver_are_told_apart_from_pageable_ones() {
        // The helper's memarray-cuda is the library build, not this test build: ask it
        // whether there is a GPU, then open the device here.
        if memarray_testing::gpu_or_skip().is_none() {
            return;
        }
        let dev = crate::Device::get(0).unwrap();
        let pinned =
            memarray_core::HostBuffer::zeroed_in(1 << 20, crate::resource::pinned_pool(&dev))
                .unwrap();
        let pageable = vec![1u8; 1 << 20];
        let _ctx = dev.bind().unwrap();
        assert!(super::host_pointer_is_known(pinned.as_ptr()));
        assert!(super::host_pointer_is_known(
            pinned.as_ptr().wrapping_add(4096)
        ));
        assert!(!super::host_pointer_is_known(pageable.as_ptr()));
        assert!(!super::host_pointer_is_known(std::ptr::null()));
    }
}
