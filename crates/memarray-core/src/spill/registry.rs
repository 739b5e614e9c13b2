//! [`SpillRegistry`]: the device-resident arrays of one device, their bytes against a
//! budget, and which to spill to make room.
//!
//! The registry never touches an array itself: a [`Spiller`] does (memarray-cuda's moves
//! the data; the tests' fake moves bytes between two host maps). Lock order: the registry's
//! mutex is never held while the spiller runs, and the spiller takes a victim's lock with a
//! try-lock only, skipping it when busy, so a thread that holds an array's lock while it
//! asks for room cannot deadlock with another doing the same.

use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use super::policy::{IdMap, IdSet, SpillPolicy};

/// What a [`Spiller`] did with a victim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpillOutcome {
    /// Its device data moved out; `bytes` of device memory are free.
    Spilled {
        /// Device bytes released.
        bytes: usize,
    },
    /// It cannot be spilled now (locked, exported, in use, its lock held): skipped.
    Busy,
    /// It no longer exists (freed meanwhile).
    Gone,
}

/// Moves one array's device data out (to its host buffer or a file) and frees its device
/// memory.
pub trait Spiller {
    /// Spills array `id`, taking its lock with a try-lock only.
    fn try_spill(&self, id: u64) -> SpillOutcome;
}

/// Counters of one device's spilling.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpillStatistics {
    /// Arrays spilled, in all.
    pub spilled_arrays: u64,
    /// Bytes spilled, in all.
    pub spilled_bytes: u64,
    /// Arrays restored, in all.
    pub restored_arrays: u64,
    /// Bytes restored, in all.
    pub restored_bytes: u64,
    /// Bytes spilled now.
    pub current_spilled_bytes: u64,
    /// Bytes of registered arrays resident on the device now.
    pub resident_bytes: u64,
    /// Nanoseconds spent spilling (in the spiller).
    pub spill_ns: u64,
    /// Nanoseconds spent restoring (enqueueing the copies back; a synchronous restore
    /// includes the copy).
    pub restore_ns: u64,
    /// Victims skipped because they were busy.
    pub skipped_busy: u64,
}

#[derive(Debug, Default)]
struct State {
    policy: SpillPolicy,
    resident: IdMap<usize>,
    spilled: IdMap<usize>,
    /// Restored ahead of use (a prefetch) and not used since: victims of last resort.
    ahead: IdSet,
    stats: SpillStatistics,
}

impl State {
    fn spilled(&mut self, id: u64, bytes: usize, ns: u64) {
        self.ahead.remove(&id);
        if let Some(b) = self.resident.remove(&id) {
            self.stats.resident_bytes -= b as u64;
        }
        if let Some(old) = self.spilled.insert(id, bytes) {
            self.stats.current_spilled_bytes -= old as u64;
        }
        self.stats.spilled_arrays += 1;
        self.stats.spilled_bytes += bytes as u64;
        self.stats.current_spilled_bytes += bytes as u64;
        self.stats.spill_ns += ns;
    }
}

/// The spillable arrays of one device (see the module docs).
#[derive(Debug)]
pub struct SpillRegistry {
    budget: Option<u64>,
    state: Mutex<State>,
}

impl SpillRegistry {
    /// A registry keeping registered arrays within `budget` device bytes (`None`: no budget,
    /// room is only made on request, after an allocation failed).
    pub fn new(budget: Option<u64>) -> Self {
        Self {
            budget,
            state: Mutex::new(State::default()),
        }
    }

