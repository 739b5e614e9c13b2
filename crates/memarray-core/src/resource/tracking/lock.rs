//! The tracking adaptor's lock ([`Lock`]): released by a plain store.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A lock for critical sections of tens of nanoseconds, taken twice per allocate + free.
///
/// `std::sync::Mutex` releases with an atomic exchange (to learn whether a waiter sleeps);
/// here the release is a plain store and a waiter spins, then yields, then sleeps 20 us at a
/// time, so no wake-up is ever owed. Uncontended, an allocate + free of the Python
/// `Resource` pair costs 13 ns less on the 2-core machine (`benches/tracking_cost.rs`).
/// The long holders (`live()` and `timeline()` copying out) keep a waiter asleep in 20 us
/// steps, not spinning. A panic inside releases it (the guard's drop); the state it guards
/// stays usable, as with the poisoned mutex this replaced, whose poison was ignored.
pub(super) struct Lock<T> {
    held: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a `Guard`, and `held` lets one guard exist at a
// time (acquired by an Acquire exchange, released by a Release store), so `&Lock<T>` on many
// threads hands `T` from one to the next as a mutex does.
unsafe impl<T: Send> Sync for Lock<T> {}

/// Spins before yielding, then yields before sleeping.
const SPINS: u32 = 64;
const YIELDS: u32 = 64;
const NAP: Duration = Duration::from_micros(20);

impl<T> Lock<T> {
    pub(super) fn new(value: T) -> Self {
        Self {
            held: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    #[inline]
    pub(super) fn lock(&self) -> Guard<'_, T> {
        if self.held.swap(true, Ordering::Acquire) {
            self.wait();
        }
        self.guard()
    }

    /// The guard of the lock just taken.
    fn guard(&self) -> Guard<'_, T> {
        Guard {
            held: &self.held,
            // SAFETY: the lock was just taken, so this is the only reference.
            value: unsafe { &mut *self.value.get() },
        }
    }

    #[cold]
    fn wait(&self) {
        let mut turns = 0u32;
        loop {
            while self.held.load(Ordering::Relaxed) {
                if turns < SPINS {
                    std::hint::spin_loop();
                } else if turns < SPINS + YIELDS {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(NAP);
                }
                turns = turns.saturating_add(1);
            }
            if !self.held.swap(true, Ordering::Acquire) {
                return;
            }
        }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Lock<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // As std's mutex does: never wait here (a holder may be the one printing).
        let mut d = f.debug_struct("Lock");
        if self.held.swap(true, Ordering::Acquire) {
            d.field("value", &format_args!("<locked>"));
        } else {
            let g = self.guard();
            d.field("value", &*g);
        }
        d.finish()
    }
}

/// The held lock; released when dropped.
pub(super) struct Guard<'a, T> {
    held: &'a AtomicBool,
    value: &'a mut T,
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.value
    }
}

impl<T> DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.value
    }
}

impl<T> Drop for Guard<'_, T> {
    fn drop(&mut self) {
        self.held.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn threads_taking_turns_lose_no_update() {
        let lock = Arc::new(Lock::new((0u64, 0u64)));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let lock = lock.clone();
                std::thread::spawn(move || {
                    for i in 0..50_000u64 {
                        let mut g = lock.lock();
                        // Two fields written apart: a second holder in between would
                        // leave them unequal.
                        g.0 += 1;
                        std::hint::black_box(i);
                        g.1 += 1;
                        assert_eq!(g.0, g.1);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*lock.lock(), (200_000, 200_000));
    }

    #[test]
    fn a_waiter_gets_the_lock_once_a_long_holder_lets_go() {
        let lock = Arc::new(Lock::new(0u32));
        let g = lock.lock();
        let waiter = {
            let lock = lock.clone();
            std::thread::spawn(move || {
                *lock.lock() += 1;
            })
        };
        // Long enough for the waiter to pass its spins and yields into naps.
        std::thread::sleep(Duration::from_millis(30));
        assert!(
            !waiter.is_finished(),
            "the waiter got in while the lock was held"
        );
        drop(g);
        waiter.join().unwrap();
        assert_eq!(*lock.lock(), 1);
    }

    #[test]
    fn a_panic_inside_releases_it() {
        let lock = Arc::new(Lock::new(5u32));
        let l = lock.clone();
        let r = std::thread::spawn(move || {
            let _g = l.lock();
            panic!("inside");
        })
        .join();
        assert!(r.is_err());
        assert_eq!(*lock.lock(), 5, "taken again after the panic");
    }
}
