//! `memarray._memarray._resources`: memory resources for Python, composed like the Rust
//! ones (`Statistics(Pool(Device(0)))`), and the per-device default that arrays' device
//! buffers come from. `memarray/resources.py` wraps these in classes.

use crate::fork::Detach;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use memarray_core::resource::{allocate_with_relief, deallocate_counted, with_source};
use memarray_core::{
    FileResource, HostResource, LimitingAdaptor, Location, LoggingAdaptor, MemoryKind,
    MemoryResource, RawStream, RetryAdaptor, Source, StatisticsAdaptor, TrackingAdaptor,
};
use memarray_cuda::resource::{CachingPool, default_resource, set_default_resource};
use memarray_cuda::{AsyncPoolResource, Device, DeviceResource, ManagedResource, PinnedResource};

use crate::convert;
use crate::errors::IntoPyResult;

/// A resource and, where it has one, the typed handle its extra methods need.
#[derive(Clone, Debug)]
enum Handle {
    Plain(Arc<dyn MemoryResource>),
    Pool(Arc<CachingPool>),
    Statistics(Arc<StatisticsAdaptor>),
    Limiting(Arc<LimitingAdaptor>),
    Logging(Arc<LoggingAdaptor>),
    Retry(Arc<RetryAdaptor>),
    Tracking(Arc<TrackingAdaptor>),
}

impl Handle {
    fn resource(&self) -> Arc<dyn MemoryResource> {
        match self {
            Handle::Plain(r) => r.clone(),
            Handle::Pool(r) => r.clone(),
            Handle::Statistics(r) => r.clone(),
            Handle::Limiting(r) => r.clone(),
            Handle::Logging(r) => r.clone(),
            Handle::Retry(r) => r.clone(),
            Handle::Tracking(r) => r.clone(),
        }
    }
}

/// A memory resource (see `memarray.resources`).
#[pyclass(name = "_Resource", module = "memarray._memarray", frozen)]
pub struct PyResource {
    handle: Handle,
}

impl PyResource {
    fn new(handle: Handle) -> Self {
        Self { handle }
    }

    pub(crate) fn resource(&self) -> Arc<dyn MemoryResource> {
        self.handle.resource()
    }

    /// A resource with no extra methods.
    pub(crate) fn plain(r: Arc<dyn MemoryResource>) -> Self {
        Self::new(Handle::Plain(r))
    }
}

fn kind_name(k: MemoryKind) -> &'static str {
    match k {
        MemoryKind::Host => "host",
        MemoryKind::Pinned => "pinned",
        MemoryKind::Device => "device",
        MemoryKind::Managed => "managed",
        MemoryKind::File => "file",
        _ => "other",
    }
}

fn device(id: &Bound<'_, PyAny>) -> PyResult<Arc<Device>> {
    Device::get(convert::int(id, "device_id")?).py()
}

impl PyResource {
    /// The Tracking adaptor this handle is, or TypeError naming the resource.
    fn tracking(&self) -> PyResult<&Arc<TrackingAdaptor>> {
        match &self.handle {
            Handle::Tracking(t) => Ok(t),
            _ => Err(PyTypeError::new_err(format!(
                "{} does not track allocations; wrap it: memarray.resources.Tracking(r)",
                self.handle.resource().name()
            ))),
        }
    }
}

#[pymethods]
impl PyResource {
    /// The resource's name, e.g. `statistics(pool(cuda:0 device))`.
    #[getter]
    fn name(&self) -> String {
        self.resource().name().to_string()
    }

