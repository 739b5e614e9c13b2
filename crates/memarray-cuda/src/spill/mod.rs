//! Spilling past a device's capacity (docs/spilling.md).
//!
//! With spilling enabled on a device ([`enable`], or `MEMARRAY_SPILL` and friends read
//! once, [`enable_from_env`]), the device-resident arrays shared through
//! [`SharedArray`](crate::array::SharedArray) (every Python array) are listed in that device's
//! [`SpillRegistry`]. When a device allocation through memarray would take the listed
//! arrays past the device budget, or fails for lack of memory after the caches and the
//! other libraries gave theirs back ([`memarray_core::resource::allocate_with_relief`]),
//! arrays chosen by the [`memarray_core::spill::SpillPolicy`] move their data to their
//! host copy (made on demand: pinned within the host budget, in a file beyond it when a
//! spill directory is set) and free their device buffer. A spilled array keeps its
//! place ([`RawArray::location`](crate::RawArray::location) names the device,
//! [`RawArray::is_spilled`](crate::RawArray::is_spilled) says where the
//! data is) and every operation that needs its device data restores it first.
//!
//! Victims are never locked, exported (a live DLPack consumer, CUDA Array Interface
//! pointer, IPC handle or device view shares their buffer), producer memory, or in
//! use on a stream (their event or a consumer's recorded use is not complete: asked of
//! the driver, no host block). Lock order: a thread may hold one array's mutex while it
//! makes room (the array it is allocating for); the registry's mutex is never held while
//! a victim is spilled; victims' mutexes are taken with a try-lock only and skipped when
//! busy. No thread ever waits on a second array's mutex, so there is no cycle.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock, Weak};

use memarray_core::resource::{StatisticsAdaptor, pressure};
use memarray_core::spill::{SpillOutcome, SpillRegistry, SpillStatistics, Spiller};
use memarray_core::{FileResource, HostBuffer, HostResource, MemoryResource};

use crate::device::Device;
use crate::error::{ArrayError, CudaError, Result, SettingError};
use crate::stream::{Stream, StreamRef};

mod settings;
#[cfg(test)]
mod tests;

pub use crate::env::parse_bytes;
pub use settings::{SpillSettings, env_settings};

/// An array the registry can spill: memarray-cuda's `SharedArray` cell. The registry
/// holds it weakly and reaches it only through this trait (the array layer sits above).
pub(crate) trait SpillTarget: Send + Sync {
    /// Spills the array through `to` if it can go now: its mutex by try-lock, its refusal
    /// checked under it.
    fn try_spill(&self, to: &DeviceSpill) -> SpillOutcome;
}

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
    /// The epoch of the device state that listed the array ([`DeviceSpill::epoch`]).
    pub(crate) epoch: u64,
    /// [`GENERATION`] when the note was last checked against its device's state: while
    /// unchanged, no `enable` or `disable` happened since, and the note needs no lookup.
    pub(crate) generation: u64,
}

/// Counters of one device's spilling.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceSpillStatistics {
    /// The registry's counters: arrays and bytes spilled and restored, time spent,
    /// current spilled bytes, resident bytes, busy victims skipped.
    pub arrays: SpillStatistics,
    /// Host memory spilling allocated for host copies, live now.
    pub host_bytes: u64,
    /// File-backed host copies spilling made, live now.
    pub file_bytes: u64,
}

/// One device's spilling: its settings, registry, the arrays it may reach, the stream
/// spills copy on and the memory host copies come from.
pub(crate) struct DeviceSpill {
    device: u32,
    /// Which listing this is: new at each `enable` that finds spilling off on the device,
    /// kept when `enable` replaces settings (the arrays are adopted). A note from another
    /// epoch belongs to a registry that is gone.
    epoch: u64,
    settings: SpillSettings,
    registry: SpillRegistry,
    arrays: Mutex<HashMap<u64, Weak<dyn SpillTarget>>>,
    /// The stream spills copy on (memarray's own, non-blocking).
    stream: OnceLock<Stream>,
    /// Host copies made by spilling (pinned pool, pageable fallback), counted.
    host: Arc<StatisticsAdaptor>,
    pageable: Arc<StatisticsAdaptor>,
    /// The third tier, opened on first need.
    file: Mutex<Option<Arc<StatisticsAdaptor>>>,
    /// Device bytes of listed resident arrays (the registry learns of arrays in batches:
    /// [`Event`]); the budget is checked against it. With a budget it is kept at once;
    /// without one, each thread's changes wait in its batch ([`Batch::deltas`]) and are
    /// added when the batch applies. Signed: a thread may add the bytes another thread
    /// takes away, and the sum is what counts ([`resident_bytes`](Self::resident_bytes)).
    resident_now: AtomicI64,
}

