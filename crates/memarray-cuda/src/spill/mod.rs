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
//!
//! Rooms: `device` (one device's state and the map of them), `batch` (each thread's
//! events, applied in batches), `notes` (what calls on an array tell its device),
//! `settings` (what the environment asks for); this file turns spilling on and off and
//! answers for it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use memarray_core::resource::{StatisticsAdaptor, pressure};
use memarray_core::spill::{SpillRegistry, SpillStatistics};
use memarray_core::{HostResource, RawStream};

use crate::device::Device;
use crate::error::{CudaError, Result, SettingError};

mod batch;
mod device;
mod notes;
mod settings;
#[cfg(test)]
mod tests;

use batch::flush;
use device::{ACTIVE, DEVICES, GENERATION, NEXT_EPOCH, state_of};

pub use crate::env::parse_bytes;
pub(crate) use device::{DeviceSpill, SpillTarget};
pub(crate) use notes::{SpillNote, after_access, forget, left_device};
pub use settings::{SpillSettings, env_settings};

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

static ENV: OnceLock<std::result::Result<(), String>> = OnceLock::new();

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
    if !active() {
        return None;
    }
    state_of(device)
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
    let epoch =
        state_of(device).map_or_else(|| NEXT_EPOCH.fetch_add(1, Ordering::Relaxed), |d| d.epoch);
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
/// them on `stream` (a no-op with spilling off or no budget, and under a capture of
/// `stream`: a spill copies and waits on the host, which a capture forbids).
fn make_room(device: u32, bytes: usize, stream: Option<RawStream>) {
    if let Some(d) = device_spill(device)
        && d.over_budget(bytes) > 0
        && !crate::graph::stream_captured(device, stream)
    {
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
