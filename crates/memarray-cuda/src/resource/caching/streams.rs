//! Stream-ordered reuse: the event recorded at a free on a stream that may not outlive the
//! call (a foreign stream, or the per-thread default stream, which names another stream
//! on another thread), and the check that a free block may go to another stream. Such a
//! stream is never named after the call that named it (it may be destroyed since). The
//! legacy default stream and memarray's own streams (recycled, never destroyed) need no
//! event at the free: one is recorded on them when it is needed, at a reuse elsewhere or a
//! give-back, which keeps a free on them at the pool's bare cost.

use memarray_core::RawStream;

use super::{CachingPool, LargeBlock, State, Tag};
use crate::event::Event;
use crate::graph::Capture;
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
        if self.device.is_none() {
            return true;
        }
        if let Some(e) = st.freed.get(&addr) {
            return e.is_complete().unwrap_or(false);
        }
        // Freed on a lasting stream: what is queued there now includes the free's work.
        let Some(event) = self.event_now(st, from) else {
            return false; // a stream with no event that may be gone: never happens; stay safe
        };
        let idle = event.is_complete().unwrap_or(false);
        st.events.push(event);
        idle
    }

    /// The event that orders the reuse or give-back of free block `addr`, freed on `tag`:
    /// the one recorded at its free, or one recorded now on a lasting stream (`None` for
    /// the legacy default stream, which the give-back itself runs on). The caller hands
    /// the event back to `st.events` when done.
    pub(super) fn order_event(&self, st: &mut State, addr: usize, tag: Tag) -> Option<Event> {
        if let Some(e) = st.freed.remove(&addr) {
            return Some(e);
        }
        if tag == RawStream::LEGACY.raw() {
            return None;
        }
        self.event_now(st, tag)
    }

    /// An event recorded now on `tag` if it is a lasting stream (the legacy default
    /// stream or one of memarray's own); `None` otherwise or on error.
    fn event_now(&self, st: &mut State, tag: Tag) -> Option<Event> {
        let device = self.device.as_ref()?;
        if !lasting(tag) {
            return None;
        }
        // SAFETY: a lasting stream lives as long as its context (checked above).
        let stream = StreamRef::from_raw_stream(unsafe { RawStream::from_raw(tag) }).ok()?;
        let event = match st.events.pop() {
            Some(e) => e,
            None => Event::new(device).ok()?,
        };
        if event.record(stream).is_ok() {
            Some(event)
        } else {
            st.events.push(event);
            None
        }
    }

    /// Whether the current call's stream `tag` is being captured into a graph (any doubt
    /// is a yes). Then no block of another stream is taken: that would query events, which
    /// a capture in global or thread-local mode forbids (the query invalidates it).
    pub(super) fn capturing(&self, tag: Tag) -> bool {
        let (Some(device), Some(stream)) = (&self.device, self.stream_of(tag)) else {
            return false;
        };
        !matches!(stream.capture(device), Ok(Capture::None))
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

    /// Puts free large block `b` at `addr` in the cache, freed on its stream (the current
    /// call's), and notes the free ([`note_free`](Self::note_free)).
    pub(super) fn cache_free(&self, st: &mut State, addr: usize, b: LargeBlock) {
        st.large.insert(addr, b);
        st.large_free
            .entry(b.tag)
            .or_default()
            .insert((b.size, addr));
        self.note_free(st, addr, b.tag);
    }

    /// Notes that block `addr` is free on `tag`, the stream the current call named: an
    /// older event of the block goes, and on a stream that may not outlive the call the
    /// event that says when the block may be used on another stream is recorded now (on
    /// a lasting stream one is recorded when needed). Without an event a block freed on
    /// a passing stream is never reused elsewhere.
    pub(super) fn note_free(&self, st: &mut State, addr: usize, tag: Tag) {
        st.drop_event(addr);
        if lasting(tag) {
            return;
        }
        let (Some(device), Some(stream)) = (&self.device, self.stream_of(tag)) else {
            return;
        };
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

/// Whether a stream outlives every call: the legacy default stream, or one memarray
/// created (recycled, never destroyed). Not the per-thread default stream: its handle
/// names a different stream on each thread.
fn lasting(tag: Tag) -> bool {
    tag == RawStream::LEGACY.raw() || (tag > 2 && crate::stream::is_owned(tag))
}
