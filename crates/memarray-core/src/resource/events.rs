//! Memory events that are not calls on a resource: spilling an array to the host and
//! restoring it (memarray-cuda's spill module). Kept in one process-wide log, bounded, so
//! the [`super::TrackingAdaptor`] (its timeline) and the [`super::LoggingAdaptor`] (its
//! CSV rows) show them next to the allocations they caused.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Instant, SystemTime};

/// One event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryEvent {
    /// Its number: 1, 2, ... in the order they happened.
    pub seq: u64,
    /// When (monotonic).
    pub at: Instant,
    /// When (wall clock, for logs).
    pub wall: SystemTime,
    /// `"spill"` or `"restore"`.
    pub kind: &'static str,
    /// The device whose memory it freed or took.
    pub device: u32,
    /// Device bytes.
    pub bytes: usize,
}

/// Most events kept; the oldest go first.
const KEPT: usize = 1 << 16;

static LOG: Mutex<VecDeque<MemoryEvent>> = Mutex::new(VecDeque::new());
static SEQ: AtomicU64 = AtomicU64::new(0);

/// Records an event.
pub fn note_event(kind: &'static str, device: u32, bytes: usize) {
    let mut log = LOG.lock().unwrap_or_else(PoisonError::into_inner);
    if log.len() >= KEPT {
        log.pop_front();
    }
    let seq = SEQ.fetch_add(1, Ordering::AcqRel) + 1;
    log.push_back(MemoryEvent {
        seq,
        at: Instant::now(),
        wall: SystemTime::now(),
        kind,
        device,
        bytes,
    });
}

/// The number of the last event (0: none yet); one atomic load.
pub fn last_event() -> u64 {
    SEQ.load(Ordering::Acquire)
}

/// The events after number `after` still kept, on `device` (every device: `None`).
pub fn events_since(after: u64, device: Option<u32>) -> Vec<MemoryEvent> {
    LOG.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter(|e| e.seq > after && device.is_none_or(|d| d == e.device))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_numbered_and_filtered_by_device() {
        let before = last_event();
        note_event("spill", 900, 10);
        note_event("restore", 901, 20);
        let all: Vec<_> = events_since(before, None)
            .into_iter()
            .filter(|e| e.device >= 900)
            .collect();
        assert_eq!(all.len(), 2);
        assert!(all[0].seq < all[1].seq && all[0].at <= all[1].at);
        let one = events_since(before, Some(901));
        assert_eq!(one.len(), 1);
        assert_eq!((one[0].kind, one[0].bytes), ("restore", 20));
    }
}
