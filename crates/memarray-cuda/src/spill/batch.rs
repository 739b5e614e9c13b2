//! Each thread's batch of registry events ([`Event`]) and of resident-count changes, and
//! applying them; the two [`DeviceSpill`] calls that need an accurate registry first.

use std::cell::RefCell;
use std::sync::Weak;
use std::sync::atomic::Ordering;

use super::device::{DeviceSpill, SpillTarget, state_of, with_device};

thread_local! {
    /// Registry events of this thread not yet applied (see [`Event`]).
    pub(super) static PENDING: RefCell<Batch> = const {
        RefCell::new(Batch { events: Vec::new(), deltas: Vec::new() })
    };
}

/// What a call on an array told its device's registry. Events are kept per thread and
/// applied in batches of [`BATCH`], when this thread needs an accurate registry (making
/// room, statistics, a spill on request) or when the thread ends. An array dropped while
/// its listing is still this thread's last event takes the listing back at once, and one
/// made and dropped within a batch never reaches the registry: with spilling enabled and
/// no budget, making and dropping an array costs two thread-local pushes and its weak
/// handle (docs/spilling.md, "What spilling costs"). Other threads' unapplied events only
/// delay when their newest arrays become candidates.
pub(super) enum Event {
    Listed(u32, u64, usize, Weak<dyn SpillTarget>),
    Touched(u32, u64),
    Restored(u32, u64, usize, u64, bool, Weak<dyn SpillTarget>),
    Forgot(u32, u64),
}

const BATCH: usize = 64;

pub(super) struct Batch {
    pub(super) events: Vec<Event>,
    /// Per device without a budget: resident bytes this thread's calls added (or took
    /// away) that `resident_now` does not hold yet.
    pub(super) deltas: Vec<(u32, i64)>,
}

impl Batch {
    fn take(&mut self) -> (Vec<Event>, Vec<(u32, i64)>) {
        (
            std::mem::replace(&mut self.events, Vec::with_capacity(BATCH)),
            std::mem::take(&mut self.deltas),
        )
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        let (events, deltas) = self.take();
        apply(events, deltas);
    }
}

/// Records `e` (and `delta` resident bytes of its device, for a device without a budget)
/// in this thread's batch, applying the batch when it is full.
pub(super) fn push(e: Event, delta: i64) {
    let device = e.device();
    let mut e = Some(e);
    let full = PENDING
        .try_with(|p| {
            let mut p = p.borrow_mut();
            if delta != 0 {
                match p.deltas.iter_mut().find(|(d, _)| *d == device) {
                    Some((_, total)) => *total += delta,
                    None => p.deltas.push((device, delta)),
                }
            }
            let last = p.events.last();
            match (&e, last) {
                // A use right after the array's last event changes no order: skip it.
                (
                    Some(Event::Touched(_, id)),
                    Some(Event::Listed(_, l, ..) | Event::Touched(_, l)),
                ) if l == id => {
                    e = None;
                    return None;
                }
                // Dropped while its listing is still the last event: neither is news.
                (Some(Event::Forgot(_, id)), Some(Event::Listed(_, l, ..))) if l == id => {
                    p.events.pop();
                    e = None;
                    return None;
                }
                _ => {}
            }
            p.events.extend(e.take());
            (p.events.len() >= BATCH).then(|| p.take())
        })
        .ok()
        .flatten();
    if let Some((events, deltas)) = full {
        apply(events, deltas);
    }
    // The thread is ending (its batch is gone): apply this one now.
    if let Some(e) = e {
        let deltas = if delta == 0 {
            Vec::new()
        } else {
            vec![(device, delta)]
        };
        apply(vec![e], deltas);
    }
}

impl Event {
    /// The device whose registry the event is for, and the array it is about.
    fn target(&self) -> (u32, u64) {
        match self {
            Event::Listed(d, id, ..)
            | Event::Touched(d, id)
            | Event::Restored(d, id, ..)
            | Event::Forgot(d, id) => (*d, *id),
        }
    }

