//! Soft watermarks: a callback of the user's when what memarray's allocation path holds on
//! a place (the [`ledger`]'s bytes of every library there) rises to a
//! watermark, before anything fails: the moment to trim a cache, shrink a batch, log.
//!
//! The allocation that crosses only queues a note (one load more per allocation and free
//! while no watermark is set; the libraries' counts are summed only on places that have
//! one); a notifier thread calls the callback, so a slow or failing callback never holds
//! an allocation up, and the callback may allocate or free through memarray. A watermark
//! fires once per rise: it re-arms when a free takes the bytes below it again.

use std::collections::HashMap;
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use super::Location;
use super::ledger;

/// Called on the notifier thread with the place, the bytes held there when it crossed,
/// and the watermark; an error (or a panic) is counted and the next notice goes on.
pub type WatermarkCallback = Arc<dyn Fn(Location, u64, u64) -> Result<(), String> + Send + Sync>;

/// One watermark as set, and what it did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatermarkStatistics {
    /// Where.
    pub place: Location,
    /// The bytes it watches for.
    pub watermark: u64,
    /// Rises past it (each one notice).
    pub crossings: u64,
    /// Notices whose callback returned an error or panicked.
    pub failures: u64,
}

struct Entry {
    row: WatermarkStatistics,
    callback: WatermarkCallback,
}

static ENTRIES: Mutex<Option<HashMap<usize, Entry>>> = Mutex::new(None);

fn with_entries<R>(f: impl FnOnce(&mut HashMap<usize, Entry>) -> R) -> R {
    let mut g = ENTRIES.lock().unwrap_or_else(PoisonError::into_inner);
    f(g.get_or_insert_with(HashMap::new))
}

/// The notifier thread's queue: (slot, bytes held at the crossing).
fn notifier() -> &'static Mutex<Sender<(usize, u64)>> {
    static TX: OnceLock<Mutex<Sender<(usize, u64)>>> = OnceLock::new();
    TX.get_or_init(|| {
        let (tx, rx) = channel::<(usize, u64)>();
        let spawned = std::thread::Builder::new()
            .name("memarray-watermarks".into())
            .spawn(move || {
                for (slot, held) in rx {
                    deliver(slot, held);
                }
            });
        // Without a thread no notice is delivered; the allocations go on regardless.
        drop(spawned);
        Mutex::new(tx)
    })
}

/// Calls the callback of `slot` (if still set) outside the registry's lock.
fn deliver(slot: usize, held: u64) {
    let Some((callback, place, level)) = with_entries(|e| {
        e.get(&slot)
            .map(|x| (x.callback.clone(), x.row.place, x.row.watermark))
    }) else {
        return;
    };
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        callback(place, held, level)
    }));
    if !matches!(ran, Ok(Ok(()))) {
        with_entries(|e| {
            if let Some(x) = e.get_mut(&slot) {
                x.row.failures += 1;
            }
        });
    }
}

/// Sets (`Some((bytes, callback))`) or removes (`None`) the watermark of `place` (one per
/// place; a second replaces the first). Set below what the place holds already, it fires
/// at the next allocation there.
///
/// # Errors
/// [`CoreError::BadBudget`](crate::CoreError::BadBudget) for a device past
/// [`ledger::MAX_DEVICES`].
pub fn set_watermark(
    place: Location,
    watermark: Option<(u64, WatermarkCallback)>,
) -> Result<(), crate::CoreError> {
    let slot = ledger::slot_of(place)?;
    match watermark {
        Some((bytes, callback)) => {
            let _ = notifier(); // the thread exists before the first crossing
            ledger::set_notify(noticed);
            with_entries(|e| {
                e.insert(
                    slot,
                    Entry {
                        row: WatermarkStatistics {
                            place,
                            watermark: bytes,
                            crossings: 0,
                            failures: 0,
                        },
                        callback,
                    },
                )
            });
            ledger::set_level(slot, Some(bytes));
        }
        None => {
            ledger::set_level(slot, None);
            with_entries(|e| e.remove(&slot));
        }
    }
    Ok(())
}

/// Every watermark set, with its counters.
pub fn watermarks() -> Vec<WatermarkStatistics> {
    let mut rows: Vec<_> = with_entries(|e| e.values().map(|x| x.row.clone()).collect());
    rows.sort_by_key(|r| ledger::slot_of(r.place).unwrap_or(usize::MAX));
    rows
}

/// The ledger's note of a rise past the watermark of `slot` (on the allocating thread):
/// counted, and queued for the notifier thread.
fn noticed(slot: usize, held: u64) {
    with_entries(|e| {
        if let Some(x) = e.get_mut(&slot) {
            x.row.crossings += 1;
        }
    });
    let tx = notifier().lock().unwrap_or_else(PoisonError::into_inner);
    let _ = tx.send((slot, held));
}
