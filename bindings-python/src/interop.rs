//! memarray as the process's one memory manager (issue 15): the C entry points torch's
//! pluggable allocator calls, the relievers that make torch, CuPy and RMM give cached
//! memory back when memarray runs out, the Python stack provider of the tracking adaptor,
//! and a resource over Python callables (RMM's device resources).
//! `memarray/torch.py`, `memarray/rmm.py` and `memarray/_pressure.py` are the Python half.

use crate::fork::Detach;
use std::collections::HashMap;
use std::ffi::{CString, c_char, c_int, c_void};
use std::ptr::NonNull;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use pyo3::exceptions::PyMemoryError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use memarray_core::resource::{
    allocate_with_relief, pressure, pressure_statistics, set_stack_provider, with_source,
};
use memarray_core::{
    CoreError, Location, MemoryInfo, MemoryKind, MemoryResource, RawStream, Source,
};
use memarray_cuda::Device;
use memarray_cuda::resource::default_resource;

/// Alignment of blocks handed to torch (torch asks for none; its own allocator gives 512).
const TORCH_ALIGN: usize = 256;

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

/// torch's stream argument as a core stream: 0 is the legacy default stream.
fn torch_stream(stream: usize) -> RawStream {
    if stream == 0 {
        RawStream::LEGACY
    } else {
        // SAFETY: torch passes a live stream of the device's primary context, current for
        // the allocation (RawStream's contract).
        unsafe { RawStream::from_raw(stream) }
    }
}