    fn device(&self) -> u32 {
        self.target().0
    }
}

/// Applies this thread's pending events now.
pub(super) fn flush() {
    let (events, deltas) = PENDING
        .try_with(|p| p.borrow_mut().take())
        .unwrap_or_default();
    apply(events, deltas);
}

fn apply(events: Vec<Event>, deltas: Vec<(u32, i64)>) {
    for (device, delta) in deltas {
        if delta != 0 {
            with_device(device, |d| {
                d.resident_now.fetch_add(delta, Ordering::Relaxed)
            });
        }
    }
    if events.is_empty() {
        return;
    }
    let skip = listed_and_forgotten(&events);
    for (i, e) in events.into_iter().enumerate() {
        if skip.get(i).copied().unwrap_or(false) {
            continue;
        }
        match e {
            Event::Listed(dev, id, bytes, target) => {
                if let Some(d) = state_of(dev) {
                    d.registry.register(id, bytes);
                    d.list(id, target);
                }
            }
            Event::Touched(dev, id) => {
                if let Some(d) = state_of(dev) {
                    d.registry.touch(id);
                }
            }
            Event::Restored(dev, id, bytes, ns, ahead, target) => {
                if let Some(d) = state_of(dev) {
                    if ahead {
                        d.registry.restored_ahead(id, bytes, ns);
                    } else {
                        d.registry.restored(id, bytes, ns);
                    }
                    d.list(id, target);
                }
            }
            Event::Forgot(dev, id) => {
                if let Some(d) = state_of(dev) {
                    d.forget(id);
                }
            }
        }
    }
}

/// Which events of a batch never reach the registry: from an array's listing on a device
/// to its first `Forgot` there, every event of that array on that device (made and
/// dropped, or moved away, within the batch). Its listing on another device, or a later
/// one on the same, is news. Walks back from the end holding the `Forgot`s not yet
/// matched; a batch holds at most [`BATCH`] events, so plain arrays on the stack.
fn listed_and_forgotten(events: &[Event]) -> [bool; BATCH] {
    let mut skip = [false; BATCH];
    let mut open = [((0u32, 0u64), 0usize); BATCH];
    let mut n_open = 0;
    for i in (0..events.len().min(BATCH)).rev() {
        let key = events[i].target();
        let found = open[..n_open].iter().position(|(k, _)| *k == key);
        match (&events[i], found) {
            // The nearest Forgot ends the window; a later one stays (it is harmless).
            (Event::Forgot(..), Some(k)) => open[k].1 = i,
            (Event::Forgot(..), None) => {
                open[n_open] = (key, i);
                n_open += 1;
            }
            (Event::Listed(..), Some(k)) => {
                let end = open[k].1;
                for t in i..=end {
                    if events[t].target() == key {
                        skip[t] = true;
                    }
                }
                n_open -= 1;
                open[k] = open[n_open];
            }
            _ => {}
        }
    }
    skip
}

impl DeviceSpill {
    /// Bytes by which the listed resident arrays plus `bytes` pass the budget (0 within it
    /// or without one).
    pub(super) fn over_budget(&self, bytes: usize) -> u64 {
        self.settings.device_budget.map_or(0, |budget| {
            (self.resident_bytes() + bytes as u64).saturating_sub(budget)
        })
    }

    /// Spills until the listed resident arrays plus `bytes` fit the budget (never `keep`).
    pub(super) fn within_budget(&self, bytes: usize, keep: Option<u64>) {
        let over = self.over_budget(bytes);
        if over > 0 {
            flush();
            self.make_room_waiting(over, keep);
        }
    }

    /// Array `id` was spilled on request, taking `ns`.
    pub(crate) fn note_spilled(&self, id: u64, bytes: usize, ns: u64) {
        flush();
        self.registry.note_spilled(id, bytes, ns);
    }
}
