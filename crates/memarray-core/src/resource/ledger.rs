//! What each library holds, and its budget: live bytes per [`Source`] and place (host
//! memory, each device) of every allocation through memarray's allocation path
//! ([`allocate_with_relief`](super::allocate_with_relief), freed through
//! [`deallocate_counted`]), kept as allocations come and go, so a monitor or an
//! out-of-memory report reads counters, never a list of allocations.
//!
//! A budget ([`set_budget`]) caps one library's live bytes on one place (or on every
//! device): an allocation that would pass it first spills memarray's arrays when the
//! library is memarray's own and spilling is on there, then fails with
//! [`CoreError::OutOfMemory`] naming the budget, while the other libraries keep
//! allocating. The check is one atomic add and one load ([`try_reserve`]), plus one load
//! for the place's [watermark](super::watermark).
//!
//! Counted are allocations that name their resource's place: a resource whose
//! [`device_id`](super::MemoryResource::device_id) is `Some(d)` counts on device `d`
//! (devices `0..MAX_DEVICES`; past that nothing is counted), any other on host memory.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use super::{Location, MemoryResource, Source};
use crate::error::CoreError;

/// Devices the ledger keeps counts for (ids `0..MAX_DEVICES`).
pub const MAX_DEVICES: usize = 64;

/// Host memory, then each device.
pub(super) const PLACES: usize = 1 + MAX_DEVICES;

/// No budget.
const NONE: u64 = u64::MAX;

type Table = [[AtomicU64; PLACES]; Source::MAX];

/// Live bytes per source and place.
static LIVE: Table = [const { [const { AtomicU64::new(0) }; PLACES] }; Source::MAX];
/// The budget in force per source and place (the place's own, else every device's):
/// what the allocation path reads.
static BUDGET: Table = [const { [const { AtomicU64::new(NONE) }; PLACES] }; Source::MAX];
/// Allocations refused by a budget, per source and place.
static REFUSED: Table = [const { [const { AtomicU64::new(0) }; PLACES] }; Source::MAX];

/// The budgets as set: per source, every device's, and each place's own. [`BUDGET`] is
/// recomputed from them under this lock.
struct Settings {
    every_device: [Option<u64>; Source::MAX],
    own: [[Option<u64>; PLACES]; Source::MAX],
}

static SETTINGS: Mutex<Settings> = Mutex::new(Settings {
    every_device: [None; Source::MAX],
    own: [[None; PLACES]; Source::MAX],
});

/// Where `resource`'s memory is, for the ledger: its device, else host memory.
pub fn location_of(resource: &dyn MemoryResource) -> Location {
    resource
        .device_id()
        .map_or(Location::Host, Location::Device)
}

/// The slot of `place` in the tables, or `None` for a device past [`MAX_DEVICES`].
fn slot(place: Location) -> Option<usize> {
    match place {
        Location::Host => Some(0),
        Location::Device(d) => ((d as usize) < MAX_DEVICES).then_some(1 + d as usize),
    }
}

/// The place of table slot `slot`.
fn at(slot: usize) -> Location {
    if slot == 0 {
        Location::Host
    } else {
        Location::Device((slot - 1) as u32)
    }
}

/// `place` in messages: "host memory" or "cuda:N".
pub(super) fn place_text(place: Location) -> String {
    match place {
        Location::Host => "host memory".into(),
        Location::Device(d) => format!("cuda:{d}"),
    }
}

/// Where a budget applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetScope {
    /// One place.
    Place(Location),
    /// Each device (a device's own budget, where set, takes precedence).
    EveryDevice,
}

/// Sets (`Some`) or removes (`None`) `source`'s budget in `scope`: the most live bytes
/// the library may hold there through memarray. Bytes it already holds stay; its next
/// allocation past the budget is refused. A device past [`MAX_DEVICES`] is refused.
///
/// # Errors
/// [`CoreError::BadBudget`] for a device past [`MAX_DEVICES`].
pub fn set_budget(source: Source, scope: BudgetScope, bytes: Option<u64>) -> Result<(), CoreError> {
    let mut s = SETTINGS.lock().unwrap_or_else(PoisonError::into_inner);
    let i = source.index();
    match scope {
        BudgetScope::EveryDevice => s.every_device[i] = bytes,
        BudgetScope::Place(place) => s.own[i][slot_of(place)?] = bytes,
    }
    for (slot, (cell, own)) in BUDGET[i].iter().zip(s.own[i]).enumerate() {
        let every = (slot > 0).then_some(s.every_device[i]).flatten();
        cell.store(own.or(every).unwrap_or(NONE), Ordering::Release);
    }
    Ok(())
}

