//! Locks held by outside observers (the seed's `_lock_id`).
//!
//! [`LockToken`]s are unique process-wide and never reused: ids come from one global
//! counter. A [`Lock`] is free or held by exactly one token; every checked access presents
//! an optional token, and a held lock refuses any other.

use std::num::NonZeroU64;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{CoreError, Result};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Proof of holding a lock: a unique, never-reused id.
///
/// # Example
///
/// ```
/// use memarray_core::Lock;
///
/// let lock = Lock::new();
/// let token = lock.try_lock()?;
/// lock.check(Some(token))?; // the holder passes
/// let err = lock.check(None).unwrap_err(); // everyone else is refused, naming the holder
/// assert!(err.to_string().contains(&token.id().to_string()));
/// lock.unlock(token)?;
/// # Ok::<(), memarray_core::CoreError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LockToken(NonZeroU64);

impl LockToken {
    fn fresh() -> Self {
        // Relaxed is enough: uniqueness comes from the atomic read-modify-write itself.
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        LockToken(NonZeroU64::new(id).expect("lock id counter wrapped after 2^64 locks"))
    }

    /// The token's id.
    pub fn id(self) -> u64 {
        self.0.get()
    }

    /// Rebuilds a token from an id (Python passes ids as ints). This is the seed's sharp
    /// knife: whoever knows the holder's id (`Lock::holder`) can present it. Locks guard
    /// against mistakes, not against code that forges tokens on purpose.
    pub fn from_id(id: u64) -> Option<Self> {
        NonZeroU64::new(id).map(LockToken)
    }
}

/// A lock slot: 0 when free, else the holder's id.
#[derive(Debug, Default)]
pub struct Lock {
    holder: AtomicU64,
}

impl Lock {
    /// A free lock.
    pub const fn new() -> Self {
        Self {
            holder: AtomicU64::new(0),
        }
    }

    /// The holder's id, if held.
    pub fn holder(&self) -> Option<u64> {
        match self.holder.load(Ordering::Acquire) {
            0 => None,
            id => Some(id),
        }
    }

    /// Whether any token holds the lock.
    pub fn is_locked(&self) -> bool {
        self.holder().is_some()
    }

    /// Takes the lock with a fresh token; fails with [`CoreError::Locked`] if held.
    pub fn try_lock(&self) -> Result<LockToken> {
        let token = LockToken::fresh();
        match self
            .holder
            .compare_exchange(0, token.id(), Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Ok(token),
            // The refused attempt's own (never used) id is named beside the holder's, so
            // two contending callers can tell their errors apart.
            Err(held) => Err(CoreError::Locked {
                held,
                requested: Some(token.id()),
            }),
        }
    }

    /// Takes the lock with a fresh token held by a [`LockGuard`], which releases it when
    /// dropped (an early return, a panic or garbage collection cannot leak it).
    pub fn try_guard(self: &Arc<Self>) -> Result<LockGuard> {
        let token = self.try_lock()?;
        Ok(LockGuard {
            lock: self.clone(),
            token,
        })
    }

    /// Releases the lock held by `token`. Fails if another token (or none) holds it.
    pub fn unlock(&self, token: LockToken) -> Result<()> {
        match self
            .holder
            .compare_exchange(token.id(), 0, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Ok(()),
            Err(0) => Err(CoreError::NotLocked {
                requested: token.id(),
            }),
            Err(held) => Err(CoreError::Locked {
                held,
                requested: Some(token.id()),
            }),
        }
    }

    /// Checks an access: allowed when free, or when `token` holds the lock.
    pub fn check(&self, token: Option<LockToken>) -> Result<()> {
        match (self.holder(), token) {
            (None, _) => Ok(()),
            (Some(h), Some(t)) if h == t.id() => Ok(()),
            (Some(held), t) => Err(CoreError::Locked {
                held,
                requested: t.map(LockToken::id),
            }),
        }
    }
}

/// A held lock that is released when the guard drops.
///
/// ```
/// use std::sync::Arc;
/// use memarray_core::Lock;
///
/// let lock = Arc::new(Lock::new());
/// {
///     let guard = lock.try_guard()?;
///     assert_eq!(lock.holder(), Some(guard.token().id()));
///     assert!(lock.try_guard().is_err(), "a second holder is refused");
/// }
/// assert!(!lock.is_locked(), "dropping the guard released the lock");
/// # Ok::<(), memarray_core::CoreError>(())
/// ```
#[derive(Debug)]
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    lock: Arc<Lock>,
    token: LockToken,
}

impl LockGuard {
    /// The token to present to checked accesses while the guard lives.
    pub fn token(&self) -> LockToken {
        self.token
    }

