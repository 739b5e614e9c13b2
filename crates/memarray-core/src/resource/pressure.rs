//! Shared memory pressure: when an allocation through memarray runs out of memory,
//! memarray first gives back its own cached blocks, then asks every other library it
//! knows to be loaded (torch, CuPy, RMM pools ...) to give back theirs, then retries once.
//!
//! Libraries come in as [relievers](register_reliever): the Python bindings register
//! one per library it can reach. Users add their own ([`add_reliever`]: a cache of
//! theirs, a model's KV blocks), asked in priority order, one at a time with a retry
//! after each, once the caches were given back and the retry failed, before spilling. [`allocate_with_relief`] is the allocation path that runs
//! the steps; the glue for torch, CuPy, Numba and RMM and memarray's own device buffers
//! all allocate through it. Every step is counted ([`pressure_statistics`]).

use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError};

use super::ledger;
use super::{Location, MemoryResource, RawStream, Source};
use crate::error::{CoreError, Result};

/// Gives cached memory of one library back on a device (`None`: host memory); returns
/// the bytes it released where it knows them (else 0), or `None` when the library is not
/// loaded in this process (then it was not asked, and is not counted).
pub type Reliever = Arc<dyn Fn(Option<u32>) -> Option<usize> + Send + Sync>;

/// Frees device memory of one device by spilling arrays (memarray-cuda's spill module):
/// called with the device and the bytes wanted, returns the device bytes it freed.
pub type SpillHook = Arc<dyn Fn(u32, usize) -> usize + Send + Sync>;

/// Keeps memarray's arrays on one device within a budget before memarray allocates
/// there (memarray-cuda's spill module): called with the device, the bytes about to be
/// allocated and the allocation's stream (a stream being captured spills nothing).
pub type BudgetHook = Arc<dyn Fn(u32, usize, Option<RawStream>) + Send + Sync>;

/// Whether `stream` of a device is being captured into a CUDA graph (memarray-cuda's
/// graph module). Under a capture no relief step runs: giving caches back frees memory
/// and waits, spilling copies and waits on the host, and a capture forbids or cannot
/// replay all of it; the allocation's first out-of-memory error is returned, saying so.
pub type CaptureProbe = fn(u32, Option<RawStream>) -> bool;

static CAPTURE_PROBE: std::sync::OnceLock<CaptureProbe> = std::sync::OnceLock::new();

/// Installs the [`CaptureProbe`] (the first one installed stays).
pub fn set_capture_probe(probe: CaptureProbe) {
    let _ = CAPTURE_PROBE.set(probe);
}

/// Whether `stream` of `device` is being captured, by the installed probe (never without
/// one).
fn captured(device: Option<u32>, stream: Option<RawStream>) -> bool {
    match (device, CAPTURE_PROBE.get()) {
        (Some(d), Some(probe)) => probe(d, stream),
        _ => false,
    }
}

/// A reliever of the user's ([`add_reliever`]): called under pressure with the device
/// (`None`: host memory) and the bytes the failing allocation asked for; returns the bytes
/// it freed where it knows them (else 0), or why it failed.
pub type UserReliever =
    Arc<dyn Fn(Option<u32>, usize) -> std::result::Result<usize, String> + Send + Sync>;

/// How a user reliever is registered, and what it did: its row in
/// [`PressureStatistics::user_relievers`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserRelieverStatistics {
    /// The id [`add_reliever`] returned.
    pub id: u64,
    /// Its name, for reports.
    pub name: String,
    /// The device it serves (`None`: every device and host memory).
    pub device: Option<u32>,
    /// The library whose memory it frees (`None`: the user's own): it is not asked while
    /// that library allocates (freeing that library's memory from inside its allocator
    /// would re-enter it).
    pub library: Option<Source>,
    /// Higher runs first.
    pub priority: i32,
    /// Times asked.
    pub calls: u64,
    /// Bytes it reported freed.
    pub released_bytes: u64,
    /// Times it failed (an error returned, or a panic caught).
    pub failures: u64,
}

