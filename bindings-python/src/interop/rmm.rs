//! RMM and memarray both ways: a memarray resource over Python callables (RMM's device
//! resources: `memarray.resources.Rmm`), and a memarray resource as callables (RMM's
//! `CallbackMemoryResource`: `memarray.rmm`).

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError};

use pyo3::exceptions::PyMemoryError;
use pyo3::prelude::*;

use memarray_core::resource::{allocate_with_relief, with_source};
use memarray_core::{
    CoreError, Location, MemoryInfo, MemoryKind, MemoryResource, RawStream, Source,
};
use memarray_cuda::Device;

use super::glue::{BLOCK_ALIGN, Blocks};

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
                align: BLOCK_ALIGN,
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
        if !align.is_power_of_two() || align > BLOCK_ALIGN {
            return Err(CoreError::BadAlignment {
                align,
                max: BLOCK_ALIGN,
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

/// `allocate(size, stream)` / `deallocate(ptr, size, stream)` over a memarray resource,
/// for another library's callback resource (RMM's `CallbackMemoryResource`): the stream is
/// any object `memarray` takes as one (RMM's has `__cuda_stream__`), the memory is
/// attributed to `source`, and only blocks handed out here are taken back.
#[pyclass(module = "memarray._memarray._interop", frozen)]
pub(super) struct ResourceCallbacks {
    resource: Arc<dyn MemoryResource>,
    source: Source,
    live: Blocks,
}

#[pymethods]
impl ResourceCallbacks {
    /// `size` bytes ordered on `stream` (size 0: the null pointer, no block); MemoryError
    /// when out of memory (after the shared relief steps). The GIL stays held: a pool hit costs less than handing it over.
    fn allocate(&self, size: &Bound<'_, PyAny>, stream: &Bound<'_, PyAny>) -> PyResult<usize> {
        let size: usize = crate::convert::int(size, "size")?;
        let stream = crate::stream::parse_move_stream(Some(stream))?.map(RawStream::from);
        if size == 0 {
            // The null pointer (CuPy's and torch's convention for empty memory); its
            // deallocate is ignored as any pointer not handed out is.
            return Ok(0);
        }
        let p = with_source(self.source, || {
            allocate_with_relief(&*self.resource, size, BLOCK_ALIGN, stream, false)
        })
        .map_err(crate::errors::core_err)?;
        let addr = p.as_ptr() as usize;
        self.live.insert(addr, size, stream);
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
        self.live.free(
            &*self.resource,
            self.source,
            BLOCK_ALIGN,
            ptr,
            size,
            Some(stream),
        )
    }

    /// Blocks handed out and not yet returned.
    fn live_blocks(&self) -> usize {
        self.live.len()
    }
}

/// Callbacks over `resource` for `source` (see [`ResourceCallbacks`]).
#[pyfunction]
pub(super) fn resource_callbacks(
    resource: &crate::resources::PyResource,
    source: &Bound<'_, PyAny>,
) -> PyResult<ResourceCallbacks> {
    let source = crate::resources::parse_source(Some(source))?.unwrap_or(Source::MEMARRAY);
    Ok(ResourceCallbacks {
        resource: resource.resource(),
        source,
        live: Blocks::default(),
    })
}

/// A resource over Python callables (see [`CallbackResource`]).
#[pyfunction]
#[pyo3(signature = (allocate, deallocate, device_id, name, make_stream=None))]
pub(super) fn callback_resource(
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