    /// "host", "pinned", "device", "managed" or "file".
    #[getter]
    fn kind(&self) -> &'static str {
        kind_name(self.resource().kind())
    }

    /// The device whose memory this is, or None for host memory.
    #[getter]
    fn device_id(&self) -> Option<u32> {
        self.resource().device_id()
    }

    /// `(free, total)` bytes where the resource knows them, else None.
    fn memory_info(&self) -> Option<(u64, u64)> {
        self.resource().memory_info().map(|i| (i.free, i.total))
    }

    /// Gives cached memory back (pools below); returns the bytes released.
    fn release_cached(&self, py: Python<'_>) -> usize {
        let r = self.resource();
        py.detach_section(|| r.release_cached())
    }

    /// The counters of a Statistics resource (current / peak / total bytes and counts,
    /// and `by_source`: the same per library that allocated) or of a Pool (used / cached / upstream bytes, hits, misses), as a dict.
    fn statistics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        match &self.handle {
            Handle::Statistics(stats) => {
                let by_source = PyDict::new(py);
                for (source, c) in stats.by_source() {
                    let row = PyDict::new(py);
                    row.set_item("current_bytes", c.current_bytes)?;
                    row.set_item("current_count", c.current_count)?;
                    row.set_item("total_bytes", c.total_bytes)?;
                    row.set_item("total_count", c.total_count)?;
                    by_source.set_item(source.name(), row)?;
                }
                d.set_item("by_source", by_source)?;
                let s = stats.statistics();
                d.set_item("current_bytes", s.current_bytes)?;
                d.set_item("peak_bytes", s.peak_bytes)?;
                d.set_item("current_count", s.current_count)?;
                d.set_item("peak_count", s.peak_count)?;
                d.set_item("total_bytes", s.total_bytes)?;
                d.set_item("total_count", s.total_count)?;
            }
            Handle::Pool(p) => {
                let s = p.statistics();
                d.set_item("used_bytes", s.used_bytes)?;
                d.set_item("cached_bytes", s.cached_bytes)?;
                d.set_item("upstream_bytes", s.upstream_bytes)?;
                d.set_item("hits", s.hits)?;
                d.set_item("misses", s.misses)?;
                d.set_item("largest_free_bytes", s.largest_free_bytes)?;
            }
            _ => {
                return Err(PyTypeError::new_err(format!(
                    "{} keeps no statistics; wrap it: Statistics(...)",
                    self.name()
                )));
            }
        }
        Ok(d)
    }

    /// A Pool growing in place: copies its blocks to host memory and releases its memory,
    /// addresses kept (`offload`), or backs it again and copies them back (`restore`);
    /// returns the bytes released or restored. `what` is "offload" or "restore".
    fn pool_sleep(&self, py: Python<'_>, what: &str) -> PyResult<u64> {
        let Handle::Pool(p) = &self.handle else {
            return Err(PyTypeError::new_err(format!(
                "{} is no Pool: only a Pool(..., grow_in_place=...) can {what}",
                self.name()
            )));
        };
        let sleep = match what {
            "offload" => memarray_cuda::sleep::offload,
            "restore" => memarray_cuda::sleep::restore,
            _ => {
                return Err(PyValueError::new_err(format!(
                    "pool_sleep: {what:?} is neither \"offload\" nor \"restore\""
                )));
            }
        };
        let p = p.clone();
        py.detach_section(|| sleep(&p)).py()
    }

    /// Whether a Pool is offloaded.
    fn offloaded(&self) -> bool {
        matches!(&self.handle, Handle::Pool(p) if p.offloaded())
    }

    /// Resets a Statistics resource's peaks to the current values.
    fn reset_peaks(&self) -> PyResult<()> {
        match &self.handle {
            Handle::Statistics(s) => {
                s.reset_peaks();
                Ok(())
            }
            _ => Err(PyTypeError::new_err("only Statistics resources have peaks")),
        }
    }

    /// `(used, limit)` bytes of a Limiting resource.
    fn limit_usage(&self) -> PyResult<(u64, u64)> {
        match &self.handle {
            Handle::Limiting(l) => Ok((l.used(), l.limit())),
            _ => Err(PyTypeError::new_err("only Limiting resources have a limit")),
        }
    }

    /// Writes a Logging resource's buffered rows to its file.
    fn flush(&self) -> PyResult<()> {
        match &self.handle {
            Handle::Logging(l) => l.flush().py(),
            _ => Err(PyTypeError::new_err(
                "only Logging resources have a log to flush",
            )),
        }
    }

    /// A Tracking resource's live allocations and timeline, as plain Python data (a dict
    /// `json.dumps` takes): `resource`, `source`, `sources` (the timeline's column names),
    /// `live` (address, size, stream, device, source, time_ns, stack, backtrace),
    /// `timeline` ([ns, bytes of each source] rows), `events` ([ns, "spill" or "restore",
    /// bytes] rows: memarray.spill on this device), `trace` (with stacks on: [ns, "alloc"
    /// or "free", address, size, stream, device, source, stack] rows, the last 65,536).
    /// TypeError for any other resource: only Tracking records allocations.
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let t = self.tracking()?;
        let (live, timeline, events, trace) =
            py.detach_section(|| (t.live(), t.timeline(), t.events(), t.trace()));
        let d = PyDict::new(py);
        d.set_item("resource", t.name())?;
        d.set_item("source", t.source().name())?;
        let sources: Vec<&str> = Source::all().iter().map(|s| s.name()).collect();
        let columns = sources.len();
        d.set_item("sources", sources)?;
        let rows = pyo3::types::PyList::empty(py);
        for a in live {
            let r = PyDict::new(py);
            r.set_item("address", a.address)?;
            r.set_item("size", a.size)?;
            r.set_item("stream", a.stream)?;
            r.set_item("device", a.device)?;
            r.set_item("source", a.source.name())?;
            r.set_item("time_ns", a.time_ns)?;
            r.set_item("stack", a.stack)?;
            r.set_item("backtrace", a.backtrace)?;
            rows.append(r)?;
        }
        d.set_item("live", rows)?;
        d.set_item(
            "timeline",
            timeline
                .into_iter()
                .map(|(t, b)| {
                    let mut row = vec![u128::from(t)];
                    // One column per registered source (the counters have room for more).
                    row.extend(b.iter().take(columns).map(|&x| x as u128));
                    row
                })
                .collect::<Vec<_>>(),
        )?;
        let ev = pyo3::types::PyList::empty(py);
        for (ns, kind, bytes) in events {
            ev.append((ns, kind, bytes))?;
        }
        d.set_item("events", ev)?;
        let tr = pyo3::types::PyList::empty(py);
        for e in trace {
            let action = if e.free { "free" } else { "alloc" };
            tr.append((
                e.time_ns,
                action,
                e.address,
                e.size,
                e.stream,
                e.device,
                e.source.name(),
                e.stack,
            ))?;
        }
        d.set_item("trace", tr)?;
        Ok(d)
    }

    /// A Tracking resource's live bytes per source (`{name: bytes}`, every registered
    /// source) and its number of live allocations, read from counters (no walk over the
    /// allocations). TypeError for any other resource.
    fn live_bytes<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyDict>, usize)> {
        let t = self.tracking()?;
        let (bytes, count) = py.detach_section(|| t.live_bytes());
        let d = PyDict::new(py);
        for (source, n) in bytes {
            d.set_item(source.name(), n)?;
        }
        Ok((d, count))
    }

    /// With stacks on: `[(source, stack, bytes)]`, live bytes per source and allocation
    /// stack, read from counters. TypeError for any other resource than a Tracking.
    fn live_by_stack(&self, py: Python<'_>) -> PyResult<Vec<(&'static str, String, usize)>> {
        let t = self.tracking()?;
        Ok(py
            .detach_section(|| t.live_by_stack())
            .into_iter()
            .map(|(source, stack, n)| (source.name(), stack, n))
            .collect())
    }

    /// How many allocations a Retry resource retried after an out-of-memory error.
    fn retries(&self) -> PyResult<u64> {
        match &self.handle {
            Handle::Retry(r) => Ok(r.retries()),
            _ => Err(PyTypeError::new_err("only Retry resources count retries")),
        }
    }

    /// `nbytes` from this resource, 256-byte aligned, freed when the Allocation is
    /// freed or garbage-collected. `source` names the library the memory is for
    /// ("memarray", "torch", "cupy", "numba", "rmm", "cuda_core"; ValueError for others) in
    /// statistics and tracking. Out of memory, memarray's caches and other libraries'
    /// are released and the allocation retried once before MemoryError.
    #[pyo3(signature = (nbytes, stream=None, source=None))]
    fn allocate(
        &self,
        py: Python<'_>,
        nbytes: &Bound<'_, PyAny>,
        stream: Option<&Bound<'_, PyAny>>,
        source: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Allocation> {
        let bytes: usize = convert::int(nbytes, "nbytes")?;
        let stream = crate::stream::parse_move_stream(stream)?.map(RawStream::from);
        let source = parse_source(source)?;
        let r = self.resource();
        let ptr = py
            .detach_section(|| {
                attributed(source, || {
                    allocate_with_relief(&*r, bytes, ALIGN, stream, false)
                        .map(|p| p.as_ptr() as usize)
                })
            })
            .py()?;
        Ok(Allocation::owned(r, ptr, bytes, stream, source))
    }

    fn __repr__(&self) -> String {
        format!("<memarray resource {}>", self.name())
    }
}