/// Counters of the relief path, process-wide.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PressureStatistics {
    /// Allocations that ran out of memory and started the relief steps.
    pub events: u64,
    /// Of those, the ones whose retry succeeded.
    pub recovered: u64,
    /// Of those, the ones that failed again (the caller got out-of-memory).
    pub failed: u64,
    /// Bytes memarray's own resources gave back (step one).
    pub own_released_bytes: u64,
    /// Of the events, those where spilling arrays ran (the last step), and the device
    /// bytes it freed.
    pub spills: u64,
    /// Device bytes spilling freed for them.
    pub spilled_bytes: u64,
    /// Per reliever: (library, times asked, bytes it reported released); a library not
    /// loaded when relief ran was not asked.
    pub relievers: Vec<(Source, u64, u64)>,
    /// The user's relievers, in the order they run.
    pub user_relievers: Vec<UserRelieverStatistics>,
}

#[derive(Default)]
struct State {
    relievers: Vec<(Source, Reliever)>,
    /// The user's relievers, each with its row (priority order, then registration);
    /// [`pressure_statistics`] copies the rows into `user_relievers`.
    user: Vec<(UserRelieverStatistics, UserReliever)>,
    spill: Option<SpillHook>,
    budget: Option<BudgetHook>,
    stats: PressureStatistics,
}

/// Installs (or with `None` removes) spilling: `spill` is the last step of the relief
/// path (any library's allocation through memarray that ran out), `budget` runs before
/// memarray's own device allocations.
pub fn set_spill_hooks(spill: Option<SpillHook>, budget: Option<BudgetHook>) {
    with_state(|st| {
        st.spill = spill;
        st.budget = budget;
    });
    HOOKED.store(
        with_state(|st| st.budget.is_some()),
        std::sync::atomic::Ordering::Release,
    );
    SPILLING.store(
        with_state(|st| st.spill.is_some()),
        std::sync::atomic::Ordering::Release,
    );
}

/// Whether spilling is on for some device (a spill hook is installed): one atomic load.
pub fn spilling() -> bool {
    SPILLING.load(std::sync::atomic::Ordering::Acquire)
}

static SPILLING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether a budget hook is installed (read on every allocation: one atomic load).
static HOOKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn with_state<R>(f: impl FnOnce(&mut State) -> R) -> R {
    let mut g = STATE.lock().unwrap_or_else(PoisonError::into_inner);
    f(g.get_or_insert_with(State::default))
}

/// Registers `reliever` as the way to make `library` give memory back (a second
/// registration for the same library replaces the first).
pub fn register_reliever(library: Source, reliever: Reliever) {
    with_state(|st| {
        st.relievers.retain(|(s, _)| *s != library);
        st.relievers.push((library, reliever));
        if !st.stats.relievers.iter().any(|(s, ..)| *s == library) {
            st.stats.relievers.push((library, 0, 0));
        }
    });
}

/// Registers a reliever of the user's for `device` (`None`: every device and host memory)
/// that frees memory of `library` (`None`: the user's own); relievers run in `priority`
/// order (higher first; equal ones in registration order), one at a time, after the
/// caches were given back and the retry failed, each followed by a retry, until the
/// allocation succeeds. Returns the id [`remove_reliever`] takes.
///
/// A reliever runs with no lock of memarray's held and may free or allocate memory through
/// memarray (an allocation it makes that runs out asks no user reliever: no recursion); an
/// error it returns or a panic is counted and the next one runs.
pub fn add_reliever(
    name: &str,
    reliever: UserReliever,
    device: Option<u32>,
    library: Option<Source>,
    priority: i32,
) -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    with_state(|st| {
        let at = st
            .user
            .iter()
            .position(|(r, _)| r.priority < priority)
            .unwrap_or(st.user.len());
        let row = UserRelieverStatistics {
            id,
            name: name.to_string(),
            device,
            library,
            priority,
            ..Default::default()
        };
        st.user.insert(at, (row, reliever));
    });
    id
}

/// Removes the user's reliever `id`; returns whether it was registered. A call of it in
/// progress on another thread finishes.
pub fn remove_reliever(id: u64) -> bool {
    with_state(|st| {
        let before = st.user.len();
        st.user.retain(|(r, _)| r.id != id);
        st.user.len() < before
    })
}

