//! Errors with no caller to return to: a driver call that fails in a `Drop` or a free path
//! (freeing memory, destroying an event, unloading a module, waiting for a dropped array's
//! work) is parked here instead of vanishing, as cudarc parks such errors on its context
//! (`record_err`) and reports them at the next check (`check_err`).
//!
//! [`park`] keeps the first [`KEPT`] errors of each kind of place and counts the rest;
//! [`check`] reports the oldest one kept (and forgets them all), [`take`] hands them over.
//! Front ends surface them: Python warns (`RuntimeWarning`) at the next memarray call after
//! one is parked, and `memarray.cuda.check_errors()` raises it; Rust callers ask
//! [`check`] where they want a failure to be seen. [`parked_count`] is one atomic load, so
//! a front end may look on every call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::error::{CudaError, Result};

/// Parked errors kept at most (later ones are counted, not kept).
pub const KEPT: usize = 16;

/// One parked error: where it happened (a fixed phrase such as "freeing device memory")
/// and what the driver said.
#[derive(Clone, Debug, PartialEq)]
pub struct Parked {
    /// The place: what memarray was doing when the call failed.
    pub during: &'static str,
    /// The error.
    pub error: CudaError,
}

impl std::fmt::Display for Parked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} failed: {}", self.during, self.error)
    }
}

/// Errors parked since the process started (kept or not).
static COUNT: AtomicU64 = AtomicU64::new(0);

static KEPT_ERRORS: Mutex<Vec<Parked>> = Mutex::new(Vec::new());

/// Parks `error`, raised while `during` in a place that cannot return it. Never panics,
/// never blocks on anything but a short lock.
pub fn park(during: &'static str, error: CudaError) {
    COUNT.fetch_add(1, Ordering::Relaxed);
    let mut kept = KEPT_ERRORS.lock().unwrap_or_else(PoisonError::into_inner);
    if kept.len() < KEPT {
        kept.push(Parked { during, error });
    }
}

/// Parks the error of `result`, if any (the result of a call made while `during`).
pub fn park_err<T>(during: &'static str, result: Result<T>) {
    if let Err(e) = result {
        park(during, e);
    }
}

/// How many errors were parked since the process started: a front end compares it with
/// the count it last saw.
pub fn parked_count() -> u64 {
    COUNT.load(Ordering::Relaxed)
}

/// The kept errors, oldest first, still kept (a front end's warning shows them; [`check`]
/// or [`take`] reports and forgets them).
pub fn kept() -> Vec<Parked> {
    KEPT_ERRORS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// The kept errors, oldest first, and forgets them.
pub fn take() -> Vec<Parked> {
    std::mem::take(&mut *KEPT_ERRORS.lock().unwrap_or_else(PoisonError::into_inner))
}

/// `Ok` when nothing is parked; else the oldest kept error, as [`CudaError::Parked`]
/// naming where it happened and how many others there were, and forgets them all.
pub fn check() -> Result<()> {
    let kept = take();
    match kept.first() {
        None => Ok(()),
        Some(first) => Err(CudaError::Parked {
            during: first.during,
            source: Box::new(first.error.clone()),
            others: kept.len() - 1,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the store is process-wide, and parallel tests would see each other's.
    #[test]
    fn parked_errors_are_kept_counted_reported_once_and_bounded() {
        take();
        assert_eq!(check(), Ok(()));
        let before = parked_count();
        park_err("freeing device memory", Err::<(), _>(CudaError::NullStream));
        park_err("destroying an event", Ok::<(), CudaError>(()));
        assert_eq!(parked_count(), before + 1);
        match check() {
            Err(CudaError::Parked {
                during,
                source,
                others,
            }) => {
                assert_eq!(during, "freeing device memory");
                assert_eq!(*source, CudaError::NullStream);
                assert_eq!(others, 0);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(check(), Ok(()), "reported once");
        for _ in 0..KEPT + 5 {
            park("unloading a module", CudaError::NullStream);
        }
        assert_eq!(parked_count(), before + 1 + KEPT as u64 + 5);
        let kept = take();
        assert_eq!(kept.len(), KEPT);
        assert_eq!(
            kept[0].to_string(),
            format!("unloading a module failed: {}", CudaError::NullStream)
        );
    }
}