    /// The budget in bytes, if any.
    pub fn budget(&self) -> Option<u64> {
        self.budget
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Array `id` holds `bytes` of device memory now (made, or restored: see
    /// [`SpillRegistry::restored`]).
    pub fn register(&self, id: u64, bytes: usize) {
        let mut st = self.lock();
        if let Some(old) = st.resident.insert(id, bytes) {
            st.stats.resident_bytes -= old as u64;
        }
        st.stats.resident_bytes += bytes as u64;
        st.policy.touch(id);
    }

    /// Array `id` was used on the device; false when it is not listed as resident.
    pub fn touch(&self, id: u64) -> bool {
        let mut st = self.lock();
        if st.resident.contains_key(&id) {
            st.ahead.remove(&id);
            st.policy.touch(id);
            return true;
        }
        false
    }

    /// Array `id` is gone (freed by its owner), resident or spilled.
    pub fn unregister(&self, id: u64) {
        let mut st = self.lock();
        if let Some(b) = st.resident.remove(&id) {
            st.stats.resident_bytes -= b as u64;
        }
        // Most programs never spill: two empty maps are not probed.
        if !st.spilled.is_empty()
            && let Some(b) = st.spilled.remove(&id)
        {
            st.stats.current_spilled_bytes -= b as u64;
        }
        if !st.ahead.is_empty() {
            st.ahead.remove(&id);
        }
        st.policy.remove(id);
    }

    /// Spilled array `id` is back on the device with `bytes`; restoring took `ns`.
    pub fn restored(&self, id: u64, bytes: usize, ns: u64) {
        let mut st = self.lock();
        st.ahead.remove(&id);
        if let Some(b) = st.spilled.remove(&id) {
            st.stats.current_spilled_bytes -= b as u64;
        }
        st.stats.restored_arrays += 1;
        st.stats.restored_bytes += bytes as u64;
        st.stats.restore_ns += ns;
        if let Some(old) = st.resident.insert(id, bytes) {
            st.stats.resident_bytes -= old as u64;
        }
        st.stats.resident_bytes += bytes as u64;
        st.policy.restored(id);
    }

    /// Lists what `old` lists, resident and spilled, without counting it as new spills or
    /// restores (settings replaced: the arrays are the same).
    pub fn adopt(&self, old: &SpillRegistry) {
        let (resident, spilled) = {
            let o = old.lock();
            (o.resident.clone(), o.spilled.clone())
        };
        let mut st = self.lock();
        for (id, bytes) in resident {
            st.resident.insert(id, bytes);
            st.stats.resident_bytes += bytes as u64;
            st.policy.touch(id);
        }
        for (id, bytes) in spilled {
            st.spilled.insert(id, bytes);
            st.stats.current_spilled_bytes += bytes as u64;
        }
    }

    /// Array `id` was spilled outside [`Self::make_room`] (on request), taking `ns`.
    pub fn note_spilled(&self, id: u64, bytes: usize, ns: u64) {
        let mut st = self.lock();
        st.spilled(id, bytes, ns);
        let expert = st.policy.expert();
        st.policy.spilled(id, expert);
    }

    /// Spilled array `id` is back ahead of its use (a prefetch): until it is used, other
    /// arrays are spilled before it.
    pub fn restored_ahead(&self, id: u64, bytes: usize, ns: u64) {
        self.restored(id, bytes, ns);
        self.lock().ahead.insert(id);
    }

    /// Whether array `id` is spilled now.
    pub fn is_spilled(&self, id: u64) -> bool {
        self.lock().spilled.contains_key(&id)
    }

    /// The counters.
    pub fn statistics(&self) -> SpillStatistics {
        self.lock().stats
    }

    /// Bytes to free before `bytes` more fit the budget (0 without a budget).
    pub fn over_budget(&self, bytes: usize) -> u64 {
        let resident = self.lock().stats.resident_bytes;
        match self.budget {
            Some(b) => (resident + bytes as u64).saturating_sub(b),
            None => 0,
        }
    }

    /// Spills victims, chosen by the policy among the registered resident arrays other
    /// than `keep`, until at least `need` device bytes are free or none is left that can
    /// go; returns the bytes freed. Busy victims are skipped for this call.
    pub fn make_room(&self, need: u64, keep: Option<u64>, spiller: &dyn Spiller) -> u64 {
        let mut freed = 0u64;
        let mut tried: HashSet<u64> = HashSet::new();
        while freed < need {
            let choice = {
                let mut st = self.lock();
                let State { policy, ahead, .. } = &mut *st;
                policy
                    .choose(|id| Some(id) != keep && !tried.contains(&id) && !ahead.contains(&id))
                    .or_else(|| policy.choose(|id| Some(id) != keep && !tried.contains(&id)))
            };
            let Some((id, expert)) = choice else { break };
            tried.insert(id);
            let start = Instant::now();
            let outcome = spiller.try_spill(id);
            let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
            let mut st = self.lock();
            match outcome {
                SpillOutcome::Spilled { bytes } => {
                    freed += bytes as u64;
                    st.spilled(id, bytes, ns);
                    st.policy.spilled(id, expert);
                }
                SpillOutcome::Busy => st.stats.skipped_busy += 1,
                SpillOutcome::Gone => {
                    if let Some(b) = st.resident.remove(&id) {
                        st.stats.resident_bytes -= b as u64;
                    }
                    st.policy.remove(id);
                }
            }
        }
        freed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::ptr::NonNull;
    use std::sync::Arc;

    use crate::resource::{HostResource, LimitingAdaptor, MemoryResource};

    const CHUNK: usize = 1024;

    /// A fake device: "device" blocks from a limited host resource, "host" copies in a map.
    struct Fake {
        device: Arc<LimitingAdaptor>,
        arrays: Mutex<HashMap<u64, Entry>>,
    }

    struct Entry {
        on_device: Option<usize>,
        host: Vec<u8>,
        pinned: bool,
    }

    impl Fake {
        fn new(device_bytes: u64) -> Self {
            Fake {
                device: Arc::new(LimitingAdaptor::new(Arc::new(HostResource), device_bytes)),
                arrays: Mutex::new(HashMap::new()),
            }
        }

        fn alloc(&self) -> Option<usize> {
            self.device
                .allocate(CHUNK, 64, None)
                .ok()
                .map(|p| p.as_ptr() as usize)
        }

        fn free(&self, p: usize) {
            // SAFETY: p came from alloc() with (CHUNK, 64) and is freed once (the entry
            // lost it first).
            unsafe {
                self.device
                    .deallocate(NonNull::new(p as *mut u8).unwrap(), CHUNK, 64, None)
            };
        }

        /// The device block of `id`, restoring it (making room first) when spilled.
        fn use_on_device(&self, reg: &SpillRegistry, id: u64) -> usize {
            if let Some(p) = self.arrays.lock().unwrap()[&id].on_device {
                assert!(reg.touch(id));
                return p;
            }
            reg.make_room(reg.over_budget(CHUNK), Some(id), self);
            let p = self.alloc().or_else(|| {
                reg.make_room(CHUNK as u64, Some(id), self);
                self.alloc()
            });
            let p = p.expect("room was made");
            let mut arrays = self.arrays.lock().unwrap();
            let e = arrays.get_mut(&id).unwrap();
            // SAFETY: p is CHUNK bytes of host memory owned by this entry now.
            unsafe { std::ptr::copy_nonoverlapping(e.host.as_ptr(), p as *mut u8, CHUNK) };
            e.on_device = Some(p);
            drop(arrays);
            reg.restored(id, CHUNK, 0);
            p
        }
    }

    impl Spiller for Fake {
        fn try_spill(&self, id: u64) -> SpillOutcome {
            let mut arrays = self.arrays.lock().unwrap();
            let Some(e) = arrays.get_mut(&id) else {
                return SpillOutcome::Gone;
            };
            if e.pinned {
                return SpillOutcome::Busy;
            }
            let Some(p) = e.on_device.take() else {
                return SpillOutcome::Gone;
            };
            // SAFETY: p is this entry's CHUNK-byte block.
            unsafe { std::ptr::copy_nonoverlapping(p as *const u8, e.host.as_mut_ptr(), CHUNK) };
            self.free(p);
            SpillOutcome::Spilled { bytes: CHUNK }
        }
    }

    /// 64 arrays at 4x a 16-array budget, 10 passes that increment every byte: every value
    /// survives, the budget holds, the pinned array never moves.
    #[test]
    fn workloads_past_the_budget_keep_every_value() {
        for (budget_arrays, device_arrays) in [(16u64, 64u64), (32, 40)] {
            let fake = Fake::new(device_arrays * CHUNK as u64);
            let reg = SpillRegistry::new(Some(budget_arrays * CHUNK as u64));
            for id in 0..64u64 {
                reg.make_room(reg.over_budget(CHUNK), None, &fake);
                let p = fake.alloc().unwrap();
                // SAFETY: a fresh CHUNK-byte block.
                unsafe { std::ptr::write_bytes(p as *mut u8, id as u8, CHUNK) };
                fake.arrays.lock().unwrap().insert(
                    id,
                    Entry {
                        on_device: Some(p),
                        host: vec![0; CHUNK],
                        pinned: id == 5,
                    },
                );
                reg.register(id, CHUNK);
                assert!(reg.statistics().resident_bytes <= budget_arrays * CHUNK as u64);
            }
            let pinned_at = fake.arrays.lock().unwrap()[&5].on_device;
            for pass in 1..=10u8 {
                for id in 0..64u64 {
                    let p = fake.use_on_device(&reg, id);
                    // SAFETY: the array's device block, CHUNK bytes, ours while used.
                    let block = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, CHUNK) };
                    assert!(
                        block
                            .iter()
                            .all(|&b| b == (id as u8).wrapping_add(pass - 1))
                    );
                    block.iter_mut().for_each(|b| *b = b.wrapping_add(1));
                    let s = reg.statistics();
                    assert!(s.resident_bytes <= budget_arrays * CHUNK as u64, "{s:?}");
                }
            }
            assert_eq!(fake.arrays.lock().unwrap()[&5].on_device, pinned_at);
            let s = reg.statistics();
            assert!(s.spilled_arrays > 0 && s.restored_arrays > 0 && s.skipped_busy > 0);
            assert_eq!(s.current_spilled_bytes, s.spilled_bytes - s.restored_bytes);
            // Freeing everything leaves nothing counted.
            for id in 0..64u64 {
                if let Some(p) = fake.arrays.lock().unwrap().remove(&id).unwrap().on_device {
                    fake.free(p);
                }
                reg.unregister(id);
            }
            let s = reg.statistics();
            assert_eq!((s.resident_bytes, s.current_spilled_bytes), (0, 0));
            assert_eq!(fake.device.used(), 0);
        }
    }

    #[test]
    fn make_room_stops_when_nothing_can_go() {
        let fake = Fake::new(4 * CHUNK as u64);
        let reg = SpillRegistry::new(None);
        for id in 0..2u64 {
            let p = fake.alloc().unwrap();
            fake.arrays.lock().unwrap().insert(
                id,
                Entry {
                    on_device: Some(p),
                    host: vec![0; CHUNK],
                    pinned: true,
                },
            );
            reg.register(id, CHUNK);
        }
        assert_eq!(reg.over_budget(1 << 30), 0, "no budget: nothing is over it");
        assert_eq!(reg.make_room(10 * CHUNK as u64, None, &fake), 0);
        assert_eq!(reg.statistics().skipped_busy, 2);
        reg.unregister(0);
        reg.unregister(1);
        for id in 0..2u64 {
            let p = fake
                .arrays
                .lock()
                .unwrap()
                .remove(&id)
                .unwrap()
                .on_device
                .unwrap();
            fake.free(p);
        }
    }

    #[test]
    fn an_array_prefetched_ahead_of_use_goes_last() {
        struct Record(Mutex<Vec<u64>>);
        impl Spiller for Record {
            fn try_spill(&self, id: u64) -> SpillOutcome {
                if id == 1 {
                    return SpillOutcome::Busy;
                }
                self.0.lock().unwrap().push(id);
                SpillOutcome::Spilled { bytes: 10 }
            }
        }
        let reg = SpillRegistry::new(None);
        reg.register(1, 10);
        reg.register(3, 10);
        reg.note_spilled(3, 10, 0);
        reg.restored_ahead(3, 10, 0);
        reg.register(2, 10);
        // LRU order 1 (busy), 3 (ahead: passed over), 2.
        let r = Record(Mutex::new(Vec::new()));
        assert_eq!(reg.make_room(10, None, &r), 10);
        assert_eq!(*r.0.lock().unwrap(), vec![2]);
        // Nothing else left: the one ahead goes after all.
        assert_eq!(reg.make_room(10, None, &r), 10);
        assert_eq!(*r.0.lock().unwrap(), vec![2, 3]);
        // A use clears the mark.
        reg.restored(3, 10, 0);
        assert!(reg.touch(3));
    }
}
