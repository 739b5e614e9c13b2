//! [`PerDevice`]: state a feature keeps for each device, beside (not inside) [`Device`]:
//! the small-copy kernel and its tuning live in `copy`, a device's default resource in
//! `resource`, its idle streams in `stream`, and crates above keep theirs the same way
//! (memarray-seed's kernel modules). `Device` stays a leaf that knows
//! nothing above it, as RMM keeps `per_device_resource` beside `cuda_device`.
//!
//! [`Device`]: crate::Device

use std::sync::{Mutex, OnceLock, PoisonError};

/// Devices with a lock-free slot; higher ordinals (rare) go through a mutex.
const FIXED: usize = 64;

/// One `T` per device ordinal, made with `T::default()` on first use and kept for the
/// life of the process (as devices are).
pub struct PerDevice<T: 'static> {
    fixed: [OnceLock<T>; FIXED],
    more: Mutex<Vec<(u32, &'static T)>>,
}

impl<T: Default + Send + Sync + 'static> PerDevice<T> {
    /// An empty table (a `static` initialiser).
    pub const fn new() -> Self {
        Self {
            fixed: [const { OnceLock::new() }; FIXED],
            more: Mutex::new(Vec::new()),
        }
    }

    /// Device `id`'s entry.
    pub fn get(&self, id: u32) -> &T {
        if let Some(slot) = self.fixed.get(id as usize) {
            return slot.get_or_init(T::default);
        }
        let mut more = self.more.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, t)) = more.iter().find(|(i, _)| *i == id) {
            return t;
        }
        let t: &'static T = Box::leak(Box::new(T::default()));
        more.push((id, t));
        t
    }
}

impl<T: Default + Send + Sync + 'static> Default for PerDevice<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: 'static> std::fmt::Debug for PerDevice<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PerDevice")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn each_device_gets_its_own_entry_once() {
        static T: PerDevice<AtomicUsize> = PerDevice::new();
        for id in [0, 1, 63, 64, 1000] {
            T.get(id).fetch_add(id as usize + 1, Ordering::Relaxed);
        }
        for id in [0, 1, 63, 64, 1000] {
            assert_eq!(T.get(id).load(Ordering::Relaxed), id as usize + 1);
            assert!(std::ptr::eq(T.get(id), T.get(id)));
        }
    }
}
