//! CUDA graphs from memarray: whether a stream is being captured (the one question every
//! capture-aware path asks), a capture scope that yields a [`Graph`], and the
//! [`GraphExec`] that launches it.
//!
//! ```no_run
//! use memarray_cuda::graph::CaptureMode;
//! use memarray_cuda::{Device, DeviceBuffer, Stream, copy, resource::default_resource};
//!
//! # fn main() -> memarray_cuda::Result<()> {
//! let dev = Device::get(0)?;
//! let s = Stream::new(&dev)?;
//! let r = default_resource(&dev)?;
//! let (a, b) = (
//!     DeviceBuffer::zeroed(&dev, 1 << 20, r.clone(), s.as_ref())?,
//!     DeviceBuffer::zeroed(&dev, 1 << 20, r, s.as_ref())?,
//! );
//! s.synchronize()?;
//! let capture = s.as_ref().begin_capture(&dev, CaptureMode::ThreadLocal)?;
//! drop(copy::copy_dtod(&b, 0, &a, 0, 1 << 20, s.as_ref())?); // captured, not run
//! let graph = capture.end()?;
//! let exec = graph.instantiate()?;
//! exec.launch(s.as_ref())?.synchronize()?; // runs the copy; launch it again at will
//! # Ok(())
//! # }
//! ```
//!
//! A capture that is dropped without [`CaptureScope::end`] is ended and its graph
//! destroyed, so the stream is usable again and nothing leaks.
//!
//! Arrays shared through [`crate::array::SharedArray`] (every array of the bindings and
//! the C API) that work in a memarray capture uses join the capture as its
//! [`GraphMember`]s: the graph holds them for its life (they cannot be freed under it, and
//! the spiller leaves them be), and each launch locks them, brings their data to the device
//! where the capture found it, orders itself after their pending work and becomes it (a
//! host read after a launch waits for the launch). A launch after a member's data moved
//! elsewhere refuses with [`CudaError::GraphArrayMoved`]. Memory used only through
//! buffers, or in a capture begun by another library, is the caller's to keep alive. Work that cannot be
//! captured (a host wait, host threads reading pageable memory) asks
//! [`StreamRef::capture`] first and refuses with [`CudaError::Captured`], which leaves the
//! capture valid.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::device::Device;
use crate::driver::{self, CUgraph, CUgraphExec};
use crate::error::{CudaError, Result};
use crate::event::Enqueued;
use crate::stream::StreamRef;

/// Whether a stream is being captured into a graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capture {
    /// Not capturing: work runs when enqueued.
    None,
    /// Capturing: work is recorded into the capture's graph (`id` names the capture).
    Active {
        /// The driver's id of the capture.
        id: u64,
    },
    /// A capture that an operation illegal under capture invalidated: its end fails.
    Invalidated {
        /// The driver's id of the capture.
        id: u64,
    },
}

/// Which calls on other streams a capture forbids (CUDA's `cudaStreamCaptureMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureMode {
    /// Potentially unsafe calls (a host wait, say) from any thread invalidate it.
    Global,
    /// Only this thread's potentially unsafe calls do.
    ThreadLocal,
    /// None do.
    Relaxed,
}

impl StreamRef {
    /// Whether this stream (of `device`) is being captured. One driver query and no
    /// allocation; none for the legacy default stream, which CUDA never captures; the
    /// per-thread default stream (which names the current context's) binds `device` first,
    /// a stream of its own names its context itself.
    pub fn capture(self, device: &Device) -> Result<Capture> {
        if self == StreamRef::legacy() {
            // CUDA never captures the legacy default stream: nothing to ask.
            return Ok(Capture::None);
        }
        let (status, id) = self.ask(device, driver::stream_capture_info)?;
        Ok(match status {
            0 => Capture::None,
            1 => Capture::Active { id },
            _ => Capture::Invalidated { id },
        })
    }

    /// The graph this stream's active capture records into, if it is being captured (valid
    /// until the capture ends); asked as [`Self::capture`] asks.
    pub(crate) fn capture_graph(self, device: &Device) -> Result<Option<CUgraph>> {
        if self == StreamRef::legacy() {
            return Ok(None);
        }
        self.ask(device, driver::stream_capture_graph)
    }