fn torch_alloc(size: usize, device: c_int, stream: usize) -> Result<usize, String> {
    let id = u32::try_from(device).map_err(|_| format!("invalid device index {device}"))?;
    let dev = Device::get(id).map_err(|e| e.to_string())?;
    let resource = default_resource(&dev).map_err(|e| e.to_string())?;
    let stream = torch_stream(stream);
    let p = with_source(Source::Torch, || {
        allocate_with_relief(&*resource, size, TORCH_ALIGN, Some(stream), false)
    })
    .map_err(|e| match e {
        CoreError::OutOfMemory { .. } => format!(
            "CUDA out of memory (memarray): tried to allocate {size} bytes on cuda:{id} for \
             torch: {e}"
        ),
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
        with_source(Source::Torch, || {
            // SAFETY: p came from this resource with (size, TORCH_ALIGN) in torch_alloc
            // (torch passes back the size it asked for); the block left the table above,
            // so it is freed once; torch's work on it is ordered on its stream (torch
            // waited for its recorded streams before giving the segment back).
            unsafe {
                block
                    .resource
                    .deallocate(p, size, TORCH_ALIGN, Some(block.stream))
            }
        });
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
fn torch_live_blocks() -> usize {
    torch_blocks().len()
}

/// The process-wide counters of the relief path, as a dict.
#[pyfunction]
fn pressure_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let s = pressure_statistics();
    let d = PyDict::new(py);
    d.set_item("events", s.events)?;
    d.set_item("recovered", s.recovered)?;
    d.set_item("failed", s.failed)?;
    d.set_item("own_released_bytes", s.own_released_bytes)?;
    d.set_item("spills", s.spills)?;
    d.set_item("spilled_bytes", s.spilled_bytes)?;
    let libs = PyDict::new(py);
    for (lib, calls, bytes) in s.relievers {
        let row = PyDict::new(py);
        row.set_item("calls", calls)?;
        row.set_item("released_bytes", bytes)?;
        libs.set_item(lib.name(), row)?;
    }
    d.set_item("libraries", libs)?;
    Ok(d)
}

/// Asks `memarray._pressure.relieve(library, device)` to make `library` give its cache
/// back (None: the library is not loaded). Without a usable interpreter it was not asked;
/// on a Python error it released nothing.
fn python_reliever(library: Source) -> pressure::Reliever {
    Arc::new(move |device| {
        Python::try_attach(|py| {
            py.import("memarray._pressure")
                .and_then(|m| m.call_method1("relieve", (library.name(), device)))
                .and_then(|r| r.extract::<Option<usize>>())
                .unwrap_or_else(|e| {
                    e.write_unraisable(py, None);
                    Some(0)
                })
        })
        .flatten()
    })
}

/// The Python stack of the allocating thread (innermost frame last), for tracking with
/// stacks on.
fn python_stack() -> Option<String> {
    Python::try_attach(|py| {
        py.import("memarray._pressure")
            .and_then(|m| m.call_method0("stack"))
            .and_then(|s| s.extract::<String>())
            .ok()
    })
    .flatten()
}

/// A device resource whose memory comes from Python callables: `allocate(nbytes, stream)`
/// returns an address, `deallocate(address, nbytes, stream)` frees it. The stream is the
/// handle as an int (0: the legacy default stream), or, with `make_stream`, the object
/// `make_stream(handle)` returns, made once per handle (RMM's resources take their own
/// stream type). `memarray.resources.Rmm` is one, over RMM's resource's bound methods.
#[derive(Debug)]
pub(crate) struct CallbackResource {
    allocate: Py<PyAny>,
    deallocate: Py<PyAny>,
    make_stream: Option<Py<PyAny>>,
    streams: Mutex<HashMap<usize, Py<PyAny>>>,
    device: u32,
    name: String,
}

impl CallbackResource {
    /// The stream argument for `handle`.
    fn stream_arg(&self, py: Python<'_>, handle: usize) -> PyResult<Py<PyAny>> {
        let Some(make) = &self.make_stream else {
            return Ok(handle.into_pyobject(py)?.into_any().unbind());
        };
        if let Some(s) = self
            .streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&handle)
        {
            return Ok(s.clone_ref(py));
        }
        let s = make.call1(py, (handle,))?;
        self.streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(handle, s.clone_ref(py));
        Ok(s)
    }

    fn call_allocate(&self, bytes: usize, stream: Option<RawStream>) -> Result<usize, CoreError> {
        let size = bytes.max(1);
        let handle = stream.map_or(0, RawStream::raw);
        let got = Python::try_attach(|py| {
            self.stream_arg(py, handle)
                .and_then(|s| self.allocate.call1(py, (size, s)))
                .and_then(|p| p.extract::<usize>(py))
                .map_err(|e| (e.is_instance_of::<PyMemoryError>(py), e.to_string()))
        })
        .unwrap_or_else(|| Err((false, "the Python interpreter is not running".into())));
        match got {
            Ok(0) => Err(CoreError::OutOfMemory {
                bytes,
                resource: self.name.clone(),
                reason: "the allocation function returned 0".into(),
            }),
            Ok(p) => Ok(p),
            Err((true, reason)) => Err(CoreError::OutOfMemory {
                bytes,
                resource: self.name.clone(),
                reason,
            }),
            Err((false, reason)) => Err(CoreError::Alloc {
                bytes,
                align: TORCH_ALIGN,
                resource: self.name.clone(),
                reason,
            }),
        }
    }
}

impl MemoryResource for CallbackResource {
    fn allocate(
        &self,
        bytes: usize,
        align: usize,
        stream: Option<RawStream>,
    ) -> memarray_core::Result<NonNull<u8>> {
        if !align.is_power_of_two() || align > TORCH_ALIGN {
            return Err(CoreError::BadAlignment {
                align,
                max: TORCH_ALIGN,
            });
        }
        let p = self.call_allocate(bytes, stream)?;
        if p % align != 0 {
            self.free(p, bytes, stream);
            return Err(CoreError::Misaligned { addr: p, align });
        }
        NonNull::new(p as *mut u8).ok_or(CoreError::Misaligned { addr: 0, align })
    }

    fn allocate_zeroed(
        &self,
        bytes: usize,
        align: usize,
        stream: Option<RawStream>,
    ) -> memarray_core::Result<NonNull<u8>> {
        let p = self.allocate(bytes, align, stream)?;
        let zeroed = Device::get(self.device).and_then(|d| {
            // SAFETY: p was just allocated on this device for the caller, bytes long, and
            // nothing else uses it yet.
            unsafe { memarray_cuda::resource::zero_memory(&d, p.as_ptr() as usize, bytes, stream) }
        });
        if let Err(e) = zeroed {
            self.free(p.as_ptr() as usize, bytes, stream);
            return Err(CoreError::Alloc {
                bytes,
                align,
                resource: self.name.clone(),
                reason: format!("zeroing failed: {e}"),
            });
        }
        Ok(p)
    }

    unsafe fn deallocate(
        &self,
        ptr: NonNull<u8>,
        bytes: usize,
        _align: usize,
        stream: Option<RawStream>,
    ) {
        self.free(ptr.as_ptr() as usize, bytes, stream);
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Device
    }

    fn is_accessible_from(&self, location: Location) -> bool {
        location == Location::Device(self.device)
    }

    fn memory_info(&self) -> Option<MemoryInfo> {
        None
    }

    fn device_id(&self) -> Option<u32> {
        Some(self.device)
    }

    fn name(&self) -> &str {
        &self.name
    }
}

impl CallbackResource {
    fn free(&self, ptr: usize, bytes: usize, stream: Option<RawStream>) {
        let handle = stream.map_or(0, RawStream::raw);
        Python::try_attach(|py| {
            let done = self
                .stream_arg(py, handle)
                .and_then(|s| self.deallocate.call1(py, (ptr, bytes.max(1), s)));
            if let Err(e) = done {
                e.write_unraisable(py, None);
            }
        });
    }
}

/// Host memory page-locked in place for a Python owner (Numba's `mempin`), unlocked by
/// `release()` or when collected.
#[pyclass(module = "memarray._memarray._interop", frozen)]
struct Pinning {
    registration: Mutex<Option<memarray_cuda::resource::HostRegistration>>,
    addr: usize,
    size: usize,
}

#[pymethods]
impl Pinning {
    #[getter]
    fn ptr(&self) -> usize {
        self.addr
    }

    #[getter]
    fn size(&self) -> usize {
        self.size
    }

    /// Unlocks the pages (a second call does nothing).
    fn release(&self, py: Python<'_>) {
        let r = self
            .registration
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        py.detach_section(|| drop(r));
    }
}

/// Page-locks `size` bytes at `ptr`, inside `owner`'s memory, for `device_id`.
#[pyfunction]
#[pyo3(signature = (owner, ptr, size, device_id, mapped=false, portable=false))]
fn pin(
    py: Python<'_>,
    owner: &Bound<'_, PyAny>,
    ptr: &Bound<'_, PyAny>,
    size: &Bound<'_, PyAny>,
    device_id: &Bound<'_, PyAny>,
    mapped: bool,
    portable: bool,
) -> PyResult<Pinning> {
    let ptr: usize = crate::convert::int(ptr, "ptr")?;
    let size: usize = crate::convert::int(size, "size")?;
    let device: u32 = crate::convert::int(device_id, "device_id")?;
    let dev = Device::get(device).map_err(crate::errors::cuda_err)?;
    // An owner with a C-contiguous buffer has the range checked against it; others (a
    // strided NumPy view Numba pins whole) are trusted, as Numba's own manager trusts them.
    let view = crate::HeldBuffer::get(owner, false);
    let inside = size > 0
        && view.as_ref().is_none_or(|v| {
            ptr >= v.addr()
                && ptr
                    .checked_add(size)
                    .is_some_and(|end| end <= v.addr() + v.len())
        });
    if !inside || ptr == 0 {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "cannot pin [{ptr:#x}, +{size}): empty, null, or not inside the owner's buffer"
        )));
    }
    drop(view);
    let flags = memarray_cuda::PinnedFlags {
        portable,
        mapped,
        write_combined: false,
    };
    // SAFETY: the range lies inside the owner's buffer (checked above); the caller keeps
    // the owner alive while pinned (Numba's PinnedMemory holds it), and the Python wrapper
    // holds it too.
    let reg = py
        .detach_section(|| unsafe {
            memarray_cuda::resource::HostRegistration::new(&dev, ptr, size, flags)
        })
        .map_err(crate::errors::cuda_err)?;
    Ok(Pinning {
        registration: Mutex::new(Some(reg)),
        addr: ptr,
        size,
    })
}