thread_local! {
    /// Whether this thread is running a user reliever: an allocation it makes that runs
    /// out asks no user reliever again.
    static IN_USER_RELIEVER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs the user's relievers that serve `device` and are not `source`'s, in order, each
/// followed by `retry` until it succeeds; the last retry's result, or `None` when none ran.
fn run_user_relievers(
    device: Option<u32>,
    source: Source,
    bytes: usize,
    mut retry: impl FnMut() -> Result<NonNull<u8>>,
) -> Option<Result<NonNull<u8>>> {
    if IN_USER_RELIEVER.with(std::cell::Cell::get) {
        return None;
    }
    let chosen: Vec<(u64, UserReliever)> = with_state(|st| {
        st.user
            .iter()
            .filter(|(r, _)| r.device.is_none() || r.device == device)
            .filter(|(r, _)| r.library != Some(source))
            .map(|(r, f)| (r.id, f.clone()))
            .collect()
    });
    let mut last = None;
    for (id, f) in chosen {
        IN_USER_RELIEVER.with(|c| c.set(true));
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(device, bytes)));
        IN_USER_RELIEVER.with(|c| c.set(false));
        let got = match ran {
            Ok(Ok(n)) => Some(n),
            Ok(Err(_)) | Err(_) => None,
        };
        with_state(|st| {
            if let Some((row, _)) = st.user.iter_mut().find(|(r, _)| r.id == id) {
                row.calls += 1;
                match got {
                    Some(n) => row.released_bytes += n as u64,
                    None => row.failures += 1,
                }
            }
        });
        let again = retry();
        let done = !matches!(again, Err(CoreError::OutOfMemory { .. }));
        last = Some(again);
        if done {
            break;
        }
    }
    last
}

/// A snapshot of the counters.
pub fn pressure_statistics() -> PressureStatistics {
    with_state(|st| PressureStatistics {
        user_relievers: st.user.iter().map(|(r, _)| r.clone()).collect(),
        ..st.stats.clone()
    })
}

/// Runs the relief steps for memory of `resource` on behalf of `source`: `resource`'s own
/// cache, then every registered library but `source` itself (asking the library that is
/// allocating to empty its cache from inside its own allocator would re-enter it). Never
/// called with a lock of memarray's held; relievers run one at a time, outside the
/// registry's lock.
pub fn relieve(resource: &dyn MemoryResource, source: Source) -> usize {
    let own = resource.release_cached();
    let relievers: Vec<(Source, Reliever)> = with_state(|st| {
        st.stats.own_released_bytes += own as u64;
        st.relievers.clone()
    });
    let device = resource.device_id();
    let mut total = own;
    for (library, f) in relievers {
        if library == source {
            continue;
        }
        // A reliever that panics released nothing; the allocation goes on.
        let asked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(device)));
        let Some(got) = asked.unwrap_or(Some(0)) else {
            continue; // not loaded here: nothing asked
        };
        total = total.saturating_add(got);
        with_state(|st| {
            if let Some(row) = st.stats.relievers.iter_mut().find(|(s, ..)| *s == library) {
                row.1 += 1;
                row.2 += got as u64;
            }
        });
    }
    total
}

/// `resource.allocate(bytes, align, stream)` (zeroed when `zeroed`) for this thread's
/// [`current_source`](super::current_source) (memarray's own outside any glue), counted on
/// the [`ledger`] (free it with [`deallocate_counted`](super::deallocate_counted)
/// and that source). Past the source's budget there, memarray's own arrays spill first
/// (when it is memarray's budget and spilling is on), then the allocation is refused
/// naming the budget. On out-of-memory, [`relieve`] and one retry; then the user's
/// relievers; if that fails too and spilling is on for the resource's device, spill
/// arrays and retry while spilling frees memory.
pub fn allocate_with_relief(
    resource: &dyn MemoryResource,
    bytes: usize,
    align: usize,
    stream: Option<RawStream>,
    zeroed: bool,
) -> Result<NonNull<u8>> {
    let source = super::current_source().unwrap_or(Source::MEMARRAY);
    if source == Source::MEMARRAY
        && HOOKED.load(std::sync::atomic::Ordering::Acquire)
        && let Some(device) = resource.device_id()
        && let Some(budget) = with_state(|st| st.budget.clone())
    {
        budget(device, bytes, stream);
    }
    let place = ledger::location_of(resource);
    within_library_budget(resource, source, place, bytes, stream)?;
    let got = allocate_relieved(resource, source, bytes, align, stream, zeroed);
    if got.is_err() {
        ledger::release(source, place, bytes);
    }
    got
}

