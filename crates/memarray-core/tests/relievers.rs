//! The user's relievers on the relief path (their own process: the registry of relievers
//! is process-wide): priority order, one at a time with a retry after each, failures and
//! panics counted and passed, a library's reliever not asked while that library allocates,
//! removal, and no recursion when a reliever's own allocation runs out.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::Slots;

use memarray_core::resource::{
    UserReliever, UserRelieverStatistics, add_reliever, allocate_with_relief, pressure_statistics,
    remove_reliever, with_source,
};
use memarray_core::{MemoryResource, Source};

fn row(id: u64) -> UserRelieverStatistics {
    pressure_statistics()
        .user_relievers
        .into_iter()
        .find(|r| r.id == id)
        .expect("registered")
}

#[test]
fn user_relievers_run_in_priority_order_until_the_allocation_fits() {
    let slots = Arc::new(Slots::capped(Some(9), 1000, 900));
    let order = Arc::new(Mutex::new(Vec::new()));
    let log = |tag: &'static str, frees: usize| -> UserReliever {
        let (order, slots) = (order.clone(), slots.clone());
        Arc::new(move |device, bytes| {
            assert_eq!((device, bytes), (Some(9), 500));
            order.lock().unwrap().push(tag);
            slots.used.fetch_sub(frees, Ordering::SeqCst);
            Ok(frees)
        })
    };
    let low = add_reliever("low", log("low", 0), Some(9), None, 0);
    let frees = add_reliever("frees", log("frees", 500), Some(9), None, 1);
    let panics = add_reliever(
        "panics",
        Arc::new(|_, _| panic!("a reliever that panics")),
        Some(9),
        None,
        7,
    );
    let errs = add_reliever(
        "errs",
        Arc::new(|_, _| Err("no".into())),
        None, // every device
        None,
        5,
    );
    let torchs = add_reliever(
        "torch's",
        log("torch's", 0),
        Some(9),
        Some(Source::register("torch").unwrap()),
        9,
    );
    // torch allocating: its own reliever is not asked; the failing ones are counted
    // and passed; "frees" makes room, so "low" is never asked.
    let p = with_source(Source::register("torch").unwrap(), || {
        allocate_with_relief(&*slots, 500, 8, None, false)
    })
    .unwrap();
    assert_eq!(*order.lock().unwrap(), ["frees"]);
    assert_eq!((row(panics).calls, row(panics).failures), (1, 1));
    // (Serving every device, "errs" may be asked by other tests' allocations too.)
    let errs_row = row(errs);
    assert!(errs_row.calls >= 1 && errs_row.failures == errs_row.calls);
    assert_eq!((row(frees).calls, row(frees).released_bytes), (1, 500));
    assert_eq!((row(low).calls, row(torchs).calls), (0, 0));
    // SAFETY: p came from `slots` with these arguments.
    unsafe { slots.deallocate(p, 500, 8, None) };
    // Removed, a reliever is never asked again; removing twice says so.
    for id in [low, frees, panics, errs, torchs] {
        assert!(remove_reliever(id));
        assert!(!remove_reliever(id));
    }
    slots.used.store(900, Ordering::SeqCst);
    let e = allocate_with_relief(&*slots, 500, 8, None, false).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert_eq!(order.lock().unwrap().len(), 1);
}

#[test]
fn a_reliever_that_allocates_and_runs_out_asks_no_reliever_again() {
    let slots = Arc::new(Slots::capped(Some(10), 1000, 1000));
    let calls = Arc::new(AtomicUsize::new(0));
    let (s, c) = (slots.clone(), calls.clone());
    let id = add_reliever(
        "allocates",
        Arc::new(move |_, _| {
            c.fetch_add(1, Ordering::SeqCst);
            // Runs out too: without the guard this would recurse without end.
            let inner = allocate_with_relief(&*s, 100, 8, None, false);
            assert!(inner.is_err());
            Ok(0)
        }),
        Some(10),
        None,
        0,
    );
    assert!(allocate_with_relief(&*slots, 100, 8, None, false).is_err());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(remove_reliever(id));
}