/// The pinned memory resource Numba's `memhostalloc` draws from: `device_id`'s pinned
/// caching pool (portable; with unified addressing every pinned block is also mapped),
/// or for write-combined memory a plain write-combined pinned resource.
#[pyfunction]
#[pyo3(signature = (device_id, write_combined=false))]
fn pinned_source(
    device_id: &Bound<'_, PyAny>,
    write_combined: bool,
) -> PyResult<crate::resources::PyResource> {
    let device: u32 = crate::convert::int(device_id, "device_id")?;
    let dev = Device::get(device).map_err(crate::errors::cuda_err)?;
    let r: Arc<dyn MemoryResource> = if write_combined {
        Arc::new(memarray_cuda::PinnedResource::with_flags(
            &dev,
            memarray_cuda::PinnedFlags {
                portable: true,
                mapped: true,
                write_combined: true,
            },
        ))
    } else {
        memarray_cuda::resource::pinned_pool(&dev)
    };
    Ok(crate::resources::PyResource::plain(r))
}

/// `allocate(size, stream)` / `deallocate(ptr, size, stream)` over a memarray resource,
/// for another library's callback resource (RMM's `CallbackMemoryResource`): the stream is
/// any object `memarray` takes as one (RMM's has `__cuda_stream__`), the memory is
/// attributed to `source`, and only blocks handed out here are taken back.
#[pyclass(module = "memarray._memarray._interop", frozen)]
struct ResourceCallbacks {
    resource: Arc<dyn MemoryResource>,
    source: Source,
    live: Mutex<HashMap<usize, usize>>,
}

