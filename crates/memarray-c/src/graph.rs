//! CUDA graphs: a capture of one stream records the work enqueued on it
//! (`memarray_capture_begin` .. `memarray_capture_end`) into a graph that launches it all
//! at once, as often as wanted (`memarray_graph_launch`).

use memarray_cuda::graph::{CaptureMode, CaptureScope, GraphExec};
use memarray_cuda::{Enqueued, StreamRef};

use crate::error::{Error, check_out, guard, memarray_status, write_out};
use crate::handle::Handle;
use crate::stream::memarray_stream;

/// A capture in progress on one stream (opaque): end it with [`memarray_capture_end`], or
/// abandon it with [`memarray_capture_free`].
pub struct memarray_capture {
    scope: CaptureScope,
}

impl Handle for memarray_capture {}

/// An instantiated graph (opaque), launchable any number of times.
pub struct memarray_graph {
    exec: GraphExec,
    nodes: usize,
}

impl Handle for memarray_graph {}

/// Begins capturing `stream` (one of memarray's or a wrapped one, not a default stream)
/// in `mode`: 0 global, 1 thread-local, 2 relaxed (CUDA's capture modes). memarray's
/// kernels and device copies enqueued on it are recorded, not run; work a graph cannot
/// replay (a pageable or staged host copy, a host wait) fails with
/// `MEMARRAY_STATUS_FAILED` and leaves the capture valid. On success `*out` is the
/// capture.
///
/// # Safety
/// `stream` is a live handle, used by the capture until it ends; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_capture_begin(
    stream: *const memarray_stream,
    mode: i32,
    out: *mut *mut memarray_capture,
) -> memarray_status {
    guard(|| {
        check_out(out, "out")?;
        // SAFETY: the caller's contract.
        let s = unsafe { memarray_stream::arg(stream, "stream") }?;
        let mode = match mode {
            0 => CaptureMode::Global,
            1 => CaptureMode::ThreadLocal,
            2 => CaptureMode::Relaxed,
            other => {
                return Err(Error::arg(format!(
                    "capture mode {other}: expected 0 (global), 1 (thread-local) or 2 (relaxed)"
                )));
            }
        };
        let scope = s.stream.begin_capture(&s.device, mode)?;
        // SAFETY: checked above.
        unsafe { write_out(out, "out", memarray_capture { scope }.into_raw()) }
    })
}

/// Ends `capture` (consumed, also on failure) and instantiates its graph: on success
/// `*out` is the graph; release it with [`memarray_graph_free`]. A capture invalidated by
/// work illegal under it fails here (`MEMARRAY_STATUS_CUDA`); the stream works again
/// either way.
///
/// # Safety
/// `capture` is a live handle, not used afterwards; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_capture_end(
    capture: *mut memarray_capture,
    out: *mut *mut memarray_graph,
) -> memarray_status {
    guard(|| {
        if capture.is_null() {
            return Err(Error::arg("capture is NULL".to_string()));
        }
        // SAFETY: the caller's contract: a live handle, consumed here.
        let c = unsafe { memarray_capture::from_raw(capture) };
        check_out(out, "out")?; // `c` drops on failure: the capture ends, its graph goes
        let graph = c.scope.end()?;
        let nodes = graph.node_count()?;
        let exec = graph.instantiate()?;
        // SAFETY: checked above.
        unsafe { write_out(out, "out", memarray_graph { exec, nodes }.into_raw()) }
    })
}

/// Abandons a capture (NULL: nothing): it ends and what it recorded is thrown away.
///
/// # Safety
/// `capture` is NULL or a live handle, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_capture_free(capture: *mut memarray_capture) {
    // SAFETY: the caller's contract.
    unsafe { memarray_capture::free(capture) }
}

/// Launches `graph` on `stream` (of the graph's device), after the work queued there and
/// the pending work of the arrays the capture used; returns at once. The graph holds those
/// arrays until `memarray_graph_free` (freeing an array's handle earlier is safe), and the
/// launch becomes their pending work (a host read waits for it). An array that moved to
/// other device memory since the capture (a swap) fails the launch, nothing launched.
///
/// # Safety
/// `graph` and `stream` are live handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_graph_launch(
    graph: *const memarray_graph,
    stream: *const memarray_stream,
) -> memarray_status {
    // SAFETY: the caller's contract.
    unsafe { on_stream(graph, stream, GraphExec::launch) }
}

/// Uploads `graph` to its device on `stream` ahead of its first launch.
///
/// # Safety
/// `graph` and `stream` are live handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_graph_upload(
    graph: *const memarray_graph,
    stream: *const memarray_stream,
) -> memarray_status {
    // SAFETY: the caller's contract.
    unsafe { on_stream(graph, stream, GraphExec::upload) }
}

/// Runs `op` (a launch or an upload) of `graph` on `stream`; the work is ordered by the
/// stream, which the caller waits on.
///
/// # Safety
/// `graph` and `stream` are NULL or live handles.
unsafe fn on_stream(
    graph: *const memarray_graph,
    stream: *const memarray_stream,
    op: fn(&GraphExec, StreamRef) -> memarray_cuda::Result<Enqueued>,
) -> memarray_status {
    guard(|| {
        // SAFETY: the caller's contract.
        let (g, s) = unsafe {
            (
                memarray_graph::arg(graph, "graph")?,
                memarray_stream::arg(stream, "stream")?,
            )
        };
        drop(op(&g.exec, s.stream)?);
        Ok(())
    })
}

/// The number of nodes (kernels, copies, memsets, waits) the capture recorded; 0 for
/// NULL.
///
/// # Safety
/// `graph` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_graph_node_count(graph: *const memarray_graph) -> usize {
    // SAFETY: the caller's contract.
    unsafe { graph.as_ref() }.map_or(0, |g| g.nodes)
}

/// Releases a graph (NULL: nothing); launches already queued still run.
///
/// # Safety
/// `graph` is NULL or a live handle, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memarray_graph_free(graph: *mut memarray_graph) {
    // SAFETY: the caller's contract.
    unsafe { memarray_graph::free(graph) }
}
