//! Stream-ordered reuse: the event recorded at a free on a stream other than the legacy
//! default stream, and the check that a free block may go to another stream. A freed-on
//! stream is never named after the call that named it (it may be destroyed since).

use memarray_core::RawStream;

use super::{CachingPool, State, Tag};
use crate::event::Event;
use crate::stream::StreamRef;

impl State {
    /// Forgets free block `addr`'s event (it is reused on its own stream, merged into a
    /// newer block of that stream, or given back).
    pub(super) fn drop_event(&mut self, addr: usize) {
        if let Some(e) = self.freed.remove(&addr) {
            self.events.push(e);
        }
    }
}

impl CachingPool {
    /// Whether free block `addr`, freed on stream `from`, may be used on another stream
    /// now (the work queued before its free has completed; no host block). Any doubt (no
    /// device, an error) is a no.
    pub(super) fn block_idle(&self, st: &mut State, addr: usize, from: Tag) -> bool {
        let Some(device) = &self.device else {
            return true;
        };
        if let Some(e) = st.freed.get(&addr) {
            return e.is_complete().unwrap_or(false);
        }
        if from != RawStream::LEGACY.raw() {
            return false; // freed on a stream with no event: never happens; stay safe
        }
        // The legacy default stream lives as long as the context.
        let event = match st.events.pop() {
            Some(e) => e,
            None => match Event::new(device) {
                Ok(e) => e,
                Err(_) => return false,
            },
        };
        let idle =
            event.record(StreamRef::legacy()).is_ok() && event.is_complete().unwrap_or(false);
        st.events.push(event);
        idle
    }

    /// The live stream of the current call's tag (the caller named it just now).
    pub(super) fn stream_of(&self, tag: Tag) -> Option<StreamRef> {
        if self.device.is_none() || tag == 0 {
            return None;
        }
        // SAFETY: only called with the tag of the stream the current call passed, live
        // for the call (RawStream's contract).
        StreamRef::from_raw_stream(unsafe { RawStream::from_raw(tag) }).ok()
    }

    /// Records, on `stream` (live now), the event that says when free block `addr` may
    /// be used on another stream. Without an event the block is never reused elsewhere.
    pub(super) fn note_free(&self, st: &mut State, addr: usize, stream: StreamRef) {
        let Some(device) = &self.device else {
            return;
        };
        st.drop_event(addr);
        let event = match st.events.pop() {
            Some(e) => e,
            None => match Event::new(device) {
                Ok(e) => e,
                Err(_) => return,
            },
        };
        if event.record(stream).is_ok() {
            st.freed.insert(addr, event);
        } else {
            st.events.push(event);
        }
    }
}
