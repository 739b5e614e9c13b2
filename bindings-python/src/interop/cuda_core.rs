//! The hot path of `memarray.cuda_core.MemoryResource` (a Python subclass of
//! `cuda.core.MemoryResource`, `memarray/cuda_core.py`): its `allocate` and `deallocate`
//! are the bound methods of a [`CudaCoreCallbacks`], so a cuda.core `Buffer` from
//! memarray's pool costs one call into Rust each way. A stream is checked once (not a
//! system call on every allocation), and the last stream object is kept.

use std::sync::{Arc, Mutex, PoisonError};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyWeakrefMethods, PyWeakrefReference};

use memarray_core::resource::{allocate_with_relief, deallocate_counted, with_source};
use memarray_core::{MemoryResource, RawStream};

use super::glue::{BLOCK_ALIGN, Blocks};

/// Streams seen lately: the last object and what it names, and the handles already
/// checked (cuda.core may hand `deallocate` another object for the same stream).
#[derive(Default)]
struct Streams {
    last: Option<(Py<PyAny>, RawStream)>,
    checked: Vec<usize>,
}

/// Handles kept as checked.
const CHECKED: usize = 8;

/// Allocate / deallocate over a memarray resource for one cuda.core memory resource.
#[pyclass(module = "memarray._memarray._interop", frozen)]
pub struct CudaCoreCallbacks {
    resource: Arc<dyn MemoryResource>,
    /// Blocks handed out.
    live: Blocks,
    /// `cuda.core.Buffer.from_handle`.
    from_handle: Py<PyAny>,
    /// The cuda.core resource the Buffers name (weak: it holds these methods).
    owner: Py<PyWeakrefReference>,
    streams: Mutex<Streams>,
}

impl CudaCoreCallbacks {
    /// `stream` as a core stream (None: the legacy default stream), as memarray's stream
    /// arguments take it; a stream object seen last costs no call, a handle checked before
    /// no system call.
    fn stream(&self, stream: &Bound<'_, PyAny>) -> PyResult<RawStream> {
        if stream.is_none() {
            return Ok(RawStream::LEGACY);
        }
        let lock = || self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((obj, raw)) = &lock().last
            && obj.is(stream)
        {
            return Ok(*raw);
        }
        let h = crate::stream::handle_of(stream)?;
        let known = usize::try_from(h).is_ok_and(|h| lock().checked.contains(&h));
        let raw: RawStream = if h == 0 {
            RawStream::LEGACY
        } else if known {
            // SAFETY: a handle checked before, named again by the caller's stream object
            // (the caller's promise that it is live, as for any stream argument).
            unsafe { RawStream::from_raw(h as usize) }
        } else {
            crate::stream::from_handle(h)?.into()
        };
        let old = {
            let mut st = lock();
            if !known && h > 0 {
                if st.checked.len() == CHECKED {
                    st.checked.remove(0);
                }
                st.checked.push(h as usize);
            }
            st.last.replace((stream.clone().unbind(), raw))
        };
        // Released after the lock: dropping a stream object may run Python code.
        drop(old);
        Ok(raw)
    }
}

#[pymethods]
impl CudaCoreCallbacks {
    /// A `cuda.core.Buffer` of `size` bytes from the resource, ordered on `stream` (None:
    /// the legacy default stream); MemoryError when out of memory (after the shared relief
    /// steps).
    #[pyo3(signature = (size, stream=None))]
    fn allocate(
        &self,
        py: Python<'_>,
        size: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let size: usize = crate::convert::int(size, "size")?;
        let stream = Some(match stream {
            Some(s) => self.stream(s)?,
            None => RawStream::LEGACY,
        });
        let owner = self.owner.bind(py).upgrade().ok_or_else(|| {
            PyValueError::new_err("the cuda.core memory resource of these callbacks is gone")
        })?;
        let p = with_source(*crate::sources::CUDA_CORE, || {
            allocate_with_relief(&*self.resource, size, BLOCK_ALIGN, stream, false)
        })
        .map_err(crate::errors::core_err)?;
        let addr = p.as_ptr() as usize;
        match self.from_handle.call1(py, (addr, size, owner)) {
            Ok(buffer) => {
                self.live.insert(addr, size, stream);
                Ok(buffer)
            }
            Err(e) => {
                // SAFETY: p came from the resource with (size, BLOCK_ALIGN) through the
                // allocation path for cuda_core just above and was handed to no one.
                unsafe {
                    deallocate_counted(
                        &*self.resource,
                        *crate::sources::CUDA_CORE,
                        p,
                        size,
                        BLOCK_ALIGN,
                        stream,
                    )
                };
                Err(e)
            }
        }
    }

    /// Returns a block `allocate` gave, ordered on `stream` (None: the stream it was
    /// allocated on); anything else is ignored. A `size` other than the block's is a
    /// ValueError (the block stays live).
    #[pyo3(signature = (ptr, size, stream=None))]
    fn deallocate(
        &self,
        ptr: &Bound<'_, PyAny>,
        size: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let ptr: usize = crate::convert::int(ptr, "ptr")?;
        let size: usize = crate::convert::int(size, "size")?;
        // None (a Buffer closed without a stream): the stream it was allocated on.
        let given = match stream.filter(|s| !s.is_none()) {
            Some(s) => Some(Some(self.stream(s)?)),
            None => None,
        };
        self.live.free(
            &*self.resource,
            *crate::sources::CUDA_CORE,
            BLOCK_ALIGN,
            ptr,
            size,
            given,
        )
    }

    /// Blocks handed out and not yet returned.
    fn live_blocks(&self) -> usize {
        self.live.len()
    }
}

/// Callbacks over `resource` whose Buffers name `owner` (a `cuda.core.MemoryResource`)
/// and are made by `from_handle` (`cuda.core.Buffer.from_handle`).
#[pyfunction]
pub fn cuda_core_callbacks(
    resource: &crate::resources::PyResource,
    owner: &Bound<'_, PyAny>,
    from_handle: &Bound<'_, PyAny>,
) -> PyResult<CudaCoreCallbacks> {
    Ok(CudaCoreCallbacks {
        resource: resource.resource(),
        live: Blocks::default(),
        from_handle: from_handle.clone().unbind(),
        owner: PyWeakrefReference::new(owner)?.unbind(),
        streams: Mutex::new(Streams::default()),
    })
}