    /// Whether this guard holds `lock` (the same slot, not an equal one).
    pub fn guards(&self, lock: &Arc<Lock>) -> bool {
        Arc::ptr_eq(&self.lock, lock)
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        // Only this guard can hold its token, and tokens are never reused: the unlock
        // cannot fail unless someone forged the id and released it first (harmless).
        let _ = self.lock.unlock(self.token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    #[test]
    fn lock_check_unlock() {
        let l = Lock::new();
        l.check(None).unwrap();
        let t = l.try_lock().unwrap();
        assert_eq!(l.holder(), Some(t.id()));
        l.check(Some(t)).unwrap();
        let e = l.check(None).unwrap_err();
        assert_eq!(
            e,
            CoreError::Locked {
                held: t.id(),
                requested: None
            }
        );
        match l.try_lock().unwrap_err() {
            CoreError::Locked {
                held,
                requested: Some(r),
            } => assert!(held == t.id() && r != t.id(), "names both ids"),
            other => panic!("expected Locked naming both ids, got {other:?}"),
        }
        l.unlock(t).unwrap();
        assert!(!l.is_locked());
        assert_eq!(
            l.unlock(t).unwrap_err(),
            CoreError::NotLocked { requested: t.id() }
        );
    }

    #[test]
    fn foreign_token_is_refused_and_named() {
        let a = Lock::new();
        let b = Lock::new();
        let ta = a.try_lock().unwrap();
        let tb = b.try_lock().unwrap();
        let e = a.check(Some(tb)).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains(&ta.id().to_string()) && msg.contains(&tb.id().to_string()));
        assert!(a.unlock(tb).is_err());
        assert!(a.is_locked(), "a foreign unlock must not release the lock");
    }

    #[test]
    fn tokens_are_unique_across_threads() {
        let ids: Vec<u64> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        let l = Lock::new();
                        (0..1000)
                            .map(|_| {
                                let t = l.try_lock().unwrap();
                                l.unlock(t).unwrap();
                                t.id()
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        let set: HashSet<_> = ids.iter().collect();
        assert_eq!(set.len(), ids.len());
    }

    #[test]
    fn only_one_thread_wins_a_contended_lock() {
        let l = Lock::new();
        let wins: usize = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8).map(|_| s.spawn(|| l.try_lock().is_ok())).collect();
            hs.into_iter().map(|h| h.join().unwrap() as usize).sum()
        });
        assert_eq!(wins, 1);
    }

    #[test]
    fn guard_releases_on_drop_and_unwind() {
        let l = Arc::new(Lock::new());
        let g = l.try_guard().unwrap();
        assert!(g.guards(&l) && l.is_locked());
        drop(g);
        assert!(!l.is_locked());
        let l2 = l.clone();
        let r = std::panic::catch_unwind(move || {
            let _g = l2.try_guard().unwrap();
            panic!("unwinding drops the guard");
        });
        assert!(r.is_err());
        assert!(
            !l.is_locked(),
            "a panic while holding must not leak the lock"
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Lock,
        Unlock(usize),
        Check(Option<usize>),
    }

    proptest! {
        /// Model check: the lock behaves like an Option<id> whatever sequence of
        /// lock, unlock and check with old or current tokens is applied.
        #[test]
        fn lock_matches_model(ops in proptest::collection::vec(
            prop_oneof![
                Just(Op::Lock),
                (0usize..8).prop_map(Op::Unlock),
                proptest::option::of(0usize..8).prop_map(Op::Check),
            ], 1..60))
        {
            let l = Lock::new();
            let mut model: Option<u64> = None;
            let mut issued: Vec<LockToken> = Vec::new();
            for op in ops {
                match op {
                    Op::Lock => {
                        let r = l.try_lock();
                        prop_assert_eq!(r.is_ok(), model.is_none());
                        if let Ok(t) = r {
                            prop_assert!(issued.iter().all(|o| o.id() != t.id()));
                            model = Some(t.id());
                            issued.push(t);
                        }
                    }
                    Op::Unlock(i) => if let Some(&t) = issued.get(i) {
                        let ok = l.unlock(t).is_ok();
                        prop_assert_eq!(ok, model == Some(t.id()));
                        if ok { model = None; }
                    },
                    Op::Check(i) => {
                        let t = i.and_then(|i| issued.get(i).copied());
                        let ok = l.check(t).is_ok();
                        prop_assert_eq!(ok, model.is_none() || model == t.map(|t| t.id()));
                    }
                }
                prop_assert_eq!(l.holder(), model);
            }
        }
    }
}
