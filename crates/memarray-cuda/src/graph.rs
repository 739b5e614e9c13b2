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
//! destroyed, so the stream is usable again and nothing leaks. Work that cannot be
//! captured (a host wait, host threads reading pageable memory) asks
//! [`StreamRef::capture`] first and refuses with [`CudaError::Captured`], which leaves the
//! capture valid.

use std::sync::Arc;

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
        let asked = if self.is_default() {
            None
        } else {
            // SAFETY: a live stream (this type's contract) that names its own context.
            unsafe { driver::stream_capture_info(self.cu()) }.ok()
        };
        let (status, id) = match asked {
            Some(answer) => answer,
            None => {
                // A default stream, or a driver that wants the context current after all.
                let _ctx = device.bind()?;
                // SAFETY: a live stream, its device's context current.
                unsafe { driver::stream_capture_info(self.cu()) }?
            }
        };
        Ok(match status {
            0 => Capture::None,
            1 => Capture::Active { id },
            _ => Capture::Invalidated { id },
        })
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
        Ok(CaptureScope {
            stream: self,
            device: device.clone(),
            ended: false,
        })
    }
}

/// A capture in progress on one stream, begun by [`StreamRef::begin_capture`].
#[derive(Debug)]
#[must_use = "a capture records work until it is ended; dropping it throws the graph away"]
pub struct CaptureScope {
    stream: StreamRef,
    device: Arc<Device>,
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
        let _ctx = self.device.bind()?;
        // SAFETY: the stream this scope began capturing, its device bound.
        let raw = unsafe { driver::stream_end_capture(self.stream.cu()) }?;
        Ok(Graph {
            raw,
            device: self.device.clone(),
        })
    }
}

impl Drop for CaptureScope {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
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
        })
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
}

// SAFETY: as Graph.
unsafe impl Send for GraphExec {}
// SAFETY: as Graph.
unsafe impl Sync for GraphExec {}

impl GraphExec {
    /// Launches the graph on `stream` (of its device), ordered after the work queued
    /// there; returns the launch as an operation to record or wait for. The memory the
    /// captured work used must still be allocated when the launch runs: keep the buffers
    /// alive as long as the graph may be launched.
    pub fn launch(&self, stream: StreamRef) -> Result<Enqueued> {
        let _ctx = self.device.bind()?;
        // SAFETY: a live executable graph and a live stream of the bound device; the
        // buffers' lifetime is the caller's promise stated above.
        unsafe { driver::graph_launch(self.raw, stream.cu()) }?;
        Ok(Enqueued::new(stream, self.device.clone()))
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