const ALIGN: usize = 256;

/// A `source=` argument: a name must be one of [`Source`]'s; None leaves the attribution
/// to the resources (memarray's own, or a Tracking adaptor's source).
pub(crate) fn parse_source(source: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Source>> {
    match source.filter(|s| !s.is_none()) {
        None => Ok(None),
        Some(s) => Source::parse(&convert::text(s, "source")?).py().map(Some),
    }
}

/// Runs `f` attributed to `source`, when one was named.
fn attributed<R>(source: Option<Source>, f: impl FnOnce() -> R) -> R {
    match source {
        Some(s) => with_source(s, f),
        None => f(),
    }
}

/// The Rust resource behind a `memarray.resources.Resource` (its `_handle`), or None.
pub(crate) fn resource_arg(
    obj: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<Arc<dyn MemoryResource>>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let handle = obj.getattr("_handle").unwrap_or_else(|_| obj.clone());
    let r = handle.cast::<PyResource>().map_err(|_| {
        PyTypeError::new_err(format!(
            "expected a memarray.resources.Resource, not {}",
            crate::errors::type_name(obj)
        ))
    })?;
    Ok(Some(r.get().resource()))
}

/// Memory from a resource, freed once: by `free()` or when collected.
#[pyclass(module = "memarray.resources", frozen)]
pub struct Allocation {
    resource: Arc<dyn MemoryResource>,
    ptr: usize,
    size: usize,
    stream: Option<RawStream>,
    source: Option<Source>,
    freed: AtomicBool,
    /// The Python object that owns `stream` (a CuPy `Stream`), kept until the memory is
    /// freed: the free is ordered on that stream, which must not be destroyed before.
    stream_owner: Option<Py<PyAny>>,
}

impl Allocation {
    /// Owns `size` bytes at `ptr` from `resource` (allocated on `stream` for `source`).
    pub(crate) fn owned(
        resource: Arc<dyn MemoryResource>,
        ptr: usize,
        size: usize,
        stream: Option<RawStream>,
        source: Option<Source>,
    ) -> Self {
        Allocation {
            resource,
            ptr,
            size,
            stream,
            source,
            freed: AtomicBool::new(false),
            stream_owner: None,
        }
    }

    /// Keeps `owner`, the object owning the allocation's stream, alive until the free
    /// (which is ordered on that stream).
    pub(crate) fn keeping_stream(mut self, owner: Py<PyAny>) -> Self {
        self.stream_owner = Some(owner);
        self
    }

    fn release(&self, stream: Option<RawStream>) {
        if self.freed.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(p) = std::ptr::NonNull::new(self.ptr as *mut u8) {
            let source = self.source.unwrap_or_default();
            // SAFETY: (ptr, size, ALIGN) came from this resource through the allocation
            // path for `source` (memarray's own when none was named) and the flag above
            // lets exactly one caller get here; the caller orders its use of the memory
            // before `stream` (or the allocation's stream).
            unsafe { deallocate_counted(&*self.resource, source, p, self.size, ALIGN, stream) }
        }
    }
}

#[pymethods]
impl Allocation {
    /// The address (a device address for device memory).
    #[getter]
    fn ptr(&self) -> usize {
        self.ptr
    }

    /// Bytes requested.
    #[getter]
    fn size(&self) -> usize {
        self.size
    }

    /// Whether `free()` has run.
    #[getter]
    fn freed(&self) -> bool {
        self.freed.load(Ordering::Acquire)
    }

    fn __int__(&self) -> usize {
        self.ptr
    }

    /// Returns the memory to its resource (a second call does nothing). A stream-ordered
    /// resource reuses it after the work queued on `stream` (default: the stream it was
    /// allocated on).
    #[pyo3(signature = (stream=None))]
    fn free(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let stream = crate::stream::parse_move_stream(stream)?
            .map(RawStream::from)
            .or(self.stream);
        py.detach_section(|| self.release(stream));
        Ok(())
    }

    /// The library named when allocating ("torch", "cupy", ...), or None.
    #[getter]
    fn source(&self) -> Option<&'static str> {
        self.source.map(Source::name)
    }

    fn __repr__(&self) -> String {
        format!(
            "<Allocation {} bytes at {:#x} from {}{}>",
            self.size,
            self.ptr,
            self.resource.name(),
            if self.freed() { ", freed" } else { "" }
        )
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        self.release(self.stream);
    }
}

