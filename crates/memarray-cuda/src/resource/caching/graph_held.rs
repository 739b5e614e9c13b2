//! Blocks held for a graph: a block freed on a stream being captured may be used by the
//! capture's kernels at every launch of its graph, so it is not reused until the graph
//! and every executable made from it are destroyed and their launches done. The graph
//! owns a CUDA user object per such block; its release (on a driver thread, where no CUDA
//! call is allowed) queues the block in [`Returned`], and the pool's next call frees it
//! for real, on the legacy default stream (the graph's work on it is complete).

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use memarray_core::RawStream;

use super::{CachingPool, State};
use crate::driver;

/// Blocks whose graphs are gone, waiting for the pool's next call.
#[derive(Debug, Default)]
pub(super) struct Returned {
    /// How many are queued: the pool's calls look at the list only when it is not zero.
    count: AtomicUsize,
    blocks: Mutex<Vec<usize>>,
}

/// What a graph's user object carries: the block and where to return it.
struct Release {
    to: Arc<Returned>,
    addr: usize,
}

/// The user object's destructor: queues the block (no CUDA call).
unsafe extern "C" fn release(data: *mut std::ffi::c_void) {
    // SAFETY: `data` is the `Box<Release>` `held_for_graph` handed the driver, released
    // once (graph_keep's contract).
    let r = unsafe { Box::from_raw(data.cast::<Release>()) };
    let mut blocks = r.to.blocks.lock().unwrap_or_else(PoisonError::into_inner);
    blocks.push(r.addr);
    r.to.count.store(blocks.len(), Ordering::Release);
}

impl CachingPool {
    /// If `stream` is being captured, makes the capture's graph hold the block at `ptr`
    /// (still live in the pool, still handed out as the NVTX map says) and returns true.
    /// The legacy default stream is never captured: no driver call there. Any doubt (no
    /// answer, no user object) frees the block as usual.
    pub(super) fn held_for_graph(
        &self,
        st: &State,
        ptr: NonNull<u8>,
        stream: Option<RawStream>,
    ) -> bool {
        let addr = ptr.as_ptr() as usize;
        let tag = self.tag(stream);
        if tag == RawStream::LEGACY.raw() || !st.live.contains_key(&addr) {
            return false;
        }
        let (Some(device), Some(s)) = (&self.device, self.stream_of(tag)) else {
            return false;
        };
        let Ok(Some(graph)) = s.capture_graph(device) else {
            return false;
        };
        let Ok(_bound) = device.bind() else {
            return false;
        };
        let data = Box::into_raw(Box::new(Release {
            to: self.returned.clone(),
            addr,
        }));
        // SAFETY: the capture's live graph, its context bound; `release` takes the box
        // back once, from any thread.
        match unsafe { driver::graph_keep(graph, data.cast(), release) } {
            Ok(()) => true,
            Err(e) => {
                // SAFETY: not handed to the driver after all: ours to drop.
                drop(unsafe { Box::from_raw(data) });
                crate::parked::park("holding a block for a graph", e);
                false
            }
        }
    }

    /// Frees, on the legacy default stream, the blocks whose graphs are gone.
    pub(super) fn take_returned(&self, st: &mut State) {
        if self.returned.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let blocks = {
            let mut queued = self
                .returned
                .blocks
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            self.returned.count.store(0, Ordering::Release);
            std::mem::take(&mut *queued)
        };
        st.graph_held = st.graph_held.saturating_sub(blocks.len());
        for addr in blocks {
            if let Some(p) = NonNull::new(addr as *mut u8) {
                self.free_in(st, p, Some(RawStream::LEGACY));
            }
        }
    }
}