static ACTIVE: AtomicBool = AtomicBool::new(false);
/// Bumped by every `enable` / `disable`: threads' cached device lookups go stale.
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// Numbers the device states' epochs.
static NEXT_EPOCH: AtomicU64 = AtomicU64::new(1);
static DEVICES: RwLock<Option<HashMap<u32, Arc<DeviceSpill>>>> = RwLock::new(None);
static ENV: OnceLock<std::result::Result<(), String>> = OnceLock::new();

fn devices() -> std::sync::RwLockReadGuard<'static, Option<HashMap<u32, Arc<DeviceSpill>>>> {
    DEVICES.read().unwrap_or_else(PoisonError::into_inner)
}

/// Whether spilling is on anywhere (the environment is read on the first ask): one
/// atomic load after that.
fn active() -> bool {
    if ENV.get().is_none() {
        // A bad environment is reported where it is read for the user (`check_env` at
        // start-up, `enable_from_env`'s own callers); here only whether spilling is on
        // matters, and a refused environment leaves it off.
        let _ = enable_from_env();
    }
    ACTIVE.load(Ordering::Acquire)
}

/// `device`'s spilling, if it is on there.
pub(crate) fn device_spill(device: u32) -> Option<Arc<DeviceSpill>> {
    with_device(device, |d| d.clone())
}

/// Runs `f` on `device`'s spilling, if it is on there, through this thread's cached view
/// (no lock, no hashing; `f` must not reach the registry's batches).
fn with_device<R>(device: u32, f: impl FnOnce(&Arc<DeviceSpill>) -> R) -> Option<R> {
    if !active() {
        return None;
    }
    let generation = GENERATION.load(Ordering::Acquire);
    let shared = || devices().as_ref().and_then(|m| m.get(&device).cloned());
    let slot = device as usize;
    let mut f = Some(f);
    let cached = LOOKUP.try_with(|c| {
        let mut c = c.borrow_mut();
        if c.0 != generation {
            *c = (generation, Vec::new());
        }
        if c.1.len() <= slot {
            c.1.resize_with(slot + 1, || None);
        }
        let entry = c.1[slot].get_or_insert_with(shared);
        entry.as_ref().map(|d| (f.take().expect("called once"))(d))
    });
    match cached {
        Ok(r) => r,
        // The thread is ending (its locals are being destroyed): ask the shared map.
        Err(_) => shared().map(|d| (f.take().expect("called once"))(&d)),
    }
}

/// One device in a thread's cached view: unasked yet, or what the shared map said.
type Cached = Option<Option<Arc<DeviceSpill>>>;