#[pyfunction]
fn host() -> PyResource {
    PyResource::new(Handle::Plain(Arc::new(HostResource)))
}

#[pyfunction]
fn device_memory(device_id: &Bound<'_, PyAny>) -> PyResult<PyResource> {
    Ok(PyResource::new(Handle::Plain(Arc::new(
        DeviceResource::new(&device(device_id)?),
    ))))
}

#[pyfunction]
fn pinned(device_id: &Bound<'_, PyAny>) -> PyResult<PyResource> {
    Ok(PyResource::new(Handle::Plain(Arc::new(
        PinnedResource::new(&device(device_id)?),
    ))))
}

#[pyfunction]
fn managed(device_id: &Bound<'_, PyAny>) -> PyResult<PyResource> {
    Ok(PyResource::new(Handle::Plain(Arc::new(
        ManagedResource::new(&device(device_id)?),
    ))))
}

#[pyfunction]
fn async_pool(device_id: &Bound<'_, PyAny>) -> PyResult<PyResource> {
    Ok(PyResource::new(Handle::Plain(Arc::new(
        AsyncPoolResource::new(&device(device_id)?).py()?,
    ))))
}

#[pyfunction]
fn file(path: &Bound<'_, PyAny>) -> PyResult<PyResource> {
    let path = convert::path(path, "path")?;
    Ok(PyResource::new(Handle::Plain(Arc::new(
        FileResource::create(&path).py()?,
    ))))
}