/// The slot of `place` in the tables; [`CoreError::BadBudget`] past [`MAX_DEVICES`].
pub(super) fn slot_of(place: Location) -> Result<usize, CoreError> {
    slot(place).ok_or_else(|| CoreError::BadBudget {
        place: place_text(place),
        reason: format!("devices 0..{MAX_DEVICES} are counted"),
    })
}

/// Bytes every library holds on `slot` now.
pub(super) fn held_on(slot: usize) -> u64 {
    LIVE.iter()
        .map(|row| row[slot].load(Ordering::Acquire))
        .fold(0, u64::saturating_add)
}

/// The budget in force for `source` on `place`, if any.
pub fn budget(source: Source, place: Location) -> Option<u64> {
    let slot = slot(place)?;
    let b = BUDGET[source.index()][slot].load(Ordering::Acquire);
    (b != NONE).then_some(b)
}

/// One library's figures on one place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LibraryUsage {
    /// The library.
    pub source: Source,
    /// Where.
    pub place: Location,
    /// Bytes it holds now through memarray's allocation path.
    pub live_bytes: u64,
    /// Its budget there, if any.
    pub budget: Option<u64>,
    /// Allocations its budget refused there.
    pub refused: u64,
}

/// Every library's figures on every place where it holds memory, has a budget or was
/// refused; one pass over counters (no lock, no list of allocations).
pub fn usage() -> Vec<LibraryUsage> {
    let mut out = Vec::new();
    for source in Source::all() {
        let i = source.index();
        for slot in 0..PLACES {
            let live_bytes = LIVE[i][slot].load(Ordering::Acquire);
            let b = BUDGET[i][slot].load(Ordering::Acquire);
            let refused = REFUSED[i][slot].load(Ordering::Relaxed);
            if live_bytes > 0 || b != NONE || refused > 0 {
                out.push(LibraryUsage {
                    source,
                    place: at(slot),
                    live_bytes,
                    budget: (b != NONE).then_some(b),
                    refused,
                });
            }
        }
    }
    out
}

/// Bytes `source` holds on `place` now.
pub fn live_bytes(source: Source, place: Location) -> u64 {
    slot(place).map_or(0, |slot| LIVE[source.index()][slot].load(Ordering::Acquire))
}

/// One line saying who holds what on `place` through memarray ("held through memarray on
/// cuda:0: torch 3.0 GiB (budget 4.0 GiB), memarray 512.0 MiB"), largest first: for error
/// texts built where the full report cannot be (torch's allocator callback).
pub fn holders_line(place: Location) -> String {
    let mut rows: Vec<LibraryUsage> = usage()
        .into_iter()
        .filter(|u| u.place == place && (u.live_bytes > 0 || u.budget.is_some()))
        .collect();
    rows.sort_by_key(|u| std::cmp::Reverse(u.live_bytes));
    let held: Vec<String> = rows
        .iter()
        .map(|u| match u.budget {
            Some(b) => format!("{} {} (budget {})", u.source, size(u.live_bytes), size(b)),
            None => format!("{} {}", u.source, size(u.live_bytes)),
        })
        .collect();
    if held.is_empty() {
        format!("nothing held through memarray on {}", place_text(place))
    } else {
        format!(
            "held through memarray on {}: {}",
            place_text(place),
            held.join(", ")
        )
    }
}

/// `bytes` for a person: KiB, MiB or GiB with one decimal (bytes below 1 KiB).
fn size(bytes: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    UNITS
        .iter()
        .find(|(_, u)| bytes >= *u)
        .map_or(format!("{bytes} B"), |(name, u)| {
            format!("{:.1} {name}", bytes as f64 / *u as f64)
        })
}

/// The watermark per slot ([`super::watermark`] sets it), read on every allocation and
/// free.
static LEVEL: [AtomicU64; PLACES] = [const { AtomicU64::new(NONE) }; PLACES];
/// Whether the next rise past a slot's watermark is noted (false after a rise, until a
/// fall below it).
static ARMED: [std::sync::atomic::AtomicBool; PLACES] =
    [const { std::sync::atomic::AtomicBool::new(true) }; PLACES];
/// Told of each rise past a watermark (the watermark module's notifier).
static NOTIFY: std::sync::OnceLock<fn(usize, u64)> = std::sync::OnceLock::new();

/// Sets (or with `None` removes) the watermark of `slot`, armed.
pub(super) fn set_level(slot: usize, level: Option<u64>) {
    ARMED[slot].store(true, Ordering::Release);
    LEVEL[slot].store(level.map_or(NONE, |l| l.min(NONE - 1)), Ordering::Release);
}

/// Installs what is told of rises past watermarks (the first one installed stays).
pub(super) fn set_notify(notify: fn(usize, u64)) {
    let _ = NOTIFY.set(notify);
}

/// After an allocation counted on `slot`: one load; past a set watermark, armed, a note.
#[inline]
fn after_rise(slot: usize) {
    let level = LEVEL[slot].load(Ordering::Acquire);
    if level != NONE {
        rose(slot, level);
    }
}