#[pymethods]
impl ResourceCallbacks {
    /// `size` bytes ordered on `stream`; MemoryError when out of memory (after the shared
    /// relief steps). The GIL stays held: a pool hit costs less than handing it over.
    fn allocate(&self, size: &Bound<'_, PyAny>, stream: &Bound<'_, PyAny>) -> PyResult<usize> {
        let size: usize = crate::convert::int(size, "size")?;
        let stream = crate::stream::parse_move_stream(Some(stream))?.map(RawStream::from);
        let p = with_source(self.source, || {
            allocate_with_relief(&*self.resource, size, TORCH_ALIGN, stream, false)
        })
        .map_err(crate::errors::core_err)?;
        let addr = p.as_ptr() as usize;
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(addr, size);
        Ok(addr)
    }

    /// Returns a block `allocate` gave, ordered on `stream`; anything else is ignored. A
    /// `size` other than the block's is a ValueError (the block stays live).
    fn deallocate(
        &self,
        ptr: &Bound<'_, PyAny>,
        size: &Bound<'_, PyAny>,
        stream: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let ptr: usize = crate::convert::int(ptr, "ptr")?;
        let size: usize = crate::convert::int(size, "size")?;
        let stream = crate::stream::parse_move_stream(Some(stream))?.map(RawStream::from);
        let known = {
            let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
            match live.get(&ptr) {
                Some(&recorded) if recorded != size => {
                    return Err(pyo3::exceptions::PyValueError::new_err(format!(
                        "block {ptr:#x} was allocated with {recorded} bytes, not {size}"
                    )));
                }
                Some(_) => live.remove(&ptr),
                None => None,
            }
        };
        if let (Some(size), Some(p)) = (known, NonNull::new(ptr as *mut u8)) {
            with_source(self.source, || {
                // SAFETY: p came from this resource with (size, TORCH_ALIGN) in allocate
                // and left the table above, so it is freed once; the caller's work on it
                // is ordered on `stream`.
                unsafe { self.resource.deallocate(p, size, TORCH_ALIGN, stream) }
            });
        }
        Ok(())
    }