/// A caching pool over `upstream`; device-bound upstreams (device, managed) get
/// stream-ordered reuse on their device, pinned memory on `device_id`'s streams.
#[pyfunction]
#[pyo3(signature = (upstream, release_threshold=None, device_id=None, grow_in_place=None))]
fn pool(
    upstream: &PyResource,
    release_threshold: Option<&Bound<'_, PyAny>>,
    device_id: Option<&Bound<'_, PyAny>>,
    grow_in_place: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyResource> {
    let up = upstream.resource();
    let threshold = convert::opt_int::<u64>(release_threshold, "release_threshold")?
        .map_or(usize::MAX, |t| usize::try_from(t).unwrap_or(usize::MAX));
    let device_id: Option<u32> = convert::opt_int(device_id, "device_id")?;
    let dev = match (device_id.or(up.device_id()), up.kind()) {
        (Some(id), _) => Some(Device::get(id).py()?),
        (None, MemoryKind::Pinned) => Some(Device::get(0).py()?),
        _ => None,
    };
    let capacity: Option<u64> = convert::opt_int(grow_in_place, "grow_in_place")?;
    let p = match (capacity, dev) {
        (None, Some(d)) => CachingPool::new(up, &d, threshold),
        (None, None) => CachingPool::host(up, threshold),
        (Some(cap), dev) => {
            let cap = usize::try_from(cap).unwrap_or(usize::MAX);
            let range: Arc<dyn memarray_core::GrowableRange> = match up.kind() {
                MemoryKind::Device => {
                    let d = dev.as_ref().ok_or_else(|| {
                        pyo3::exceptions::PyValueError::new_err("a device pool needs a device")
                    })?;
                    Arc::new(memarray_cuda::resource::VmmRange::reserve(d, cap).py()?)
                }
                MemoryKind::Host => Arc::new(memarray_core::HostRange::reserve(cap, 2 << 20).py()?),
                other => {
                    return Err(pyo3::exceptions::PyValueError::new_err(format!(
                        "grow_in_place is for device or host memory, not {other:?} memory"
                    )));
                }
            };
            CachingPool::growing(up, range, dev.as_ref(), threshold)
        }
    };
    Ok(PyResource::new(Handle::Pool(Arc::new(p))))
}

#[pyfunction]
fn statistics(upstream: &PyResource) -> PyResource {
    PyResource::new(Handle::Statistics(Arc::new(StatisticsAdaptor::new(
        upstream.resource(),
    ))))
}

#[pyfunction]
fn limiting(upstream: &PyResource, max_bytes: &Bound<'_, PyAny>) -> PyResult<PyResource> {
    let limit: u64 = convert::int(max_bytes, "max_bytes")?;
    Ok(PyResource::new(Handle::Limiting(Arc::new(
        LimitingAdaptor::new(upstream.resource(), limit),
    ))))
}

#[pyfunction]
fn logging(upstream: &PyResource, path: &Bound<'_, PyAny>) -> PyResult<PyResource> {
    let path = convert::path(path, "path")?;
    Ok(PyResource::new(Handle::Logging(Arc::new(
        LoggingAdaptor::to_path(upstream.resource(), &path).py()?,
    ))))
}

/// Tracks `upstream`'s live allocations; those made outside a library's glue are
/// `source`'s. Python stacks when `stacks`, Rust backtraces when `backtraces`.
#[pyfunction]
#[pyo3(signature = (upstream, source=None, stacks=false, backtraces=false))]
fn tracking(
    upstream: &PyResource,
    source: Option<&Bound<'_, PyAny>>,
    stacks: bool,
    backtraces: bool,
) -> PyResult<PyResource> {
    let source = parse_source(source)?.unwrap_or(Source::MEMARRAY);
    Ok(PyResource::new(Handle::Tracking(Arc::new(
        TrackingAdaptor::new(upstream.resource(), source)
            .with_stacks(stacks)
            .with_backtraces(backtraces),
    ))))
}

#[pyfunction]
fn retry(upstream: &PyResource) -> PyResource {
    PyResource::new(Handle::Retry(Arc::new(RetryAdaptor::new(
        upstream.resource(),
    ))))
}

/// Makes `r` the resource new device buffers on `device_id` come from.
#[pyfunction]
fn set_default(r: &PyResource, device_id: &Bound<'_, PyAny>) -> PyResult<()> {
    let d = device(device_id)?;
    let res = r.resource();
    if !res.is_accessible_from(Location::Device(d.id())) {
        return Err(PyValueError::new_err(format!(
            "{} serves {} memory, which cuda:{} cannot use for device buffers",
            res.name(),
            kind_name(res.kind()),
            d.id()
        )));
    }
    set_default_resource(&d, res).py()?;
    Ok(())
}

/// The resource new device buffers on `device_id` come from now.
#[pyfunction]
fn get_default(device_id: &Bound<'_, PyAny>) -> PyResult<PyResource> {
    Ok(PyResource::new(Handle::Plain(
        default_resource(&device(device_id)?).py()?,
    )))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let r = PyModule::new(py, "_resources")?;
    r.add_class::<PyResource>()?;
    r.add_class::<Allocation>()?;
    r.add_function(wrap_pyfunction!(host, &r)?)?;
    r.add_function(wrap_pyfunction!(device_memory, &r)?)?;
    r.add_function(wrap_pyfunction!(pinned, &r)?)?;
    r.add_function(wrap_pyfunction!(managed, &r)?)?;
    r.add_function(wrap_pyfunction!(async_pool, &r)?)?;
    r.add_function(wrap_pyfunction!(file, &r)?)?;
    r.add_function(wrap_pyfunction!(pool, &r)?)?;
    r.add_function(wrap_pyfunction!(statistics, &r)?)?;
    r.add_function(wrap_pyfunction!(limiting, &r)?)?;
    r.add_function(wrap_pyfunction!(logging, &r)?)?;
    r.add_function(wrap_pyfunction!(retry, &r)?)?;
    r.add_function(wrap_pyfunction!(tracking, &r)?)?;
    r.add_function(wrap_pyfunction!(set_default, &r)?)?;
    r.add_function(wrap_pyfunction!(get_default, &r)?)?;
    r.add_function(wrap_pyfunction!(crate::host_pool::release_numpy_pool, &r)?)?;
    r.add_function(wrap_pyfunction!(
        crate::host_pool::numpy_pool_statistics,
        &r
    )?)?;
    m.add_submodule(&r)?;
    Ok(())
}