thread_local! {
    /// This thread's view of `DEVICES`, valid while `GENERATION` is unchanged.
    static LOOKUP: RefCell<(u64, Vec<Cached>)> =
        const { RefCell::new((u64::MAX, Vec::new())) };
    /// Registry events of this thread not yet applied (see [`Event`]).
    static PENDING: RefCell<Batch> = const {
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
enum Event {
    Listed(u32, u64, usize, Weak<dyn SpillTarget>),
    Touched(u32, u64),
    Restored(u32, u64, usize, u64, bool, Weak<dyn SpillTarget>),
    Forgot(u32, u64),
}

const BATCH: usize = 64;

struct Batch {
    events: Vec<Event>,
    /// Per device without a budget: resident bytes this thread's calls added (or took
    /// away) that `resident_now` does not hold yet.
    deltas: Vec<(u32, i64)>,
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
fn push(e: Event, delta: i64) {
    let mut e = Some(e);
    let full = PENDING
        .try_with(|p| {
            let mut p = p.borrow_mut();
            if delta != 0 {
                let device = e.as_ref().map_or(0, Event::device);
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
            vec![(e.device(), delta)]
        };
        apply(vec![e], deltas);
    }
}

impl Event {
    fn device(&self) -> u32 {
        match self {
            Event::Listed(d, ..)
            | Event::Touched(d, _)
            | Event::Restored(d, ..)
            | Event::Forgot(d, _) => *d,
        }
    }
}

/// Applies this thread's pending events now.
fn flush() {
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
    let id_of = |e: &Event| match e {
        Event::Listed(_, id, ..)
        | Event::Touched(_, id)
        | Event::Restored(_, id, ..)
        | Event::Forgot(_, id) => *id,
    };
    // Arrays listed and forgotten within the batch never reach the registry. (A batch
    // holds at most BATCH events: sorted arrays on the stack beat hashing here.)
    let mut gone = [0u64; BATCH];
    let mut n_gone = 0;
    for e in &events {
        if let Event::Forgot(_, id) = e
            && n_gone < BATCH
        {
            gone[n_gone] = *id;
            n_gone += 1;
        }
    }
    let gone = &mut gone[..n_gone];
    gone.sort_unstable();
    let mut born = [0u64; BATCH];
    let mut n_born = 0;
    for e in &events {
        if let Event::Listed(_, id, ..) = e
            && n_born < BATCH
            && gone.binary_search(id).is_ok()
        {
            born[n_born] = *id;
            n_born += 1;
        }
    }
    let born_here = &mut born[..n_born];
    born_here.sort_unstable();
    for e in events {
        let id = id_of(&e);
        if born_here.binary_search(&id).is_ok() {
            continue;
        }
        match e {
            Event::Listed(dev, id, bytes, target) => {
                if let Some(d) = device_spill(dev) {
                    d.registry.register(id, bytes);
                    d.list(id, target);
                }
            }
            Event::Touched(dev, id) => {
                if let Some(d) = device_spill(dev) {
                    d.registry.touch(id);
                }
            }
            Event::Restored(dev, id, bytes, ns, ahead, target) => {
                if let Some(d) = device_spill(dev) {
                    if ahead {
                        d.registry.restored_ahead(id, bytes, ns);
                    } else {
                        d.registry.restored(id, bytes, ns);
                    }
                    d.list(id, target);
                }
            }
            Event::Forgot(dev, id) => {
                if let Some(d) = device_spill(dev) {
                    d.forget(id);
                }
            }
        }
    }
}

/// Turns spilling on for `device` with `settings` (replacing earlier settings; arrays
/// already spilled stay spilled and come back as usual).
pub fn enable(device: u32, settings: SpillSettings) -> Result<()> {
    let dev = Device::get(device)?;
    if let Some(dir) = &settings.file_dir
        && !dir.is_dir()
    {
        return Err(CudaError::from(SettingError::Invalid {
            what: "spill directory",
            detail: format!("{} does not exist or is not a directory", dir.display()),
        }));
    }
    let pinned = crate::resource::pinned_pool(&dev);
    // Replacing settings keeps the epoch (the arrays are adopted below).
    let epoch = device_spill(device)
        .map_or_else(|| NEXT_EPOCH.fetch_add(1, Ordering::Relaxed), |d| d.epoch);
    let state = Arc::new(DeviceSpill {
        device,
        epoch,
        registry: SpillRegistry::new(settings.device_budget),
        settings,
        arrays: Mutex::new(HashMap::new()),
        stream: OnceLock::new(),
        host: Arc::new(StatisticsAdaptor::new(pinned)),
        pageable: Arc::new(StatisticsAdaptor::new(Arc::new(HostResource))),
        file: Mutex::new(None),
        resident_now: AtomicI64::new(0),
    });
    flush();
    let mut g = DEVICES.write().unwrap_or_else(PoisonError::into_inner);
    let map = g.get_or_insert_with(HashMap::new);
    if let Some(old) = map.insert(device, state.clone()) {
        // The arrays the old settings listed stay listed (counters start again).
        let old_arrays =
            std::mem::take(&mut *old.arrays.lock().unwrap_or_else(PoisonError::into_inner));
        state
            .arrays
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(old_arrays);
        state.registry.adopt(&old.registry);
        state
            .resident_now
            .store(old.resident_now.load(Ordering::Relaxed), Ordering::Relaxed);
    }
    let budgets = map.values().any(|d| d.settings.device_budget.is_some());
    drop(g);
    install_hooks(budgets);
    GENERATION.fetch_add(1, Ordering::AcqRel);
    ACTIVE.store(true, Ordering::Release);
    Ok(())
}

/// The pressure module's hooks: spilling at the end of the out-of-memory path, and the
/// budget check before memarray's own allocations only where a device has a budget.
fn install_hooks(budgets: bool) {
    pressure::set_spill_hooks(
        Some(Arc::new(relieve)),
        budgets.then(|| -> pressure::BudgetHook { Arc::new(make_room) }),
    );
}

/// Turns spilling off for `device`: nothing more is spilled there (spilled arrays still
/// come back when used).
pub fn disable(device: u32) {
    flush();
    let mut g = DEVICES.write().unwrap_or_else(PoisonError::into_inner);
    if let Some(map) = g.as_mut() {
        map.remove(&device);
        if map.is_empty() {
            ACTIVE.store(false, Ordering::Release);
            pressure::set_spill_hooks(None, None);
        } else {
            install_hooks(map.values().any(|d| d.settings.device_budget.is_some()));
        }
    }
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// The settings of `device`, if spilling is on there.
pub fn settings(device: u32) -> Option<SpillSettings> {
    device_spill(device).map(|d| d.settings.clone())
}

/// The counters of `device`, if spilling is on there.
pub fn statistics(device: u32) -> Option<DeviceSpillStatistics> {
    let d = device_spill(device)?;
    flush();
    let file_bytes = d
        .file
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
        .map_or(0, |f| f.statistics().current_bytes);
    Some(DeviceSpillStatistics {
        arrays: d.registry.statistics(),
        host_bytes: d.host.statistics().current_bytes + d.pageable.statistics().current_bytes,
        file_bytes,
    })
}

/// Applies [`env_settings`] once per process (later calls return the first outcome).
/// Memarray calls it on first use; the Python package calls it at import, so a bad
/// value is a `ValueError` there.
pub fn enable_from_env() -> std::result::Result<(), String> {
    ENV.get_or_init(|| {
        let Some((devices, settings)) = env_settings()? else {
            return Ok(());
        };
        for d in devices {
            match enable(d, settings.clone()) {
                // No driver here: nothing to spill from.
                Ok(()) | Err(CudaError::Unavailable { .. }) => {}
                Err(e) => return Err(format!("MEMARRAY_SPILL: cuda:{d}: {e}")),
            }
        }
        Ok(())
    })
    .clone()
}

/// Makes room for `bytes` more on `device` within its budget before memarray allocates
/// them (a no-op with spilling off or no budget).
fn make_room(device: u32, bytes: usize) {
    if let Some(d) = device_spill(device) {
        d.within_budget(bytes, None);
    }
}

/// The relief path's last step: spill at least `need` bytes of `device`'s arrays.
fn relieve(device: u32, need: usize) -> usize {
    match device_spill(device) {
        Some(d) => {
            flush();
            d.make_room_waiting(need as u64, None) as usize
        }
        None => 0,
    }
}

/// Tells the registry what a call on array `id` changed: `place` is
/// `RawArray::spill_place` (resident on, listed on), `target` makes the weak handle.
pub(crate) fn after_access(
    id: u64,
    note: &mut SpillNote,
    place: (Option<u32>, Option<u32>),
    nbytes: usize,
    target: impl FnOnce() -> Weak<dyn SpillTarget>,
) {
    if note.registered.is_none() && !active() {
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
        if has_budget && let Some(d) = device_spill(device) {
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

impl DeviceSpill {
    /// Spills until the listed resident arrays plus `bytes` fit the budget (never `keep`).
    fn within_budget(&self, bytes: usize, keep: Option<u64>) {
        let Some(budget) = self.settings.device_budget else {
            return;
        };
        let now = self.resident_bytes();
        let over = (now + bytes as u64).saturating_sub(budget);
        if over > 0 {
            flush();
            self.make_room_waiting(over, keep);
        }
    }

    /// Spills at least `need` bytes if it can. When the victims left are busy with queued
    /// work (the host ran ahead of the device: a prefetch loop queues copies and kernels
    /// faster than they run), the device is waited for once and the rest tried again: a
    /// budget or an allocation is worth that host block.
    /// Device bytes of listed resident arrays as far as this device knows them now (never
    /// below zero: a count taken away before another thread's addition arrived).
    fn resident_bytes(&self) -> u64 {
        u64::try_from(self.resident_now.load(Ordering::Relaxed)).unwrap_or(0)
    }

    fn make_room_waiting(&self, need: u64, keep: Option<u64>) -> u64 {
        let busy = self.registry.statistics().skipped_busy;
        let mut freed = self.registry.make_room(need, keep, self);
        if freed < need
            && self.registry.statistics().skipped_busy > busy
            && let Ok(dev) = Device::get(self.device)
            && dev.synchronize().is_ok()
        {
            freed += self.registry.make_room(need - freed, keep, self);
        }
        freed
    }

    fn list(&self, id: u64, target: Weak<dyn SpillTarget>) {
        self.arrays
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, target);
    }

    /// Array `id` was spilled on request, taking `ns`.
    pub(crate) fn note_spilled(&self, id: u64, bytes: usize, ns: u64) {
        flush();
        self.registry.note_spilled(id, bytes, ns);
    }

    fn forget(&self, id: u64) {
        self.registry.unregister(id);
        self.arrays
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
    }

    /// The stream spills copy on.
    pub(crate) fn stream(&self) -> Result<StreamRef> {
        Ok(self.stream_owned()?.as_ref())
    }

    fn stream_owned(&self) -> Result<&Stream> {
        if let Some(s) = self.stream.get() {
            return Ok(s);
        }
        let s = Stream::new(&Device::get(self.device)?)?;
        Ok(self.stream.get_or_init(|| s))
    }

    /// A host copy for a spill: pinned (pageable when pinning fails) within the host
    /// budget, from the spill file beyond it.
    pub(crate) fn host_for(&self, nbytes: usize) -> Result<HostBuffer> {
        let in_ram =
            self.host.statistics().current_bytes + self.pageable.statistics().current_bytes;
        let fits = self
            .settings
            .host_budget
            .is_none_or(|b| in_ram + nbytes as u64 <= b);
        if fits {
            // SAFETY: the spill's download writes every byte before anything reads it.
            return match unsafe { HostBuffer::uninit_in(nbytes, self.host.clone()) } {
                Ok(h) => Ok(h),
                Err(_) => {
                    crate::resource::count_fallback(nbytes);
                    Ok(HostBuffer::zeroed_in(nbytes, self.pageable.clone())?)
                }
            };
        }
        let Some(dir) = &self.settings.file_dir else {
            return Err(ArrayError::NotSpillable {
                reason: "the host budget is spent and no spill directory is set",
            }
            .into());
        };
        let file = {
            let mut g = self.file.lock().unwrap_or_else(PoisonError::into_inner);
            match &*g {
                Some(f) => f.clone(),
                None => {
                    let path = dir.join(format!(
                        "memarray-spill-{}-cuda{}",
                        std::process::id(),
                        self.device
                    ));
                    let f = FileResource::create(&path)?;
                    // Mapped regions outlive the name: the file goes with the process. A
                    // name left behind (a read-only directory entry) costs a stray file,
                    // never data: nothing opens it by name again.
                    let _ = std::fs::remove_file(&path);
                    let f = Arc::new(StatisticsAdaptor::new(Arc::new(f)));
                    *g = Some(f.clone());
                    f
                }
            }
        };
        Ok(HostBuffer::zeroed_in(
            nbytes,
            file as Arc<dyn MemoryResource>,
        )?)
    }
}

impl Spiller for DeviceSpill {
    fn try_spill(&self, id: u64) -> SpillOutcome {
        let target = self
            .arrays
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id)
            .and_then(Weak::upgrade);
        match target {
            Some(t) => t.try_spill(self),
            None => SpillOutcome::Gone,
        }
    }
}