    /// Asks the driver `query` about this stream (not the legacy one): a stream of its own
    /// names its context; the per-thread default stream (which names the current context's)
    /// binds `device` first, as does a driver that wants the context current after all.
    fn ask<T>(self, device: &Device, query: unsafe fn(driver::CUstream) -> Result<T>) -> Result<T> {
        if !self.is_default() {
            // SAFETY: a live stream (this type's contract) that names its own context.
            if let Ok(answer) = unsafe { query(self.cu()) } {
                return Ok(answer);
            }
        }
        let _ctx = device.bind()?;
        // SAFETY: a live stream, its device's context current.
        unsafe { query(self.cu()) }
    }

    /// Refuses `what` with [`CudaError::Captured`] when this stream is being captured (or
    /// its capture was invalidated): for work that cannot be captured. The capture stays
    /// as it was.
    pub fn refuse_under_capture(self, device: &Device, what: &'static str) -> Result<()> {
        match self.capture(device)? {
            Capture::None => Ok(()),
            Capture::Active { id } | Capture::Invalidated { id } => Err(CudaError::Captured {
                what,
                stream: self.raw(),
                id,
            }),
        }
    }

    /// Begins capturing this stream of `device` in `mode`: work enqueued on it until
    /// [`CaptureScope::end`] is recorded into a graph instead of run. A default stream
    /// cannot be captured ([`CudaError::InvalidArgument`]).
    pub fn begin_capture(self, device: &Arc<Device>, mode: CaptureMode) -> Result<CaptureScope> {
        if self.is_default() {
            return Err(CudaError::InvalidArgument {
                what: "begin_capture",
                detail: "a default stream cannot be captured; capture a Stream of your own".into(),
            });
        }
        let mode = match mode {
            CaptureMode::Global => 0,
            CaptureMode::ThreadLocal => 1,
            CaptureMode::Relaxed => 2,
        };
        let _ctx = device.bind()?;
        // SAFETY: a live, non-default stream of the bound device.
        unsafe { driver::stream_begin_capture(self.cu(), mode) }?;
        // Made first, so a failure below ends the capture (the scope's drop).
        let mut scope = CaptureScope {
            stream: self,
            device: device.clone(),
            id: None,
            ended: false,
        };
        // SAFETY: the live stream just begun capturing, its device bound.
        let (_, id) = unsafe { driver::stream_capture_info(self.cu()) }?;
        members().insert(id, Vec::new());
        scope.id = Some(id);
        Ok(scope)
    }
}

/// Whether `stream` (the legacy default stream for `None`) of `device` is being captured,
/// for the relief path, which skips its steps under a capture
/// ([`memarray_core::resource::CaptureProbe`]); any doubt is a no.
pub(crate) fn stream_captured(device: u32, stream: Option<memarray_core::RawStream>) -> bool {
    let Some(stream) = stream else {
        return false; // the legacy default stream is never captured
    };
    let (Ok(device), Ok(stream)) = (Device::get(device), StreamRef::from_raw_stream(stream)) else {
        return false;
    };
    !matches!(stream.capture(&device), Ok(Capture::None))
}

/// What a graph's launches need of something its capture used (an array): kept alive by
/// the graph, then at each launch held still, checked and ordered ([`GraphMember::hold`]),
/// and told of the launch ([`HeldMember::launched`]).
pub trait GraphMember: Send + Sync + std::fmt::Debug {
    /// A key unique to the member and the same everywhere it is locked: members are held
    /// in key order, so launches over overlapping members cannot deadlock.
    fn key(&self) -> u64;

    /// Readies the member for a launch on `stream`: its data where the capture used it
    /// ([`CudaError::GraphArrayMoved`] otherwise), `stream` ordered after its pending work,
    /// and the member held still until the returned hold is dropped.
    fn hold(&self, stream: StreamRef) -> Result<Box<dyn HeldMember + '_>>;
}

