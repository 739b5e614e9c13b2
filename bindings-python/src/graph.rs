//! CUDA graphs from Python: `memarray.cuda.Stream.capture()` records the work enqueued on
//! the stream into a graph (`memarray.cuda.Graph`) that launches it all at once, as many
//! times as wanted. Over `memarray_cuda::graph`.

use std::sync::{Mutex, PoisonError};

use pyo3::prelude::*;

use memarray_cuda::StreamRef;
use memarray_cuda::graph::{CaptureMode, CaptureScope, GraphExec};

use crate::errors::IntoPyResult;
use crate::fork::Detach;
use crate::stream::{PyStream, parse_move_stream};

/// Capturing, on `memarray.cuda.Stream` (its other methods are in `stream.rs`).
#[pymethods]
impl PyStream {
    /// A capture of this stream into a CUDA graph, as a `with` block: memarray's
    /// kernels, device copies and replayable host copies (pinned memory) enqueued on the
    /// stream inside it are recorded, not run, and `capture.graph` launches them all at
    /// once afterwards. What cannot be replayed (a pageable or staged host copy, a host
    /// wait) raises `memarray.CaptureError` and leaves the capture valid. `mode`:
    /// 'thread_local' (default), 'global' or 'relaxed' (CUDA's capture modes).
    #[pyo3(signature = (mode="thread_local"))]
    fn capture(slf: Bound<'_, Self>, mode: &str) -> PyResult<PyCapture> {
        let mode = capture_mode(mode)?;
        Ok(PyCapture::new(slf.unbind(), mode))
    }

    /// Whether the stream is being captured into a graph (by memarray, torch, CuPy...).
    fn is_capturing(&self) -> PyResult<bool> {
        let s = self.stream.as_ref();
        Ok(s.capture(self.stream.device()).py()? != memarray_cuda::graph::Capture::None)
    }
}

/// The capture modes by their CUDA names.
fn capture_mode(mode: &str) -> PyResult<CaptureMode> {
    match mode {
        "global" => Ok(CaptureMode::Global),
        "thread_local" => Ok(CaptureMode::ThreadLocal),
        "relaxed" => Ok(CaptureMode::Relaxed),
        other => Err(pyo3::exceptions::PyValueError::new_err(format!(
            "capture mode {other:?}: expected 'thread_local' (the default), 'global' or 'relaxed'"
        ))),
    }
}

/// A capture of one stream, as a `with` block: work enqueued on the stream inside it is
/// recorded, not run; at the block's end the graph is instantiated (`graph`). A block
/// left by an exception ends the capture and throws its graph away.
#[pyclass(name = "Capture", module = "memarray.cuda", frozen)]
pub struct PyCapture {
    stream: Py<PyStream>,
    mode: CaptureMode,
    scope: Mutex<Option<CaptureScope>>,
    graph: Mutex<Option<Py<PyGraph>>>,
}

impl PyCapture {
    fn new(stream: Py<PyStream>, mode: CaptureMode) -> Self {
        Self {
            stream,
            mode,
            scope: Mutex::new(None),
            graph: Mutex::new(None),
        }
    }
}

#[pymethods]
impl PyCapture {
    fn __enter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        let me = slf.get();
        let mut scope = me.scope.lock().unwrap_or_else(PoisonError::into_inner);
        if scope.is_some()
            || me
                .graph
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_some()
        {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(
                "this capture was used already: call stream.capture() again for a new one",
            ));
        }
        let s = &me.stream.get().stream;
        *scope = Some(s.as_ref().begin_capture(s.device(), me.mode).py()?);
        drop(scope);
        Ok(slf)
    }

    #[pyo3(signature = (exc_type, _exc=None, _tb=None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let Some(scope) = self
            .scope
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        else {
            return Ok(false);
        };
        if exc_type.is_some_and(|t| !t.is_none()) {
            drop(scope); // ends the capture and destroys what it recorded
            return Ok(false);
        }
        let (exec, nodes) = py
            .detach_section(|| {
                let graph = scope.end()?;
                let nodes = graph.node_count()?;
                Ok::<_, memarray_cuda::CudaError>((graph.instantiate()?, nodes))
            })
            .py()?;
        let graph = Py::new(
            py,
            PyGraph {
                exec,
                nodes,
                stream: self.stream.clone_ref(py),
            },
        )?;
        *self.graph.lock().unwrap_or_else(PoisonError::into_inner) = Some(graph);
        Ok(false)
    }

    /// The instantiated graph, once the `with` block has ended.
    #[getter]
    fn graph(&self, py: Python<'_>) -> PyResult<Py<PyGraph>> {
        self.graph
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|g| g.clone_ref(py))
            .ok_or_else(|| {
                pyo3::exceptions::PyRuntimeError::new_err(
                    "the capture has no graph: use it after its `with` block has ended \
                     (a block left by an exception throws its graph away)",
                )
            })
    }
}

/// An instantiated CUDA graph: `launch()` runs everything the capture recorded as one
/// launch, on the captured stream unless another is given. The graph holds the arrays the
/// capture used for its life (the spiller leaves them be); memory used through other
/// libraries must stay allocated while the graph may run.
#[pyclass(name = "Graph", module = "memarray.cuda", frozen)]
pub struct PyGraph {
    exec: GraphExec,
    nodes: usize,
    stream: Py<PyStream>,
}

impl PyGraph {
    fn stream_arg(&self, stream: Option<&Bound<'_, PyAny>>) -> PyResult<StreamRef> {
        Ok(parse_move_stream(stream)?.unwrap_or(self.stream.get().stream.as_ref()))
    }
}

#[pymethods]
impl PyGraph {
    /// Launches the graph on `stream` (default: the captured stream), after the work
    /// queued there and the pending work of the arrays it uses; returns at once. The
    /// launch becomes those arrays' pending work (a host read waits for it). Raises
    /// `memarray.CaptureError` (nothing launched) when one of them moved to other device
    /// memory since the capture.
    #[pyo3(signature = (stream=None))]
    fn launch(&self, py: Python<'_>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let s = self.stream_arg(stream)?;
        // The GIL is let go: a launch waits for its arrays' other calls to finish.
        py.detach_section(|| self.exec.launch(s).map(drop)).py()
    }

    /// Launches the graph `n` times in a row on `stream` (default: the captured stream).
    #[pyo3(signature = (n, stream=None))]
    fn replay(&self, py: Python<'_>, n: usize, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let s = self.stream_arg(stream)?;
        py.detach_section(|| self.exec.launch_n(s, n).map(drop))
            .py()
    }

    /// Uploads the graph to the device ahead of its first launch.
    #[pyo3(signature = (stream=None))]
    fn upload(&self, stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let s = self.stream_arg(stream)?;
        self.exec.upload(s).py().map(drop)
    }

    /// The number of nodes (kernels, copies, memsets, waits) the capture recorded.
    #[getter]
    fn node_count(&self) -> usize {
        self.nodes
    }

    /// How many memarray arrays the graph holds.
    #[getter]
    fn array_count(&self) -> usize {
        self.exec.member_count()
    }

    fn __repr__(&self) -> String {
        format!(
            "memarray.cuda.Graph(nodes={}, arrays={})",
            self.nodes,
            self.exec.member_count()
        )
    }
}
