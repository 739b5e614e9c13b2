//! torch's pluggable allocator over memarray: the C entry points `memarray/torch.py` hands
//! to `torch.cuda.memory.CUDAPluggableAllocator` (the segment source of the MemPool each
//! device routes to), the blocks torch holds, and the C++ out-of-memory throw.

use std::collections::HashMap;
use std::ffi::{CString, c_char, c_int, c_void};
use std::ptr::NonNull;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use pyo3::prelude::*;

use memarray_core::resource::{allocate_with_relief, deallocate_counted, with_source};
use memarray_core::{CoreError, MemoryResource, RawStream};
use memarray_cuda::Device;
use memarray_cuda::resource::default_resource;

use super::glue::{BLOCK_ALIGN, raw_stream};

unsafe extern "C-unwind" {
    /// Throws a C++ `std::runtime_error` with `message` (src/torch_oom.cpp).
    fn memarray_throw_out_of_memory(message: *const c_char) -> !;
}

/// A segment handed to torch's caching allocator: where it came from and the stream torch
/// allocated it on. torch itself orders the segment's release after every stream
/// `Tensor.record_stream` named (it synchronises their events before emptying its cache).
struct TorchBlock {
    resource: Arc<dyn MemoryResource>,
    stream: RawStream,
}

static TORCH_BLOCKS: LazyLock<Mutex<HashMap<usize, TorchBlock>>> = LazyLock::new(Default::default);

fn torch_blocks() -> std::sync::MutexGuard<'static, HashMap<usize, TorchBlock>> {
    TORCH_BLOCKS.lock().unwrap_or_else(PoisonError::into_inner)
}

fn torch_alloc(size: usize, device: c_int, stream: usize) -> Result<usize, String> {
    if size == 0 {
        // The null pointer, as torch's own allocator gives an empty tensor; free ignores it.
        return Ok(0);
    }
    let id = u32::try_from(device).map_err(|_| format!("invalid device index {device}"))?;
    let dev = Device::get(id).map_err(|e| e.to_string())?;
    let resource = default_resource(&dev).map_err(|e| e.to_string())?;
    let stream = raw_stream(stream);
    let p = with_source(*crate::sources::TORCH, || {
        allocate_with_relief(&*resource, size, BLOCK_ALIGN, Some(stream), false)
    })
    .map_err(|e| match e {
        // The report torch's text can carry, from counters (no Python here): who holds
        // what on the device, and what relief tried.
        CoreError::OutOfMemory { .. } => {
            let relief = memarray_core::resource::pressure_statistics();
            format!(
                "CUDA out of memory (memarray): tried to allocate {size} bytes on cuda:{id} \
                 for torch: {e}\n{}\nrelief so far: {} out-of-memory events, {} recovered\n\
                 memarray.resources.library_usage() and memarray.notebook.device_usage({id}) \
                 show more",
                memarray_core::resource::ledger::holders_line(memarray_core::Location::Device(id)),
                relief.events,
                relief.recovered,
            )
        }
        other => format!("memarray could not allocate {size} bytes on cuda:{id}: {other}"),
    })?;
    let addr = p.as_ptr() as usize;
    torch_blocks().insert(addr, TorchBlock { resource, stream });
    Ok(addr)
}

/// torch's allocation function (`CUDAPluggableAllocator`'s `alloc_fn`): `size` bytes of
/// `device`'s default resource, ordered on `stream`. A failure throws a C++ exception
/// (torch raises it as RuntimeError); a panic never crosses.
///
/// # Safety
/// 1. Called by torch's allocator with a device index and a live stream of it (or 0).
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn memarray_torch_malloc(
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    let got = std::panic::catch_unwind(|| {
        let _section = crate::fork::foreign_section();
        torch_alloc(size, device, stream as usize)
    });
    let message = match got {
        Ok(Ok(p)) => return p as *mut c_void,
        Ok(Err(m)) => m,
        Err(_) => "memarray's torch allocator panicked (a bug: please report it)".to_string(),
    };
    let c = CString::new(message.replace('\0', " ")).unwrap_or_default();
    // SAFETY: a valid C string, copied into the exception before `c` is dropped; the
    // "C-unwind" ABI lets the C++ exception pass this frame.
    unsafe { memarray_throw_out_of_memory(c.as_ptr()) }
}

fn torch_release(ptr: usize, size: usize) {
    let Some(block) = torch_blocks().remove(&ptr) else {
        return; // not a block of ours: torch never frees one it did not get from us
    };
    if let Some(p) = NonNull::new(ptr as *mut u8) {
        // SAFETY: p came from this resource with (size, BLOCK_ALIGN) through the
        // allocation path for torch in torch_alloc (torch passes back the size it asked
        // for); the block left the table above, so it is freed once; torch's work on it is
        // ordered on its stream (torch waited for its recorded streams before giving the
        // segment back).
        unsafe {
            deallocate_counted(
                &*block.resource,
                *crate::sources::TORCH,
                p,
                size,
                BLOCK_ALIGN,
                Some(block.stream),
            )
        }
    }
}

/// torch's free function (`free_fn`): returns the block, ordered after the work of its
/// stream and of every stream `Tensor.record_stream` named. Never unwinds.
///
/// # Safety
/// 1. Called by torch's allocator with a pointer and size `memarray_torch_malloc` gave it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_torch_free(
    ptr: *mut c_void,
    size: usize,
    _device: c_int,
    _stream: *mut c_void,
) {
    let _ = std::panic::catch_unwind(|| {
        let _section = crate::fork::foreign_section();
        torch_release(ptr as usize, size)
    });
}

/// Live blocks torch holds from memarray (for tests and statistics).
#[pyfunction]
pub(super) fn torch_live_blocks() -> usize {
    torch_blocks().len()
}