/// A [`GraphMember`] held for one launch.
pub trait HeldMember {
    /// Makes `launch` the member's pending work.
    fn launched(&mut self, launch: &Enqueued) -> Result<()>;
}

/// The members of each capture memarray began, by the driver's capture id, until the
/// capture ends (into its graph) or is abandoned.
fn members() -> std::sync::MutexGuard<'static, Members> {
    static MEMBERS: std::sync::OnceLock<Mutex<Members>> = std::sync::OnceLock::new();
    MEMBERS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// Each capture's members, by capture id.
type Members = HashMap<u64, Vec<Arc<dyn GraphMember>>>;

/// Makes `member` a member of capture `id` (replacing one of the same key), if memarray
/// began that capture; returns whether it did. A capture begun elsewhere (torch, CuPy)
/// keeps nothing: its graph's memory is its owner's to keep.
pub fn join_capture(id: u64, member: Arc<dyn GraphMember>) -> bool {
    let mut all = members();
    let Some(list) = all.get_mut(&id) else {
        return false;
    };
    let key = member.key();
    match list.iter_mut().find(|m| m.key() == key) {
        Some(m) => *m = member,
        None => list.push(member),
    }
    true
}

/// Capture `id`'s members in key order, the capture forgotten.
fn take_members(id: Option<u64>) -> Vec<Arc<dyn GraphMember>> {
    let mut list = id.and_then(|id| members().remove(&id)).unwrap_or_default();
    list.sort_by_key(|m| m.key());
    list
}

/// A capture in progress on one stream, begun by [`StreamRef::begin_capture`].
#[derive(Debug)]
#[must_use = "a capture records work until it is ended; dropping it throws the graph away"]
pub struct CaptureScope {
    stream: StreamRef,
    device: Arc<Device>,
    /// The driver's id of the capture (`None` only while it is being begun).
    id: Option<u64>,
    ended: bool,
}

impl CaptureScope {
    /// The stream being captured.
    pub fn stream(&self) -> StreamRef {
        self.stream
    }

    /// Ends the capture and returns its graph. A capture invalidated by an operation
    /// illegal under capture is the driver's error (`cuStreamEndCapture`); the stream is
    /// no longer capturing either way.
    pub fn end(mut self) -> Result<Graph> {
        self.ended = true;
        let members = take_members(self.id);
        let _ctx = self.device.bind()?;
        // SAFETY: the stream this scope began capturing, its device bound.
        let raw = unsafe { driver::stream_end_capture(self.stream.cu()) }?;
        Ok(Graph {
            raw,
            device: self.device.clone(),
            members,
        })
    }
}

impl Drop for CaptureScope {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        drop(take_members(self.id));
        // An abandoned capture: end it and destroy what it recorded, so the stream is
        // usable again and the graph does not leak.
        let ended = self.device.bind().and_then(|_ctx| {
            // SAFETY: the stream this scope began capturing, its device bound.
            let g = unsafe { driver::stream_end_capture(self.stream.cu()) }?;
            // SAFETY: the graph just handed back, used by nothing else.
            unsafe { driver::graph_destroy(g) }
        });
        crate::parked::park_err("ending an abandoned capture", ended);
    }
}

/// A captured graph of work, not yet runnable: [`Graph::instantiate`] makes it so.
#[derive(Debug)]
pub struct Graph {
    raw: CUgraph,
    device: Arc<Device>,
    /// What the capture used, in key order, held for the graph's executables.
    members: Vec<Arc<dyn GraphMember>>,
}

// SAFETY: a graph handle is a driver token any thread may use with the context bound;
// every use here binds it, and `&self` methods only read the graph.
unsafe impl Send for Graph {}
// SAFETY: as above.
unsafe impl Sync for Graph {}

impl Graph {
    /// The number of nodes (kernels, copies, memsets, waits) the capture recorded.
    pub fn node_count(&self) -> Result<usize> {
        let _ctx = self.device.bind()?;
        // SAFETY: a live graph, its device bound.
        unsafe { driver::graph_node_count(self.raw) }
    }

