//! What calls on an array tell its device's spilling ([`SpillNote`], kept with each
//! `SharedArray`): listed when it becomes resident, used, restored, spilled, dropped; and
//! a note from a device state that is gone (a `disable`) is forgotten.

use std::sync::Weak;
use std::sync::atomic::Ordering;

use super::batch::{Event, push};
use super::device::{GENERATION, SpillTarget, state_of, with_device};

/// What the spill registries know of an array; kept with its `SharedArray`.
#[derive(Debug, Default)]
pub(crate) struct SpillNote {
    /// The device whose registry lists the array (resident or spilled).
    pub(crate) registered: Option<u32>,
    /// Nanoseconds of a restore the registry has not been told of yet.
    pub(crate) restored_ns: Option<u64>,
    /// That restore was a prefetch (ahead of use).
    pub(crate) ahead: bool,
    /// Device bytes this array adds to its device's resident count now.
    pub(crate) counted: usize,
    /// They were added to the count at once (the device has a budget), not through this
    /// thread's batch: they are taken away the same way.
    pub(crate) at_once: bool,
    /// The epoch of the device state that listed the array (`DeviceSpill::epoch`).
    pub(crate) epoch: u64,
    /// [`GENERATION`] when the note was last checked against its device's state: while
    /// unchanged, no `enable` or `disable` happened since, and the note needs no lookup.
    pub(crate) generation: u64,
}

/// Tells the registry what a call on array `id` changed: `place` is
/// `RawArray::spill_place` (resident on, listed on), `captured` says the call was
/// captured into a CUDA graph (an array listed then spills nothing to keep the budget: a
/// spill copies and waits on the host, which a capture forbids; the next allocation
/// outside the capture makes the room), `target` makes the weak handle.
pub(crate) fn after_access(
    id: u64,
    note: &mut SpillNote,
    place: (Option<u32>, Option<u32>),
    nbytes: usize,
    captured: bool,
    target: impl FnOnce() -> Weak<dyn SpillTarget>,
) {
    if note.registered.is_none() && !super::active() {
        return;
    }
    revalidate(note);
    let (resident, listed_on) = place;
    if let Some(old) = note.registered
        && Some(old) != listed_on
    {
        forget(id, note);
    }
    let Some(device) = listed_on else {
        return;
    };
    if resident.is_some()
        && note.registered == Some(device)
        && note.counted == nbytes
        && note.restored_ns.is_none()
    {
        // A use of a listed resident array: the hot path, no lookup.
        push(Event::Touched(device, id), 0);
        return;
    }
    let change = if resident.is_some() {
        nbytes as i64 - note.counted as i64
    } else {
        0
    };
    let Some((has_budget, epoch)) = with_device(device, |d| {
        let budget = d.settings.device_budget.is_some();
        if budget && change != 0 {
            d.resident_now.fetch_add(change, Ordering::Relaxed);
        }
        (budget, d.epoch)
    }) else {
        return;
    };
    note.epoch = epoch;
    if resident.is_none() {
        // Spilled: it left the resident count when it spilled.
        note.registered = Some(device);
        return;
    }
    // Without a budget the count waits in this thread's batch.
    let delta = if has_budget { 0 } else { change };
    note.counted = nbytes;
    note.at_once = has_budget;
    if let Some(ns) = note.restored_ns.take() {
        memarray_core::resource::events::note_event("restore", device, nbytes);
        let ahead = std::mem::take(&mut note.ahead);
        push(
            Event::Restored(device, id, nbytes, ns, ahead, target()),
            delta,
        );
    } else if note.registered == Some(device) {
        push(Event::Touched(device, id), delta);
    } else {
        push(Event::Listed(device, id, nbytes, target()), delta);
        note.registered = Some(device);
        // Made without memarray's allocation hook (an import, a born array listed on
        // first use): the budget holds from here on.
        if has_budget
            && !captured
            && let Some(d) = state_of(device)
        {
            d.within_budget(0, Some(id));
        }
    }
    note.registered = Some(device);
}

/// Takes a dropped (or handed out) array out of the registry that lists it.
pub(crate) fn forget(id: u64, note: &mut SpillNote) {
    revalidate(note);
    if let Some(device) = note.registered.take() {
        let counted = std::mem::take(&mut note.counted) as i64;
        // Taken away as it was added: at once, or through this thread's batch.
        let delta = if std::mem::take(&mut note.at_once) {
            if counted > 0 {
                with_device(device, |d| {
                    d.resident_now.fetch_sub(counted, Ordering::Relaxed)
                });
            }
            0
        } else {
            -counted
        };
        push(Event::Forgot(device, id), delta);
    }
}

/// Forgets what `note` says of a device state that is gone (spilling was disabled there,
/// and maybe enabled again: a new registry that never listed the array, a count that
/// never held its bytes), so the array is listed afresh at its next use. One atomic load
/// while no `enable` or `disable` happened since the note was last checked.
fn revalidate(note: &mut SpillNote) {
    let generation = GENERATION.load(Ordering::Acquire);
    if note.generation == generation {
        return;
    }
    note.generation = generation;
    let Some(device) = note.registered else {
        return;
    };
    if with_device(device, |d| d.epoch) != Some(note.epoch) {
        note.registered = None;
        note.counted = 0;
        note.at_once = false;
    }
}

/// An array spilled `bytes` from `device`: it no longer counts as resident, and the
/// event is logged.
pub(crate) fn left_device(note: &mut SpillNote, device: u32, bytes: usize) {
    memarray_core::resource::events::note_event("spill", device, bytes);
    revalidate(note);
    let counted = std::mem::take(&mut note.counted) as i64;
    if let Some(epoch) = with_device(device, |d| {
        d.resident_now.fetch_sub(counted, Ordering::Relaxed);
        d.epoch
    }) {
        // The spilled array is this state's now (the caller marks it registered).
        note.epoch = epoch;
    }
}
