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

/// The graph `s`'s capture records into, if `s` is being captured (active, not
/// invalidated): valid until the capture ends.
///
/// # Safety
/// 1. `s` is a live stream (or 1/2) of the current context.
pub(crate) unsafe fn stream_capture_graph(s: CUstream) -> Result<Option<CUgraph>> {
    init()?;
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut graph: CUgraph = std::ptr::null_mut();
    // SAFETY: item 1; the out pointers are valid, the other optional ones null.
    check("cuStreamGetCaptureInfo", unsafe {
        sys::cuStreamGetCaptureInfo_v2(
            s,
            &mut status,
            std::ptr::null_mut(),
            &mut graph,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    })?;
    Ok(
        (status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE && !graph.is_null())
            .then_some(graph),
    )
}

/// Gives graph `g` (one being captured, or built) a reference that calls `release(data)`
/// once `g`, every graph it is cloned into and every executable made from them are
/// destroyed and their launches have completed (CUDA's user objects). `release` runs on a
/// driver thread and must make no CUDA call. On an error nothing is kept and `release` is
/// not called: `data` is the caller's again.
///
/// # Safety
/// 1. `g` is a live graph of the current context; `release(data)` is sound to call once,
///    from any thread, at any later time.
pub(crate) unsafe fn graph_keep(
    g: CUgraph,
    data: *mut std::ffi::c_void,
    release: unsafe extern "C" fn(*mut std::ffi::c_void),
) -> Result<()> {
    init()?;
    let mut obj: sys::CUuserObject = std::ptr::null_mut();
    // SAFETY: item 1; one reference, owned here until moved to the graph below.
    check("cuUserObjectCreate", unsafe {
        sys::cuUserObjectCreate(
            &mut obj,
            data,
            Some(release),
            1,
            sys::CUuserObject_flags::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC as u32,
        )
    })?;
    // SAFETY: item 1; the reference created above moves to the graph.
    let moved = unsafe {
        sys::cuGraphRetainUserObject(
            g,
            obj,
            1,
            sys::CUuserObjectRetain_flags::CU_GRAPH_USER_OBJECT_MOVE as u32,
        )
    };
    if moved != sys::CUresult::CUDA_SUCCESS {
        // Our reference is still ours: dropping it would call `release`, which the
        // caller must not see on an error. The object is leaked (a few bytes) instead.
        return check("cuGraphRetainUserObject", moved);
    }
    Ok(())
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