    /// Blocks handed out and not yet returned.
    fn live_blocks(&self) -> usize {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// Callbacks over `resource` for `source` (see [`ResourceCallbacks`]).
#[pyfunction]
fn resource_callbacks(
    resource: &crate::resources::PyResource,
    source: &Bound<'_, PyAny>,
) -> PyResult<ResourceCallbacks> {
    let source = crate::resources::parse_source(Some(source))?.unwrap_or(Source::Memarray);
    Ok(ResourceCallbacks {
        resource: resource.resource(),
        source,
        live: Mutex::new(HashMap::new()),
    })
}

/// CuPy's allocator hook (`cupy.cuda.set_allocator(...)`), in Rust: a Python function in
/// its place cost 1.6x CuPy's own pool per `cupy.empty`. Each call allocates from memarray's
/// default resource of CuPy's current device, ordered on CuPy's current stream, for the
/// source "cupy", and returns a `cupy.cuda.MemoryPointer` over an `UnownedMemory` whose
/// owner (an `Allocation`) frees the block when CuPy lets go. The GIL stays held: a pool
/// hit costs less than handing it over.
#[pyclass(module = "memarray._memarray._interop", frozen)]
struct CupyAllocator {
    get_device: Py<PyAny>,
    get_stream: Py<PyAny>,
    unowned_memory: Py<PyAny>,
    memory_pointer: Py<PyAny>,
}

#[pymethods]
impl CupyAllocator {
    fn __call__(&self, py: Python<'_>, nbytes: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let nbytes: usize = crate::convert::int(nbytes, "nbytes")?;
        let device: u32 = self.get_device.call0(py)?.extract(py)?;
        let stream: usize = self
            .get_stream
            .call0(py)?
            .getattr(py, pyo3::intern!(py, "ptr"))?
            .extract(py)?;
        let dev = Device::get(device).map_err(crate::errors::cuda_err)?;
        let resource = default_resource(&dev).map_err(crate::errors::cuda_err)?;
        let raw = torch_stream(stream);
        let p = with_source(Source::Cupy, || {
            allocate_with_relief(&*resource, nbytes, TORCH_ALIGN, Some(raw), false)
        })
        .map_err(crate::errors::core_err)?;
        let addr = p.as_ptr() as usize;
        let owner = Py::new(
            py,
            crate::resources::Allocation::owned(
                resource,
                addr,
                nbytes,
                Some(raw),
                Some(Source::Cupy),
            ),
        )?;
        let memory = self
            .unowned_memory
            .call1(py, (addr, nbytes, owner, device))?;
        self.memory_pointer.call1(py, (memory, 0))
    }
}

/// The hook over CuPy's `runtime.getDevice`, `get_current_stream`, `UnownedMemory` and
/// `MemoryPointer` (passed in: this module never imports CuPy).
#[pyfunction]
fn cupy_allocator(
    get_device: Py<PyAny>,
    get_stream: Py<PyAny>,
    unowned_memory: Py<PyAny>,
    memory_pointer: Py<PyAny>,
) -> CupyAllocator {
    CupyAllocator {
        get_device,
        get_stream,
        unowned_memory,
        memory_pointer,
    }
}

/// A resource over Python callables (see [`CallbackResource`]).
#[pyfunction]
#[pyo3(signature = (allocate, deallocate, device_id, name, make_stream=None))]
fn callback_resource(
    allocate: Py<PyAny>,
    deallocate: Py<PyAny>,
    device_id: &Bound<'_, PyAny>,
    name: String,
    make_stream: Option<Py<PyAny>>,
) -> PyResult<crate::resources::PyResource> {
    let device: u32 = crate::convert::int(device_id, "device_id")?;
    memarray_cuda::Device::get(device).map_err(crate::errors::cuda_err)?;
    Ok(crate::resources::PyResource::plain(Arc::new(
        CallbackResource {
            allocate,
            deallocate,
            make_stream,
            streams: Mutex::new(HashMap::new()),
            device,
            name,
        },
    )))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let i = PyModule::new(py, "_interop")?;
    i.add_function(wrap_pyfunction!(torch_live_blocks, &i)?)?;
    i.add_function(wrap_pyfunction!(pressure_stats, &i)?)?;
    i.add_function(wrap_pyfunction!(callback_resource, &i)?)?;
    i.add_function(wrap_pyfunction!(pin, &i)?)?;
    i.add_function(wrap_pyfunction!(resource_callbacks, &i)?)?;
    i.add_function(wrap_pyfunction!(cupy_allocator, &i)?)?;
    i.add_class::<CupyAllocator>()?;
    i.add_class::<ResourceCallbacks>()?;
    i.add_function(wrap_pyfunction!(pinned_source, &i)?)?;
    i.add_class::<Pinning>()?;
    i.add_function(wrap_pyfunction!(crate::cuda_core::cuda_core_callbacks, &i)?)?;
    i.add_class::<crate::cuda_core::CudaCoreCallbacks>()?;
    m.add_submodule(&i)?;
    for library in [Source::Torch, Source::Cupy, Source::Rmm] {
        pressure::register_reliever(library, python_reliever(library));
    }
    set_stack_provider(python_stack);
    Ok(())
}