#[cold]
fn rose(slot: usize, level: u64) {
    let held = held_on(slot);
    if held >= level
        && ARMED[slot].swap(false, Ordering::AcqRel)
        && let Some(notify) = NOTIFY.get()
    {
        notify(slot, held);
    }
}

/// After a free taken off `slot`: one load; below a set watermark, re-armed.
#[inline]
fn after_fall(slot: usize) {
    let level = LEVEL[slot].load(Ordering::Acquire);
    if level != NONE && held_on(slot) < level {
        ARMED[slot].store(true, Ordering::Release);
    }
}

/// What a refused reservation found: the budget and the bytes already held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverBudget {
    /// The budget.
    pub budget: u64,
    /// Bytes held before this allocation.
    pub live: u64,
}

/// Counts `bytes` more for `source` on `place` unless that passes its budget (then
/// nothing is counted). One atomic add and one load; a place past [`MAX_DEVICES`] counts
/// nothing and has no budget.
#[inline]
pub fn try_reserve(source: Source, place: Location, bytes: usize) -> Result<(), OverBudget> {
    let Some(slot) = slot(place) else {
        return Ok(());
    };
    let i = source.index();
    let b = bytes as u64;
    let before = LIVE[i][slot].fetch_add(b, Ordering::AcqRel);
    let budget = BUDGET[i][slot].load(Ordering::Acquire);
    if before.saturating_add(b) <= budget {
        after_rise(slot);
        return Ok(());
    }
    LIVE[i][slot].fetch_sub(b, Ordering::AcqRel);
    Err(OverBudget {
        budget,
        live: before,
    })
}

/// Counts a refusal by `source`'s budget on `place`.
pub(super) fn note_refused(source: Source, place: Location) {
    if let Some(slot) = slot(place) {
        REFUSED[source.index()][slot].fetch_add(1, Ordering::Relaxed);
    }
}

/// Takes `bytes` of `source` on `place` off the count (a free, or an allocation that
/// failed after [`try_reserve`]).
#[inline]
pub fn release(source: Source, place: Location, bytes: usize) {
    if let Some(slot) = slot(place) {
        LIVE[source.index()][slot].fetch_sub(bytes as u64, Ordering::AcqRel);
        after_fall(slot);
    }
}

/// Frees memory that [`allocate_with_relief`](super::allocate_with_relief) gave `source`
/// (the thread's [`current_source`](super::current_source) then, memarray's own outside
/// any glue): `resource.deallocate` with the same arguments, under `source` (so adaptors
/// that count per source count the free for it), then takes it off the ledger.
///
/// # Safety
/// As [`MemoryResource::deallocate`]: `ptr` came from `resource` with `(bytes, align)`
/// through the allocation path, for `source`, and is freed once.
pub unsafe fn deallocate_counted(
    resource: &dyn MemoryResource,
    source: Source,
    ptr: std::ptr::NonNull<u8>,
    bytes: usize,
    align: usize,
    stream: Option<super::RawStream>,
) {
    // SAFETY: the caller's contract.
    super::with_source(source, || unsafe {
        resource.deallocate(ptr, bytes, align, stream)
    });
    // Off the count once the resource has it back: a budget never lets the library's
    // next allocation in before this memory left it.
    release(source, location_of(resource), bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holders_line_names_each_library_largest_first_with_its_budget() {
        // Device 60 is this test's alone.
        let place = Location::Device(60);
        assert_eq!(
            holders_line(place),
            "nothing held through memarray on cuda:60"
        );
        let other = Source::register("line_b").unwrap();
        try_reserve(Source::MEMARRAY, place, 512 << 20).unwrap();
        try_reserve(other, place, 3 << 30).unwrap();
        set_budget(other, BudgetScope::Place(place), Some(4 << 30)).unwrap();
        assert_eq!(
            holders_line(place),
            "held through memarray on cuda:60: line_b 3.0 GiB (budget 4.0 GiB), memarray \
             512.0 MiB"
        );
        release(Source::MEMARRAY, place, 512 << 20);
        release(other, place, 3 << 30);
        set_budget(other, BudgetScope::Place(place), None).unwrap();
        assert_eq!(size(1000), "1000 B");
        assert_eq!(size(1536), "1.5 KiB");
    }

    #[test]
    fn a_place_past_the_counted_devices_counts_nothing_and_refuses_a_budget() {
        let far = Location::Device(MAX_DEVICES as u32);
        let s = Source::MEMARRAY;
        assert!(try_reserve(s, far, 1 << 40).is_ok());
        assert_eq!(live_bytes(s, far), 0);
        assert!(set_budget(s, BudgetScope::Place(far), Some(1)).is_err());
        assert_eq!(budget(s, far), None);
    }
}
