//! Stream capture and graphs: what a stream's capture is, capturing into a graph,
//! instantiating it and launching it.

use cudarc::driver::sys;

use super::{CUstream, check, init};
use crate::error::Result;

pub(crate) use sys::{CUgraph, CUgraphExec};

/// A stream's capture status: `(0 none | 1 active | 2 invalidated, capture id)`.
///
/// # Safety
/// 1. `s` is a live stream (or 1/2) of the current context.
pub(crate) unsafe fn stream_capture_info(s: CUstream) -> Result<(u32, u64)> {
    init()?;
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id: sys::cuuint64_t = 0;
    // SAFETY: item 1; the out pointers are valid, the optional ones null (not asked).
    check("cuStreamGetCaptureInfo", unsafe {
        sys::cuStreamGetCaptureInfo_v2(
            s,
            &mut status,
            &mut id,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    })?;
    Ok((status as u32, id))
}

/// Begins capturing `s` in `mode` (0 global, 1 thread-local, 2 relaxed).
///
/// # Safety
/// 1. `s` is a live stream of the current context that is not a default stream.
pub(crate) unsafe fn stream_begin_capture(s: CUstream, mode: u32) -> Result<()> {
    init()?;
    let mode = match mode {
        0 => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
        1 => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        _ => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
    };
    // SAFETY: item 1.
    check("cuStreamBeginCapture", unsafe {
        sys::cuStreamBeginCapture_v2(s, mode)
    })
}

/// Ends the capture of `s`: the graph captured, or the driver's error (an invalidated
/// capture is `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`, its partial graph destroyed by the
/// driver). Either way `s` is no longer capturing.
///
/// # Safety
/// 1. `s` is a live stream of the current context that this thread began capturing.
pub(crate) unsafe fn stream_end_capture(s: CUstream) -> Result<CUgraph> {
    init()?;
    let mut g: CUgraph = std::ptr::null_mut();
    // SAFETY: item 1; the out pointer is valid.
    let r = unsafe { sys::cuStreamEndCapture(s, &mut g) };
    if r != sys::CUresult::CUDA_SUCCESS && !g.is_null() {
        // SAFETY: a graph the driver handed back with the error is ours to destroy.
        let _ignored = unsafe { sys::cuGraphDestroy(g) };
    }
    check("cuStreamEndCapture", r)?;
    Ok(g)
}

/// The number of nodes of `g`.
///
/// # Safety
/// 1. `g` is a live graph.
pub(crate) unsafe fn graph_node_count(g: CUgraph) -> Result<usize> {
    init()?;
    let mut n = 0usize;
    // SAFETY: item 1; a null node array asks for the count alone.
    check("cuGraphGetNodes", unsafe {
        sys::cuGraphGetNodes(g, std::ptr::null_mut(), &mut n)
    })?;
    Ok(n)
}

/// Instantiates `g` (no flags).
///
/// # Safety
/// 1. `g` is a live graph of the current context.
pub(crate) unsafe fn graph_instantiate(g: CUgraph) -> Result<CUgraphExec> {
    init()?;
    let mut e: CUgraphExec = std::ptr::null_mut();
    // SAFETY: item 1; the out pointer is valid.
    check("cuGraphInstantiateWithFlags", unsafe {
        sys::cuGraphInstantiateWithFlags(&mut e, g, 0)
    })?;
    Ok(e)
}

/// Launches `e` on `s`.
///
/// # Safety
/// 1. `e` is a live executable graph and `s` a live stream (or 1/2) of its context, which
///    is current; every address the graph's nodes use is valid until the launch has run.
pub(crate) unsafe fn graph_launch(e: CUgraphExec, s: CUstream) -> Result<()> {
    init()?;
    // SAFETY: item 1.
    check("cuGraphLaunch", unsafe { sys::cuGraphLaunch(e, s) })
}

/// Uploads `e`'s work to the device on `s` ahead of its first launch.
///
/// # Safety
/// As [`graph_launch`].
pub(crate) unsafe fn graph_upload(e: CUgraphExec, s: CUstream) -> Result<()> {
    init()?;
    // SAFETY: as graph_launch's item 1.
    check("cuGraphUpload", unsafe { sys::cuGraphUpload(e, s) })
}

/// Destroys `g`.
///
/// # Safety
/// 1. `g` is a live graph used by no other call.
pub(crate) unsafe fn graph_destroy(g: CUgraph) -> Result<()> {
    init()?;
    // SAFETY: item 1.
    check("cuGraphDestroy", unsafe { sys::cuGraphDestroy(g) })
}

/// Destroys `e` (launches already queued still run).
///
/// # Safety
/// 1. `e` is a live executable graph used by no other call.
pub(crate) unsafe fn graph_exec_destroy(e: CUgraphExec) -> Result<()> {
    init()?;
    // SAFETY: item 1.
    check("cuGraphExecDestroy", unsafe { sys::cuGraphExecDestroy(e) })
}