    /// An executable form of the graph, launchable any number of times.
    pub fn instantiate(&self) -> Result<GraphExec> {
        let _ctx = self.device.bind()?;
        // SAFETY: a live graph of the bound device.
        let raw = unsafe { driver::graph_instantiate(self.raw) }?;
        Ok(GraphExec {
            raw,
            device: self.device.clone(),
            members: self.members.clone(),
        })
    }

    /// How many arrays the graph holds (see the module docs).
    pub fn member_count(&self) -> usize {
        self.members.len()
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        let done = self.device.bind().and_then(|_ctx| {
            // SAFETY: this graph, used by nothing else (executables made from it are
            // independent of it).
            unsafe { driver::graph_destroy(self.raw) }
        });
        crate::parked::park_err("destroying a graph", done);
    }
}

/// An instantiated graph: [`GraphExec::launch`] runs all its work as one launch.
#[derive(Debug)]
pub struct GraphExec {
    raw: CUgraphExec,
    device: Arc<Device>,
    members: Vec<Arc<dyn GraphMember>>,
}

// SAFETY: as Graph.
unsafe impl Send for GraphExec {}
// SAFETY: as Graph.
unsafe impl Sync for GraphExec {}

impl GraphExec {
    /// Launches the graph on `stream` (of its device), ordered after the work queued
    /// there and after its members' pending work; the launch becomes their pending work.
    /// Refuses with [`CudaError::GraphArrayMoved`] (nothing launched) when a member's data
    /// moved since the capture. Memory the capture used other than its members' must
    /// still be allocated when the launch runs: keep such buffers alive as long as the
    /// graph may be launched.
    pub fn launch(&self, stream: StreamRef) -> Result<Enqueued> {
        self.launch_n(stream, 1)
    }

    /// [`Self::launch`] `n` times in a row (the members held, checked and told once);
    /// `n == 0` launches nothing and only orders `stream` after the members' work.
    pub fn launch_n(&self, stream: StreamRef, n: usize) -> Result<Enqueued> {
        // Held in key order until the launches are theirs.
        let mut held = self
            .members
            .iter()
            .map(|m| m.hold(stream))
            .collect::<Result<Vec<_>>>()?;
        {
            let _ctx = self.device.bind()?;
            for _ in 0..n {
                // SAFETY: a live executable graph and a live stream of the bound device;
                // the members' memory is where the capture used it (checked by `hold`)
                // and kept by them until this launch is done; other memory is the
                // caller's promise.
                unsafe { driver::graph_launch(self.raw, stream.cu()) }?;
            }
        }
        let launch = Enqueued::new(stream, self.device.clone());
        // Every member is told, even after one fails: the first error is returned.
        let told: Vec<Result<()>> = held.iter_mut().map(|h| h.launched(&launch)).collect();
        told.into_iter().collect::<Result<()>>()?;
        Ok(launch)
    }

    /// How many arrays the graph holds (see the module docs).
    pub fn member_count(&self) -> usize {
        self.members.len()
    }

    /// Uploads the graph's work to the device on `stream` ahead of its first launch (the
    /// first launch is then as cheap as the later ones).
    pub fn upload(&self, stream: StreamRef) -> Result<Enqueued> {
        let _ctx = self.device.bind()?;
        // SAFETY: as launch.
        unsafe { driver::graph_upload(self.raw, stream.cu()) }?;
        Ok(Enqueued::new(stream, self.device.clone()))
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        let done = self.device.bind().and_then(|_ctx| {
            // SAFETY: this executable graph, used by nothing else; launches already
            // queued still run.
            unsafe { driver::graph_exec_destroy(self.raw) }
        });
        crate::parked::park_err("destroying an executable graph", done);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_the_work_the_stream_and_the_capture_and_says_it_stays_valid() {
        let e = CudaError::Captured {
            what: "a spill",
            stream: 0x5a5a,
            id: 7,
        };
        let text = e.to_string();
        for part in ["a spill", "0x5a5a", "capture 7", "still valid"] {
            assert!(text.contains(part), "{text}");
        }
        assert_eq!(e.kind(), memarray_core::ErrorKind::Failed);
    }
}
