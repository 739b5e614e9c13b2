//! One device's spilling state ([`DeviceSpill`]: settings, registry, the arrays it may
//! reach, the stream spills copy on, host copies' memory, the resident count) and the map
//! of them, looked up through a per-thread cache.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock, Weak};

use memarray_core::resource::StatisticsAdaptor;
use memarray_core::spill::{SpillOutcome, SpillRegistry, Spiller};
use memarray_core::{FileResource, HostBuffer, MemoryResource};

use super::settings::SpillSettings;
use crate::device::Device;
use crate::error::{ArrayError, Result};
use crate::stream::{Stream, StreamRef};

/// An array the registry can spill: memarray-cuda's `SharedArray` cell. The registry
/// holds it weakly and reaches it only through this trait (the array layer sits above).
pub(crate) trait SpillTarget: Send + Sync {
    /// Spills the array through `to` if it can go now: its mutex by try-lock, its refusal
    /// checked under it.
    fn try_spill(&self, to: &DeviceSpill) -> SpillOutcome;
}

/// One device's spilling: its settings, registry, the arrays it may reach, the stream
/// spills copy on and the memory host copies come from.
pub(crate) struct DeviceSpill {
    pub(super) device: u32,
    /// Which listing this is: new at each `enable` that finds spilling off on the device,
    /// kept when `enable` replaces settings (the arrays are adopted). A note from another
    /// epoch belongs to a registry that is gone.
    pub(super) epoch: u64,
    pub(super) settings: SpillSettings,
    pub(super) registry: SpillRegistry,
    pub(super) arrays: Mutex<HashMap<u64, Weak<dyn SpillTarget>>>,
    /// The stream spills copy on (memarray's own, non-blocking).
    pub(super) stream: OnceLock<Stream>,
    /// Host copies made by spilling (pinned pool, pageable fallback), counted.
    pub(super) host: Arc<StatisticsAdaptor>,
    pub(super) pageable: Arc<StatisticsAdaptor>,
    /// The third tier, opened on first need.
    pub(super) file: Mutex<Option<Arc<StatisticsAdaptor>>>,
    /// Device bytes of listed resident arrays (the registry learns of arrays in batches:
    /// [`Event`](super::batch::Event)); the budget is checked against it. With a budget it is kept at once;
    /// without one, each thread's changes wait in its batch ((`Batch::deltas`)) and are
    /// added when the batch applies. Signed: a thread may add the bytes another thread
    /// takes away, and the sum is what counts ([`resident_bytes`](Self::resident_bytes)).
    pub(super) resident_now: AtomicI64,
}

/// Spilling is on for some device.
pub(super) static ACTIVE: AtomicBool = AtomicBool::new(false);
/// Bumped by every `enable` / `disable`: threads' cached device lookups go stale.
pub(super) static GENERATION: AtomicU64 = AtomicU64::new(0);
/// Numbers the device states' epochs.
pub(super) static NEXT_EPOCH: AtomicU64 = AtomicU64::new(1);
/// Each device's spilling, where it is on.
pub(super) static DEVICES: RwLock<Option<HashMap<u32, Arc<DeviceSpill>>>> = RwLock::new(None);

fn devices() -> std::sync::RwLockReadGuard<'static, Option<HashMap<u32, Arc<DeviceSpill>>>> {
    DEVICES.read().unwrap_or_else(PoisonError::into_inner)
}

/// `device`'s spilling, if it is on there (without reading the environment).
pub(super) fn state_of(device: u32) -> Option<Arc<DeviceSpill>> {
    with_device(device, |d| d.clone())
}

/// Runs `f` on `device`'s spilling, if it is on there, through this thread's cached view
/// (no lock, no hashing; `f` must not reach the registry's batches). The environment is
/// not read here: the entries above (`super::active`) read it first.
pub(super) fn with_device<R>(device: u32, f: impl FnOnce(&Arc<DeviceSpill>) -> R) -> Option<R> {
    if !ACTIVE.load(Ordering::Acquire) {
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
}

impl DeviceSpill {
    /// Device bytes of listed resident arrays as far as this device knows them now (never
    /// below zero: a count taken away before another thread's addition arrived).
    pub(super) fn resident_bytes(&self) -> u64 {
        u64::try_from(self.resident_now.load(Ordering::Relaxed)).unwrap_or(0)
    }

    /// Spills at least `need` bytes if it can. When the victims left are busy with queued
    /// work (the host ran ahead of the device: a prefetch loop queues copies and kernels
    /// faster than they run), the device is waited for once and the rest tried again: a
    /// budget or an allocation is worth that host block.
    pub(super) fn make_room_waiting(&self, need: u64, keep: Option<u64>) -> u64 {
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

    pub(super) fn list(&self, id: u64, target: Weak<dyn SpillTarget>) {
        self.arrays
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, target);
    }

    pub(super) fn forget(&self, id: u64) {
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