/// Counts `bytes` for `source` on `place` within its budget: past it, memarray's own
/// arrays spill first when the source is memarray's and spilling is on there (not under a
/// capture), then the allocation is refused with [`CoreError::OutOfMemory`] naming the
/// budget.
fn within_library_budget(
    resource: &dyn MemoryResource,
    source: Source,
    place: Location,
    bytes: usize,
    stream: Option<RawStream>,
) -> Result<()> {
    let Err(mut over) = ledger::try_reserve(source, place, bytes) else {
        return Ok(());
    };
    if source == Source::MEMARRAY
        && let Location::Device(device) = place
        && !captured(Some(device), stream)
        && let Some(spill) = with_state(|st| st.spill.clone())
    {
        for _ in 0..16 {
            let need = (over.live + bytes as u64).saturating_sub(over.budget);
            if spill(device, need as usize) == 0 {
                break;
            }
            match ledger::try_reserve(source, place, bytes) {
                Ok(()) => return Ok(()),
                Err(o) => over = o,
            }
        }
    }
    ledger::note_refused(source, place);
    Err(CoreError::OutOfMemory {
        bytes,
        resource: resource.name().to_string(),
        reason: format!(
            "past {source}'s budget on {}: it holds {} of its {} bytes; free some of its \
             memory or raise its budget (other libraries are not limited by it)",
            ledger::place_text(place),
            over.live,
            over.budget
        ),
    })
}

/// The allocation and the relief steps after it (see [`allocate_with_relief`]).
fn allocate_relieved(
    resource: &dyn MemoryResource,
    source: Source,
    bytes: usize,
    align: usize,
    stream: Option<RawStream>,
    zeroed: bool,
) -> Result<NonNull<u8>> {
    let call = || {
        if zeroed {
            resource.allocate_zeroed(bytes, align, stream)
        } else {
            resource.allocate(bytes, align, stream)
        }
    };
    match call() {
        Err(CoreError::OutOfMemory {
            bytes,
            resource: name,
            reason,
        }) if captured(resource.device_id(), stream) => Err(CoreError::OutOfMemory {
            bytes,
            resource: name,
            reason: format!(
                "{reason}; no relief or spilling was tried: the stream is being captured into \
                 a CUDA graph (they free memory and wait on the host); make room before the \
                 capture"
            ),
        }),
        Err(CoreError::OutOfMemory { .. }) => {
            with_state(|st| st.stats.events += 1);
            relieve(resource, source);
            let mut again = call();
            if matches!(again, Err(CoreError::OutOfMemory { .. }))
                && let Some(after) = run_user_relievers(resource.device_id(), source, bytes, call)
            {
                again = after;
            }
            if matches!(again, Err(CoreError::OutOfMemory { .. }))
                && let Some(device) = resource.device_id()
                && let Some(spill) = with_state(|st| st.spill.clone())
            {
                with_state(|st| st.stats.spills += 1);
                // Each round spills at least `bytes` more; a pool's fragmentation may need
                // a few. Stops when nothing more can go.
                for _ in 0..16 {
                    let freed = spill(device, bytes);
                    with_state(|st| st.stats.spilled_bytes += freed as u64);
                    if freed == 0 {
                        break;
                    }
                    again = call();
                    if !matches!(again, Err(CoreError::OutOfMemory { .. })) {
                        break;
                    }
                }
            }
            with_state(|st| match &again {
                Ok(_) => st.stats.recovered += 1,
                Err(_) => st.stats.failed += 1,
            });
            again
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::{HostResource, LimitingAdaptor, with_source};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// One test owns the process-wide registry (tests run in threads of one process).
    #[test]
    fn relief_asks_other_libraries_then_retries_once() {
        let limit = Arc::new(LimitingAdaptor::new(Arc::new(HostResource), 1000));
        // "torch" holds 800 bytes of the budget in its cache; its reliever frees them.
        let held = limit.allocate(800, 8, None).unwrap();
        let held = Mutex::new(Some(held.as_ptr() as usize));
        let torch_calls = Arc::new(AtomicUsize::new(0));
        let cupy_calls = Arc::new(AtomicUsize::new(0));
        let (l, t) = (limit.clone(), torch_calls.clone());
        register_reliever(
            Source::register("torch").unwrap(),
            Arc::new(move |device| {
                assert_eq!(device, None);
                t.fetch_add(1, Ordering::SeqCst);
                match held.lock().unwrap().take() {
                    Some(p) => {
                        let p = NonNull::new(p as *mut u8).unwrap();
                        // SAFETY: p came from `l` with these arguments, freed once here.
                        unsafe { l.deallocate(p, 800, 8, None) };
                        Some(800)
                    }
                    None => Some(0),
                }
            }),
        );
        let c = cupy_calls.clone();
        register_reliever(
            Source::register("cupy").unwrap(),
            Arc::new(move |_| {
                c.fetch_add(1, Ordering::SeqCst);
                Some(0)
            }),
        );
        // A library that is not loaded is not counted as asked.
        register_reliever(Source::register("rmm").unwrap(), Arc::new(|_| None));
        let before = pressure_statistics();
        // 500 bytes do not fit next to torch's 800: relief frees them and the retry works.
        let p = allocate_with_relief(&*limit, 500, 8, None, false).unwrap();
        assert_eq!(torch_calls.load(Ordering::SeqCst), 1);
        assert_eq!(cupy_calls.load(Ordering::SeqCst), 1);
        // Allocating for torch never asks torch itself; 2000 bytes never fit: out of memory.
        let e = with_source(Source::register("torch").unwrap(), || {
            allocate_with_relief(&*limit, 2000, 8, None, true).unwrap_err()
        });
        assert!(e.is_out_of_memory(), "{e}");
        assert_eq!(torch_calls.load(Ordering::SeqCst), 1);
        assert_eq!(cupy_calls.load(Ordering::SeqCst), 2);
        let after = pressure_statistics();
        assert_eq!(after.events - before.events, 2);
        assert_eq!(after.recovered - before.recovered, 1);
        assert_eq!(after.failed - before.failed, 1);
        let torch_row = after
            .relievers
            .iter()
            .find(|r| r.0 == Source::register("torch").unwrap())
            .unwrap();
        assert_eq!((torch_row.1, torch_row.2), (1, 800));
        let rmm_row = after
            .relievers
            .iter()
            .find(|r| r.0 == Source::register("rmm").unwrap())
            .unwrap();
        assert_eq!((rmm_row.1, rmm_row.2), (0, 0));
        // SAFETY: p came from `limit` with these arguments and is freed once.
        unsafe { limit.deallocate(p, 500, 8, None) };
    }

    /// A device resource (device 7) that is always out of memory, counting the relief
    /// path's asks of its cache.
    #[derive(Debug)]
    struct Full(AtomicUsize);

    impl MemoryResource for Full {
        fn allocate(&self, bytes: usize, _: usize, _: Option<RawStream>) -> Result<NonNull<u8>> {
            Err(CoreError::OutOfMemory {
                bytes,
                resource: "full".into(),
                reason: "nothing left".into(),
            })
        }
        fn allocate_zeroed(
            &self,
            bytes: usize,
            align: usize,
            stream: Option<RawStream>,
        ) -> Result<NonNull<u8>> {
            self.allocate(bytes, align, stream)
        }
        unsafe fn deallocate(&self, _: NonNull<u8>, _: usize, _: usize, _: Option<RawStream>) {}
        fn kind(&self) -> crate::MemoryKind {
            crate::MemoryKind::Device
        }
        fn is_accessible_from(&self, _: crate::Location) -> bool {
            false
        }
        fn device_id(&self) -> Option<u32> {
            Some(7)
        }
        fn release_cached(&self) -> usize {
            self.0.fetch_add(1, Ordering::SeqCst);
            0
        }
        fn name(&self) -> &str {
            "full"
        }
    }

    #[test]
    fn under_a_capture_no_relief_runs_and_the_error_says_why() {
        // Device 7's streams are "captured" (no other test uses device 7).
        set_capture_probe(|device, stream| device == 7 && stream.is_some());
        let full = Full(AtomicUsize::new(0));
        // SAFETY: a token handle, never handed to a driver (the probe only compares).
        let captured = Some(unsafe { RawStream::from_raw(0x5a5a) });
        let e = allocate_with_relief(&full, 64, 8, captured, false).unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
        let text = e.to_string();
        for part in [
            "nothing left",
            "captured into a CUDA graph",
            "before the capture",
        ] {
            assert!(text.contains(part), "{text}");
        }
        assert_eq!(
            full.0.load(Ordering::SeqCst),
            0,
            "no cache was asked to give back"
        );
    }
}
